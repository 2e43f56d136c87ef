//! The Nomad shapes and the job JSON front end: a jobspec shown as Nomad's job JSON and
//! registered back is the same job; what berth does not take is named; bad JSON is
//! refused with the field's path.

use serde_json::{Value, json};

use super::register::{JobJsonError, job_hcl};
use super::shapes;

const HCL: &str = r#"job "web" {
  type        = "service"
  datacenters = ["dc1"]
  meta {
    owner = "ops"
  }
  constraint {
    attribute = "${attr.kernel.name}"
    value     = "linux"
  }
  group "g" {
    count = 2
    network {
      mode     = "bridge"
      hostname = "web-1"
      port "http" {
        static = 8000
        to     = 8080
      }
      port "admin" {
        to = 9090
      }
      port "metrics" {}
      dns {
        servers  = ["10.0.0.2"]
        searches = ["svc.example"]
        options  = ["ndots:2"]
      }
    }
    restart {
      attempts = 3
      interval = "10m"
      delay    = "15s"
      mode     = "delay"
    }
    ephemeral_disk {
      size = 200
    }
    volume "data" {
      type      = "host"
      source    = "scratch"
      read_only = true
    }
    task "prep" {
      driver = "mock"
      lifecycle {
        hook = "prestart"
      }
      config {
        run_for = "0s"
      }
    }
    task "app" {
      driver       = "exec"
      user         = "nobody"
      kill_timeout = "7s"
      kill_signal  = "SIGTERM"
      config {
        command = "/bin/sh"
        args    = ["-c", "echo ${NOMAD_TASK_DIR} and $${HOME}"]
      }
      env {
        GREETING = "hi ${NOMAD_ALLOC_ID}"
      }
      resources {
        cpu        = 250
        memory     = 64
        memory_max = 128
      }
      volume_mount {
        volume      = "data"
        destination = "/data"
        read_only   = true
      }
      template {
        data        = "port={{ env \"NOMAD_PORT_http\" }}"
        destination = "local/app.conf"
        perms       = "600"
      }
      logs {
        max_files     = 3
        max_file_size = 5
      }
    }
  }
}
"#;

/// The jobspec as a comparable value: what the agent runs, without source locations.
fn comparable(job: &berth_jobspec::Job) -> Value {
    serde_json::to_value(shapes::job(job, None)).unwrap()
}

#[test]
fn a_job_shown_as_nomad_json_registers_back_as_the_same_job() {
    let job = berth_jobspec_hcl::parse("web.nomad.hcl", HCL).unwrap();
    let json = comparable(&job);
    assert_eq!(json["ID"], "web");
    assert_eq!(
        json["TaskGroups"][0]["Tasks"][1]["Resources"]["MemoryMB"],
        64
    );
    assert_eq!(
        json["TaskGroups"][0]["RestartPolicy"]["Delay"],
        15_000_000_000u64
    );
    let converted = job_hcl(&json!({ "Job": json })).unwrap();
    assert_eq!(converted.id, "web");
    assert!(converted.warnings.is_empty(), "{:?}", converted.warnings);
    let again = berth_jobspec_hcl::parse("web.json", &converted.hcl)
        .unwrap_or_else(|e| panic!("{e}\n{}", converted.hcl));
    assert_eq!(comparable(&again), comparable(&job), "{}", converted.hcl);
}

/// Strings of a JSON job are literal, as Nomad reads them: `${...}` is not evaluated as
/// HCL (an unknown variable is no error), and runtime names stay for the task's start.
#[test]
fn json_strings_stay_literal() {
    let body = json!({"Job": {"ID": "lit", "Type": "batch", "TaskGroups": [{"Name": "g", "Tasks": [{
        "Name": "t", "Driver": "mock",
        "Config": {"run_for": "0s", "note": "${var.nope} %{ if true }x%{ endif }"},
        "Env": {"DIR": "${NOMAD_TASK_DIR}/x"},
    }]}]}});
    let converted = job_hcl(&body).unwrap();
    let job = berth_jobspec_hcl::parse("lit.json", &converted.hcl)
        .unwrap_or_else(|e| panic!("{e}\n{}", converted.hcl));
    let task = &job.groups[0].tasks[0];
    assert_eq!(task.config["note"], "${var.nope} %{ if true }x%{ endif }");
    assert_eq!(
        task.env,
        [("DIR".to_string(), "${NOMAD_TASK_DIR}/x".to_string())]
    );
}

