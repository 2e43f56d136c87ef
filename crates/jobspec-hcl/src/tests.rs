//! Jobspec parsing: what parses, and the positioned problems for what does not.

use std::time::Duration;

use super::*;
use berth_model::mount::Propagation;

fn problems(source: &str) -> Vec<String> {
    match parse("job.hcl", source) {
        Ok(job) => panic!("expected problems, parsed {job:?}"),
        Err(error) => error.problems.iter().map(ToString::to_string).collect(),
    }
}

const FULL: &str = r#"
job "web" {
  type = "batch"
  meta = { owner = "ops" }

  group "g" {
    count = 2

    volume "data" {
      type      = "host"
      source    = "shared-data"
      read_only = false
    }

    restart {
      attempts = 1
      delay    = "1s"
      mode     = "fail"
    }

    service {
      name = "api"
      port = "http"
      tags = ["v1"]
      connect {
        sidecar_service {
          proxy {
            upstreams {
              destination_name = "db"
              local_bind_port  = 5432
            }
          }
        }
        sidecar_task {
          driver = "raw_exec"
          config {
            command = "/usr/bin/envoy"
            args    = ["-c", "${NOMAD_SECRETS_DIR}/envoy_bootstrap.json"]
          }
        }
      }
    }

    task "server" {
      driver = "exec"
      config {
        command = "/bin/sh"
        args    = ["-c", "echo hi"]
      }
      env {
        GREETING = "hello"
        PORT     = 8080
      }
      kill_timeout = "10s"

      volume_mount {
        volume           = "data"
        destination      = "/srv"
        propagation_mode = "host-to-task"
      }

      service {
        name = "task-svc"
        port = 9090
      }
    }
  }
}
"#;

#[test]
fn parses_a_full_job() {
    let job = parse("job.hcl", FULL).unwrap();
    assert_eq!(job.name, "web");
    assert_eq!(job.job_type, JobType::Batch);
    assert_eq!(job.meta, [("owner".to_string(), "ops".to_string())]);
    let group = &job.groups[0];
    assert_eq!(group.count, 2);
    assert_eq!(group.volumes[0].volume_type, VolumeType::Host);
    assert_eq!(group.volumes[0].source, "shared-data");
    assert_eq!(group.restart.attempts, 1);
    assert_eq!(group.restart.delay, Duration::from_secs(1));
    let upstreams = &group.services[0]
        .connect
        .as_ref()
        .unwrap()
        .sidecar_service
        .as_ref()
        .unwrap()
        .upstreams;
    assert_eq!(
        upstreams[0],
        Upstream {
            destination_name: "db".into(),
            local_bind_port: 5432
        }
    );
    // The sidecar is a prestart sidecar task after the group's own.
    let proxy = group.tasks.last().unwrap();
    assert_eq!(proxy.name, "connect-proxy-api");
    assert_eq!(proxy.driver, "raw_exec");
    assert_eq!(proxy.connect_proxy_for.as_deref(), Some("api"));
    assert_eq!(
        proxy.lifecycle,
        Some(Lifecycle {
            hook: LifecycleHook::Prestart,
            sidecar: true
        })
    );
    let task = &group.tasks[0];
    assert_eq!(task.driver, "exec");
    assert_eq!(
        task.config,
        serde_json::json!({"command": "/bin/sh", "args": ["-c", "echo hi"]})
    );
    assert_eq!(
        task.env,
        [
            ("GREETING".into(), "hello".into()),
            ("PORT".into(), "8080".into())
        ]
    );
    assert_eq!(task.kill_timeout, Duration::from_secs(10));
    assert_eq!(task.volume_mounts[0].propagation, Propagation::HostToTask);
    // Group and task services go through the same parser.
    assert_eq!(task.services[0].port.as_deref(), Some("9090"));
}

