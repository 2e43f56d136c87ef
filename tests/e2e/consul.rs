//! Service registration in Consul, against the Consul API double (Consul itself cannot
//! be installed here): registration when a task starts, anti-entropy that keeps tags
//! edited in Consul only with `enable_tag_override`, deregistration at stop, the same
//! IDs and no duplicates after an agent `kill -9`, orphans removed, retries with backoff
//! while Consul fails, and ACL refusals shown: a token Consul does not know, a token that
//! lacks a permission (its writes refused, its lists filtered), and tokens revoked that
//! were already gone.

use std::time::{Duration, Instant};

use serde_json::json;

use berth_harness::AgentProcess;
use berth_testkit::consul::{ConsulDouble, Policy};

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
        check {
          type         = "grpc"
          grpc_service = "api.v1"
          grpc_use_tls = true
          interval     = "10s"
          timeout      = "2s"
        }
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

/// Waits until berth has read the agent's services `syncs` more times: that many sync
/// passes, however slow the machine.
async fn wait_for_syncs(consul: &ConsulDouble, syncs: usize) {
    let listed = |c: &ConsulDouble| {
        c.requests()
            .iter()
            .filter(|r| r.path == "/v1/agent/services")
            .count()
    };
    let target = listed(consul) + syncs;
    wait_until("berth's next syncs", || listed(consul) >= target).await;
}

