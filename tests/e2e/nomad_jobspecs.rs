//! Nomad jobspecs as Nomad users write them, through `berth job run` and
//! `berth job validate`: HCL2 variables and locals, constraints checked on this node,
//! run-time interpolation, templates, a bare command name, and every problem reported
//! at once.

use berth_harness::AgentProcess;
use berth_model::status::ClientStatus;

const JOB: &str = r#"
variable "greeting" {
  type = string
}

variable "who" {
  type    = string
  default = "nobody"
}

locals {
  message = "${upper(var.greeting)}, ${var.who}"
}

job "interp" {
  type = "batch"

  constraint {
    attribute = "${attr.kernel.name}"
    value     = "linux"
  }

  # Attributes Nomad's fingerprinters set and jobspecs constrain on.
  constraint {
    attribute = "${attr.os.cgroups.version}"
    operator  = "regexp"
    value     = "^[12]$"
  }

  constraint {
    attribute = "${attr.unique.network.ip-address}"
    operator  = "is_set"
  }

  group "g" {
    restart {
      attempts = 0
    }

    update {
      max_parallel = 1
    }

    volume "scratch" {
      type   = "host"
      source = "scratch"
    }

    task "t" {
      driver = "exec"

      volume_mount {
        volume      = "scratch"
        destination = "${NOMAD_TASK_DIR}/scratch"
      }

      env {
        MESSAGE = local.message
      }

      template {
        data        = "from-template={{ env \"MESSAGE\" }} task={{ env \"NOMAD_TASK_NAME\" }}\n"
        destination = "local/conf/d/out.txt"
      }

      template {
        data        = "FROM_ENV_TEMPLATE={{ env \"NOMAD_JOB_NAME\" }}\n"
        destination = "${NOMAD_SECRETS_DIR}/vars.env"
        env         = true
      }

      config {
        command = "sh"
        args    = ["-c", "echo alloc_dir=${NOMAD_ALLOC_DIR} kernel=${attr.kernel.name} msg=$MESSAGE env_tpl=$FROM_ENV_TEMPLATE; cat ${NOMAD_TASK_DIR}/conf/d/out.txt; echo from-task > ${NOMAD_TASK_DIR}/scratch/note"]
      }
    }
  }
}
"#;

#[tokio::test(flavor = "multi_thread")]
async fn job_run_evaluates_variables_locals_constraints_interpolation_and_templates() {
    let mut agent = AgentProcess::new();
    agent.start().await;
    let jobspec = agent.path().join("interp.nomad.hcl");
    std::fs::write(&jobspec, JOB).unwrap();
    let vars = agent.path().join("prod.vars.hcl");
    std::fs::write(&vars, "who = \"world\"\n").unwrap();
    let (code, stdout, stderr) = agent.cli(&[
        "job",
        "run",
        "-var",
        "greeting=hi",
        "-var-file",
        vars.to_str().unwrap(),
        jobspec.to_str().unwrap(),
    ]);
    let id = stdout
        .lines()
        .find_map(|l| l.trim().strip_prefix("alloc "))
        .unwrap_or_else(|| panic!("{stdout}\n{stderr}"))
        .to_string();
    let (_, alloc_status, _) = agent.cli(&["alloc", "status", &id]);
    assert_eq!(code, 0, "{stdout}\n{stderr}\n{alloc_status}");
    assert!(
        stderr.contains("Job Warnings:")
            && stderr.contains("update has no effect on a single berth node"),
        "{stderr}"
    );
    let status = agent.finished(&id).await;
    let output = std::fs::read_to_string(status.alloc_dir.join("alloc/logs/t.stdout.0")).unwrap();
    assert_eq!(status.client_status, ClientStatus::Complete, "{output}");
    assert_eq!(
        output,
        "alloc_dir=/alloc kernel=linux msg=HI, world env_tpl=interp\n\
         from-template=HI, world task=t\n"
    );
    // The volume went where its interpolated destination says.
    assert_eq!(
        std::fs::read_to_string(agent.path().join("scratch/note")).unwrap(),
        "from-task\n"
    );

    // The same job on a node it does not fit: accepted and not placed, as in Nomad,
    // `job run` saying which constraint filtered the node out, and exiting 2.
    let elsewhere = agent.path().join("elsewhere.hcl");
    std::fs::write(
        &elsewhere,
        JOB.replace("value     = \"linux\"", "value     = \"windows\""),
    )
    .unwrap();
    let (code, stdout, stderr) = agent.cli(&[
        "job",
        "run",
        "-var",
        "greeting=hi",
        elsewhere.to_str().unwrap(),
    ]);
    assert_eq!(code, 2, "{stdout}{stderr}");
    assert!(
        stdout.contains("failed to place all allocations")
            && stdout.contains("windows")
            && stdout.contains("1 nodes excluded by filter"),
        "{stdout}"
    );
    // Without a value for a variable that has no default: told how to give one.
    let (code, _, stderr) = agent.cli(&["job", "run", jobspec.to_str().unwrap()]);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("variable \"greeting\" has no value: give it one with -var greeting=…"),
        "{stderr}"
    );
}

