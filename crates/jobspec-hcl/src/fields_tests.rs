//! The field table (`berth_jobspec::fields`) against the decoder: every field it names
//! is read by that name, so the JSON reader and writer and the HCL reader agree.

use berth_jobspec::fields::*;

/// A jobspec that writes `field` in a block of kind `block`, with the rest a job
/// needs around it.
fn jobspec_writing(block: &str, field: &Field) -> String {
    let value = match field.kind {
        Kind::Text => format!("{} = \"x\"", field.hcl),
        Kind::Number | Kind::Positive => format!("{} = 1", field.hcl),
        Kind::Bool => format!("{} = true", field.hcl),
        Kind::Duration => format!("{} = \"1s\"", field.hcl),
        Kind::List => format!("{} = []", field.hcl),
        Kind::Map => format!("{} = {{}}", field.hcl),
        Kind::Block if field.hcl == "config" => "config {}".to_string(),
        Kind::Block | Kind::Blocks => match field.hcl {
            "group" => "group \"h\" {\n task \"u\" {\n driver = \"mock\"\n }\n }".into(),
            "task" => "task \"u\" {\n driver = \"mock\"\n }".into(),
            "volume" => "volume \"v\" {\n type = \"host\"\n source = \"s\"\n }".into(),
            name => format!("{name} {{}}"),
        },
    };
    let task = |inner: &str| format!("task \"t\" {{\n driver = \"mock\"\n {inner}\n }}");
    let group = |inner: &str| format!("group \"g\" {{\n {inner}\n {}\n }}", task(""));
    let in_group_task = |inner: &str| format!("group \"g\" {{\n {}\n }}", task(inner));
    let body = match block {
        "job" => format!("{value}\n{}", group("")),
        "periodic" => format!("periodic {{\n {value}\n }}\n{}", group("")),
        "parameterized" => format!("parameterized {{\n {value}\n }}\n{}", group("")),
        "constraint" => format!("constraint {{\n {value}\n }}\n{}", group("")),
        "group" => group(&value),
        "restart" | "ephemeral_disk" => group(&format!("{block} {{\n {value}\n }}")),
        "volume" => group(&format!("volume \"v\" {{\n {value}\n }}")),
        "task" => in_group_task(&value),
        "volume_mount" | "template" | "resources" | "lifecycle" | "logs" | "dispatch_payload" => {
            in_group_task(&format!("{block} {{\n {value}\n }}"))
        }
        "change_script" => in_group_task(&format!(
            "template {{\n destination = \"local/x\"\n change_mode = \"script\"\n change_script {{\n {value}\n }}\n }}"
        )),
        "wait" => in_group_task(&format!(
            "template {{\n destination = \"local/x\"\n wait {{\n {value}\n }}\n }}"
        )),
        other => panic!("no jobspec around a {other} block"),
    };
    format!("job \"j\" {{\n{body}\n}}\n")
}

#[test]
fn the_decoder_reads_every_field_of_the_table_by_its_hcl_name() {
    for (block, fields) in BLOCKS {
        for field in *fields {
            let source = jobspec_writing(block, field);
            let problems = match crate::parse("fields.nomad.hcl", &source) {
                Ok(_) => String::new(),
                Err(error) => error.to_string(),
            };
            assert!(
                !problems.contains(&format!("unknown field \"{}\"", field.hcl))
                    && !problems.contains("unknown block"),
                "{block}.{}: {problems}\n{source}",
                field.hcl
            );
        }
    }
}