/// `berth service list`, once it has a line that `ready` accepts (or after 30 s).
fn service_list_once(agent: &AgentProcess, ready: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, out, _) = agent.cli(&["service", "list"]);
        if ready(&out) || Instant::now() > deadline {
            return out;
        }
        std::thread::sleep(Duration::from_millis(200));
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
    // A grpc check is Consul's to run, with the service it asks about and TLS.
    let register = consul
        .requests()
        .into_iter()
        .find(|r| r.path.starts_with("/v1/agent/service/register") && r.body["ID"] == json!(api))
        .unwrap();
    let grpc = &register.body["Checks"][0];
    assert_eq!(
        (&grpc["GRPC"], &grpc["GRPCUseTLS"]),
        (&json!("127.0.0.1:18080/api.v1"), &json!(true)),
        "{grpc:#}"
    );
    let checks = consul.checks();
    assert!(
        checks
            .values()
            .any(|c| c["ServiceID"] == json!(api) && c["Type"] == json!("grpc")),
        "{checks:#?}"
    );

    // An operator edits both services' tags in the catalog. Consul's own anti-entropy
    // keeps the edit only where tag override is on (the agent takes the catalog's tags);
    // for api it restores the agent's tags, and the agent's copy never changes.
    assert!(consul.edit_catalog_tags(&web, &["v1", "canary-by-ops"]));
    assert!(!consul.edit_catalog_tags(&api, &["hacked"]));
    // Another client re-registers api through the agent with other tags: the agent
    // takes that, and berth's sync (every second here) puts its own tags back.
    let seen = consul.requests().len();
    consul.register_as_another_client(&api, &["hacked"]);
    wait_until("api's tags reverted", || {
        tags(&consul, &api) == json!(["a"])
    })
    .await;
    let reverted_by = consul.requests()[seen..]
        .iter()
        .filter(|r| r.path.starts_with("/v1/agent/service/register") && r.body["ID"] == json!(api))
        .count();
    assert!(reverted_by > 0, "berth re-registered api");
    // Several periodic syncs later, berth has kept web's edited tags (it took them into
    // its registration) and api's own.
    wait_for_syncs(&consul, 3).await;
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
    let seen = consul.requests().len();
    agent.start().await;
    wait_until("the orphan removed", || {
        !consul
            .services()
            .contains_key("_berth-task-0000-gone-old-http")
    })
    .await;
    // A few syncs more, however slow the node: nothing else goes or comes.
    wait_for_syncs(&consul, 2).await;
    let after: Vec<String> = consul.services().into_keys().collect();
    let mut expected = before.clone();
    expected.push("billing-1".into());
    expected.sort();
    assert_eq!(
        after, expected,
        "the same IDs, once each, and the other tool's service"
    );
    // And they never flapped: the restored tasks' services were not taken for orphans
    // before their runners set them again.
    let flapped: Vec<String> = consul.requests()[seen..]
        .iter()
        .filter(|r| r.path.starts_with("/v1/agent/service/deregister/"))
        .map(|r| r.path.clone())
        .filter(|path| before.iter().any(|id| path.ends_with(id.as_str())))
        .collect();
    assert!(
        flapped.is_empty(),
        "deregistered after the restart: {flapped:?}"
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
            s.tasks["server"].state == berth_model::events::TaskStateKind::Running
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
    let Err(berth_api::client::ClientError::Api(error, _)) = agent.submit("shop.hcl", SHOP).await
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
    // TLS is for Consul's grpc checks; berth's own speak plaintext.
    let local = SHOP.replace("          grpc_use_tls = true\n", "").replace(
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

/// A double of the `consul` program for `consul connect envoy -bootstrap`: records its
/// arguments (one per line) in `argv`, prints a small bootstrap JSON.
fn fake_consul(dir: &std::path::Path) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt as _;
    let program = dir.join("fake-consul");
    let argv = dir.join("argv");
    std::fs::write(
        &program,
        format!(
            "#!/bin/sh\nprintf '%s\\n' \"$@\" > {}\necho '{{\"admin\":{{\"access_log_path\":\"/dev/null\"}},\"node\":{{\"cluster\":\"count-api\"}}}}'\n",
            argv.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
    program
}

/// A group with a Connect service whose sidecar task prints what it was given.
const COUNTDASH: &str = r#"job "countdash" {
  group "api" {
    service {
      name = "count-api"
      port = "9001"
      connect {
        sidecar_service {
          proxy {
            upstreams {
              destination_name = "count-db"
              local_bind_port  = 8081
            }
          }
        }
        sidecar_task {
          driver = "exec"
          config {
            command = "/bin/sh"
            args    = ["-c", "ls -ln /secrets; cat /secrets/si_token; echo; cat /secrets/envoy_bootstrap.json; sleep 600"]
          }
        }
      }
    }
    task "web" {
      driver = "exec"
      config {
        command = "/bin/sleep"
        args    = ["600"]
      }
    }
  }
}
"#;

async fn proxy_output(agent: &AgentProcess, alloc: &str) -> String {
    let status = agent.alloc(alloc).await;
    let path = status
        .alloc_dir
        .join("alloc/logs/connect-proxy-count-api.stdout.0");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = std::fs::read_to_string(&path).unwrap_or_default();
        if out.contains("cluster") || Instant::now() > deadline {
            return out;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_connect_sidecar_gets_a_service_identity_token_and_an_envoy_bootstrap_and_the_token_is_revoked()
 {
    let consul = ConsulDouble::start().await;
    consul.require_token("operator-token");
    let scratch = tempfile::tempdir().unwrap();
    let program = fake_consul(scratch.path());
    let mut agent = agent_with(
        &consul,
        &format!(
            "  token = \"operator-token\"\n  binary = \"{}\"\n",
            program.display()
        ),
    );
    agent.start().await;
    let submitted = agent.submit("countdash.hcl", COUNTDASH).await.unwrap();
    let alloc = &submitted.alloc_ids[0];
    let out = proxy_output(&agent, alloc).await;

    // One token, for the service, whose secret the sidecar holds (0440).
    let tokens = consul.tokens();
    assert_eq!(tokens.len(), 1, "{tokens:?}");
    let token = tokens.values().next().unwrap();
    assert_eq!(
        token["ServiceIdentities"],
        json!([{ "ServiceName": "count-api" }])
    );
    let secret = token["SecretID"].as_str().unwrap();
    assert!(out.contains(&format!("\n{secret}\n")), "{out}");
    let si_line = out.lines().find(|l| l.ends_with(" si_token")).unwrap();
    assert!(si_line.starts_with("-r--r-----"), "{out}");
    assert!(out.contains("{\"admin\":"), "{out}");

    // The bootstrap was asked for the sidecar of berth's service ID, with the token.
    let service_id = format!("_berth-task-{alloc}-group-api-count-api-9001");
    let argv: Vec<String> = std::fs::read_to_string(scratch.path().join("argv"))
        .unwrap()
        .lines()
        .map(String::from)
        .collect();
    let after = |flag: &str| {
        argv.iter()
            .position(|a| a == flag)
            .and_then(|i| argv.get(i + 1))
            .cloned()
    };
    assert_eq!(argv[..2], ["connect", "envoy"]);
    assert!(argv.contains(&"-bootstrap".to_string()), "{argv:?}");
    assert_eq!(
        after("-proxy-id"),
        Some(format!("{service_id}-sidecar-proxy"))
    );
    assert_eq!(after("-token").as_deref(), Some(secret));
    assert_eq!(after("-http-addr"), Some(consul.address()));

    // The service went to Consul with its Connect sidecar, which anti-entropy keeps.
    let register = consul
        .requests()
        .into_iter()
        .find(|r| r.body["ID"] == json!(service_id))
        .unwrap();
    assert_eq!(
        register.body["Connect"]["SidecarService"]["Proxy"]["Upstreams"],
        json!([{ "DestinationName": "count-db", "LocalBindPort": 8081 }])
    );
    wait_for_syncs(&consul, 3).await;
    assert!(
        consul
            .services()
            .contains_key(&format!("{service_id}-sidecar-proxy"))
    );

    // Stopped: the token is revoked, the services gone.
    assert_eq!(agent.cli(&["job", "stop", "countdash"]).0, 0);
    wait_until("the token revoked", || consul.tokens().is_empty()).await;
    wait_until("deregistered", || consul.services().is_empty()).await;
    drop(agent);

    // Without ACLs: no token, and no -token.
    let consul = ConsulDouble::start().await;
    let mut agent = agent_with(&consul, &format!("  binary = \"{}\"\n", program.display()));
    agent.start().await;
    let submitted = agent.submit("countdash.hcl", COUNTDASH).await.unwrap();
    let out = proxy_output(&agent, &submitted.alloc_ids[0]).await;
    assert!(out.contains("{\"admin\":"), "{out}");
    assert!(!out.contains("si_token"), "{out}");
    let argv = std::fs::read_to_string(scratch.path().join("argv")).unwrap();
    assert!(!argv.lines().any(|l| l == "-token"), "{argv}");
}

/// Runs the Connect job on an agent with `extra` in its consul block until the sidecar
/// fails its setup; the sidecar's events, one per line.
async fn sidecar_failure(consul: &ConsulDouble, extra: &str) -> String {
    use berth_model::events::EventKind;
    let mut agent = agent_with(consul, extra);
    agent.start().await;
    let submitted = agent.submit("countdash.hcl", COUNTDASH).await.unwrap();
    let alloc = &submitted.alloc_ids[0];
    agent
        .wait_alloc(alloc, "the sidecar failed", |s| {
            s.tasks["connect-proxy-count-api"]
                .events
                .iter()
                .any(|e| e.kind == EventKind::SetupFailure)
        })
        .await;
    agent.alloc(alloc).await.tasks["connect-proxy-count-api"]
        .events
        .iter()
        .map(|e| format!("{}: {}\n", e.kind, e.message))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sidecar_whose_token_cannot_be_derived_fails_with_an_event_saying_why() {
    let scratch = tempfile::tempdir().unwrap();
    let program = fake_consul(scratch.path());
    // A token the ACL system does not know: refused at once.
    let consul = ConsulDouble::start().await;
    consul.require_token("the-right-one");
    let events = sidecar_failure(
        &consul,
        &format!(
            "  token = \"a-wrong-one\"\n  binary = \"{}\"\n",
            program.display()
        ),
    )
    .await;
    assert!(
        events.contains(
            "connect: deriving the service identity token of \"count-api\": Consul refused \
             creating a service identity token for \"count-api\": 403: ACL not found (the \
             consul token needs acl:write)"
        ),
        "{events}"
    );

    // A token Consul knows, which may register services but not write ACLs: Consul's
    // refusal, naming the token and the permission, with berth's hint.
    let consul = ConsulDouble::start().await;
    let accessor = consul.add_token(
        "services-only",
        Policy {
            service_write: vec![String::new()],
            ..Policy::default()
        },
    );
    let events = sidecar_failure(
        &consul,
        &format!(
            "  token = \"services-only\"\n  binary = \"{}\"\n",
            program.display()
        ),
    )
    .await;
    assert!(
        events.contains(&format!(
            "connect: deriving the service identity token of \"count-api\": Consul refused \
             creating a service identity token for \"count-api\": 403: Permission denied: \
             token with AccessorID '{accessor}' lacks permission 'acl:write' (the consul \
             token needs acl:write)"
        )),
        "{events}"
    );
    assert!(consul.tokens().is_empty());

    // Consul failing for longer than service_identity_timeout: timed out.
    let consul = ConsulDouble::start().await;
    consul.fail_next(1_000_000);
    let events = sidecar_failure(
        &consul,
        &format!(
            "  token = \"t\"\n  service_identity_timeout = \"2s\"\n  binary = \"{}\"\n",
            program.display()
        ),
    )
    .await;
    assert!(
        events.contains(
            "deriving the service identity token of \"count-api\" timed out after 2s \
             (service_identity_timeout)"
        ),
        "{events}"
    );
    assert!(
        !scratch.path().join("argv").exists(),
        "no bootstrap without a token"
    );
}

/// `shutdown_delay`: a stopped task's services leave Consul first, and only after the
/// delay does the task get its kill signal, so that clients stop sending it work.
#[tokio::test(flavor = "multi_thread")]
async fn a_tasks_services_leave_consul_its_shutdown_delay_before_it_is_killed() {
    use berth_model::events::{EventKind, TaskStateKind};
    let consul = ConsulDouble::start().await;
    let mut agent = agent_with(&consul, "");
    agent.start().await;
    let job = SHOP.replace(
        "      driver = \"exec\"\n",
        "      driver = \"exec\"\n      shutdown_delay = \"2s\"\n",
    );
    let submitted = agent.submit("shop.hcl", &job).await.unwrap();
    let alloc = submitted.alloc_ids[0].clone();
    wait_until("both services registered", || consul.services().len() == 2).await;
    let stopping = {
        let client = agent.client();
        tokio::spawn(async move {
            client
                .delete::<serde_json::Value>("/v1/berth/job/shop")
                .await
        })
    };
    wait_until("both services deregistered", || {
        consul.services().is_empty()
    })
    .await;
    let status = agent.alloc(&alloc).await;
    assert_eq!(
        status.tasks["server"].state,
        TaskStateKind::Running,
        "the task still runs once its services are gone"
    );
    let _ = stopping.await;
    agent
        .wait_alloc(&alloc, "stopped", |s| {
            s.tasks["server"].state == TaskStateKind::Dead
        })
        .await;
    let events = agent.alloc(&alloc).await.tasks["server"].events.clone();
    let at = |kind: EventKind| {
        events
            .iter()
            .find(|e| e.kind == kind)
            .unwrap_or_else(|| panic!("no {kind} event: {events:#?}"))
            .time_ms
    };
    let waited = at(EventKind::Killing) - at(EventKind::WaitingShutdownDelay);
    assert!(waited >= 1900, "killed {waited} ms after the delay began");
}

/// A dynamic port (`port "http" {}`) is numbered when the alloc is placed, from Nomad's
/// 20000–32000, different for each alloc; the task gets it as `NOMAD_PORT_http` and
/// `NOMAD_ADDR_http`, its service is registered with it, and an agent restarted after
/// `kill -9` keeps it.
#[tokio::test(flavor = "multi_thread")]
async fn a_dynamic_port_is_numbered_at_placement_given_to_the_task_and_registered() {
    let consul = ConsulDouble::start().await;
    let mut agent = agent_with(&consul, "");
    agent.start().await;
    let job = r#"job "dyn" {
  group "g" {
    count = 2
    network {
      port "http" {}
    }
    task "t" {
      driver = "exec"
      config {
        command = "/bin/sh"
        args    = ["-c", "echo $NOMAD_PORT_http $NOMAD_ADDR_http; exec sleep 600"]
      }
      service {
        name = "dyn"
        port = "http"
      }
    }
  }
}
"#;
    let submitted = agent.submit("dyn.hcl", job).await.unwrap();
    wait_until("both allocs' services registered", || {
        consul.services().len() == 2
    })
    .await;
    let mut ports = Vec::new();
    for alloc in &submitted.alloc_ids {
        let status = agent.alloc(alloc).await;
        let log = status.alloc_dir.join("alloc/logs/t.stdout.0");
        let deadline = Instant::now() + Duration::from_secs(30);
        let printed = loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if !text.is_empty() || Instant::now() > deadline {
                break text;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let (port, addr) = printed.trim().split_once(' ').unwrap();
        let port: u16 = port.parse().unwrap();
        assert!((20000..=32000).contains(&port), "{printed}");
        assert_eq!(addr, format!("127.0.0.1:{port}"));
        let id = format!("_berth-task-{alloc}-t-dyn-http");
        assert_eq!(consul.services()[&id]["Port"], json!(port));
        ports.push((id, port));
    }
    assert_ne!(ports[0].1, ports[1].1, "each alloc its own port");

    agent.kill9();
    agent.start().await;
    wait_for_syncs(&consul, 2).await;
    for (id, port) in &ports {
        assert_eq!(
            consul.services()[id]["Port"],
            json!(port),
            "kept after a restart"
        );
    }
}

/// A group's `shutdown_delay`: its services leave Consul at once, and its tasks are told
/// to stop only after the delay.
#[tokio::test(flavor = "multi_thread")]
async fn a_groups_services_leave_consul_its_shutdown_delay_before_its_tasks_stop() {
    use berth_model::events::{EventKind, TaskStateKind};
    let consul = ConsulDouble::start().await;
    let mut agent = agent_with(&consul, "");
    agent.start().await;
    let job = r#"job "grouped" {
  group "g" {
    shutdown_delay = "2s"
    service {
      name = "front"
      port = "8080"
    }
    task "t" {
      driver = "exec"
      config {
        command = "/bin/sleep"
        args    = ["600"]
      }
    }
  }
}
"#;
    let submitted = agent.submit("grouped.hcl", job).await.unwrap();
    let alloc = submitted.alloc_ids[0].clone();
    wait_until("the group service registered", || {
        consul.services().len() == 1
    })
    .await;
    let asked = Instant::now();
    let stopping = {
        let client = agent.client();
        tokio::spawn(async move {
            client
                .delete::<serde_json::Value>("/v1/berth/job/grouped")
                .await
        })
    };
    wait_until("the group service deregistered", || {
        consul.services().is_empty()
    })
    .await;
    assert_eq!(
        agent.alloc(&alloc).await.tasks["t"].state,
        TaskStateKind::Running,
        "the task still runs once the group's services are gone"
    );
    let _ = stopping.await;
    agent
        .wait_alloc(&alloc, "stopped", |s| {
            s.tasks["t"].state == TaskStateKind::Dead
        })
        .await;
    let killing = agent.alloc(&alloc).await.tasks["t"]
        .events
        .iter()
        .any(|e| e.kind == EventKind::Killing);
    assert!(killing);
    assert!(
        asked.elapsed() >= Duration::from_millis(1900),
        "{:?}",
        asked.elapsed()
    );
}

/// A token that lacks `service:write` on one of the task's services: Consul refuses that
/// registration with its "Permission denied" naming the token and the service; berth
/// shows the refusal and keeps the service pending, registers the other, and the task
/// runs on.
#[tokio::test(flavor = "multi_thread")]
async fn a_registration_the_token_may_not_write_is_refused_and_shown_and_the_rest_registers() {
    use berth_model::events::TaskStateKind;
    let consul = ConsulDouble::start().await;
    let accessor = consul.add_token(
        "web-only",
        Policy {
            service_write: vec!["shop-web".into()],
            service_read: vec![String::new()],
            key_read: Vec::new(),
            acl_write: false,
        },
    );
    let mut agent = agent_with(&consul, "  token = \"web-only\"\n");
    agent.start().await;
    let submitted = agent.submit("shop.hcl", SHOP).await.unwrap();
    let alloc = &submitted.alloc_ids[0];
    wait_until("shop-web registered", || {
        id_of(&consul, "shop-web").is_some()
    })
    .await;
    let out = service_list_once(&agent, |out| out.contains("failing"));
    assert!(
        out.contains(&format!(
            "Consul refused registering service \"api\": 403: Permission denied: token with \
             AccessorID '{accessor}' lacks permission 'service:write' on \"api\""
        )),
        "{out}"
    );
    let line = |name: &str| {
        out.lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("no {name} line: {out}"))
            .to_string()
    };
    assert!(line("api ").contains("pending"), "{out}");
    assert!(line("shop-web").contains("registered"), "{out}");
    assert_eq!(id_of(&consul, "api"), None);
    let refused = consul
        .requests()
        .into_iter()
        .find(|r| r.status == 403)
        .expect("a refused request");
    assert!(
        refused.path.starts_with("/v1/agent/service/register"),
        "{refused:?}"
    );
    assert_eq!(
        agent.alloc(alloc).await.tasks["server"].state,
        TaskStateKind::Running
    );
}

/// A token that may read only berth's own services: Consul's lists come back filtered
/// (200, with `X-Consul-Results-Filtered-By-ACLs: true`). berth syncs on what it can see
/// without failing or churning, and touches nothing it cannot see — also not an orphan
/// of its own the token may not read, which therefore stays.
#[tokio::test(flavor = "multi_thread")]
async fn lists_filtered_by_acls_neither_fail_the_sync_nor_touch_what_berth_cannot_see() {
    let consul = ConsulDouble::start().await;
    consul.add_service("billing-1", "billing");
    consul.add_check("billing-alive", "billing-1");
    let orphan = "_berth-task-0000-gone-old-http";
    consul.add_service(orphan, "old");
    consul.add_token(
        "shop-only",
        Policy {
            service_write: vec!["shop-web".into(), "api".into()],
            ..Policy::default()
        },
    );
    let mut agent = agent_with(&consul, "  token = \"shop-only\"\n");
    agent.start().await;
    agent.submit("shop.hcl", SHOP).await.unwrap();
    wait_until("both services registered", || {
        id_of(&consul, "shop-web").is_some() && id_of(&consul, "api").is_some()
    })
    .await;
    wait_for_syncs(&consul, 3).await;

    let requests = consul.requests();
    for list in ["/v1/agent/services", "/v1/agent/checks"] {
        assert!(
            requests
                .iter()
                .any(|r| r.path == list && r.filtered && r.status == 200),
            "{list} was never answered filtered"
        );
    }
    assert!(
        requests.iter().all(|r| r.status == 200),
        "refused: {:?}",
        requests
            .iter()
            .filter(|r| r.status != 200)
            .collect::<Vec<_>>()
    );
    // Once registered, never again: the filtered lists do not make berth think its
    // services are missing or different.
    for name in ["shop-web", "api"] {
        let id = id_of(&consul, name).unwrap();
        let registrations = requests
            .iter()
            .filter(|r| {
                r.path.starts_with("/v1/agent/service/register") && r.body["ID"] == json!(id)
            })
            .count();
        assert_eq!(registrations, 1, "{name} registered {registrations} times");
    }
    assert!(
        !requests
            .iter()
            .any(|r| r.path.starts_with("/v1/agent/service/deregister/")),
        "berth deregistered something it cannot see"
    );
    let services = consul.services();
    assert!(services.contains_key("billing-1") && services.contains_key(orphan));
    assert!(consul.checks().contains_key("billing-alive"));
    let out = service_list_once(&agent, |out| out.contains("registered"));
    assert!(!out.contains("failing"), "{out}");
    assert!(
        out.lines()
            .filter(|l| l.starts_with("shop-web") || l.starts_with("api "))
            .all(|l| l.contains("registered")),
        "{out}"
    );
}

/// Runs the Connect job with an operator token, until its sidecar has its service
/// identity token: the agent, the alloc, and the token's accessor.
async fn connect_job_with_a_token(
    consul: &ConsulDouble,
    program: &std::path::Path,
) -> (AgentProcess, String, String) {
    let mut agent = agent_with(
        consul,
        &format!(
            "  token = \"operator-token\"\n  binary = \"{}\"\n",
            program.display()
        ),
    );
    agent.start().await;
    let submitted = agent.submit("countdash.hcl", COUNTDASH).await.unwrap();
    let alloc = submitted.alloc_ids[0].clone();
    let out = proxy_output(&agent, &alloc).await;
    assert!(out.contains("{\"admin\":"), "{out}");
    let accessor = consul.tokens().into_keys().next().expect("a token derived");
    (agent, alloc, accessor)
}

/// A service identity token an operator already deleted in Consul: revoking it is
/// answered 200 `true` (Consul: nothing to do), and berth forgets it.
#[tokio::test(flavor = "multi_thread")]
async fn revoking_a_token_already_deleted_in_consul_succeeds_and_it_is_forgotten() {
    let consul = ConsulDouble::start().await;
    consul.require_token("operator-token");
    let scratch = tempfile::tempdir().unwrap();
    let program = fake_consul(scratch.path());
    let (agent, alloc, accessor) = connect_job_with_a_token(&consul, &program).await;
    let accessors = agent
        .alloc(&alloc)
        .await
        .alloc_dir
        .join("si-token-accessors");
    assert!(
        std::fs::read_to_string(&accessors)
            .unwrap()
            .contains(&accessor)
    );

    consul.delete_token_as_operator(&accessor);
    assert_eq!(agent.cli(&["job", "stop", "countdash"]).0, 0);
    let revoke_path = format!("/v1/acl/token/{accessor}");
    wait_until("the revoke asked for", || {
        consul.requests().iter().any(|r| r.path == revoke_path)
    })
    .await;
    let revoke = consul
        .requests()
        .into_iter()
        .find(|r| r.path == revoke_path)
        .unwrap();
    assert_eq!(revoke.method, axum::http::Method::DELETE);
    assert_eq!(revoke.status, 200);
    wait_until("the accessor forgotten", || !accessors.exists()).await;
}

/// berth's own Consul token deleted before the alloc ends: Consul answers the revoke
/// with 404 "Cannot find token to delete" (its handler's mapping of "ACL not found" for
/// the *request's* token), so the service identity token was not revoked and must be
/// kept for a later try.
#[tokio::test(flavor = "multi_thread")]
async fn a_revoke_refused_for_berths_own_unknown_token_keeps_the_accessor() {
    let consul = ConsulDouble::start().await;
    consul.require_token("operator-token");
    let scratch = tempfile::tempdir().unwrap();
    let program = fake_consul(scratch.path());
    let (agent, alloc, accessor) = connect_job_with_a_token(&consul, &program).await;
    let accessors = agent
        .alloc(&alloc)
        .await
        .alloc_dir
        .join("si-token-accessors");

    consul.forget_acl_token("operator-token");
    assert_eq!(agent.cli(&["job", "stop", "countdash"]).0, 0);
    let revoke_path = format!("/v1/acl/token/{accessor}");
    wait_until("the revoke asked for", || {
        consul
            .requests()
            .iter()
            .any(|r| r.path == revoke_path && r.status == 404)
    })
    .await;
    agent
        .wait_alloc(&alloc, "stopped", |s| {
            s.client_status != berth_model::status::ClientStatus::Running
        })
        .await;
    wait_for_syncs(&consul, 2).await;
    assert!(consul.tokens().contains_key(&accessor), "not revoked");
    assert!(
        std::fs::read_to_string(&accessors)
            .unwrap_or_default()
            .contains(&accessor),
        "an unrevoked token's accessor was forgotten"
    );
}

/// A Consul service's script check: berth registers it as a TTL check, runs the script
/// inside the task, and sets the check's status and output in Consul after each run
/// (with the agent's token, under ACLs), as Nomad does; `check_restart` restarts the
/// task after the script fails. No update is sent before Consul holds the check (the
/// first run, and the first after a restart, end before the registration), and one
/// that finds the check gone has it registered again at once, not at the next
/// anti-entropy pass.
#[tokio::test(flavor = "multi_thread")]
async fn a_consul_services_script_check_is_a_ttl_check_berth_runs_and_updates() {
    let consul = ConsulDouble::start().await;
    consul.add_token(
        "scripted-writer",
        Policy {
            service_write: vec!["scripted".into()],
            service_read: vec![String::new()],
            key_read: Vec::new(),
            acl_write: false,
        },
    );
    // Anti-entropy far apart: what re-registers below is the failed update.
    let mut agent = AgentProcess::with_config(&format!(
        "consul {{\n  address = \"{}\"\n  sync_interval = \"600s\"\n  service_address = \"127.0.0.1\"\n  token = \"scripted-writer\"\n}}\n",
        consul.address()
    ));
    agent.start().await;
    let job = r#"job "scripted" {
  group "g" {
    restart {
      attempts = 2
      delay    = "0s"
      mode     = "fail"
    }
    task "t" {
      driver = "exec"
      config {
        command = "/bin/sh"
        args    = ["-c", "if [ -f local/once ]; then touch local/healthy; else touch local/once; fi; exec sleep 600"]
      }
      service {
        name = "scripted"
        check {
          name     = "alive"
          type     = "script"
          command  = "/bin/sh"
          args     = ["-c", "echo checked as $(id -u); test -f /local/healthy || exit 2"]
          interval = "1s"
          timeout  = "2s"
          check_restart {
            limit = 2
          }
        }
      }
    }
  }
}
"#;
    let alloc = agent.run_job("scripted.hcl", job).await;
    // First run: no healthy file, so critical in Consul and then a restart; after it,
    // passing.
    let deadline = Instant::now() + Duration::from_secs(60);
    let check = loop {
        let status = agent.alloc(&alloc).await;
        let check = consul
            .checks()
            .into_values()
            .find(|c| c["ServiceName"] == json!("scripted"));
        if let Some(check) = &check
            && status.tasks["t"].restarts == 1
            && check["Status"] == json!("passing")
        {
            break check.clone();
        }
        assert!(
            Instant::now() < deadline,
            "{check:#?}\n{:#?}",
            status.tasks["t"].events
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(check["Type"], json!("ttl"), "{check:#}");
    let output = check["Output"].as_str().unwrap();
    assert!(
        output.starts_with("checked as ") && output != "checked as 0",
        "the script ran in the task as its user: {check:#}"
    );
    // Registered as a TTL check of interval + 31s; updated by its ID with the token.
    let register = consul
        .requests()
        .into_iter()
        .find(|r| r.path.starts_with("/v1/agent/service/register"))
        .unwrap();
    assert_eq!(register.body["Checks"][0]["TTL"], json!("32s"));
    let check_id = check["CheckID"].as_str().unwrap();
    let updates: Vec<_> = consul
        .requests()
        .into_iter()
        .filter(|r| r.path == format!("/v1/agent/check/update/{check_id}"))
        .collect();
    assert!(
        updates.iter().all(|u| u.status == 200),
        "no update before the registration: {updates:#?}"
    );
    assert!(
        updates
            .iter()
            .any(|u| u.body["Status"] == json!("critical")),
        "the first runs failed: {updates:#?}"
    );
    let status = agent.alloc(&alloc).await;
    assert!(
        status.tasks["t"]
            .events
            .iter()
            .any(|e| e.message == "healthcheck: check \"alive\" unhealthy"),
        "{:#?}",
        status.tasks["t"].events
    );

    // Consul loses the service (restarted without its data): the next update finds no
    // check, berth registers the service again and sends the update once more.
    let service_id = check["ServiceID"].as_str().unwrap().to_string();
    let registered_before = consul
        .requests()
        .iter()
        .filter(|r| r.path.starts_with("/v1/agent/service/register"))
        .count();
    consul.forget_service(&service_id);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let back = consul.checks().get(check_id).cloned();
        if back
            .as_ref()
            .is_some_and(|c| c["Status"] == json!("passing"))
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the check is registered again and updated: {back:#?}\n{:#?}",
            consul.requests()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let requests = consul.requests();
    let registered_after = requests
        .iter()
        .filter(|r| r.path.starts_with("/v1/agent/service/register"))
        .count();
    assert_eq!(registered_after, registered_before + 1, "{requests:#?}");
    assert!(
        requests
            .iter()
            .any(|r| r.path == format!("/v1/agent/check/update/{check_id}") && r.status == 404),
        "the update that found no check: {requests:#?}"
    );
    let (code, _, stderr) = agent.cli(&["job", "stop", "scripted"]);
    assert_eq!(code, 0, "{stderr}");
}