#[test]
fn reports_every_problem_with_line_and_path_in_the_order_written() {
    let found = problems(
        r#"job "web" {
  group "g" {
    task "t" {
      drivr = "exec"
      kill_timeout = 5
    }
  }
}
"#,
    );
    assert_eq!(
        found,
        [
            "3:5: job.web.group.g.task.t.driver: is required",
            "4:7: job.web.group.g.task.t.drivr: unknown field \"drivr\" (allowed here: driver, config, env, meta, resources, kill_timeout, kill_signal, volume_mount, csi_plugin, service, lifecycle, hooks, user, template, artifact, logs, constraint, affinity, leader, shutdown_delay, max_run_duration, vault, identity, secret, dispatch_payload, scaling, kind, consul, restart, action)",
            "5:22: job.web.group.g.task.t.kill_timeout: expected a duration such as \"30s\", \"5m\" or \"1h30m\", found a number",
        ]
    );
}

#[test]
fn duplicate_labels_are_refused_not_merged() {
    let found = problems(
        "job \"web\" {\n  group \"g\" {\n    task \"t\" { driver = \"exec\" }\n  }\n  group \"g\" {\n    task \"u\" { driver = \"exec\" }\n  }\n}\n",
    );
    assert_eq!(
        found,
        ["5:3: job.web.group.g: duplicate group \"g\" (the first is at line 2)"]
    );
}

#[test]
fn the_old_volume_config_form_gets_a_migration_hint() {
    let found = problems(
        r#"job "web" {
  group "g" {
    volume "data" {
      type = "host"
      config {
        source = "shared-data"
      }
    }
    task "t" { driver = "exec" }
  }
}
"#,
    );
    assert_eq!(
        found,
        [
            "5:7: job.web.group.g.volume.data.config: volume \"config\" blocks are no longer supported: move `source` into the volume block, as in: volume \"data\" { type = \"host\", source = \"shared-data\" }"
        ]
    );
}

#[test]
fn invalid_propagation_mode_uses_nomads_words() {
    let found = problems(
        "job \"w\" {\n group \"g\" {\n  task \"t\" {\n   driver = \"exec\"\n   volume_mount {\n    volume = \"v\"\n    destination = \"/v\"\n    propagation_mode = \"sideways\"\n   }\n  }\n }\n}\n",
    );
    assert_eq!(
        found,
        [
            "8:24: job.w.group.g.task.t.volume_mount.propagation_mode: volume mount has an invalid propagation mode: \"sideways\" (use private, host-to-task or bidirectional)"
        ]
    );
}

#[test]
fn a_number_is_not_silently_a_string() {
    let found = problems("job \"w\" {\n group \"g\" {\n  task \"t\" { driver = 5 }\n }\n}\n");
    assert_eq!(
        found,
        ["3:23: job.w.group.g.task.t.driver: expected a string, found a number"]
    );
}

#[test]
fn syntax_errors_name_the_file_line_and_column() {
    let error = parse("broken.hcl", "job \"w\" {\n  group \"g\" {\n").unwrap_err();
    assert!(
        error.to_string().starts_with(
            "broken.hcl has 1 problem:\n  broken.hcl:2:15: jobspec: invalid block body"
        ),
        "{error}"
    );
}

#[test]
fn bad_durations_and_counts_are_positioned_errors_not_panics() {
    let source = "job \"w\" {\n  group \"g\" {\n    restart {\n      interval = \"9999999999999999h\"\n      delay = \"\"\n      attempts = -1\n    }\n    task \"t\" {\n      driver = \"mock\"\n      kill_timeout = \"-5s\"\n    }\n  }\n}\n";
    let error = parse("bad.hcl", source).unwrap_err().to_string();
    for expected in [
        "bad.hcl:4:",
        "interval: \"9999999999999999h\" is not a duration: is too large (at most 876000h)",
        "bad.hcl:5:",
        "delay: \"\" is not a duration: is empty",
        "bad.hcl:10:",
        "kill_timeout: \"-5s\" is not a duration: must not be negative",
    ] {
        assert!(
            error.contains(expected),
            "missing {expected:?} in:\n{error}"
        );
    }
}

