//! Service registration in Consul, against the Consul API double (Consul itself cannot
//! be installed here): registration when a task starts, anti-entropy that keeps tags
//! edited in Consul only with `enable_tag_override`, deregistration at stop, the same
//! IDs and no duplicates after an agent `kill -9`, orphans removed, retries with backoff
//! while Consul fails, and ACL refusals shown.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::agent_process::AgentProcess;
use crate::consul_double::ConsulDouble;

fn agent_with(consul: &ConsulDouble, extra: &str) -> AgentProcess {
    AgentProcess::with_config(&format!(
        "consul {{\n  address = \"{}\"\n  sync_interval = \"1s\"\n  service_address = \"127.0.0.1\"\n{extra}}}\n",
        consul.address()
    ))
}

/// A job whose task has two services on the static port "http": `web`, whose tags
/// Consul may override, and `api`, whose tags berth keeps.
const SHOP: &str = r#"job "shop" {
  group "g" {
    network {
      port "http" {
        static = 18080
      }
    }
    task "server" {
      driver = "exec"
      config {
        command = "/bin/sleep"
        args    = ["600"]
      }
      service {
        name                = "${NOMAD_JOB_NAME}-web"
        port                = "http"
        tags                = ["v1"]
        enable_tag_override = true
        meta {
          team = "payments"
        }
        check {
          type     = "http"
          path     = "/health"
          interval = "10s"
          timeout  = "2s"
        }
      }
      service {
        name = "api"
        port = "http"
        tags = ["a"]
      }
    }
  }
}
"#;

async fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(Instant::now() < deadline, "never {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn id_of(consul: &ConsulDouble, name: &str) -> Option<String> {
    consul
        .services()
        .into_iter()
        .find(|(_, s)| s["Service"] == json!(name))
        .map(|(id, _)| id)
}

fn tags(consul: &ConsulDouble, id: &str) -> serde_json::Value {
    consul.services()[id]["Tags"].clone()
}