/// Fields berth does not take are ignored, as Nomad ignores unknown ones, and named;
/// the server's own fields are ignored quietly.
#[test]
fn ignored_fields_are_named_in_warnings() {
    let body = json!({"Job": {
        "ID": "w", "Type": "batch", "Region": "global", "Priority": 50, "CreateIndex": 9,
        "Update": {"MaxParallel": 1},
        "Frobnicate": true,
        "TaskGroups": [{"Name": "g", "Networks": [{"Mode": "bridge", "MBits": 10, "IP": "10.0.0.9"}], "Tasks": [{
            "Name": "t", "Driver": "mock", "Services": [{"Name": "s"}],
        }]}],
    }});
    let converted = job_hcl(&body).unwrap();
    assert_eq!(
        converted.warnings,
        [
            "Job.TaskGroups[0].Networks[0].MBits is not supported by berth and was ignored",
            "Job.TaskGroups[0].Tasks[0].Services is not supported by berth and was ignored",
            "Job.Frobnicate is not supported by berth and was ignored",
            "Job.Update is not supported by berth and was ignored",
        ]
    );
}

#[test]
fn a_wrong_type_is_refused_with_its_path() {
    let cases = [
        (
            json!({"Job": {"ID": "x", "TaskGroups": "no"}}),
            "Job.TaskGroups must be a list",
        ),
        (
            json!({"Job": {"ID": "x", "TaskGroups": [{"Name": "g", "Count": -1}]}}),
            "Job.TaskGroups[0].Count must be a whole number of at least 0",
        ),
        (
            json!({"Job": {"ID": "x", "TaskGroups": [{"Name": "g", "Tasks": [{"Name": "t", "Env": ["A=1"]}]}]}}),
            "Job.TaskGroups[0].Tasks[0].Env must be an object",
        ),
        (
            json!({"Job": {"Type": "batch"}}),
            "the job has no ID (nor Name)",
        ),
        (json!({"Jobs": {}}), "the body has no \"Job\" object"),
        (json!({"Job": [1]}), "Job must be an object"),
    ];
    for (body, expected) in cases {
        assert_eq!(job_hcl(&body).unwrap_err().to_string(), expected);
    }
    assert!(matches!(
        job_hcl(&json!({"Job": {"ID": 7}})),
        Err(JobJsonError::WrongType { .. })
    ));
}

/// A name chosen to break out of the HCL it becomes is still only a name: the front
/// end's checks see it as written.
#[test]
fn names_cannot_inject_hcl() {
    let body = json!({"Job": {"ID": "x\" {\n}\njob \"y", "TaskGroups": []}});
    let converted = job_hcl(&body).unwrap();
    let error = berth_jobspec_hcl::parse("x.json", &converted.hcl)
        .unwrap_err()
        .to_string();
    assert!(error.contains("is not allowed"), "{error}");
}

#[test]
fn the_nearest_path_is_named_for_an_unknown_one() {
    let response = super::not_found("/v1/job", "GET");
    assert_eq!(response.status(), axum::http::StatusCode::NOT_FOUND);
    assert_eq!(super::distance("/v1/jobz", "/v1/jobs"), 1);
}

#[tokio::test]
async fn the_404_shows_the_request_escaped_and_cut_short() {
    let path = format!("/v1/\u{202e}evil\u{1b}[2J{}", "x".repeat(10_000));
    let response = super::not_found(&path, "GE\u{7}T");
    let body = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .unwrap();
    let body = String::from_utf8(body.to_vec()).unwrap();
    assert!(
        !body.chars().any(|c| c.is_control() && c != '\n'),
        "{body:?}"
    );
    assert!(!body.contains('\u{202e}'), "{body:?}");
    assert!(body.contains("\\u{202e}evil"), "{body:?}");
    assert!(body.len() < 1_000, "{} bytes", body.len());
}