#[test]
fn resources_below_nomads_minimums_are_refused_with_their_line() {
    let source = "job \"w\" {\n  group \"g\" {\n    task \"t\" {\n      driver = \"mock\"\n      resources {\n        cpu = 0\n        memory = 0\n      }\n    }\n  }\n}\n";
    let error = parse("res.hcl", source).unwrap_err().to_string();
    for expected in [
        "res.hcl:6:",
        "minimum CPU value is 1 (MHz); got 0",
        "res.hcl:7:",
        "minimum memory value is 10 (MiB); got 0",
    ] {
        assert!(
            error.contains(expected),
            "missing {expected:?} in:\n{error}"
        );
    }
    let over = "job \"w\" {\n  group \"g\" {\n    task \"t\" {\n      driver = \"mock\"\n      resources {\n        memory = 256\n        memory_max = 128\n      }\n    }\n  }\n}\n";
    let error = parse("res.hcl", over).unwrap_err().to_string();
    assert!(
        error.contains("memory_max (128) may not be below memory (256)"),
        "{error}"
    );
    let fine = "job \"w\" {\n  group \"g\" {\n    task \"t\" {\n      driver = \"mock\"\n      resources {\n        memory = 64\n        memory_max = 128\n      }\n    }\n  }\n}\n";
    let job = parse("res.hcl", fine).unwrap();
    let resources = &job.groups[0].tasks[0].resources;
    assert_eq!(
        (resources.memory_mb, resources.memory_max_mb),
        (64, Some(128))
    );
}

// Arbitrary input never panics the parser: it parses, or it fails with positioned
// problems. Random text finds the lexer's edges; random edits of a real jobspec reach
// the decoders. Failing cases proptest finds are kept in proptest-regressions/.
mod properties {
    use proptest::prelude::*;

    use super::*;

    const REAL: &str = include_str!("../../../examples/hello.hcl");

    /// `REAL` with `edits` applied: (position, replacement) pairs, positions taken modulo
    /// the length and moved back to a char boundary.
    fn edited(edits: &[(usize, String)]) -> String {
        let mut text = REAL.to_string();
        for (at, replacement) in edits {
            let mut at = at % (text.len() + 1);
            while !text.is_char_boundary(at) {
                at -= 1;
            }
            let end = (at + replacement.len().min(3)).min(text.len());
            let mut end = end.max(at);
            while !text.is_char_boundary(end) {
                end += 1;
            }
            text.replace_range(at..end, replacement);
        }
        text
    }

    fn check(source: &str) {
        if let Err(error) = parse("fuzz.hcl", source) {
            assert!(!error.problems.is_empty());
            for problem in &error.problems {
                assert!(!problem.message.is_empty(), "{problem:?}");
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1024))]

        #[test]
        fn any_text(source in "\\PC{0,400}") {
            check(&source);
        }

        #[test]
        fn edits_of_a_real_jobspec(
            edits in prop::collection::vec(
                (any::<usize>(), "[{}\\[\\]\"=$#/\\\\a-z0-9 \n.-]{0,6}"),
                1..8,
            )
        ) {
            check(&edited(&edits));
        }
    }
}

#[test]
fn a_task_restart_block_overrides_the_groups_policy_field_by_field() {
    let job = parse(
        "j.hcl",
        "job \"j\" {\n  group \"g\" {\n    restart {\n      attempts = 5\n      delay = \"2s\"\n    }\n    task \"a\" {\n      driver = \"exec\"\n      restart {\n        attempts = 1\n      }\n    }\n    task \"b\" {\n      driver = \"exec\"\n    }\n  }\n}\n",
    )
    .unwrap();
    let group = &job.groups[0];
    let own = group.tasks[0].restart.as_ref().unwrap();
    assert_eq!(own.attempts, 1);
    assert_eq!(own.delay, Duration::from_secs(2), "the rest from the group");
    assert_eq!(group.tasks[1].restart, None);
    assert_eq!(group.restart.attempts, 5);
}

