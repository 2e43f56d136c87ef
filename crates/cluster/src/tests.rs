//! The cluster store against a real etcd (started per test in a temp dir).

use std::sync::Arc;
use std::time::Duration;

use super::catalog::EtcdCatalog;
use super::etcd_access::EtcdAccess;
use super::*;
use berth_model::cluster::{ClusterSettings, StoreKind};
use berth_model::csi::AccessMode;
use berth_state::catalog::{Catalog, CatalogError, Claim, ClaimMode, Volume};
use berth_testkit::etcd::EtcdServer;

pub(super) fn settings(server: &EtcdServer, prefix: &str) -> ClusterSettings {
    ClusterSettings {
        store: StoreKind::Etcd,
        endpoints: vec![server.endpoint()],
        prefix: prefix.into(),
        dial_timeout: Duration::from_secs(2),
        heartbeat_ttl: Duration::from_secs(2),
        ..ClusterSettings::default()
    }
}

pub(super) fn node(name: &str) -> NodeRecord {
    NodeRecord {
        id: random_id(),
        name: name.into(),
        datacenter: "dc1".into(),
        node_pool: "default".into(),
        node_class: String::new(),
        http_addr: None,
        attributes: Default::default(),
        drivers: Default::default(),
        host_volumes: Vec::new(),
        host_volume_paths: Default::default(),
        eligibility: "eligible".into(),
        drain: false,
        cpu_mhz: 1000,
        memory_mb: 1024,
        disk_mb: 0,
        reserved: Default::default(),
        reserved_ports: Vec::new(),
        registered_ms: 0,
    }
}

pub(super) fn join(server: &EtcdServer, name: &str) -> (Arc<Cluster>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::join(&settings(server, "/berth"), dir.path(), node(name)).unwrap();
    (cluster, dir)
}

pub(super) fn volume(id: &str) -> Volume {
    Volume {
        id: id.into(),
        name: id.into(),
        plugin_id: "hostpath".into(),
        external_id: id.into(),
        capabilities: vec![],
        capacity_bytes: 0,
        parameters: Default::default(),
        context: Default::default(),
        secrets: Default::default(),
        origin: "registered".into(),
        accessible_topology: Vec::new(),
    }
}

pub(super) fn writer(alloc: &str, node: &str) -> Claim {
    Claim {
        alloc_id: alloc.into(),
        alloc_name: format!("job.g[{alloc}]"),
        mode: ClaimMode::Write,
        access_mode: AccessMode::SingleNodeWriter,
        node: node.into(),
        since: 0,
        external_node_id: None,
    }
}

#[test]
fn two_agents_claiming_one_single_writer_volume_at_once_never_both_hold_it() {
    let server = EtcdServer::start();
    let (a, _da) = join(&server, "a");
    let (b, _db) = join(&server, "b");
    let catalog_a = Arc::new(EtcdCatalog::new(a));
    let catalog_b = Arc::new(EtcdCatalog::new(b));
    catalog_a.register_volume(volume("data")).unwrap();
    for round in 0..100 {
        let barrier = Arc::new(std::sync::Barrier::new(2));
        let race = |catalog: Arc<EtcdCatalog>, node: &'static str| {
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                barrier.wait();
                catalog.claim("data", writer(&format!("{node}-{round}"), node))
            })
        };
        let first = race(catalog_a.clone(), "a");
        let second = race(catalog_b.clone(), "b");
        let results = [first.join().unwrap(), second.join().unwrap()];
        let won = results.iter().filter(|r| r.is_ok()).count();
        assert_eq!(won, 1, "round {round}: {results:?}");
        let refusal = results.iter().find_map(|r| r.as_ref().err()).unwrap();
        assert!(
            matches!(refusal, CatalogError::Refused(m) if m.contains("already writes to it")),
            "round {round}: the loser is told who holds it: {refusal}"
        );
        let holders = catalog_b.volume("data").unwrap().claims;
        assert_eq!(holders.len(), 1, "round {round}: {holders:?}");
        catalog_a.release("data", &holders[0].alloc_id).unwrap();
        assert!(catalog_b.volume("data").unwrap().claims.is_empty());
    }
}