/// Every string of a JSON job means what it says, whatever markers, escapes and control
/// characters it holds: nothing is evaluated (a review found `%${3*7}` computed to `%21`
/// through the HCL printer's escaping).
#[test]
fn no_string_of_a_json_job_is_evaluated() {
    let strings = [
        "${HOME} %${3*7}",
        "${} %${jsonencode({a=range(3)})}",
        "${A} $${B} $$${C}",
        "$%{ if true }x%{ endif }",
        "%%{ x } %{ y",
        "trailing $ and %",
        "quote \" backslash \\ newline \n tab \t nul-free \u{1} bell \u{7}",
        "unicode é ✓ 🚢",
    ];
    for (i, value) in strings.iter().enumerate() {
        let key = format!("K{i} {value}");
        let body = json!({"Job": {"ID": "lit", "Type": "batch", "TaskGroups": [{"Name": "g", "Tasks": [{
            "Name": "t", "Driver": "mock",
            "Config": {"run_for": "0s", "note": value},
            "Env": {"E": value},
            "Meta": {key.clone(): value},
        }]}]}});
        let converted = job_hcl(&body).unwrap();
        let job = berth_jobspec_hcl::parse("lit.json", &converted.hcl)
            .unwrap_or_else(|e| panic!("{value:?}: {e}\n{}", converted.hcl));
        let task = &job.groups[0].tasks[0];
        assert_eq!(task.config["note"], *value, "{}", converted.hcl);
        assert_eq!(task.env, [("E".to_string(), value.to_string())]);
        assert_eq!(task.meta, [(key, value.to_string())]);
    }
}

/// The writer (the Nomad types `shapes.rs` fills) writes every field of the jobspec's
/// field table under the JSON name the JSON reader (`register.rs`) reads it by.
#[test]
fn the_job_json_writes_every_field_of_the_table_by_its_json_name() {
    const PARAMETERIZED: &str = r#"job "p" {
  type = "batch"
  datacenters = ["dc1"]
  meta { a = "b" }
  constraint {
    attribute = "${attr.kernel.name}"
    value = "linux"
  }
  parameterized {
    payload = "optional"
    meta_required = ["x"]
    meta_optional = ["y"]
  }
  group "g" {
    count = 1
    shutdown_delay = "1s"
    meta { c = "d" }
    restart {
      attempts = 1
      interval = "1m"
      delay = "1s"
      mode = "fail"
    }
    ephemeral_disk { size = 100 }
    volume "v" {
      type = "host"
      source = "s"
      read_only = true
    }
    task "t" {
      driver = "mock"
      user = "nobody"
      kill_timeout = "5s"
      kill_signal = "SIGINT"
      shutdown_delay = "1s"
      env { E = "f" }
      meta { g = "h" }
      config { run_for = "1s" }
      resources {
        cpu = 100
        memory = 64
        memory_max = 128
      }
      lifecycle {
        hook = "prestart"
        sidecar = false
      }
      volume_mount {
        volume = "v"
        destination = "/v"
        read_only = true
      }
      template {
        data = "x"
        destination = "local/x"
      }
      template {
        data = "y"
        destination = "local/y"
        change_mode = "script"
        change_script {
          command = "/bin/reload"
          args = ["-q"]
        }
      }
      dispatch_payload { file = "input" }
      logs {
        max_files = 2
        max_file_size = 5
      }
    }
  }
}
"#;
    const PERIODIC: &str = r#"job "c" {
  type = "batch"
  periodic {
    crons = ["@daily"]
    prohibit_overlap = true
    enabled = true
  }
  group "g" {
    task "t" {
      driver = "mock"
    }
  }
}
"#;
    let mut parameterized =
        comparable(&berth_jobspec_hcl::parse("p.nomad.hcl", PARAMETERIZED).unwrap());
    let periodic = comparable(&berth_jobspec_hcl::parse("c.nomad.hcl", PERIODIC).unwrap());
    // A job is periodic or parameterized, not both: the job's fields from the two.
    parameterized["Periodic"] = periodic["Periodic"].clone();
    let group = &parameterized["TaskGroups"][0];
    let task = &group["Tasks"][0];
    let objects: Vec<(&str, &Value)> = vec![
        ("job", &parameterized),
        ("periodic", &periodic["Periodic"]),
        ("parameterized", &parameterized["ParameterizedJob"]),
        ("constraint", &parameterized["Constraints"][0]),
        ("group", group),
        ("restart", &group["RestartPolicy"]),
        ("ephemeral_disk", &group["EphemeralDisk"]),
        ("volume", &group["Volumes"]["v"]),
        ("task", task),
        ("resources", &task["Resources"]),
        ("lifecycle", &task["Lifecycle"]),
        ("volume_mount", &task["VolumeMounts"][0]),
        ("template", &task["Templates"][0]),
        ("wait", &task["Templates"][0]["Wait"]),
        ("change_script", &task["Templates"][1]["ChangeScript"]),
        ("dispatch_payload", &task["DispatchPayload"]),
        ("logs", &task["LogConfig"]),
    ];
    for (block, fields) in berth_jobspec::fields::BLOCKS {
        let object = objects
            .iter()
            .find(|(name, _)| name == block)
            .map(|(_, object)| *object)
            .unwrap_or_else(|| panic!("no JSON object for the {block} block"));
        for field in *fields {
            assert!(
                object.get(field.json).is_some_and(|v| !v.is_null()),
                "{block}.{} is not written as {}: {object:#}",
                field.hcl,
                field.json
            );
        }
    }
}

