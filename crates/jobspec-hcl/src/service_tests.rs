//! Services' checks as berth runs them: script checks and `check_restart`.

use super::*;

/// Script checks and `check_restart` (a check's own, or its service's for all its
/// checks); what berth cannot run is refused at the check, with the reason.
#[test]
fn script_checks_and_check_restart_are_read_and_what_cannot_run_is_refused() {
    let source = |provider: &str, check_extra: &str, group_service: &str| {
        format!(
            r#"job "web" {{
  group "g" {{
    network {{
      port "http" {{}}
    }}
{group_service}
    task "t" {{
      driver = "exec"
      config {{
        command = "/bin/true"
      }}
      service {{
        name     = "web"
        provider = "{provider}"
        check_restart {{
          limit = 3
          grace = "10s"
        }}
        check {{
          type     = "script"
          command  = "/bin/check"
          args     = ["-q"]
          interval = "5s"
          timeout  = "1s"
          {check_extra}
        }}
        check {{
          type     = "tcp"
          port     = "http"
          interval = "5s"
          timeout  = "1s"
          check_restart {{
            limit           = 1
            ignore_warnings = true
          }}
        }}
      }}
    }}
  }}
}}
"#
        )
    };
    let job = parse("job.hcl", &source("nomad", "", "")).unwrap();
    let checks = &job.groups[0].tasks[0].services[0].checks;
    assert_eq!(
        checks[0].kind,
        CheckKind::Script {
            command: "/bin/check".into(),
            args: vec!["-q".into()]
        }
    );
    assert_eq!(
        checks[0].check_restart,
        Some(CheckRestart {
            limit: 3,
            grace: std::time::Duration::from_secs(10),
            ignore_warnings: false
        })
    );
    assert_eq!(
        checks[1].check_restart,
        Some(CheckRestart {
            limit: 1,
            grace: std::time::Duration::ZERO,
            ignore_warnings: true
        })
    );
    let refused = |source: String| parse("job.hcl", &source).unwrap_err().to_string();
    // A Consul service's script check is berth's to run too (a TTL check in Consul),
    // with its check_restart, and no warning about it; its tcp check's is Consul's.
    let consul = parse("job.hcl", &source("consul", "", "")).unwrap();
    let consul_checks = &consul.groups[0].tasks[0].services[0].checks;
    assert!(matches!(consul_checks[0].kind, CheckKind::Script { .. }));
    let warned: Vec<String> = consul.warnings.iter().map(|w| w.to_string()).collect();
    assert_eq!(
        warned
            .iter()
            .filter(|w| w.contains("check_restart has no effect"))
            .count(),
        1,
        "{warned:#?}"
    );
    assert!(
        refused(source("nomad", "task = \"t\"", ""))
            .contains("task is for a group service's check")
    );
    let group_service = r#"    service {
      name     = "g"
      provider = "nomad"
      check {
        type     = "script"
        command  = "/bin/true"
        interval = "5s"
        timeout  = "1s"
      }
    }"#;
    assert!(refused(source("nomad", "", group_service)).contains("needs task = "));
    let https = source("nomad", "", "").replace(
        "type     = \"tcp\"",
        "type     = \"http\"\n          path     = \"/\"\n          protocol = \"https\"",
    );
    assert!(refused(https).contains("over plain http only"));
}

#[test]
fn check_restart_of_a_consul_check_is_a_warning_that_says_why() {
    let job = parse(
        "job.hcl",
        r#"job "web" {
  group "g" {
    task "t" {
      driver = "exec"
      config {
        command = "/bin/true"
      }
      service {
        name = "web"
        check {
          type     = "tcp"
          port     = 80
          interval = "5s"
          timeout  = "1s"
          check_restart {
            limit = 3
          }
        }
      }
    }
  }
}
"#,
    )
    .unwrap();
    assert!(
        job.warnings.iter().any(|w| w
            .to_string()
            .contains("check_restart has no effect on a Consul service's http, tcp or grpc check")),
        "{:#?}",
        job.warnings
    );
}

/// `identity` blocks: the default one's audience is Nomad's, a named one needs its own,
/// and what berth cannot give is refused with the reason.
#[test]
fn identities_are_read_and_what_cannot_be_given_is_refused() {
    let source = |blocks: &str| {
        format!(
            "job \"j\" {{\n  group \"g\" {{\n    task \"t\" {{\n      driver = \"exec\"\n      \
             config {{\n        command = \"/bin/true\"\n      }}\n{blocks}\n    }}\n  }}\n}}\n"
        )
    };
    let job = parse(
        "job.hcl",
        &source(
            "identity {\n  env = true\n}\nidentity {\n  name = \"vault\"\n  aud = [\"vault.io\"]\n  \
             file = true\n  ttl = \"1h\"\n  change_mode = \"signal\"\n  change_signal = \"SIGHUP\"\n}",
        ),
    )
    .unwrap();
    let ids = &job.groups[0].tasks[0].identities;
    assert_eq!(ids[0].name, "default");
    assert_eq!(ids[0].audience, ["nomad.io"]);
    assert_eq!(ids[0].env_name(), "NOMAD_TOKEN");
    assert_eq!(ids[1].file_name(), "secrets/nomad_vault.jwt");
    assert_eq!(ids[1].ttl, Some(std::time::Duration::from_secs(3600)));
    assert_eq!(ids[1].change_mode, IdentityChange::Signal("SIGHUP".into()));
    let refused = |blocks: &str| parse("job.hcl", &source(blocks)).unwrap_err().to_string();
    assert!(
        refused("identity {\n  name = \"v\"\n}").contains("aud: is required for a named identity")
    );
    assert!(refused("identity {}\nidentity {}").contains("a second identity named \"default\""));
    assert!(
        refused("identity {\n  name = \"a-b\"\n  aud = [\"x\"]\n}")
            .contains("only letters, digits and _")
    );
    assert!(refused("identity {\n  change_mode = \"signal\"\n}").contains("needs a change_signal"));
    assert!(
        refused("identity {\n  filepath = \"/etc/t\"\n}").contains("filepath is not supported")
    );
}