#[test]
fn a_periodic_job_launches_at_its_crons_next_times_in_utc() {
    use chrono::{TimeZone, Utc};
    let job = parse(
        "p.hcl",
        r#"job "p" {
  type = "batch"
  periodic {
    crons = ["30 2 * * *", "15 * * * * * *"]
  }
  group "g" {
    task "t" {
      driver = "mock"
    }
  }
}"#,
    )
    .unwrap();
    let periodic = job.periodic.unwrap();
    assert!(periodic.enabled && !periodic.prohibit_overlap);
    // 02:29:00: the seconds cron (second 15 of every minute) comes first.
    let at = Utc.with_ymd_and_hms(2026, 11, 24, 2, 29, 0).unwrap();
    assert_eq!(
        periodic.next_after(at),
        Some(Utc.with_ymd_and_hms(2026, 11, 24, 2, 29, 15).unwrap())
    );
    // 02:29:50: the daily cron at 02:30:00 comes before 02:30:15.
    let at = Utc.with_ymd_and_hms(2026, 11, 24, 2, 29, 50).unwrap();
    assert_eq!(
        periodic.next_after(at),
        Some(Utc.with_ymd_and_hms(2026, 11, 24, 2, 30, 0).unwrap())
    );
}

#[test]
fn a_parameterized_job_says_what_a_dispatch_brings() {
    let job = parse(
        "d.hcl",
        r#"job "d" {
  type = "batch"
  parameterized {
    payload       = "forbidden"
    meta_required = ["a"]
    meta_optional = ["b", "c"]
  }
  group "g" {
    task "t" {
      driver = "mock"
      dispatch_payload {
        file = "in/payload.bin"
      }
    }
  }
}"#,
    )
    .unwrap();
    let rules = job.parameterized.unwrap();
    assert_eq!(rules.payload, PayloadRule::Forbidden);
    assert_eq!(rules.meta_required, ["a"]);
    assert_eq!(rules.meta_optional, ["b", "c"]);
    assert_eq!(
        job.groups[0].tasks[0].dispatch_payload.as_deref(),
        Some("local/in/payload.bin")
    );
}

#[test]
fn service_ports_and_checks_say_what_berth_can_register() {
    let source = r#"job "shop" {
  group "g" {
    network {
      mode = "bridge"
      port "http" {
        static = 8080
      }
      port "admin" {}
    }
    task "t" {
      driver = "exec"
      config {
        command = "/bin/true"
      }
      service {
        name = "web"
        port = "http"
        check {
          type     = "tcp"
          interval = "5s"
          timeout  = "1s"
        }
      }
      service {
        name = "admin"
        port = "admin"
      }
    }
  }
}
"#;
    let job = parse("job.hcl", source).unwrap();
    let group = &job.groups[0];
    assert_eq!(
        group.ports,
        [
            PortLabel {
                label: "http".into(),
                number: Some(8080),
                to: None,
            },
            PortLabel {
                label: "admin".into(),
                number: None,
                to: None,
            }
        ]
    );
    assert_eq!(group.tasks[0].services[0].checks[0].kind, CheckKind::Tcp);
    let warnings: Vec<String> = job.warnings.iter().map(|w| w.to_string()).collect();
    // A dynamic port is fine (numbered at placement); a label the network lacks is not.
    assert!(
        !warnings.iter().any(|w| w.contains("admin")),
        "{warnings:#?}"
    );
    let unknown = parse(
        "job.hcl",
        &source.replace("port = \"admin\"", "port = \"nope\""),
    )
    .unwrap();
    assert!(
        unknown.warnings.iter().any(|w| w.to_string().contains(
            "port \"nope\" is not a port of the group's network block (its ports: http, admin); the service will not be registered"
        )),
        "{:#?}",
        unknown.warnings
    );
    assert_eq!(group.network_mode, NetworkMode::Bridge);
    assert!(
        !warnings.iter().any(|w| w.contains("mode")),
        "{warnings:#?}"
    );
    let cni = parse(
        "job.hcl",
        &source.replace("mode = \"bridge\"", "mode = \"cni/mine\""),
    )
    .unwrap();
    assert_eq!(cni.groups[0].network_mode, NetworkMode::Host);
    assert!(
        cni.warnings.iter().any(|w| w
            .to_string()
            .contains("mode \"cni/mine\" has no effect on berth (it has \"host\" and \"bridge\")")),
        "{:#?}",
        cni.warnings
    );

    let udp = source.replace("type     = \"tcp\"", "type     = \"udp\"");
    let error = parse("job.hcl", &udp).unwrap_err().to_string();
    assert!(
        error.contains(
            "check type \"udp\" is not supported: berth's checks are of type \"http\", \"tcp\", \"grpc\" or \"script\""
        ),
        "{error}"
    );
    let bad_name = source.replace("name = \"web\"", "name = \"web_1\"");
    let error = parse("job.hcl", &bad_name).unwrap_err().to_string();
    assert!(
        error.contains("service name \"web_1\" is not valid"),
        "{error}"
    );
}

