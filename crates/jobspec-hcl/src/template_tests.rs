//! `template` blocks as the decoder reads them: change modes, wait, delimiters, owner
//! ids, and each problem named where it is written.

use std::time::Duration;

use super::*;

fn problems(source: &str) -> Vec<String> {
    match parse("job.hcl", source) {
        Ok(job) => panic!("expected problems, parsed {job:?}"),
        Err(error) => error.problems.iter().map(ToString::to_string).collect(),
    }
}

fn with_template(body: &str) -> String {
    format!(
        "job \"j\" {{\n  group \"g\" {{\n    task \"t\" {{\n      driver = \"exec\"\n      template {{\n{body}\n      }}\n    }}\n  }}\n}}\n"
    )
}

#[test]
fn a_template_reads_its_change_mode_wait_delimiters_and_owner() {
    let source = with_template(
        r#"        data            = "[[ range nomadService \"db\" ]][[ .Address ]][[ end ]]"
        destination     = "local/db.conf"
        change_mode     = "signal"
        change_signal   = "SIGHUP"
        splay           = "1s"
        left_delimiter  = "[["
        right_delimiter = "]]"
        uid             = 1234
        gid             = -1
        error_on_missing_key = true
        wait {
          min = "2s"
          max = "10s"
        }"#,
    );
    let job = parse("job.hcl", &source).unwrap();
    let template = &job.groups[0].tasks[0].templates[0];
    assert_eq!(template.change_mode, ChangeMode::Signal("SIGHUP".into()));
    assert_eq!(template.splay, Duration::from_secs(1));
    assert_eq!(
        template.wait,
        TemplateWait {
            min: Duration::from_secs(2),
            max: Duration::from_secs(10)
        }
    );
    assert_eq!((template.uid, template.gid), (Some(1234), None));
    assert_eq!(template.left_delimiter, "[[");
    assert!(template.error_on_missing_key && !template.once);
    // The defaults are Nomad's.
    let job = parse(
        "job.hcl",
        &with_template("        data = \"x\"\n        destination = \"local/x\""),
    )
    .unwrap();
    let template = &job.groups[0].tasks[0].templates[0];
    assert_eq!(template.change_mode, ChangeMode::Restart);
    assert_eq!(template.splay, Duration::from_secs(5));
    assert_eq!(template.wait, TemplateWait::default());
    assert_eq!(template.left_delimiter, "{{");
}

#[test]
fn template_problems_are_named_where_they_are_written() {
    let cases = [
        (
            "data = \"{{ secret \\\"db\\\" }}\"\n destination = \"local/x\"",
            "data: line 1: template function \"secret\" is not supported: it reads Vault",
        ),
        (
            "data = \"{{ nomadService \\\"x\\\" \"\n destination = \"local/x\"",
            "data: line 1: an action {{ is never closed with }}",
        ),
        (
            "data = \"x\"\n destination = \"local/x\"\n change_mode = \"signal\"",
            "change_mode: change_mode = \"signal\" needs change_signal",
        ),
        (
            "data = \"x\"\n destination = \"local/x\"\n change_mode = \"signal\"\n change_signal = \"SIGWINCH\"",
            "change_signal: \"SIGWINCH\" is not a signal berth sends",
        ),
        (
            "data = \"x\"\n destination = \"local/x\"\n change_mode = \"reload\"",
            "\"reload\" is not a change mode (restart, signal, script or noop)",
        ),
        (
            "data = \"x\"\n destination = \"local/x\"\n change_signal = \"SIGHUP\"",
            "change_signal is used only with change_mode = \"signal\"",
        ),
        (
            "data = \"x\"\n destination = \"local/x\"\n change_mode = \"script\"",
            "needs a change_script block with its command",
        ),
        (
            "data = \"x\"\n destination = \"local/x\"\n wait {\n min = \"10s\"\n max = \"1s\"\n }",
            "wait.min: min (10s) is longer than max (1s)",
        ),
        (
            "data = \"x\"\n destination = \"local/x\"\n uid = -5",
            "uid must be a user or group id (0 or more), or -1",
        ),
        (
            "data = \"x\"\n destination = \"local/x\"\n left_delimiter = \"< <\"",
            "\"< <\" cannot delimit actions",
        ),
    ];
    for (body, expected) in cases {
        let found = problems(&with_template(body)).join("\n");
        assert!(found.contains(expected), "{body}:\n{found}");
    }
}

#[test]
fn a_template_past_the_size_limit_is_refused_before_it_is_read() {
    let body = format!(
        "data = \"{}\"\n destination = \"local/x\"",
        "x".repeat(300_000)
    );
    let found = problems(&with_template(&body)).join("\n");
    assert!(
        found.contains("the template is 300000 bytes; berth reads templates of up to 262144 bytes"),
        "{found}"
    );
}

#[test]
fn a_task_has_at_most_64_templates() {
    let one =
        "      template {\n        data = \"x\"\n        destination = \"local/x\"\n      }\n";
    let source = format!(
        "job \"j\" {{\n  group \"g\" {{\n    task \"t\" {{\n      driver = \"exec\"\n{}    }}\n  }}\n}}\n",
        one.repeat(65)
    );
    let found = problems(&source).join("\n");
    assert!(found.contains("a task has at most 64 templates"), "{found}");
    assert!(
        found.starts_with(&format!("{}:7: ", 5 + 64 * 4)),
        "the 65th is named where it is written: {found}"
    );
    let source = format!(
        "job \"j\" {{\n  group \"g\" {{\n    task \"t\" {{\n      driver = \"exec\"\n{}    }}\n  }}\n}}\n",
        one.repeat(64)
    );
    assert!(parse("job.hcl", &source).is_ok());
}