/// What would let a job author aim the agent's checks elsewhere is refused, and so are
/// checks more often than each second.
#[test]
fn a_nomad_services_checks_reach_only_the_allocs_own_ports_at_most_each_second() {
    let source = |service_extra: &str, check: &str| {
        format!(
            r#"job "web" {{
  group "g" {{
    network {{
      port "http" {{}}
    }}
    task "t" {{
      driver = "exec"
      config {{
        command = "/bin/true"
      }}
      service {{
        name     = "web"
        port     = "http"
        provider = "nomad"
        {service_extra}
        check {{
          interval = "5s"
          timeout  = "1s"
          {check}
        }}
      }}
    }}
  }}
}}
"#
        )
    };
    let refused = |extra: &str, check: &str| {
        parse("job.hcl", &source(extra, check))
            .unwrap_err()
            .to_string()
    };
    parse(
        "job.hcl",
        &source("", "type = \"http\"\npath = \"/health\""),
    )
    .unwrap();
    assert!(refused("", "type = \"tcp\"\nport = 8500").contains("not a port number"));
    assert!(
        refused("address = \"169.254.169.254\"", "type = \"tcp\"")
            .contains("has the alloc's address")
    );
    assert!(refused("", "type = \"http\"\npath = \"@169.254.169.254/x\"").contains("with no @"));
    assert!(
        refused("", "type = \"http\"\npath = \"/\"\nmethod = \"PUT\"").contains("GET or HEAD only")
    );
    let fast = source("", "type = \"tcp\"").replace("interval = \"5s\"", "interval = \"0s\"");
    assert!(
        parse("job.hcl", &fast)
            .unwrap_err()
            .to_string()
            .contains("interval: must be at least 1s")
    );
}

/// A grpc check names the service it asks about (none: the server's own health); TLS is
/// Consul's to speak, so a provider "nomad" service's grpc check over TLS is refused.
#[test]
fn grpc_checks_are_read_and_tls_is_for_consul_services_only() {
    let source = |provider: &str, extra: &str| {
        format!(
            r#"job "web" {{
  group "g" {{
    network {{
      port "grpc" {{}}
    }}
    task "t" {{
      driver = "exec"
      config {{
        command = "/bin/true"
      }}
      service {{
        name     = "web"
        port     = "grpc"
        provider = "{provider}"
        check {{
          type     = "grpc"
          interval = "5s"
          timeout  = "1s"
          {extra}
        }}
      }}
    }}
  }}
}}
"#
        )
    };
    let kind = |job: &Job| job.groups[0].tasks[0].services[0].checks[0].kind.clone();
    let plain = parse("job.hcl", &source("nomad", "")).unwrap();
    assert_eq!(
        kind(&plain),
        CheckKind::Grpc {
            service: String::new(),
            use_tls: false
        }
    );
    let named = parse("job.hcl", &source("nomad", "grpc_service = \"web.v1\"")).unwrap();
    assert_eq!(
        kind(&named),
        CheckKind::Grpc {
            service: "web.v1".into(),
            use_tls: false
        }
    );
    let tls = "grpc_use_tls = true";
    let consul = parse("job.hcl", &source("consul", tls)).unwrap();
    assert_eq!(
        kind(&consul),
        CheckKind::Grpc {
            service: String::new(),
            use_tls: true
        }
    );
    let refused = parse("job.hcl", &source("nomad", tls))
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("grpc checks over plaintext gRPC only"),
        "{refused}"
    );
}

/// A connect sidecar_task named as a task of its group is refused: the two would share
/// a directory, records and a network (attack review).
#[test]
fn a_sidecar_task_named_as_a_task_of_its_group_is_refused() {
    let source = |sidecar: &str| {
        format!(
            r#"job "j" {{
  group "g" {{
    network {{
      mode = "bridge"
    }}
    service {{
      name = "api"
      port = "9090"
      connect {{
        sidecar_service {{}}
        sidecar_task {{
          name   = "{sidecar}"
          driver = "raw_exec"
          config {{
            command = "/usr/bin/envoy"
          }}
        }}
      }}
    }}
    task "web" {{
      driver = "exec"
      config {{
        command = "/bin/true"
      }}
    }}
  }}
}}
"#
        )
    };
    assert!(parse("job.hcl", &source("proxy")).is_ok());
    let error = parse("job.hcl", &source("web")).unwrap_err().to_string();
    assert!(
        error.contains("the connect sidecar_task \"web\" has the name of another task"),
        "{error}"
    );
    // Two sidecars of one name (a second helper review).
    let second = r#"    service {
      name = "db"
      port = "9091"
      connect {
        sidecar_service {}
        sidecar_task {
          name   = "proxy"
          driver = "raw_exec"
          config {
            command = "/usr/bin/envoy"
          }
        }
      }
    }
    task "web" {"#;
    let twice = source("proxy").replacen("    task \"web\" {", second, 1);
    assert_ne!(twice, source("proxy"));
    let error = parse("job.hcl", &twice).unwrap_err().to_string();
    assert!(
        error.contains("the connect sidecar_task \"proxy\" has the name of another task"),
        "{error}"
    );
}
