//! One run reports every independent problem of a jobspec: what cannot be evaluated, what
//! cannot be decoded and what is invalid, each once, at its line, in the order written;
//! a value that could not be evaluated draws no second problem.

use super::*;
use berth_hcl::eval::VariableInputs;

fn problems_of(source: &str) -> Vec<String> {
    problems_with(source, &VariableInputs::default())
}

fn problems_with(source: &str, inputs: &VariableInputs) -> Vec<String> {
    match parse_with("job.hcl", source, inputs) {
        Ok(job) => panic!("expected problems, parsed {job:?}"),
        Err(error) => error.problems.iter().map(ToString::to_string).collect(),
    }
}

/// Each of `expected` is the start of one problem (`line:column: path: message…`), in
/// order, and there is no other.
fn assert_problems(found: &[String], expected: &[&str]) {
    let text = found.join("\n");
    assert_eq!(found.len(), expected.len(), "{text}");
    for (problem, start) in found.iter().zip(expected) {
        assert!(problem.starts_with(start), "{start:?} in\n{text}");
    }
}

#[test]
fn an_undeclared_variable_a_decode_error_and_a_type_error_are_reported_together() {
    let source = r#"variable "greeting" {
  type    = string
  default = "hello"
}

job "three" {
  type = "batch"
  group "g" {
    task "a" {
      driver = "exec"
      config {
        command = var.nope
      }
    }
    task "b" {
      driver = "exec"
      memory = 256
      config {
        command = "/bin/echo"
        args    = [var.greeting]
      }
      env {
        COUNT = 1 + var.greeting
      }
    }
  }
}
"#;
    let found = problems_of(source);
    assert_problems(
        &found,
        &[
            "12:19: job.three.group.g.task.a.config.command: var.nope is not declared: add a \
             variable \"nope\" block, or use one of the declared variables (greeting)",
            "17:7: job.three.group.g.task.b.memory: unknown field \"memory\"",
            "23:17: job.three.group.g.task.b.env.COUNT: binary operator `+` is not applicable",
        ],
    );
}

#[test]
fn evaluation_problems_do_not_hide_decode_and_validation_problems() {
    // An unknown function, a variable's failed validation, a wrong type, a bad duration
    // and an unknown local: five places, five problems.
    let source = r#"variable "replicas" {
  type    = number
  default = 9
  validation {
    condition     = var.replicas <= 5
    error_message = "at most 5 replicas."
  }
}

job "five" {
  datacenters = "dc1"
  group "g" {
    count = var.replicas
    task "t" {
      driver       = "exec"
      kill_timeout = "soon"
      config {
        command = frobnicate("/bin/true")
      }
      meta = { where = local.nowhere }
    }
  }
}
"#;
    let found = problems_of(source);
    assert_problems(
        &found,
        &[
            "4:3: jobspec: variable \"replicas\": at most 5 replicas.",
            "11:17: job.five.datacenters: expected a list of strings, found a string",
            "16:22: job.five.group.g.task.t.kill_timeout: \"soon\" is not a duration",
            "18:19: job.five.group.g.task.t.config.command: unknown function frobnicate()",
            "20:24: job.five.group.g.task.t.meta.where: local.nowhere is not defined in a \
             locals block",
        ],
    );
}

#[test]
fn a_value_that_failed_to_evaluate_is_neither_required_nor_of_the_wrong_type() {
    // Each of these attributes is required, typed, or checked for emptiness: its
    // evaluation problem is the only one.
    let source = r#"job "j" {
  type = var.kind
  periodic {
    cron = var.schedule
  }
  group "g" {
    count = var.count
    service {
      name = "web"
      port = var.port
      provider = "nomad"
    }
    task "t" {
      driver = var.driver
      constraint {
        attribute = var.attribute
        value     = "linux"
      }
      env {
        A = var.a
      }
      config {
        args = ["-c", var.args]
      }
      template {
        destination = var.destination
        data        = "x"
      }
    }
  }
}
"#;
    let found = problems_of(source);
    let names = [
        "kind",
        "schedule",
        "count",
        "port",
        "driver",
        "attribute",
        "a",
        "args",
        "destination",
    ];
    assert_eq!(found.len(), names.len(), "{}", found.join("\n"));
    for (problem, name) in found.iter().zip(names) {
        assert!(
            problem.contains(&format!("var.{name} is not declared")),
            "{name}: {}",
            found.join("\n")
        );
    }
}

#[test]
fn a_variable_or_local_without_a_value_is_reported_once_where_it_is_declared() {
    let source = r#"variable "image" {
  type = string
}