#[test]
fn ephemeral_disk_is_the_groups_disk_size_with_nomads_log_rule() {
    let job = parse(
        "job.hcl",
        "job \"j\" {\n  group \"g\" {\n    ephemeral_disk {\n      size   = 500\n      sticky = true\n    }\n    task \"t\" {\n      driver = \"mock\"\n    }\n  }\n}\n",
    )
    .unwrap();
    assert_eq!(job.groups[0].ephemeral_disk_mb, 500);
    let job = parse(
        "job.hcl",
        "job \"j\" {\n  group \"g\" {\n    task \"t\" {\n      driver = \"mock\"\n    }\n  }\n}\n",
    )
    .unwrap();
    assert_eq!(job.groups[0].ephemeral_disk_mb, 300);
    // Default logs keep 10 × 10 MB a stream: they do not fit in 100 MB.
    let found = problems(
        "job \"j\" {\n  group \"g\" {\n    ephemeral_disk {\n      size = 100\n    }\n    task \"t\" {\n      driver = \"mock\"\n    }\n  }\n}\n",
    );
    assert_eq!(
        found,
        [
            "2:3: job.j.group.g.ephemeral_disk: task \"t\": log storage (100 MB: logs { max_files × \
          max_file_size }) must be less than the group's ephemeral_disk size (100 MB)"
        ]
    );
    let found = problems(
        "job \"j\" {\n  group \"g\" {\n    ephemeral_disk {\n      size = 5\n    }\n    task \"t\" {\n      driver = \"mock\"\n      logs {\n        max_files = 1\n        max_file_size = 1\n      }\n    }\n  }\n}\n",
    );
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].contains("5 MB is too little for an alloc (at least 10 MB)"),
        "{found:?}"
    );
}

#[test]
fn system_and_sysbatch_jobs_keep_their_type_and_count_is_zero_or_one() {
    let spec = |job_type: &str, count: &str| {
        format!(
            "job \"j\" {{\n  type = \"{job_type}\"\n  group \"g\" {{\n{count}    task \"t\" {{\n      driver = \"mock\"\n    }}\n  }}\n}}\n"
        )
    };
    let system = parse("job.hcl", &spec("system", "")).unwrap();
    assert_eq!(system.job_type, JobType::System);
    assert_eq!(system.groups[0].count, 1);
    // A system task is restarted like a service's; a sysbatch one like a batch's.
    assert_eq!(
        system.groups[0].restart,
        RestartPolicy::default_for(JobType::Service)
    );
    let sysbatch = parse("job.hcl", &spec("sysbatch", "    count = 0\n")).unwrap();
    assert_eq!(sysbatch.job_type, JobType::SysBatch);
    assert_eq!(sysbatch.groups[0].count, 0);
    assert_eq!(
        sysbatch.groups[0].restart,
        RestartPolicy::default_for(JobType::Batch)
    );
    assert!(JobType::SysBatch.runs_to_completion() && JobType::SysBatch.per_node());
    assert!(!JobType::System.runs_to_completion() && JobType::System.per_node());
    assert_eq!(
        problems(&spec("system", "    count = 3\n")),
        [
            "4:13: job.j.group.g.count: a system job runs one alloc of each group per node: \
          count may be 0 or 1, not 3"
        ]
    );
    assert_eq!(problems(&spec("sysbatch", "    count = 2\n")).len(), 1);
    // Periodic jobs may be sysbatch, as in Nomad, not system.
    let periodic = |job_type: &str| {
        spec(job_type, "").replace(
            "group",
            "periodic {\n    crons = [\"@hourly\"]\n  }\n  group",
        )
    };
    assert!(parse("job.hcl", &periodic("sysbatch")).is_ok());
    assert_eq!(problems(&periodic("system")).len(), 1);
}

