//! Services' checks as berth runs them: script checks and `check_restart`.

use crate::*;

/// Script checks and `check_restart` (a check's own, or its service's for all its
/// checks); what berth cannot run is refused at the check, with the reason.
#[test]
fn script_checks_and_check_restart_are_read_and_what_cannot_run_is_refused() {
    let source = |provider: &str, check_extra: &str, group_service: &str| {
        format!(
            r#"job "web" {{
  group "g" {{
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
          port     = 80
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
    assert!(
        refused(source("consul", "", ""))
            .contains("a script check of a Consul service is not supported"),
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
            .contains("check_restart has no effect on a Consul service's check")),
        "{:#?}",
        job.warnings
    );
}
