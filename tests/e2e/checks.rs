//! The checks berth runs itself, end to end: a provider "nomad" service's script check
//! runs inside its task and, failing twice in a row, restarts it through its
//! `check_restart` (Nomad's "healthcheck: check ... unhealthy"); after the restart it
//! passes, and so do an http check of python3's http.server in the task and a tcp
//! check, each shown by Nomad's `GET /v1/client/allocation/:id/checks`. grpc checks ask
//! a grpcio server in the task the health protocol's Check.

use std::time::{Duration, Instant};

use berth_harness::AgentProcess;
use berth_model::events::EventKind;
use berth_model::status::ClientStatus;

const JOB: &str = r#"job "checked" {
  group "g" {
    network {
      port "http" {}
    }
    restart {
      attempts = 3
      delay    = "0s"
      mode     = "fail"
    }
    task "t" {
      driver = "exec"
      config {
        command = "/bin/sh"
        args    = ["-c", "if [ -f local/once ]; then touch local/healthy; else touch local/once; fi; exec python3 -m http.server $NOMAD_PORT_http --directory local"]
      }
      service {
        name     = "web"
        port     = "http"
        provider = "nomad"
        check {
          name     = "alive"
          type     = "script"
          command  = "/bin/sh"
          args     = ["-c", "echo checking as $(id -u); test -f /local/healthy"]
          interval = "1s"
          timeout  = "2s"
          check_restart {
            limit = 2
          }
        }
        check {
          name     = "index"
          type     = "http"
          path     = "/once"
          interval = "1s"
          timeout  = "2s"
        }
        check {
          name     = "port"
          type     = "tcp"
          interval = "1s"
          timeout  = "2s"
        }
      }
    }
  }
}
"#;