/// A job asks for at most 10,000 allocs in all: dynamic groups cannot multiply a
/// group's own bound (attack review: 1,000 groups of 10,000 held the scheduler).
#[test]
fn a_jobs_groups_ask_for_at_most_ten_thousand_allocs_in_all() {
    let groups = |count: u32| {
        format!(
            "job \"wide\" {{\n  dynamic \"group\" {{\n    for_each = range(3)\n    labels   = [\"g${{group.value}}\"]\n    content {{\n      count = {count}\n      task \"t\" {{\n        driver = \"mock\"\n      }}\n    }}\n  }}\n}}\n"
        )
    };
    assert!(parse("wide.hcl", &groups(3000)).is_ok());
    let refused = parse("wide.hcl", &groups(4000)).unwrap_err().to_string();
    assert!(
        refused.contains(
            "the job's groups ask for 12000 allocs in all; a job may ask for at most 10000"
        ),
        "{refused}"
    );
}

#[test]
fn a_child_job_is_its_parent_under_its_own_id_with_the_dispatch_meta_over_the_jobs() {
    let source = r#"
job "batch" {
  type = "batch"
  meta {
    owner  = "ops"
    region = "eu"
  }
  parameterized {
    payload       = "optional"
    meta_optional = ["region"]
  }
  group "g" {
    task "t" {
      driver = "exec"
      config { command = "/bin/true" }
    }
  }
}
"#;
    let mut parent = parse("batch.hcl", source).expect("the parent parses");
    parent.submitted_by_operator = true;
    let child = parent.clone().into_child(
        "batch/dispatch-1-abc",
        "batch",
        &[("region".to_string(), "us".to_string())],
        Some(b"hello".to_vec()),
    );
    assert_eq!(child.name, "batch/dispatch-1-abc");
    assert_eq!(child.parent.as_deref(), Some("batch"));
    assert!(
        child.parameterized.is_none(),
        "a child is not parameterized itself"
    );
    assert!(!child.submitted_by_operator, "no grant names a child");
    assert_eq!(
        child.meta,
        vec![
            ("owner".to_string(), "ops".to_string()),
            ("region".to_string(), "us".to_string())
        ]
    );
    assert_eq!(child.payload.as_deref(), Some(&b"hello"[..]));
    assert_eq!(child.groups, parent.groups);
}

#[test]
fn a_bridge_port_maps_to_its_to_and_a_host_port_ignores_it_saying_so() {
    let source = |mode: &str| {
        format!(
            r#"
job "web" {{
  group "g" {{
    network {{
      mode = "{mode}"
      port "http" {{
        static = 8000
        to     = 8080
      }}
      port "admin" {{}}
    }}
    task "t" {{
      driver = "exec"
      config {{ command = "/bin/true" }}
    }}
  }}
}}
"#
        )
    };
    let bridge = parse("job.hcl", &source("bridge")).unwrap();
    let group = &bridge.groups[0];
    assert_eq!(group.network_mode, NetworkMode::Bridge);
    assert_eq!(group.ports[0].inside(NetworkMode::Bridge), Some(8080));
    // Without `to`, inside is the host's number (a dynamic one, once numbered).
    assert_eq!(group.ports[1].inside(NetworkMode::Bridge), None);
    assert!(bridge.warnings.is_empty(), "{:#?}", bridge.warnings);
    // Nomad's -1 (and 0) map to the host port's own number.
    for same in ["-1", "0"] {
        let job = parse("job.hcl", &source("bridge").replace("8080", same)).unwrap();
        assert_eq!(job.groups[0].ports[0].to, None, "to = {same}");
        assert_eq!(
            job.groups[0].ports[0].inside(NetworkMode::Bridge),
            Some(8000)
        );
    }
    let error = parse("job.hcl", &source("bridge").replace("8080", "-2"))
        .unwrap_err()
        .to_string();
    assert!(error.contains("-2 is out of range (0 to 65535)"), "{error}");
    let host = parse("job.hcl", &source("host")).unwrap();
    assert_eq!(
        host.groups[0].ports[0].to,
        Some(8080),
        "kept for a docker task"
    );
    assert_eq!(
        host.groups[0].ports[0].inside(NetworkMode::Host),
        Some(8000)
    );
    assert!(
        host.warnings.iter().any(|w| w
            .to_string()
            .contains("to has no effect on a single berth node: in mode \"host\" a task listens on the host's port itself")),
        "{:#?}",
        host.warnings
    );
    // A group with a docker task: its own network forwards the port to its `to`.
    let docker = parse("job.hcl", &source("host").replace("\"exec\"", "\"docker\"")).unwrap();
    let warned = docker
        .warnings
        .iter()
        .any(|w| w.to_string().contains("to has no effect"));
    assert!(!warned, "{:#?}", docker.warnings);
}

