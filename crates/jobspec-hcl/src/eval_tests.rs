//! HCL2 evaluation of jobspecs: variables, locals, functions, what is left for run time,
//! and the bounds on what a job author can make the agent build.

use super::*;
use berth_hcl::eval::{VariableInputs, inline_files};

fn job_with(source: &str, inputs: &VariableInputs) -> Result<Job, Vec<String>> {
    parse_with("job.hcl", source, inputs)
        .map_err(|e| e.problems.iter().map(ToString::to_string).collect())
}

fn task_of(job: &Job) -> &Task {
    &job.groups[0].tasks[0]
}

const VARIABLES: &str = r#"
variable "name" {
  type    = string
  default = "web"
}

variable "replicas" {
  type    = number
  default = 1
  validation {
    condition     = var.replicas >= 1 && var.replicas <= 5
    error_message = "replicas must be between 1 and 5."
  }
}

variable "dcs" {
  type    = list(string)
  default = ["dc1"]
}

locals {
  label   = "${local.prefix}-${var.name}"
  prefix  = upper(var.name)
  args    = concat(["-c"], [format("echo %s x%d", local.label, var.replicas)])
}

job "app" {
  datacenters = var.dcs
  group "g" {
    count = var.replicas
    task "t" {
      driver = "exec"
      config {
        command = "sh"
        args    = local.args
      }
      env {
        WHERE = "${NOMAD_ALLOC_DIR}/${var.name}/${attr.kernel.name}"
        ITEMS = join(",", [for d in var.dcs : upper(d)])
      }
    }
  }
}
"#;

#[test]
fn variables_take_defaults_and_locals_resolve_in_dependency_order() {
    let job = job_with(VARIABLES, &VariableInputs::default()).unwrap();
    assert_eq!(job.datacenters, ["dc1"]);
    assert_eq!(job.groups[0].count, 1);
    let task = task_of(&job);
    assert_eq!(
        task.config["args"],
        serde_json::json!(["-c", "echo WEB-web x1"])
    );
    let env: std::collections::BTreeMap<_, _> = task.env.iter().cloned().collect();
    // Run-time variables stay for the task runner; var.* is evaluated around them.
    assert_eq!(env["WHERE"], "${NOMAD_ALLOC_DIR}/web/${attr.kernel.name}");
    assert_eq!(env["ITEMS"], "DC1");
}

#[test]
fn inputs_override_defaults_in_nomads_order_and_are_typed() {
    let inputs = VariableInputs {
        env: vec![
            ("name".into(), "from-env".into()),
            ("replicas".into(), "4".into()),
        ],
        files: vec![(
            "prod.vars.hcl".into(),
            "name = \"from-file\"\ndcs = [\"eu-1\", \"eu-2\"]\n".into(),
        )],
        args: vec![("replicas".into(), "3".into())],
    };
    let job = job_with(VARIABLES, &inputs).unwrap();
    assert_eq!(job.groups[0].count, 3, "-var beats NOMAD_VAR_");
    assert_eq!(job.datacenters, ["eu-1", "eu-2"]);
    assert_eq!(
        task_of(&job).config["args"],
        serde_json::json!(["-c", "echo FROM-FILE-from-file x3"]),
        "a var file beats NOMAD_VAR_"
    );
    let list_from_text = VariableInputs {
        args: vec![("dcs".into(), "[\"a\", \"b\"]".into())],
        ..Default::default()
    };
    assert_eq!(
        job_with(VARIABLES, &list_from_text).unwrap().datacenters,
        ["a", "b"]
    );
}

#[test]
fn variable_problems_are_all_reported_with_their_place() {
    let inputs = VariableInputs {
        args: vec![("replicas".into(), "9".into()), ("nope".into(), "1".into())],
        ..Default::default()
    };
    let source = VARIABLES.replace("  default = [\"dc1\"]\n", "");
    let problems = job_with(&source, &inputs).unwrap_err();
    let text = problems.join("\n");
    assert!(text.contains("replicas must be between 1 and 5."), "{text}");
    assert!(
        text.contains("-var nope=…: the jobspec declares no variable \"nope\""),
        "{text}"
    );
    assert!(
        text.contains("variable \"dcs\" has no value: give it one with -var dcs=…"),
        "{text}"
    );
    assert!(
        problems
            .iter()
            .any(|p| p.starts_with("10:3:") && p.contains("replicas must")),
        "{text}"
    );
    let wrong_type = VariableInputs {
        args: vec![("replicas".into(), "three".into())],
        ..Default::default()
    };
    let text = job_with(VARIABLES, &wrong_type).unwrap_err().join("\n");
    assert!(
        text.contains("variable \"replicas\" (from -var replicas): \"three\" is not a number"),
        "{text}"
    );
}