variable "port" {
  type    = number
  default = "eighty"
}

locals {
  command = "/bin/${var.image}"
  args    = [local.command, upper(12, 13)]
  flags   = concat(local.args, ["-v"])
}

job "j" {
  group "g" {
    task "t" {
      driver = "exec"
      config {
        command = local.command
        args    = local.flags
        port    = var.port
      }
      env {
        IMAGE = "${var.image}-${NOMAD_ALLOC_ID}"
      }
    }
  }
}
"#;
    // `local.args` and what uses it depend on `var.image`: they are not evaluated (their
    // own mistake, upper() with two arguments, shows once `var.image` has a value).
    let found = problems_of(source);
    assert_problems(
        &found,
        &[
            "1:1: jobspec: variable \"image\" has no value",
            "5:1: jobspec: variable \"port\" (from its default): \"eighty\" is not a number",
        ],
    );
    // Given a value, the variable's dependents evaluate; the rest still fail.
    let inputs = VariableInputs {
        args: vec![("image".into(), "app".into())],
        ..Default::default()
    };
    let found = problems_with(source, &inputs);
    assert_problems(
        &found,
        &[
            "5:1: jobspec: variable \"port\" (from its default)",
            "12:3: jobspec: local \"args\": ",
        ],
    );
}

#[test]
fn a_dynamic_block_that_cannot_be_expanded_leaves_no_missing_block_behind() {
    let source = r#"job "j" {
  group "g" {
    dynamic "task" {
      for_each = var.tasks
      labels   = [task.key]
      content {
        driver = "exec"
      }
    }
  }
  group "h" {
    dynamic "task" {
      for_each = { a = 1, b = {} }
      labels   = [task.value]
      content {
        driver = "exec"
      }
    }
  }
}
"#;
    let found = problems_of(source);
    assert_problems(
        &found,
        &[
            "3:5: job.j.group.g.dynamic.task: for_each: var.tasks is not declared",
            "14:19: job.j.group.h.dynamic.task: a dynamic block's labels must be strings",
        ],
    );
}

#[test]
fn a_bound_reached_refuses_the_jobspec_for_that_alone() {
    // Past the evaluation budget, the tree is not decoded: its unknown field is not
    // reported, as the jobspec is refused anyway.
    let body = "X".repeat(20_000);
    let source = format!(
        "job \"j\" {{\n  meta = {{\n    x = \"%{{for a in range(1000)}}{body}%{{endfor}}\"\n  }}\n  group \"g\" {{\n    task \"t\" {{\n      driver = \"exec\"\n      drivr = \"exec\"\n    }}\n  }}\n}}\n"
    );
    let found = problems_of(&source);
    assert_problems(
        &found,
        &["3:9: job.j.meta.x: evaluating this jobspec would build more than 16 MiB"],
    );
}

#[test]
fn hostile_or_broken_expressions_give_problems_not_panics() {
    for expression in [
        "var",
        "local",
        "var[\"x\"]",
        "var.x.y[3]",
        "local.a.b",
        "[for x in var.nope : x]",
        "{ for k, v in var.nope : k => v }",
        "\"${var.nope}${NOMAD_ALLOC_ID}\"",
        "\"%{ if var.nope }x%{ endif }\"",
        "\"%{ for x in var.nope }${x}%{ endfor }\"",
        "upper(var.nope, var.nope)",
        "1 / 0",
        "1 % 0",
        "18446744073709551615 + 1",
        "-9223372036854775807 - 2",
        "4294967296 * 4294967296",
        "1e308 * 10",
        "-9223372036854775808 % -1",
        "-\"x\"",
        "!5",
        "true ? var.nope : 1",
        "jsondecode(\"{\")",
        "range(-1)",
        "element([], 3)",
    ] {
        let source = format!(
            "locals {{\n  a = 1\n}}\njob \"j\" {{\n  group \"g\" {{\n    task \"t\" {{\n      driver = \"exec\"\n      meta = {{ m = {expression} }}\n      kill_signal = 5\n    }}\n  }}\n}}\n"
        );
        let result = std::panic::catch_unwind(|| parse("job.hcl", &source));
        let Ok(result) = result else {
            panic!("{expression} panicked");
        };
        let problems = result.unwrap_err().problems;
        // The wrong kill_signal is found whatever happened to the expression.
        assert!(
            problems.iter().any(|p| p
                .to_string()
                .starts_with("9:21: job.j.group.g.task.t.kill_signal:")),
            "{expression}: {problems:?}"
        );
    }
}
