//! A cluster of three agents on a real etcd (started in a temp dir): a job submitted to
//! one agent spreads over the nodes; a killed agent's allocs are replaced on the others
//! within its heartbeat TTL (plus the 5 s the issue allows), and that agent, back,
//! stops the allocs it no longer holds; a drained node hands its allocs to the others;
//! a job that fits nowhere says which constraint ruled out how many nodes.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use berth_harness::AgentProcess;
use berth_testkit::etcd::EtcdServer;
use serde_json::Value;

/// The heartbeat TTL the agents run with: short, so the test fails if a replacement
/// waits for a longer one.
pub(crate) const TTL_SECS: u64 = 2;

pub(crate) fn member(etcd: &EtcdServer, name: &str) -> AgentProcess {
    let endpoint = etcd.endpoint();
    let name = name.to_string();
    AgentProcess::production(move |_, _| {
        format!(
            "name = \"{name}\"\n\
             cluster {{\n  store = \"etcd\"\n  endpoints = [\"{endpoint}\"]\n  \
             prefix = \"/e2e\"\n  heartbeat_ttl = \"{TTL_SECS}s\"\n}}\n"
        )
    })
}

const SPREAD_JOB: &str = r#"
job "web" {
  group "web" {
    count = 6
    task "sleep" {
      driver = "exec"
      config {
        command = "/bin/sleep"
        args    = ["600"]
      }
      resources {
        cpu    = 50
        memory = 16
      }
    }
  }
}
"#;

/// The job's allocs as the cluster shows them (from any agent): name, node, status.
pub(crate) async fn allocs(
    agent: &AgentProcess,
    job: &str,
) -> Vec<(String, String, String, String)> {
    let listed: Value = agent
        .client()
        .get(&format!("/v1/job/{job}/allocations"))
        .await
        .unwrap();
    listed
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            let field = |k: &str| a[k].as_str().unwrap_or_default().to_string();
            (
                field("ID"),
                field("Name"),
                field("NodeName"),
                field("ClientStatus"),
            )
        })
        .collect()
}

/// Running allocs per node name.
pub(crate) fn running_per_node(
    allocs: &[(String, String, String, String)],
) -> BTreeMap<String, usize> {
    let mut per_node = BTreeMap::new();
    for (_, _, node, status) in allocs {
        if status == "running" {
            *per_node.entry(node.clone()).or_default() += 1;
        }
    }
    per_node
}