#[test]
fn locals_in_a_cycle_or_unknown_are_refused() {
    let cyclic = "locals {\n  a = local.b\n  b = \"${local.c}x\"\n  c = local.a\n}\njob \"j\" {\n  group \"g\" {\n    task \"t\" {\n      driver = \"exec\"\n    }\n  }\n}\n";
    let text = job_with(cyclic, &VariableInputs::default())
        .unwrap_err()
        .join("\n");
    assert!(
        text.contains(
            "locals refer to each other in a cycle: local.a → local.b → local.c → local.a"
        ),
        "{text}"
    );
    let unknown = cyclic.replace("c = local.a", "c = local.zzz");
    let text = job_with(&unknown, &VariableInputs::default())
        .unwrap_err()
        .join("\n");
    assert!(
        text.contains("local \"c\" refers to local.zzz, which is not defined"),
        "{text}"
    );
}

#[test]
fn run_time_names_outside_strings_and_unknown_functions_are_explained() {
    let source = "job \"j\" {\n  group \"g\" {\n    count = attr.cpu.numcores\n    task \"t\" {\n      driver = nosuch(\"exec\")\n    }\n  }\n}\n";
    let problems = job_with(source, &VariableInputs::default()).unwrap_err();
    let text = problems.join("\n");
    assert!(
        text.contains(
            "3:13: job.j.group.g.count: attr is known only when the task starts; use it inside a string"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "5:16: job.j.group.g.task.t.driver: unknown function nosuch() (berth has: abs,"
        ),
        "{text}"
    );
}

#[test]
fn the_agent_reads_no_file_and_the_cli_inlines_them_on_the_same_line() {
    let source = "job \"j\" {\n  group \"g\" {\n    task \"t\" {\n      driver = \"exec\"\n      env {\n        CONF = file(\"app.conf\")\n      }\n      meta = { after = \"still line 8\" }\n    }\n  }\n}\n";
    let text = job_with(source, &VariableInputs::default())
        .unwrap_err()
        .join("\n");
    assert!(
        text.contains("6:16: job.j.group.g.task.t.env.CONF: file() reads the disk of the machine"),
        "{text}"
    );

    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("app.conf"), "a = \"${x}\"\n\tb\\c %{y}\n").unwrap();
    let inlined = inline_files(source, dir.path()).unwrap();
    assert_eq!(inlined.lines().count(), source.lines().count());
    let job = job_with(&inlined, &VariableInputs::default()).unwrap();
    assert_eq!(
        task_of(&job).env,
        [(
            "CONF".to_string(),
            "a = \"${x}\"\n\tb\\c %{y}\n".to_string()
        )]
    );

    let missing = inline_files(&source.replace("app.conf", "gone.conf"), dir.path()).unwrap_err();
    assert_eq!(missing[0].at.line, 6);
    assert!(
        missing[0].message.contains("file(\"gone.conf\")"),
        "{:?}",
        missing
    );
}

/// A job author can make the agent evaluate what they like; each way to make it build
/// something huge is refused before it gets there.
#[test]
fn evaluation_is_bounded_for_a_hostile_job_author() {
    let wrap = |body: &str| {
        format!(
            "{body}\njob \"j\" {{\n  group \"g\" {{\n    task \"t\" {{\n      driver = \"exec\"\n    }}\n  }}\n}}\n"
        )
    };
    let mut doubling = String::from("locals {\n  l0 = \"xxxxxxxxxxxxxxxx\"\n");
    for i in 1..40 {
        doubling.push_str(&format!(
            "  l{i} = \"${{local.l{}}}${{local.l{}}}\"\n",
            i - 1,
            i - 1
        ));
    }
    doubling.push_str("}\n");
    let text = job_with(&wrap(&doubling), &VariableInputs::default())
        .unwrap_err()
        .join("\n");
    assert!(text.contains("bytes as JSON; berth allows 65536"), "{text}");

    let nested = "locals {\n  n = [for a in range(1000) : [for b in range(1000) : b]]\n}\n";
    let text = job_with(&wrap(nested), &VariableInputs::default())
        .unwrap_err()
        .join("\n");
    assert!(
        text.contains("a for expression inside another is not supported"),
        "{text}"
    );

    // Template directives are loops too: nested ones are refused, and what a loop would
    // build from a literal body is charged before it is built (a 1.4 KB jobspec of three
    // nested %{for} over 200 elements made 80 MB).
    let two_hundred = format!("[{}]", vec!["1"; 200].join(","));
    let cubed = format!(
        "job \"j\" {{\n  meta = {{\n    x = \"%{{for a in {two_hundred}}}%{{for b in {two_hundred}}}XXXXXXXXXX%{{endfor}}%{{endfor}}\"\n  }}\n  group \"g\" {{\n    task \"t\" {{\n      driver = \"exec\"\n    }}\n  }}\n}}\n"
    );
    let text = job_with(&cubed, &VariableInputs::default())
        .unwrap_err()
        .join("\n");
    assert!(
        text.contains("a for expression inside another is not supported"),
        "{text}"
    );
    let body = "X".repeat(20_000);
    let looped = format!(
        "job \"j\" {{\n  meta = {{\n    x = \"%{{for a in range(1000)}}{body}%{{endfor}}\"\n    y = join(\",\", [for a in range(1000) : \"{body}\"])\n  }}\n  group \"g\" {{\n    task \"t\" {{\n      driver = \"exec\"\n    }}\n  }}\n}}\n"
    );
    let text = job_with(&looped, &VariableInputs::default())
        .unwrap_err()
        .join("\n");
    assert_eq!(
        text.matches("evaluating this jobspec would build more than 16 MiB")
            .count(),
        2,
        "{text}"
    );

    let huge_range = "locals {\n  n = range(100000000)\n}\n";
    let text = job_with(&wrap(huge_range), &VariableInputs::default())
        .unwrap_err()
        .join("\n");
    assert!(text.contains("berth allows 1024"), "{text}");

    let mut many = String::from("locals {\n  a = \"x\"\n  b = \"");
    for _ in 0..1100 {
        many.push_str("${local.a}");
    }
    many.push_str("\"\n}\n");
    let source = wrap(&many).replace(
        "driver = \"exec\"",
        &format!(
            "driver = \"exec\"\n      meta = {{ m = \"{}\" }}",
            "${local.a}".repeat(1100)
        ),
    );
    let text = job_with(&source, &VariableInputs::default())
        .unwrap_err()
        .join("\n");
    assert!(
        text.contains("more than 1024 references to variables and locals"),
        "{text}"
    );

    // Counted before evaluating: in one local, and in a variable's validation.
    let text = job_with(&wrap(&many), &VariableInputs::default())
        .unwrap_err()
        .join("\n");
    assert!(
        text.contains("local \"b\": the jobspec makes more than 1024 references"),
        "{text}"
    );
    let condition = format!(
        "variable \"v\" {{\n  default = \"x\"\n  validation {{\n    condition = \"{}\" != \"\"\n    error_message = \"no\"\n  }}\n}}\n",
        "${var.v}".repeat(1100)
    );
    let text = job_with(&wrap(&condition), &VariableInputs::default())
        .unwrap_err()
        .join("\n");
    assert!(
        text.contains("validation: the jobspec makes more than 1024 references"),
        "{text}"
    );
}