#[tokio::test(flavor = "multi_thread")]
async fn a_failing_script_check_restarts_its_task_and_every_check_shows_its_result() {
    let mut agent = AgentProcess::new();
    agent.start().await;
    let alloc = agent.run_job("checked.hcl", JOB).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    let checks = loop {
        let status = agent.alloc(&alloc).await;
        assert_ne!(status.client_status, ClientStatus::Failed, "{status:#?}");
        let checks: serde_json::Value = agent
            .client()
            .get(&format!("/v1/client/allocation/{alloc}/checks"))
            .await
            .unwrap();
        let passing = checks
            .as_object()
            .is_some_and(|c| c.len() == 3 && c.values().all(|r| r["Status"] == "success"));
        if status.tasks["t"].restarts == 1 && passing {
            break checks;
        }
        assert!(
            Instant::now() < deadline,
            "{checks:#}\n{:#?}",
            status.tasks["t"].events
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let by_name = |name: &str| {
        checks
            .as_object()
            .unwrap()
            .values()
            .find(|r| r["Check"] == name)
            .unwrap_or_else(|| panic!("{name}: {checks:#}"))
            .clone()
    };
    let alive = by_name("alive");
    assert_eq!(
        (&alive["Service"], &alive["Task"], &alive["Mode"]),
        (&"web".into(), &"t".into(), &"healthiness".into())
    );
    // The script ran in the task, as its user (not the agent's root).
    let uid = alive["Output"].as_str().unwrap();
    assert!(
        uid.starts_with("checking as ") && uid != "checking as 0",
        "{alive:#}"
    );
    let index = by_name("index");
    assert_eq!(index["StatusCode"], 200, "{index:#}");
    assert!(
        by_name("port")["Output"]
            .as_str()
            .unwrap()
            .ends_with("Success")
    );

    let status = agent.alloc(&alloc).await;
    let events = &status.tasks["t"].events;
    assert!(
        events.iter().any(|e| e.kind == EventKind::RestartSignaled
            && e.message == "healthcheck: check \"alive\" unhealthy"),
        "{events:#?}"
    );
    // Healthy since: no second restart.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(agent.alloc(&alloc).await.tasks["t"].restarts, 1);
    // `service list` shows how the checks stand.
    let (code, stdout, stderr) = agent.cli(&["service", "list"]);
    assert_eq!(code, 0, "{stderr}");
    let line = stdout
        .lines()
        .find(|l| l.starts_with("web "))
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(line.contains(" passing "), "{stdout}");
    let (code, _, stderr) = agent.cli(&["job", "stop", "checked"]);
    assert_eq!(code, 0, "{stderr}");
}

/// A gRPC health server as a service author writes one with grpcio (its generic
/// handler, the protocol's two messages by hand), run by the task's own python3.
const GRPC_JOB: &str = r#"job "grpc-checked" {
  group "g" {
    network {
      port "grpc" {}
    }
    task "t" {
      driver = "exec"
      config {
        command = "/usr/bin/python3"
        args    = ["local/health.py", "${NOMAD_PORT_grpc}"]
      }
      template {
        destination = "local/health.py"
        data        = <<EOT
import sys
from concurrent import futures
import grpc

SERVING, NOT_SERVING = 1, 2
STATUS = {"": SERVING, "web": SERVING, "down": NOT_SERVING}

def check(request, context):
    # HealthCheckRequest: field 1, the service's name (a short string here).
    service = request[2:].decode() if request[:1] == b"\x0a" else ""
    if service not in STATUS:
        context.abort(grpc.StatusCode.NOT_FOUND, "unknown service " + service)
    return bytes([0x08, STATUS[service]])

handler = grpc.method_handlers_generic_handler(
    "grpc.health.v1.Health", {"Check": grpc.unary_unary_rpc_method_handler(check)})
server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
server.add_generic_rpc_handlers((handler,))
server.add_insecure_port("0.0.0.0:" + sys.argv[1])
server.start()
print("serving", flush=True)
server.wait_for_termination()
EOT
      }
      service {
        name     = "web"
        port     = "grpc"
        provider = "nomad"
        check {
          name     = "server"
          type     = "grpc"
          interval = "1s"
          timeout  = "2s"
        }
        check {
          name         = "web"
          type         = "grpc"
          grpc_service = "web"
          interval     = "1s"
          timeout      = "2s"
        }
        check {
          name         = "down"
          type         = "grpc"
          grpc_service = "down"
          interval     = "1s"
          timeout      = "2s"
        }
        check {
          name         = "missing"
          type         = "grpc"
          grpc_service = "missing"
          interval     = "1s"
          timeout      = "2s"
        }
      }
    }
  }
}
"#;

/// berth's grpc checks ask a real gRPC server (grpcio) the health protocol's Check:
/// SERVING passes, NOT_SERVING and an unknown service fail, each saying why.
#[tokio::test(flavor = "multi_thread")]
async fn grpc_checks_ask_a_real_grpc_server_and_only_serving_passes() {
    let mut agent = AgentProcess::new();
    agent.start().await;
    let alloc = agent.run_job("grpc-checked.hcl", GRPC_JOB).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    let checks = loop {
        let checks: serde_json::Value = agent
            .client()
            .get(&format!("/v1/client/allocation/{alloc}/checks"))
            .await
            .unwrap();
        let settled = checks.as_object().is_some_and(|c| {
            c.len() == 4
                && c.values().all(|r| {
                    // Answered by the server: a check run before it listened says
                    // "connecting to …: Connection refused" until its next interval.
                    r["Output"].as_str().is_some_and(|o| {
                        o.starts_with("gRPC check") && !o.contains(": connecting to ")
                    })
                })
                && c.values().filter(|r| r["Status"] == "success").count() == 2
        });
        if settled {
            break checks;
        }
        assert!(
            Instant::now() < deadline,
            "{checks:#}\n{}",
            agent.task_stdout(&alloc, "t")
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let by_name = |name: &str| {
        checks
            .as_object()
            .unwrap()
            .values()
            .find(|r| r["Check"] == name)
            .unwrap_or_else(|| panic!("{name}: {checks:#}"))
            .clone()
    };
    for passing in ["server", "web"] {
        assert_eq!(by_name(passing)["Status"], "success", "{checks:#}");
    }
    let down = by_name("down");
    assert_eq!(down["Status"], "failure", "{down:#}");
    assert!(
        down["Output"]
            .as_str()
            .unwrap()
            .ends_with("/down: NotServing"),
        "{down:#}"
    );
    let missing = by_name("missing");
    assert_eq!(missing["Status"], "failure", "{missing:#}");
    assert!(
        missing["Output"]
            .as_str()
            .unwrap()
            .contains("NotFound: unknown service missing"),
        "{missing:#}"
    );
    let (code, _, stderr) = agent.cli(&["job", "stop", "grpc-checked"]);
    assert_eq!(code, 0, "{stderr}");
}