/// Polls until `done` holds for the job's allocs, or fails after `within`.
pub(crate) async fn wait_allocs(
    agent: &AgentProcess,
    job: &str,
    what: &str,
    within: Duration,
    done: impl Fn(&[(String, String, String, String)]) -> bool,
) -> Duration {
    let started = Instant::now();
    loop {
        let now = allocs(agent, job).await;
        if done(&now) {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < within,
            "{what}: not within {within:?}: {now:#?}\n{}",
            agent.output()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_job_spreads_over_three_nodes_and_moves_off_a_dead_or_drained_one() {
    let etcd = EtcdServer::start();
    let mut a = member(&etcd, "node-a");
    let mut b = member(&etcd, "node-b");
    let mut c = member(&etcd, "node-c");
    a.start().await;
    b.start().await;
    c.start().await;
    let nodes: Value = b.client().get("/v1/nodes").await.unwrap();
    let names: Vec<&str> = nodes
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["Name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["node-a", "node-b", "node-c"],
        "every agent sees every node"
    );

    // Submitted to one agent, placed on all three: two each (bin-packing with Nomad's
    // job anti-affinity), and running there.
    a.submit("web.hcl", SPREAD_JOB).await.unwrap();
    wait_allocs(
        &c,
        "web",
        "6 running allocs, 2 per node",
        Duration::from_secs(30),
        |all| running_per_node(all).values().copied().collect::<Vec<_>>() == [2, 2, 2],
    )
    .await;

    // node-c's agent dies: its allocs are lost and replaced on a and b within the TTL
    // (+ 5 s). Its two allocs are taken by node, not by status: node-a's view of a
    // report can trail node-c's own by a moment.
    let on_c: Vec<String> = allocs(&a, "web")
        .await
        .into_iter()
        .filter(|(_, _, node, _)| node == "node-c")
        .map(|(id, ..)| id)
        .collect();
    assert_eq!(on_c.len(), 2, "node-a sees node-c's two allocs: {on_c:?}");
    c.kill9();
    let took = wait_allocs(
        &a,
        "web",
        "node-c's allocs lost and replaced on node-a and node-b",
        Duration::from_secs(TTL_SECS + 5),
        |all| {
            let per_node = running_per_node(all);
            let lost = all
                .iter()
                .filter(|(id, _, _, status)| on_c.contains(id) && status == "lost")
                .count();
            !per_node.contains_key("node-c") && per_node.values().sum::<usize>() == 6 && lost == 2
        },
    )
    .await;
    eprintln!("replaced {:?} after the kill (TTL {TTL_SECS} s)", took);

    // Back, node-c stops what it no longer holds (its tasks outlived its agent).
    c.start().await;
    for id in &on_c {
        c.finished(id).await;
    }

    // node-a is drained (`berth node drain`, from another node's agent): its allocs move
    // to b and c, and none runs on a.
    let a_id = nodes.as_array().unwrap()[0]["ID"]
        .as_str()
        .unwrap()
        .to_string();
    let (code, out, err) = b.cli(&["node", "drain", "--enable", "node-a"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains(&a_id) && out.contains("drain strategy set"),
        "{out}"
    );
    wait_allocs(
        &b,
        "web",
        "node-a drained",
        Duration::from_secs(20),
        |all| {
            let per_node = running_per_node(all);
            !per_node.contains_key("node-a") && per_node.values().sum::<usize>() == 6
        },
    )
    .await;
    let node: Value = c.client().get(&format!("/v1/node/{a_id}")).await.unwrap();
    assert_eq!(node["Drain"], true);
    assert_eq!(node["SchedulingEligibility"], "ineligible");
    // `berth node status` from any agent lists every node in Nomad's words.
    let (code, out, err) = c.cli(&["node", "status"]);
    assert_eq!(code, 0, "{out}{err}");
    let rows: Vec<&str> = out.lines().skip(1).collect();
    assert_eq!(rows.len(), 3, "{out}");
    assert!(
        rows[0].contains("node-a") && rows[0].contains("true") && rows[0].contains("ineligible"),
        "{out}"
    );
    assert!(
        rows[1].contains("node-b") && rows[1].contains(" eligible"),
        "{out}"
    );
}

/// A job author submits through a permissive node a job the node it is placed on
/// forbids (`user = "root"` for `exec`, refused by that node's `user` policy): the node
/// that would run it checks it against its own config and refuses, with the reason in
/// the alloc's status, instead of running it.
#[tokio::test(flavor = "multi_thread")]
async fn the_node_that_runs_a_job_checks_it_against_its_own_config() {
    let etcd = EtcdServer::start();
    let endpoint = etcd.endpoint();
    let cluster_block = format!(
        "cluster {{\n  store = \"etcd\"\n  endpoints = [\"{endpoint}\"]\n  \
         prefix = \"/strict\"\n  heartbeat_ttl = \"{TTL_SECS}s\"\n}}\n"
    );
    let strict_block = cluster_block.clone();
    let mut strict =
        AgentProcess::production(move |_, _| format!("name = \"strict\"\n{strict_block}"));
    let mut permissive = AgentProcess::production(move |port, _| {
        format!(
            "name = \"permissive\"\nuser {{\n  denylist = []\n}}\n{cluster_block}\
             http {{\n  address = \"127.0.0.1:{port}\"\n  token \"author\" {{\n    \
             secret = \"job-author-secret-0123\"\n    scope = \"submit\"\n  }}\n}}\n"
        )
    });
    strict.start().await;
    permissive.start().await;
    let job = r#"
job "as-root" {
  group "g" {
    constraint {
      attribute = "${node.unique.name}"
      value     = "strict"
    }
    task "t" {
      driver = "exec"
      user   = "root"
      config {
        command = "/bin/sleep"
        args    = ["600"]
      }
    }
  }
}
"#;
    permissive.submit("as-root.hcl", job).await.unwrap();
    wait_allocs(
        &permissive,
        "as-root",
        "the alloc refused by the strict node",
        Duration::from_secs(20),
        |all| {
            all.iter()
                .any(|(_, _, node, status)| node == "strict" && status == "failed")
        },
    )
    .await;
    let listed: Value = permissive
        .client()
        .get("/v1/job/as-root/allocations")
        .await
        .unwrap();
    let why = listed[0]["ClientDescription"].as_str().unwrap_or_default();
    assert!(why.contains("root"), "the refusal says why: {listed}");
    // A job author's token may submit, but not drain or fence off a node (Nomad's
    // node:write is the operator's).
    let author = berth_api::client::Client::new(&permissive.address())
        .unwrap()
        .with_token(Some("job-author-secret-0123".into()));
    let nodes: Value = author.get("/v1/nodes").await.unwrap();
    let strict_id = nodes[1]["ID"].as_str().unwrap().to_string();
    for (path, body) in [
        ("drain", serde_json::json!({"DrainSpec": {"Deadline": -1}})),
        (
            "eligibility",
            serde_json::json!({"Eligibility": "ineligible"}),
        ),
    ] {
        let refused = author
            .post::<_, Value>(&format!("/v1/node/{strict_id}/{path}"), &body)
            .await
            .unwrap_err();
        assert!(
            refused.to_string().contains("needs the operator"),
            "{path}: {refused}"
        );
    }
    let node: Value = author.get(&format!("/v1/node/{strict_id}")).await.unwrap();
    assert_eq!(node["SchedulingEligibility"], "eligible");
    // Nothing of it runs on the strict node.
    let local: Value = strict
        .client()
        .get("/v1/berth/allocations")
        .await
        .unwrap_or(Value::Null);
    assert!(
        local.as_array().is_none_or(|a| a.is_empty()),
        "the strict node recorded nothing: {local}"
    );
}

/// etcd goes away: running allocs keep running, a submission fails at once saying the
/// store is unavailable and since when, and once etcd is back the agents carry on (the
/// next job is placed) without having granted or lost anything in between.
#[tokio::test(flavor = "multi_thread")]
async fn an_etcd_outage_fails_submissions_clearly_and_stops_nothing() {
    let mut etcd = EtcdServer::start();
    let mut a = member(&etcd, "node-a");
    let mut b = member(&etcd, "node-b");
    a.start().await;
    b.start().await;
    let one = SPREAD_JOB
        .replace("count = 6", "count = 2")
        .replace("\"web\"", "\"one\"");
    a.submit("one.hcl", &one).await.unwrap();
    wait_allocs(&b, "one", "2 running", Duration::from_secs(30), |all| {
        running_per_node(all).values().sum::<usize>() == 2
    })
    .await;
    let local: Value = a.client().get("/v1/berth/allocations").await.unwrap();
    let running_here: Vec<String> = local
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["id"].as_str().unwrap().to_string())
        .collect();
    assert!(!running_here.is_empty(), "{local}");

    etcd.stop();
    let two = one.replace("\"one\"", "\"two\"");
    let started = Instant::now();
    let refused = a.submit("two.hcl", &two).await.unwrap_err().to_string();
    assert!(
        refused.contains("cluster store") && refused.contains("unavailable since"),
        "{refused}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );
    // A stop cannot be recorded either, and says why (not "no such job").
    let (code, out, err) = a.cli(&["job", "stop", "one"]);
    assert_ne!(code, 0, "{out}");
    assert!(err.contains("unavailable since"), "{out}{err}");
    // Longer than the heartbeat TTL: nothing here is stopped for it.
    tokio::time::sleep(Duration::from_secs(TTL_SECS + 1)).await;
    for id in &running_here {
        let alloc = a.alloc(id).await;
        assert_eq!(
            alloc.client_status,
            berth_model::status::ClientStatus::Running,
            "{alloc:#?}"
        );
    }

    etcd.resume();
    // Back: submissions work again and the new job is placed.
    let deadline = Instant::now() + Duration::from_secs(20);
    while let Err(error) = a.submit("two.hcl", &two).await {
        assert!(Instant::now() < deadline, "still refused: {error}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    wait_allocs(&b, "two", "2 running", Duration::from_secs(30), |all| {
        running_per_node(all).values().sum::<usize>() == 2
    })
    .await;
    let still: Vec<(String, String, String, String)> = allocs(&b, "one").await;
    assert_eq!(
        running_per_node(&still).values().sum::<usize>(),
        2,
        "the first job's allocs ran through: {still:#?}"
    );
}