#[tokio::test(flavor = "multi_thread")]
async fn services_are_registered_kept_by_anti_entropy_and_deregistered_at_stop() {
    let consul = ConsulDouble::start().await;
    let mut agent = agent_with(&consul, "");
    agent.start().await;
    let submitted = agent.submit("shop.hcl", SHOP).await.unwrap();
    let alloc = &submitted.alloc_ids[0];
    wait_until("both services registered", || consul.services().len() == 2).await;

    let web = id_of(&consul, "shop-web").unwrap();
    assert_eq!(web, format!("_berth-task-{alloc}-server-shop-web-http"));
    let service = &consul.services()[&web];
    assert_eq!(service["Port"], json!(18080));
    assert_eq!(service["Address"], json!("127.0.0.1"));
    assert_eq!(service["EnableTagOverride"], json!(true));
    assert_eq!(service["Meta"], json!({ "team": "payments" }));
    let checks = consul.checks();
    let check = checks
        .values()
        .find(|c| c["ServiceID"] == json!(web))
        .expect("the web service's check");
    assert_eq!(check["Type"], json!("http"));
    let register = consul
        .requests()
        .into_iter()
        .find(|r| {
            r.method == axum::http::Method::PUT
                && r.path.starts_with("/v1/agent/service/register")
                && r.body["ID"] == json!(web)
        })
        .unwrap();
    assert_eq!(
        register.body["Checks"][0]["HTTP"],
        json!("http://127.0.0.1:18080/health")
    );
    assert_eq!(register.body["Checks"][0]["Interval"], json!("10s"));
    let api = id_of(&consul, "api").unwrap();
    assert_eq!(consul.services()[&api]["EnableTagOverride"], json!(false));

    // An operator edits both services' tags in Consul. The periodic sync (every second
    // here) keeps the edit where tag override is on, and reverts the other.
    consul.edit_tags(&web, &["v1", "canary-by-ops"]);
    consul.edit_tags(&api, &["hacked"]);
    wait_until("api's tags reverted", || {
        tags(&consul, &api) == json!(["a"])
    })
    .await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(tags(&consul, &web), json!(["v1", "canary-by-ops"]));
    assert_eq!(tags(&consul, &api), json!(["a"]));

    let (code, out, err) = agent.cli(&["service", "list"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains(&format!("Consul: {}", consul.address())),
        "{out}"
    );
    let web_line = out.lines().find(|l| l.starts_with("shop-web")).unwrap();
    assert!(web_line.contains("registered"), "{out}");
    assert!(web_line.contains("127.0.0.1:18080"), "{out}");
    assert!(web_line.contains("v1,canary-by-ops"), "{out}");

    assert_eq!(agent.cli(&["job", "stop", "shop"]).0, 0);
    wait_until("both services deregistered", || {
        consul.services().is_empty()
    })
    .await;
    assert!(consul.checks().is_empty());
    let (_, out, _) = agent.cli(&["service", "list"]);
    assert!(out.contains("No services"), "{out}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_agent_killed_and_restarted_registers_the_same_ids_and_removes_only_its_orphans() {
    let consul = ConsulDouble::start().await;
    let mut agent = agent_with(&consul, "");
    agent.start().await;
    agent.submit("shop.hcl", SHOP).await.unwrap();
    wait_until("both services registered", || consul.services().len() == 2).await;
    let before: Vec<String> = consul.services().into_keys().collect();

    agent.kill9();
    // Meanwhile: a berth service of an alloc that is gone, and someone else's service.
    consul.add_service("_berth-task-0000-gone-old-http", "old");
    consul.add_service("billing-1", "billing");
    agent.start().await;
    wait_until("the orphan removed", || {
        !consul
            .services()
            .contains_key("_berth-task-0000-gone-old-http")
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let after: Vec<String> = consul.services().into_keys().collect();
    let mut expected = before.clone();
    expected.push("billing-1".into());
    expected.sort();
    assert_eq!(
        after, expected,
        "the same IDs, once each, and the other tool's service"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn consul_failures_are_retried_with_backoff_while_the_task_runs_and_acl_refusals_are_shown() {
    let consul = ConsulDouble::start().await;
    consul.fail_next(3);
    let mut agent = agent_with(&consul, "");
    agent.start().await;
    let submitted = agent.submit("shop.hcl", SHOP).await.unwrap();
    agent
        .wait_alloc(&submitted.alloc_ids[0], "running", |s| {
            s.tasks["server"].state == berth::model::events::TaskStateKind::Running
        })
        .await;
    wait_until("registered after the failures", || {
        consul.services().len() == 2
    })
    .await;
    // The first sync and its retries: 1 s, then 2 s, then 3 s apart.
    let failed: Vec<Instant> = consul
        .requests()
        .iter()
        .filter(|r| r.status == 500)
        .map(|r| r.at)
        .collect();
    assert_eq!(failed.len(), 3);
    let gaps: Vec<Duration> = failed.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(
        gaps[0] >= Duration::from_millis(900) && gaps[1] >= Duration::from_millis(1900),
        "backoff gaps {gaps:?}"
    );
    let (_, out, _) = agent.cli(&["service", "list"]);
    assert!(!out.contains("failing"), "{out}");
    assert_eq!(agent.cli(&["job", "stop", "shop"]).0, 0);
    wait_until("deregistered", || consul.services().is_empty()).await;
    drop(agent);

    // A token Consul does not know: the refusal is shown, nothing is half-registered.
    let consul = ConsulDouble::start().await;
    consul.require_token("the-right-one");
    let mut agent = agent_with(&consul, "  token = \"a-wrong-one\"\n");
    agent.start().await;
    agent.submit("shop.hcl", SHOP).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let out = loop {
        let (_, out, _) = agent.cli(&["service", "list"]);
        if (out.contains("failing") && out.contains("shop-web")) || Instant::now() > deadline {
            break out;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(
        out.contains("Consul refused listing the agent's services: 403: ACL not found"),
        "{out}"
    );
    assert!(
        out.lines()
            .any(|l| l.starts_with("shop-web") && l.contains("pending")),
        "{out}"
    );
    assert!(consul.services().is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_consul_service_without_a_consul_block_is_refused_and_provider_nomad_is_listed() {
    let mut agent = AgentProcess::new();
    agent.start().await;
    let Err(berth::api::client::ClientError::Api(error, _)) = agent.submit("shop.hcl", SHOP).await
    else {
        panic!("a consul service without a consul block was accepted");
    };
    assert_eq!(
        error.problems[0],
        "shop.hcl:14:7: job.shop.group.g.task.server.service: task \"server\": service \"${NOMAD_JOB_NAME}-web\" is registered in \
         Consul, and this agent has no consul block: add consul { address = \
         \"127.0.0.1:8500\" } to the agent config, or set provider = \"nomad\" to keep the \
         service in berth's own list"
    );
    let local = SHOP.replace(
        "name = \"api\"",
        "name = \"api\"\n        provider = \"nomad\"",
    );
    let local = local.replacen(
        "        name                = \"${NOMAD_JOB_NAME}-web\"",
        "        provider            = \"nomad\"\n        name                = \"${NOMAD_JOB_NAME}-web\"",
        1,
    );
    agent.submit("shop.hcl", &local).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, out, _) = agent.cli(&["service", "list"]);
        if out.contains("api ") {
            assert!(out.contains("Consul: none"), "{out}");
            let line = out.lines().find(|l| l.starts_with("api ")).unwrap();
            assert!(line.contains("nomad") && line.contains("local"), "{out}");
            break;
        }
        assert!(Instant::now() < deadline, "never listed: {out}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