/// A group's network as Nomad's API clients send it (`Networks`: the mode, static and
/// dynamic ports with `To`, Nomad's `-1`, `DNS`, `Hostname`) is the jobspec's `network`
/// block; what a server placed (`IP`, a dynamic port's `Value`) is not kept.
#[test]
fn a_json_jobs_network_is_its_groups_network() {
    let body = json!({"Job": {
        "ID": "net", "Type": "service",
        "TaskGroups": [{"Name": "g", "Networks": [{
            "Mode": "bridge", "Hostname": "web-1", "IP": "10.0.0.9",
            "DNS": {"Servers": ["10.0.0.2"], "Searches": null, "Options": ["ndots:2"]},
            "ReservedPorts": [{"Label": "http", "Value": 8000, "To": 8080, "HostNetwork": "default"}],
            "DynamicPorts": [
                {"Label": "admin", "Value": 23456, "To": -1},
                {"Label": "metrics", "Value": 0, "To": 0}
            ],
        }], "Tasks": [{"Name": "t", "Driver": "mock"}]}],
    }});
    let converted = job_hcl(&body).unwrap();
    assert!(converted.warnings.is_empty(), "{:?}", converted.warnings);
    let job = berth_jobspec_hcl::parse("net.json", &converted.hcl).unwrap();
    let group = &job.groups[0];
    assert_eq!(group.network_mode, berth_jobspec::NetworkMode::Bridge);
    assert_eq!(group.hostname.as_deref(), Some("web-1"));
    let dns = group.dns.as_ref().unwrap();
    assert_eq!(
        (dns.servers.as_slice(), dns.options.as_slice()),
        (&["10.0.0.2".to_string()][..], &["ndots:2".to_string()][..])
    );
    let ports: Vec<_> = group
        .ports
        .iter()
        .map(|p| (p.label.as_str(), p.number, p.to))
        .collect();
    assert_eq!(
        ports,
        [
            ("http", Some(8000), Some(8080)),
            ("admin", None, None),
            ("metrics", None, None)
        ]
    );
    // Bad input is refused with its path.
    let mut bad = body.clone();
    bad["Job"]["TaskGroups"][0]["Networks"][0]["ReservedPorts"][0]["To"] = json!(-7);
    assert_eq!(
        job_hcl(&bad).unwrap_err().to_string(),
        "Job.TaskGroups[0].Networks[0].ReservedPorts[0].To must be a port number, or -1"
    );
    let mut bad = body;
    bad["Job"]["TaskGroups"][0]["Networks"][0]["DynamicPorts"][0]["Label"] = json!("");
    assert_eq!(
        job_hcl(&bad).unwrap_err().to_string(),
        "Job.TaskGroups[0].Networks[0].DynamicPorts[0].Label must be a port label"
    );
}