#[test]
fn job_validate_reports_five_independent_errors_each_at_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let jobspec = dir.path().join("broken.hcl");
    std::fs::write(
        &jobspec,
        r#"job "broken" {
  type = "sytem"
  vault {
    policies = ["db"]
  }
  group "g" {
    count = "two"
    task "t" {
      driver = "exec"
      artifact {
        source = "git::https://example.com/app.git"
      }
      template {
        data        = "{{ secret \"app/config\" }}"
        destination = "/etc/app.conf"
      }
      config {
        command = "/bin/true"
      }
    }
  }
}
"#,
    )
    .unwrap();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_berth"))
        .args(["job", "validate"])
        .arg(&jobspec)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    for (line, text) in [
        (2, "unknown job type \"sytem\""),
        (3, "vault is not supported: berth cannot fetch Vault tokens"),
        (7, "count: expected a number"),
        (
            11,
            "uses the git getter; berth fetches http:// and https:// sources only",
        ),
        (14, "template function \"secret\" is not supported"),
        (
            15,
            "\"/etc/app.conf\" must be a file in the task's local/ or secrets/ directory",
        ),
    ] {
        assert!(
            stderr
                .lines()
                .any(|l| l.contains(&format!(":{line}:")) && l.contains(text)),
            "line {line}: {text}\n{stderr}"
        );
    }
}

/// An undeclared variable, a misplaced attribute and a type error, in three places of
/// one jobspec: `berth job validate` and a submit to the agent each report all three, at
/// their lines, in the order written, and nothing else.
#[tokio::test(flavor = "multi_thread")]
async fn an_undeclared_variable_hides_no_other_mistake_from_validate_or_submit() {
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/jobspecs/three-independent-mistakes.nomad.hcl");
    let expected = [
        (
            13,
            19,
            "job.greeter.group.g.task.announce.config.command: var.nope is not declared: add \
             a variable \"nope\" block, or use one of the declared variables (greeting)",
        ),
        (
            19,
            7,
            "job.greeter.group.g.task.greet.memory: unknown field \"memory\" (allowed here: \
             driver, config,",
        ),
        (
            25,
            18,
            "job.greeter.group.g.task.greet.env.REPEAT: binary operator `+` is not \
             applicable to `1` and `\"hello\"`",
        ),
    ];
    let check = |file: &str, problems: &[&str], output: &str| {
        assert_eq!(problems.len(), expected.len(), "{output}");
        for (problem, (line, column, text)) in problems.iter().zip(expected) {
            assert!(
                problem.starts_with(&format!("{file}:{line}:{column}: {text}")),
                "{file}:{line}:{column}: {text}\n{output}"
            );
        }
    };

    let output = std::process::Command::new(env!("CARGO_BIN_EXE_berth"))
        .args(["job", "validate"])
        .arg(&fixture)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).to_string();
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    let file = fixture.display().to_string();
    assert!(
        stderr.contains(&format!("{file} has 3 problems:")),
        "{stderr}"
    );
    let lines: Vec<&str> = stderr
        .lines()
        .map(str::trim_start)
        .filter(|l| l.starts_with(&format!("{file}:")))
        .collect();
    check(&file, &lines, &stderr);

    let mut agent = AgentProcess::new();
    agent.start().await;
    let source = std::fs::read_to_string(&fixture).unwrap();
    let Err(berth_api::client::ClientError::Api(error, _)) =
        agent.submit("greeter.hcl", &source).await
    else {
        panic!("a jobspec with three mistakes was accepted");
    };
    let problems: Vec<&str> = error.problems.iter().map(String::as_str).collect();
    check("greeter.hcl", &problems, &error.problems.join("\n"));
}

/// A task owns its directory, and restarts: a symlink it plants where a template goes
/// must not make the agent, as root, write a host file on the next start.
#[tokio::test(flavor = "multi_thread")]
async fn a_template_destination_turned_symlink_by_the_task_writes_nothing_outside() {
    let mut agent = AgentProcess::new();
    agent.start().await;
    let victim = agent.path().join("victim");
    std::fs::write(&victim, "untouched\n").unwrap();
    let script = format!(
        "if [ -L /local/out.txt ]; then echo still-a-link; exit 0; fi; rm -f /local/out.txt; \
         ln -s {} /local/out.txt; exit 1",
        victim.display()
    );
    let source = format!(
        r#"job "planter" {{
  type = "batch"
  group "g" {{
    restart {{
      attempts = 1
      delay    = "1s"
      mode     = "fail"
    }}
    task "t" {{
      driver = "exec"
      template {{
        data        = "overwritten by the agent\n"
        destination = "local/out.txt"
      }}
      config {{
        command = "/bin/sh"
        args    = ["-c", {}]
      }}
    }}
  }}
}}
"#,
        serde_json::to_string(&script).unwrap()
    );
    let submitted = agent.submit("planter.hcl", &source).await.unwrap();
    let id = &submitted.alloc_ids[0];
    agent
        .wait_alloc(id, "failed", |s| s.client_status == ClientStatus::Failed)
        .await;
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "untouched\n");
    let status = agent.alloc(id).await;
    let events = format!("{:#?}", status.tasks["t"].events);
    assert!(
        events.contains(
            "local/out.txt: the path leads out of the task's directory or through a symlink"
        ),
        "{events}"
    );
}