#[test]
fn a_bridge_group_forwards_a_bounded_number_of_ports() {
    let ports: String = (0..65)
        .map(|i| format!("      port \"p{i}\" {{}}\n"))
        .collect();
    let source = format!(
        "job \"many\" {{\n  group \"g\" {{\n    network {{\n      mode = \"bridge\"\n{ports}    }}\n    task \"t\" {{\n      driver = \"exec\"\n      config {{ command = \"/bin/true\" }}\n    }}\n  }}\n}}\n"
    );
    let error = parse("job.hcl", &source).unwrap_err().to_string();
    assert!(
        error.contains("65 ports: a group in bridge mode forwards at most 64"),
        "{error}"
    );
    // In host mode nothing is forwarded: no bound.
    assert!(
        parse(
            "job.hcl",
            &source.replace("mode = \"bridge\"", "mode = \"host\"")
        )
        .is_ok()
    );
}

/// `dns` writes the group's resolv.conf; each value is one token of its line, so no
/// value can add a line of its own (a `nameserver` of the author's).
#[test]
fn a_dns_block_becomes_the_groups_resolv_conf_and_refuses_what_is_not_one_token() {
    let source = |dns: &str, extra: &str| {
        format!(
            "job \"web\" {{\n  group \"g\" {{\n    network {{\n      mode = \"bridge\"\n{extra}      dns {{\n{dns}      }}\n    }}\n    task \"t\" {{\n      driver = \"exec\"\n      config {{ command = \"/bin/true\" }}\n    }}\n  }}\n}}\n"
        )
    };
    let job = parse(
        "job.hcl",
        &source(
            "        servers  = [\"10.0.0.2\", \"2001:db8::1\"]\n        searches = [\"svc.example.com\", \"_tcp.example.\"]\n        options  = [\"ndots:2\", \"edns0\"]\n",
            "      hostname = \"web-1\"\n",
        ),
    )
    .unwrap();
    let group = &job.groups[0];
    assert_eq!(group.hostname.as_deref(), Some("web-1"));
    let dns = group.dns.as_ref().unwrap();
    let host = "nameserver 10.255.0.1\nsearch corp.example\noptions rotate\n";
    assert_eq!(
        dns.resolv_conf(host),
        "# written by berth from the group's network { dns } block\n\
         nameserver 10.0.0.2\nnameserver 2001:db8::1\n\
         search svc.example.com _tcp.example.\n\
         options ndots:2 edns0\n"
    );
    // What the block leaves out is the host's, as Nomad does: an empty block is the
    // host's resolver, never one without a name server.
    let only_options = DnsConfig {
        options: vec!["ndots:1".into()],
        ..Default::default()
    };
    assert_eq!(
        only_options.resolv_conf(host),
        "# written by berth from the group's network { dns } block\n\
         nameserver 10.255.0.1\nsearch corp.example\noptions ndots:1\n"
    );
    // A value that is not one token of its line is never written, whoever made it.
    let forged = DnsConfig {
        servers: vec!["10.0.0.2\nnameserver 6.6.6.6".into(), "10.0.0.3".into()],
        ..Default::default()
    };
    assert!(
        forged.resolv_conf("").ends_with("\nnameserver 10.0.0.3\n"),
        "{}",
        forged.resolv_conf("")
    );
    for (dns, expected) in [
        (
            "        servers = [\"10.0.0.2\\nnameserver 6.6.6.6\"]\n",
            "\"10.0.0.2\\nnameserver 6.6.6.6\" is not an IP address",
        ),
        (
            "        servers = [\"dns.example.com\"]\n",
            "\"dns.example.com\" is not an IP address",
        ),
        (
            "        searches = [\"a.example b.example\"]\n",
            "\"a.example b.example\" is not a domain name",
        ),
        (
            "        options = [\"ndots:2\\nnameserver 6.6.6.6\"]\n",
            "is not a resolver option",
        ),
    ] {
        let error = parse("job.hcl", &source(dns, "")).unwrap_err().to_string();
        assert!(error.contains(expected), "{dns}: {error}");
    }
    let many: Vec<String> = (0..17).map(|i| format!("\"10.0.0.{i}\"")).collect();
    let error = parse(
        "job.hcl",
        &source(&format!("        servers = [{}]\n", many.join(",")), ""),
    )
    .unwrap_err()
    .to_string();
    assert!(
        error.contains("17 entries: berth writes at most 16"),
        "{error}"
    );
    let error = parse("job.hcl", &source("", "      hostname = \"web_1\"\n"))
        .unwrap_err()
        .to_string();
    assert!(error.contains("\"web_1\" is not a host name"), "{error}");
    // In host mode a hostname has no effect, and says so; dns still applies.
    let host = parse(
        "job.hcl",
        &source(
            "        servers = [\"10.0.0.2\"]\n",
            "      hostname = \"web-1\"\n",
        )
        .replace("\"bridge\"", "\"host\""),
    )
    .unwrap();
    assert_eq!(host.groups[0].hostname, None);
    assert!(host.groups[0].dns.is_some());
    assert!(
        host.warnings
            .iter()
            .any(|w| w.to_string().contains("has no effect in mode \"host\"")),
        "{:#?}",
        host.warnings
    );
}