/// A template as Nomad's API clients send it (every field, `Uid: -1`, `Wait` in
/// nanoseconds, empty strings for what is unset) is the jobspec's `template` block.
#[test]
fn a_json_template_is_its_template_block() {
    let body = json!({"Job": {
        "ID": "tpl", "Type": "service",
        "TaskGroups": [{"Name": "g", "Tasks": [{"Name": "t", "Driver": "mock", "Templates": [{
            "EmbeddedTmpl": "<% env \"A\" %>", "DestPath": "local/a", "Envvars": false,
            "Perms": "0640", "ChangeMode": "signal", "ChangeSignal": "SIGHUP",
            "ChangeScript": null, "Splay": 2_000_000_000u64,
            "Wait": {"Min": 1_000_000_000u64, "Max": 9_000_000_000u64},
            "Uid": -1, "Gid": 1000, "LeftDelim": "<%", "RightDelim": "%>",
            "ErrMissingKey": true, "Once": false, "SourcePath": "", "VaultGrace": 0
        }]}]}],
    }});
    let converted = job_hcl(&body).unwrap();
    assert!(converted.warnings.is_empty(), "{:?}", converted.warnings);
    let job = berth_jobspec_hcl::parse("tpl.json", &converted.hcl).unwrap();
    let template = &job.groups[0].tasks[0].templates[0];
    assert_eq!(
        template.change_mode,
        berth_jobspec::ChangeMode::Signal("SIGHUP".into())
    );
    assert_eq!(template.splay, std::time::Duration::from_secs(2));
    assert_eq!(template.wait.max, std::time::Duration::from_secs(9));
    assert_eq!((template.uid, template.gid), (None, Some(1000)));
    assert_eq!(
        (template.left_delimiter.as_str(), template.perms),
        ("<%", 0o640)
    );
    assert!(template.error_on_missing_key);
    // And back: what berth writes reads the same.
    let written = serde_json::to_value(super::shapes::job(&job, None)).unwrap();
    let again = job_hcl(&json!({ "Job": written })).unwrap();
    let job_again = berth_jobspec_hcl::parse("tpl.json", &again.hcl).unwrap();
    assert_eq!(
        job_again.groups[0].tasks[0].templates[0].change_mode,
        template.change_mode
    );
    assert_eq!(
        job_again.groups[0].tasks[0].templates[0].wait,
        template.wait
    );
}

/// An artifact and a run-time limit as Nomad's API clients send them (`Getter*` names,
/// nanoseconds, `GetterInsecure` false) are the jobspec's `artifact` block and
/// `max_run_duration`; and what berth writes reads the same.
#[test]
fn json_artifacts_and_max_run_duration_are_their_blocks() {
    let sha = "0".repeat(64);
    let body = json!({"Job": {
        "ID": "art", "Type": "batch",
        "TaskGroups": [{"Name": "g", "Tasks": [{"Name": "t", "Driver": "mock",
            "MaxRunDuration": 90_000_000_000u64,
            "Artifacts": [{
                "GetterSource": "https://example.com/app.tar.gz",
                "GetterOptions": {"checksum": format!("sha256:{sha}")},
                "GetterHeaders": {"X-Token": "t"},
                "GetterMode": "any", "RelativeDest": "local/app", "Chown": true,
                "GetterInsecure": false
            }]
        }]}],
    }});
    let converted = job_hcl(&body).unwrap();
    assert!(converted.warnings.is_empty(), "{:?}", converted.warnings);
    let job = berth_jobspec_hcl::parse("art.json", &converted.hcl).unwrap();
    let task = &job.groups[0].tasks[0];
    assert_eq!(
        task.max_run_duration,
        Some(std::time::Duration::from_secs(90))
    );
    let artifact = &task.artifacts[0];
    assert_eq!(artifact.source, "https://example.com/app.tar.gz");
    assert_eq!(artifact.destination, "local/app");
    assert_eq!(
        artifact.options,
        [("checksum".to_string(), format!("sha256:{sha}"))]
    );
    assert_eq!(artifact.headers, [("X-Token".to_string(), "t".to_string())]);
    assert!(artifact.chown);
    let written = serde_json::to_value(super::shapes::job(&job, None)).unwrap();
    let again = job_hcl(&json!({ "Job": written })).unwrap();
    let job_again = berth_jobspec_hcl::parse("art.json", &again.hcl).unwrap();
    let task_again = &job_again.groups[0].tasks[0];
    assert_eq!(task_again.artifacts.len(), 1);
    assert_eq!(task_again.artifacts[0].options, artifact.options);
    assert_eq!(task_again.max_run_duration, task.max_run_duration);
    // A getter berth does not have is refused at its path, with the reason.
    let mut git = body;
    git["Job"]["TaskGroups"][0]["Tasks"][0]["Artifacts"][0]["GetterSource"] =
        json!("git::https://example.com/r.git");
    let converted = job_hcl(&git).unwrap();
    let error = berth_jobspec_hcl::parse("art.json", &converted.hcl)
        .unwrap_err()
        .to_string();
    assert!(error.contains("uses the git getter"), "{error}");
}