#[test]
fn dynamic_blocks_make_one_block_per_element_with_the_iterators_key_and_value() {
    let source = r#"
locals {
  workers = { alpha = "1", beta = "2" }
  ports   = ["http", "metrics"]
}
job "fanout" {
  type = "batch"
  group "g" {
    dynamic "task" {
      for_each = local.workers
      iterator = worker
      labels   = ["worker-${worker.key}"]
      content {
        driver = "exec"
        config {
          command = "/bin/echo"
          args    = ["shard", worker.value, "${NOMAD_ALLOC_DIR}"]
        }
        dynamic "template" {
          for_each = local.ports
          content {
            data        = "${template.key}=${template.value} on ${worker.key}"
            destination = "local/${template.value}.txt"
          }
        }
      }
    }
  }
}"#;
    let job = job_with(source, &VariableInputs::default()).unwrap();
    let tasks = &job.groups[0].tasks;
    let names: Vec<&str> = tasks.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["worker-alpha", "worker-beta"]);
    assert_eq!(
        tasks[1].config["args"],
        serde_json::json!(["shard", "2", "${NOMAD_ALLOC_DIR}"])
    );
    let templates: Vec<(&str, &str)> = tasks[1]
        .templates
        .iter()
        .map(|t| (t.data.as_str(), t.destination.as_str()))
        .collect();
    assert_eq!(
        templates,
        [
            ("0=http on beta", "local/http.txt"),
            ("1=metrics on beta", "local/metrics.txt")
        ]
    );
}

#[test]
fn dynamic_blocks_that_cannot_be_expanded_say_why() {
    let with = |dynamic: &str| {
        let source = format!(
            "job \"j\" {{\n  group \"g\" {{\n{dynamic}\n    task \"t\" {{\n      driver = \"mock\"\n    }}\n  }}\n}}"
        );
        job_with(&source, &VariableInputs::default())
            .unwrap_err()
            .join("\n")
    };
    let not_a_collection = with(
        "    dynamic \"meta\" {\n      for_each = 3\n      content {\n        a = \"b\"\n      }\n    }",
    );
    assert!(
        not_a_collection.starts_with("3:5:")
            && not_a_collection.contains("for_each must be a list, a set or a map, not 3"),
        "{not_a_collection}"
    );
    let no_content = with("    dynamic \"meta\" {\n      for_each = [1]\n    }");
    assert!(
        no_content.contains("a dynamic block needs for_each and a content block"),
        "{no_content}"
    );
    // Nested, they multiply: 64 × 65 blocks are refused, not built.
    let too_many = with(
        "    dynamic \"volume\" {\n      for_each = range(64)\n      iterator = outer\n      labels = [\"v${outer.value}\"]\n      content {\n        type = \"host\"\n        dynamic \"mount_options\" {\n          for_each = range(65)\n          content {\n            fs_type = \"x\"\n          }\n        }\n      }\n    }",
    );
    assert!(
        too_many.contains("the dynamic blocks would make more than 4096 blocks"),
        "{too_many}"
    );
}
