//! One node shape on both planes: a lone agent describes itself as the record a cluster
//! member registers, so `GET /v1/nodes` and `GET /v1/node/:id` answer with the same
//! fields, and the same rules (a driver the operator left off is unhealthy, a host
//! volume has its path, what the node reserves is shown),
//! whichever plane answers.

use std::collections::BTreeSet;

use berth_harness::AgentProcess;
use berth_testkit::etcd::EtcdServer;
use serde_json::Value;

/// The field names of a JSON object.
fn fields(value: &Value) -> BTreeSet<String> {
    value
        .as_object()
        .unwrap_or_else(|| panic!("not an object: {value}"))
        .keys()
        .cloned()
        .collect()
}

/// What both nodes keep for themselves.
const RESERVED: &str = "reserved {\n  cpu = 100\n  memory = 64\n  disk = 32\n}\n";

async fn node_views(agent: &AgentProcess) -> (Value, Value) {
    let listed: Value = agent.client().get("/v1/nodes").await.unwrap();
    let stub = listed[0].clone();
    let id = stub["ID"].as_str().unwrap().to_string();
    let full: Value = agent.client().get(&format!("/v1/node/{id}")).await.unwrap();
    (stub, full)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lone_agent_and_a_cluster_member_show_their_node_in_one_shape() {
    let etcd = EtcdServer::start();
    let endpoint = etcd.endpoint();
    let mut clustered = AgentProcess::production(move |_, _| {
        format!(
            "name = \"member\"\n{RESERVED}cluster {{\n  store = \"etcd\"\n  endpoints = \
             [\"{endpoint}\"]\n  prefix = \"/e2e-shape\"\n}}\n"
        )
    });
    let mut lone = AgentProcess::production(|_, _| format!("name = \"lone\"\n{RESERVED}"));
    clustered.start().await;
    lone.start().await;
    let (member_stub, member_node) = node_views(&clustered).await;
    let (lone_stub, lone_node) = node_views(&lone).await;

    assert_eq!(fields(&lone_stub), fields(&member_stub));
    assert_eq!(fields(&lone_node), fields(&member_node));
    // Same config but the cluster block: the same drivers, volumes and attributes.
    for key in ["Drivers", "HostVolumes", "NodeResources", "Attributes"] {
        assert_eq!(
            fields(&lone_node[key]),
            fields(&member_node[key]),
            "{key}: {} against {}",
            lone_node[key],
            member_node[key]
        );
    }
    assert_eq!(lone_node["Name"], "lone");
    assert_eq!(member_node["Name"], "member");
    // The same rules: raw_exec, which the operator did not enable, is detected and
    // unhealthy on both; mock, enabled, is healthy on both.
    for node in [&lone_node, &member_node] {
        assert_eq!(node["Drivers"]["raw_exec"]["Healthy"], false, "{node}");
        assert_eq!(node["Drivers"]["mock"]["Healthy"], true, "{node}");
        assert_eq!(
            fields(&node["Drivers"]["exec"]),
            fields(&member_node["Drivers"]["exec"])
        );
        let scratch = &node["HostVolumes"]["scratch"];
        assert!(
            scratch["Path"].as_str().unwrap().ends_with("/scratch"),
            "{scratch}"
        );
        assert_eq!(scratch["ReadOnly"], false);
        assert!(
            node["NodeResources"]["Memory"]["MemoryMB"]
                .as_u64()
                .unwrap()
                > 0
        );
    }
}

/// The running alloc of the job `shape` as `GET /v1/allocations` lists it and as
/// `GET /v1/allocation/:id` reads it, once its task runs.
async fn alloc_views(agent: &AgentProcess) -> (Value, Value) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let listed: Value = agent.client().get("/v1/allocations").await.unwrap();
        let running = listed.as_array().and_then(|allocs| {
            allocs
                .iter()
                .find(|a| a["JobID"] == "shape" && a["TaskStates"]["t"]["State"] == "running")
        });
        if let Some(stub) = running {
            let id = stub["ID"].as_str().unwrap().to_string();
            let full: Value = agent
                .client()
                .get(&format!("/v1/allocation/{id}"))
                .await
                .unwrap();
            return (stub.clone(), full);
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the alloc never ran: {listed:#}\n{}",
            agent.output()
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// An alloc has one shape on both planes too: a lone agent lists and reads its allocs
/// through the cluster's records with its runner's fresher task states, as a member
/// does (`api/nomad/cluster.rs`'s one stub builder).
#[tokio::test(flavor = "multi_thread")]
async fn a_lone_agent_and_a_cluster_member_show_their_allocs_in_one_shape() {
    let etcd = EtcdServer::start();
    let endpoint = etcd.endpoint();
    let mut clustered = AgentProcess::production(move |_, _| {
        format!(
            "name = \"member\"\ncluster {{\n  store = \"etcd\"\n  endpoints = \
             [\"{endpoint}\"]\n  prefix = \"/e2e-alloc-shape\"\n}}\n"
        )
    });
    let mut lone = AgentProcess::production(|_, _| "name = \"lone\"\n".to_string());
    clustered.start().await;
    lone.start().await;
    let job = "job \"shape\" {\n  group \"g\" {\n    task \"t\" {\n      driver = \"mock\"\n      \
               config {\n        run_for = \"1h\"\n      }\n    }\n  }\n}\n";
    for agent in [&lone, &clustered] {
        agent.submit("shape.nomad.hcl", job).await.unwrap();
    }
    let (member_stub, member_alloc) = alloc_views(&clustered).await;
    let (lone_stub, lone_alloc) = alloc_views(&lone).await;

    assert_eq!(fields(&lone_stub), fields(&member_stub));
    assert_eq!(fields(&lone_alloc), fields(&member_alloc));
    for (key, stub, alloc) in [
        ("lone", &lone_stub, &lone_alloc),
        ("member", &member_stub, &member_alloc),
    ] {
        assert_eq!(stub["NodeName"], key, "{stub}");
        assert_eq!(stub["ClientStatus"], "running", "{stub}");
        assert_eq!(stub["DesiredStatus"], "run", "{stub}");
        assert_eq!(stub["TaskGroup"], "g", "{stub}");
        assert_eq!(stub["JobType"], "service", "{stub}");
        assert!(stub["CreateTime"].as_u64().unwrap() > 0, "{stub}");
        // The read is the list's stub and the job.
        assert_eq!(alloc["ID"], stub["ID"]);
        assert_eq!(alloc["Job"]["ID"], "shape");
        assert_eq!(
            fields(&alloc["TaskStates"]["t"]),
            fields(&member_stub["TaskStates"]["t"])
        );
    }
}

/// A `reserved` block that keeps all the node has is refused at start, saying what
/// the node has.
#[tokio::test(flavor = "multi_thread")]
async fn a_reserved_block_larger_than_the_node_is_refused_at_start() {
    let config = berth_client::config::AgentConfig::parse(
        "agent.hcl",
        "reserved {\n  memory = 100000000\n}\n",
    )
    .unwrap();
    let started = berth_harness::InProcessAgent::start_with(
        "berth-e2e-reserved",
        config,
        Default::default(),
        Default::default(),
    )
    .await;
    let Err(error) = started else {
        panic!("an agent reserving 100 TB of memory started");
    };
    let text = error.to_string();
    assert!(
        text.starts_with("reserved { memory = 100000000 } keeps all this node has: it has ")
            && text.contains("MB of memory in all"),
        "{text}"
    );
}