#[test]
fn address_mode_is_read_for_services_and_checks_and_driver_is_host_with_a_warning() {
    let source = |mode: &str| {
        format!(
            "job \"web\" {{\n  group \"g\" {{\n    network {{\n      mode = \"bridge\"\n      port \"http\" {{ to = 8080 }}\n    }}\n    service {{\n      name = \"web\"\n      port = \"http\"\n      address_mode = \"{mode}\"\n      check {{\n        type = \"tcp\"\n        interval = \"10s\"\n        timeout = \"2s\"\n        address_mode = \"alloc\"\n      }}\n    }}\n    task \"t\" {{\n      driver = \"exec\"\n      config {{ command = \"/bin/true\" }}\n    }}\n  }}\n}}\n"
        )
    };
    let job = parse("job.hcl", &source("alloc")).unwrap();
    let service = &job.groups[0].services[0];
    assert_eq!(service.address_mode, AddressMode::Alloc);
    assert_eq!(service.checks[0].address_mode, AddressMode::Alloc);
    assert_eq!(
        parse("job.hcl", &source("host")).unwrap().groups[0].services[0].address_mode,
        AddressMode::Host
    );
    let driver = parse("job.hcl", &source("driver")).unwrap();
    assert_eq!(driver.groups[0].services[0].address_mode, AddressMode::Host);
    assert!(
        driver.warnings.iter().any(|w| w.to_string().contains(
            "address_mode \"driver\" is a driver's own network (docker's), which berth's drivers do not have: registered as \"host\""
        )),
        "{:#?}",
        driver.warnings
    );
    let error = parse("job.hcl", &source("nope")).unwrap_err().to_string();
    assert!(
        error.contains("address_mode \"nope\" is not one of"),
        "{error}"
    );
}