/// The corpus in `tests/fixtures/jobspecs`: jobspecs written the way Nomad users write
/// them, each ending with what `berth job validate` must say of it (`# expect: accepted`,
/// `# expect: warning LINE TEXT`, `# expect: error LINE TEXT`; at the end, so that
/// adding one moves no line). Every expectation must be met, and nothing else may be
/// reported.
#[test]
fn the_nomad_style_corpus_gets_exactly_its_expected_outcomes() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/jobspecs");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "hcl"))
        .collect();
    files.sort();
    assert!(files.len() >= 14, "{files:?}");
    let mut failures = Vec::new();
    for file in &files {
        let source = std::fs::read_to_string(file).unwrap();
        let expected: Vec<(&str, usize, &str)> = source
            .lines()
            .filter_map(|l| l.strip_prefix("# expect: "))
            .filter(|e| *e != "accepted")
            .map(|e| {
                let mut parts = e.splitn(3, ' ');
                let kind = parts.next().unwrap();
                let line = parts.next().unwrap().parse().unwrap();
                (kind, line, parts.next().unwrap())
            })
            .collect();
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_berth"))
            .arg("--config")
            .arg(dir.join("../corpus-agent.hcl"))
            .args(["job", "validate"])
            .arg(file)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr).to_string();
        let name = file.display().to_string();
        let reported: Vec<(&str, &str)> = stderr
            .lines()
            .filter(|l| l.contains(&format!("{name}:")))
            .map(|l| {
                let kind = if l.trim_start().starts_with("* ") {
                    "warning"
                } else {
                    "error"
                };
                (kind, l)
            })
            .collect();
        let errors_expected = expected.iter().any(|(kind, _, _)| *kind == "error");
        let code = output.status.code();
        if code != Some(if errors_expected { 2 } else { 0 }) {
            failures.push(format!("{name}: exit {code:?}\n{stderr}"));
            continue;
        }
        for (kind, line, text) in &expected {
            let found = reported.iter().any(|(k, l)| {
                k == kind && l.contains(&format!("{name}:{line}:")) && l.contains(text)
            });
            if !found {
                failures.push(format!(
                    "{name}: no {kind} at line {line}: {text}\n{stderr}"
                ));
            }
        }
        if reported.len() != expected.len() {
            failures.push(format!(
                "{name}: {} reported, {} expected\n{stderr}",
                reported.len(),
                expected.len()
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// A volume_mount destination is interpolated at start from values the job author
/// controls (its env): whatever it becomes is checked again, so `..` cannot take the
/// mount out of the task's root, and the task does not start.
#[tokio::test(flavor = "multi_thread")]
async fn an_interpolated_destination_that_leaves_the_task_root_is_refused() {
    let mut agent = AgentProcess::new();
    agent.start().await;
    let source = r#"job "escape" {
  type = "batch"
  group "g" {
    restart {
      attempts = 0
    }
    volume "scratch" {
      type   = "host"
      source = "scratch"
    }
    task "t" {
      driver = "exec"
      env {
        WHERE = "/../../../../../../tmp/berth-escaped"
      }
      volume_mount {
        volume      = "scratch"
        destination = "${WHERE}"
      }
      config {
        command = "/bin/sh"
        args    = ["-c", "echo ran"]
      }
    }
  }
}
"#;
    let submitted = agent.submit("escape.hcl", source).await.unwrap();
    let id = &submitted.alloc_ids[0];
    agent
        .wait_alloc(id, "failed", |s| s.client_status == ClientStatus::Failed)
        .await;
    let status = agent.alloc(id).await;
    let events = format!("{:#?}", status.tasks["t"].events);
    assert!(
        events.contains(
            "volume_mount \\\"scratch\\\": destination \\\"${WHERE}\\\" is \\\"/../../../../../../tmp/berth-escaped\\\" here"
        ),
        "{events}"
    );
    assert!(!std::path::Path::new("/tmp/berth-escaped").exists());
    assert!(
        crate::support::host_mounts_under(std::path::Path::new("/tmp/berth-escaped")).is_empty()
    );
    let stdout =
        std::fs::read_to_string(status.alloc_dir.join("alloc/logs/t.stdout.0")).unwrap_or_default();
    assert_eq!(stdout, "", "the task ran");
}