#[test]
fn nodes_register_under_leases_and_a_silent_node_is_gone_within_its_ttl() {
    let server = EtcdServer::start();
    let (a, _da) = join(&server, "a");
    let (b, _db) = join(&server, "b");
    let names = |c: &Cluster| -> Vec<String> {
        c.nodes()
            .unwrap()
            .into_iter()
            .map(|n| n.record.name)
            .collect()
    };
    assert_eq!(names(&a), ["a", "b"]);
    // b's agent goes away without a word (its keep-alives stop): its lease runs out.
    let started = std::time::Instant::now();
    drop_without_revoking(b);
    while names(&a) != ["a"] {
        assert!(
            started.elapsed() < Duration::from_secs(2 + 3),
            "b was still listed {:?} after its 2 s TTL",
            started.elapsed()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // a kept its lease alive all along, past several TTLs.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(names(&a), ["a"]);
}

/// Stops a member's keep-alives as a killed agent would (no revoke).
fn drop_without_revoking(cluster: Arc<Cluster>) {
    let cluster = Arc::into_inner(cluster).expect("the only handle");
    cluster.lease.abandon();
}

#[test]
fn a_prefix_of_another_cluster_and_a_newer_layout_are_refused_with_both_sides_named() {
    let server = EtcdServer::start();
    let (_a, dir) = join(&server, "a");
    // The same data dir against a prefix another cluster made first.
    let other = tempfile::tempdir().unwrap();
    let _b = Cluster::join(&settings(&server, "/other"), other.path(), node("b")).unwrap();
    let error = Cluster::join(&settings(&server, "/other"), dir.path(), node("a")).unwrap_err();
    let message = error.to_string();
    assert!(
        matches!(error, ClusterError::OtherCluster { .. }) && message.contains("\"/other\""),
        "{message}"
    );
    // A layout version from a newer berth.
    let access = EtcdAccess::from_settings(&server.settings("/newer")).unwrap();
    let etcd = etcd::Etcd::connect(&access).unwrap();
    let writer = etcd.clone();
    etcd.block(async move { writer.put("/newer/meta/cluster-id", b"x".to_vec(), 0).await })
        .unwrap();
    let writer = etcd.clone();
    etcd.block(async move { writer.put("/newer/meta/schema", b"7".to_vec(), 0).await })
        .unwrap();
    let fresh = tempfile::tempdir().unwrap();
    let message = Cluster::join(&settings(&server, "/newer"), fresh.path(), node("c"))
        .unwrap_err()
        .to_string();
    assert!(
        message.contains("layout version 7") && message.contains(&format!("version {SCHEMA}")),
        "{message}"
    );
}

#[test]
fn an_unreachable_store_is_a_clear_error_within_the_dial_timeout() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut settings = ClusterSettings {
        store: StoreKind::Etcd,
        endpoints: vec![format!("http://127.0.0.1:{port}")],
        ..ClusterSettings::default()
    };
    settings.dial_timeout = Duration::from_millis(500);
    let dir = tempfile::tempdir().unwrap();
    let started = std::time::Instant::now();
    let message = Cluster::join(&settings, dir.path(), node("a"))
        .unwrap_err()
        .to_string();
    assert!(
        message.contains("is unavailable") && message.contains(&format!("127.0.0.1:{port}")),
        "{message}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn a_claim_made_while_etcd_is_down_fails_clearly_and_nothing_is_double_granted_after() {
    let mut server = EtcdServer::start();
    let (a, _da) = join(&server, "a");
    let (b, _db) = join(&server, "b");
    let catalog_a = EtcdCatalog::new(a);
    let catalog_b = EtcdCatalog::new(b);
    catalog_a.register_volume(volume("data")).unwrap();
    catalog_a.claim("data", writer("first", "a")).unwrap();
    server.stop();
    let error = catalog_b.claim("data", writer("second", "b")).unwrap_err();
    assert!(error.to_string().contains("unavailable"), "{error}");
    server.resume();
    // Back: the holder is still the first, and the second is refused, not granted.
    let mut answer = catalog_b.claim("data", writer("second", "b"));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while matches!(answer, Err(CatalogError::Store(_))) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        answer = catalog_b.claim("data", writer("second", "b"));
    }
    assert!(
        matches!(answer, Err(CatalogError::Refused(_))),
        "{answer:?}"
    );
    let claims = catalog_a.volume("data").unwrap().claims;
    assert_eq!(claims.len(), 1);
    assert_eq!(claims[0].alloc_id, "first");
}

#[test]
fn a_forged_placement_whose_ids_could_steer_paths_is_never_read() {
    let server = EtcdServer::start();
    let (a, _da) = join(&server, "a");
    let node = a.node_id().to_string();
    let forged = |alloc_id: &str, job_id: &str| {
        serde_json::json!({
            "alloc_id": alloc_id, "job_id": job_id, "job_version": 1, "group": "g",
            "group_index": 0, "alloc_index": 0, "name": "x.g[0]", "node_id": node,
            "cpu_mhz": 1, "memory_mb": 1, "placed_ms": 0,
        })
        .to_string()
        .into_bytes()
    };
    let good = random_id();
    for (key_alloc, alloc_id, job_id) in [
        ("evil1", "/etc", "web"),
        ("..", "../../../../tmp/escape", "web"),
        (good.as_str(), good.as_str(), "../jobs"),
        (good.as_str(), "11111111-1111-4111-8111-111111111111", "web"),
    ] {
        let key = a.key(&["allocs", &node, key_alloc]);
        let value = forged(alloc_id, job_id);
        let etcd = a.store().clone();
        a.store()
            .block(async move { etcd.put(&key, value, 0).await })
            .unwrap();
        let (placements, _) = a.own_placements().unwrap();
        assert!(
            placements.is_empty(),
            "{alloc_id:?} / {job_id:?}: {placements:?}"
        );
        assert!(a.snapshot().unwrap().placements.is_empty());
    }
    // A well-formed one is read.
    let key = a.key(&["allocs", &node, &good]);
    let value = forged(&good, "web");
    let etcd = a.store().clone();
    a.store()
        .block(async move { etcd.put(&key, value, 0).await })
        .unwrap();
    assert_eq!(a.own_placements().unwrap().0.len(), 1);
}

/// Two live nodes of one name would each judge the other's CSI claims as its own (a
/// forced detach on one released the other's running alloc's claim) and take each
/// other's calls: a second node of a live node's name is refused at join, naming the
/// holder. The same node joining again (a restarted agent, its old lease still alive)
/// is not, and the name is free once its holder's lease is gone.
#[test]
fn a_second_live_node_of_the_same_name_is_refused_at_join() {
    let server = EtcdServer::start();
    let (first, first_dir) = join(&server, "twin");
    let other = tempfile::tempdir().unwrap();
    let error =
        Cluster::join(&settings(&server, "/berth"), other.path(), node("twin")).unwrap_err();
    let message = error.to_string();
    assert!(
        matches!(&error, ClusterError::NameTaken { name, other } if name == "twin" && other == first.node_id()),
        "{message}"
    );
    assert!(message.contains("set another `name`"), "{message}");
    assert_eq!(
        first.nodes().unwrap().len(),
        1,
        "the twin wrote no node record"
    );

    // The first node restarting (same id, its old lease still alive) gets its name back.
    let again = NodeRecord {
        id: first.node_id().to_string(),
        ..node("twin")
    };
    let restarted = Cluster::join(&settings(&server, "/berth"), first_dir.path(), again).unwrap();
    drop_without_revoking(first);
    // Once the name's holder is gone (its lease ran out), another node may take it.
    let holder = restarted.node_id().to_string();
    drop_without_revoking(restarted);
    let started = std::time::Instant::now();
    loop {
        match Cluster::join(&settings(&server, "/berth"), other.path(), node("twin")) {
            Ok(joined) => {
                assert_ne!(joined.node_id(), holder);
                break;
            }
            Err(ClusterError::NameTaken { .. }) => {
                assert!(
                    started.elapsed() < Duration::from_secs(2 + 3),
                    "never freed"
                );
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(error) => panic!("{error}"),
        }
    }
}

/// A launched child is written once (two schedulers launching one time write one), and
/// not at all once its parent changed since it was read (stopped, submitted again).
#[test]
fn a_child_is_created_once_and_not_after_its_parent_changed() {
    use super::state::{ChildCreated, ClusterJob};
    let server = EtcdServer::start();
    let (a, _da) = join(&server, "a");
    let parent = ClusterJob {
        id: "tick".into(),
        source_name: "tick.hcl".into(),
        source: "job \"tick\" {}".into(),
        variables: Default::default(),
        submitted_ms: 0,
        stopped: false,
        may_run_plugins: false,
        child_of: None,
        by_operator: false,
        owner: None,
        typed: None,
    };
    let version = a.put_job(&parent).unwrap();
    let child = |id: &str| ClusterJob {
        id: id.into(),
        child_of: Some(berth_state::ChildOf {
            parent: "tick".into(),
            meta: Vec::new(),
            payload: None,
        }),
        ..parent.clone()
    };
    let first = child("tick/periodic-1");
    assert_eq!(
        a.create_child(&first, version, &eval()).unwrap(),
        ChildCreated::Created
    );
    assert_eq!(
        a.create_child(&first, version, &eval()).unwrap(),
        ChildCreated::Exists
    );
    let stopped = ClusterJob {
        stopped: true,
        ..parent.clone()
    };
    a.put_job(&stopped).unwrap();
    assert_eq!(
        a.create_child(&child("tick/periodic-2"), version, &eval())
            .unwrap(),
        ChildCreated::ParentChanged
    );
    assert!(a.job("tick/periodic-2").unwrap().is_none());
}

/// A stop or purge writes only the version of the job it read: a resubmit by another
/// agent in between is never overwritten by the stopped older source, nor deleted.
#[test]
fn a_stop_or_purge_of_a_version_read_before_a_resubmit_writes_nothing() {
    use super::state::ClusterJob;
    let server = EtcdServer::start();
    let (a, _da) = join(&server, "a");
    let (b, _db) = join(&server, "b");
    let first = ClusterJob {
        id: "lk".into(),
        source_name: "lk.hcl".into(),
        source: "job \"lk\" {}".into(),
        variables: Default::default(),
        submitted_ms: 1,
        stopped: true,
        may_run_plugins: false,
        child_of: None,
        by_operator: false,
        owner: None,
        typed: None,
    };
    let stopped_version = a.put_job(&first).unwrap();
    // Agent b resubmits the job after agent a read the stopped version.
    let resubmitted = ClusterJob {
        submitted_ms: 2,
        stopped: false,
        ..first.clone()
    };
    b.put_job(&resubmitted).unwrap();
    assert!(!a.delete_job_if("lk", stopped_version, &eval()).unwrap());
    assert!(!a.put_job_if(&first, stopped_version, &eval()).unwrap());
    let (kept, version) = a.job("lk").unwrap().expect("the resubmit was deleted");
    assert_eq!(kept, resubmitted);
    // At the version it reads now, it writes.
    assert!(a.delete_job_if("lk", version, &eval()).unwrap());
    assert!(a.job_entry("lk").unwrap().is_none());
    // A record no agent can read still has a version, so it can be purged.
    let key = a.key(&["jobs", "bad"]);
    let etcd = a.store().clone();
    a.store()
        .block(async move { etcd.put(&key, b"{not json".to_vec(), 0).await })
        .unwrap();
    let (unreadable, version) = a.job_entry("bad").unwrap().unwrap();
    assert!(unreadable.is_none());
    assert!(a.delete_job_if("bad", version, &eval()).unwrap());
}

fn eval() -> super::evals::Evaluation {
    super::evals::Evaluation::pending("test", super::evals::trigger::REGISTER)
}
