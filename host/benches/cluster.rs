//! The cluster store against the embedded one, in the same run, interleaved, medians:
//!
//! - **claim + release** of a single-writer volume: `EtcdCatalog` (a transaction each,
//!   on a real etcd on loopback) next to `EmbeddedCatalog` (the agent's redb file);
//! - **placement throughput**: the scheduler's read of the cluster, its plan and the
//!   transactions that write it, for a job of many allocs over many nodes, next to what
//!   one node does when it places a job (all alloc records in one redb transaction);
//! - **scale**: many simulated nodes (each registered under its own lease, kept alive
//!   from this process) and many allocs placed: etcd's request rate (from etcd's own
//!   `grpc_server_handled_total`) and the scheduler's time per placement; then 10,000
//!   jobs of 10 allocs placed, and the time of one round after one change: by the
//!   leader's mirror (kept from its watch, planning what changed) next to a round that
//!   reads the whole cluster, interleaved.
//!
//! It ends with `summary: name = value` lines (`common::summary`), the same-run
//! comparisons last: `summary: claim_release_etcd_over_embedded = …` and
//! `summary: placement_time_etcd_over_embedded = …`.
//!
//! Run as `cargo bench -p berth --bench cluster` (needs the `etcd` binary: Debian's
//! `etcd-server`). `BERTH_BENCH_SMALL=1` runs it small (CI).

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc::Receiver;

use berth_cluster::catalog::EtcdCatalog;
use berth_cluster::etcd::Change;
use berth_cluster::scheduler::mirror::Mirror;
use berth_cluster::state::ClusterJob;
use berth_cluster::{Cluster, NodeRecord, scheduler};
use berth_model::cluster::{ClusterSettings, StoreKind};
use berth_model::csi::AccessMode;
use berth_state::catalog::embedded::EmbeddedCatalog;
use berth_state::catalog::{Catalog, Claim, ClaimMode, Volume};
use berth_testkit::etcd::EtcdServer;
use common::{median, micros, ratio, sized, summary};

fn settings(etcd: &EtcdServer, prefix: &str) -> ClusterSettings {
    ClusterSettings {
        store: StoreKind::Etcd,
        endpoints: vec![etcd.endpoint()],
        prefix: prefix.into(),
        heartbeat_ttl: Duration::from_secs(10),
        ..ClusterSettings::default()
    }
}

fn node(index: usize) -> NodeRecord {
    NodeRecord {
        id: format!("{index:08x}-0000-4000-8000-000000000000"),
        name: format!("sim-{index}"),
        datacenter: "dc1".into(),
        node_pool: "default".into(),
        node_class: String::new(),
        http_addr: None,
        attributes: [("attr.kernel.name".to_string(), "linux".to_string())]
            .into_iter()
            .collect(),
        drivers: [("exec".to_string(), true)].into_iter().collect(),
        host_volumes: Vec::new(),
        host_volume_paths: Default::default(),
        eligibility: "eligible".into(),
        drain: false,
        cpu_mhz: 64_000,
        memory_mb: 256 * 1024,
        disk_mb: 0,
        reserved: Default::default(),
        reserved_ports: Vec::new(),
        registered_ms: 0,
    }
}

fn volume() -> Volume {
    Volume {
        id: "data".into(),
        name: "data".into(),
        plugin_id: "hostpath".into(),
        external_id: "data".into(),
        capabilities: vec![],
        capacity_bytes: 0,
        parameters: Default::default(),
        context: Default::default(),
        secrets: Default::default(),
        origin: "registered".into(),
        accessible_topology: Vec::new(),
    }
}

fn writer(alloc: &str) -> Claim {
    Claim {
        alloc_id: alloc.into(),
        alloc_name: format!("bench.g[{alloc}]"),
        mode: ClaimMode::Write,
        access_mode: AccessMode::SingleNodeWriter,
        node: "n1".into(),
        since: 0,
        external_node_id: None,
    }
}

fn job(count: usize) -> ClusterJob {
    ClusterJob {
        id: "bench".into(),
        source_name: "bench.hcl".into(),
        source: format!(
            "job \"bench\" {{\n  group \"g\" {{\n    count = {count}\n    task \"t\" {{\n      \
             driver = \"exec\"\n      config {{\n        command = \"/bin/true\"\n      }}\n      \
             resources {{\n        cpu = 10\n        memory = 10\n      }}\n    }}\n  }}\n}}\n"
        ),
        variables: Default::default(),
        submitted_ms: 0,
        stopped: false,
        may_run_plugins: false,
        child_of: None,
        by_operator: false,
        owner: None,
        typed: None,
    }
}

/// A job of 10 allocs named `id`, stored typed as a submit stores it.
fn small_job(id: &str) -> ClusterJob {
    let mut job = job(10);
    job.source = job
        .source
        .replace("job \"bench\"", &format!("job \"{id}\""));
    job.id = id.to_string();
    let parsed = berth_jobspec_hcl::parse(&job.source_name, &job.source).unwrap();
    job.typed = berth_cluster::typed::TypedJob::of(&parsed);
    job
}

/// Claim then release, `rounds` times; the time of each pair.
fn claim_release(catalog: &dyn Catalog, rounds: usize) -> Vec<Duration> {
    (0..rounds)
        .map(|round| {
            let alloc = format!("a{round}");
            let started = Instant::now();
            catalog.claim("data", writer(&alloc)).unwrap();
            catalog.release("data", &alloc).unwrap();
            started.elapsed()
        })
        .collect()
}

/// Sum of etcd's `grpc_server_handled_total` (every gRPC request it answered).
fn etcd_requests(etcd: &EtcdServer) -> f64 {
    use std::io::{Read, Write};
    let address = etcd.endpoint().trim_start_matches("http://").to_string();
    let mut stream = std::net::TcpStream::connect(&address).unwrap();
    write!(
        stream,
        "GET /metrics HTTP/1.0\r\nHost: {address}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap();
    text.lines()
        .filter(|l| l.starts_with("grpc_server_handled_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// One placement round: read the cluster, plan, write; the allocs placed and the time.
async fn place_round(
    cluster: &Arc<Cluster>,
    leader_key: &str,
    leader_revision: i64,
) -> (usize, Duration) {
    let started = Instant::now();
    let snapshot = {
        let cluster = cluster.clone();
        tokio::task::spawn_blocking(move || cluster.snapshot())
            .await
            .unwrap()
            .unwrap()
    };
    let plan = scheduler::plan(&snapshot, 1);
    assert!(
        scheduler::apply(
            cluster,
            &plan,
            &snapshot.blocked,
            leader_key,
            leader_revision
        )
        .await
        .unwrap(),
        "still the leader"
    );
    (plan.place.len(), started.elapsed())
}

/// One round of the leader's mirror, as the leader makes it: plan what changed, write
/// it, complete the evaluations. The allocs placed and the jobs planned.
async fn mirror_round(
    cluster: &Arc<Cluster>,
    mirror: &mut Mirror,
    leader_key: &str,
    leader_revision: i64,
) -> (usize, usize) {
    let now = berth_cluster::now_ms();
    let (round, plan) = tokio::task::block_in_place(|| mirror.plan_round(now));
    let written = scheduler::apply(
        cluster,
        &plan,
        &round.snapshot.blocked,
        leader_key,
        leader_revision,
    )
    .await
    .unwrap();
    assert!(written, "still the leader");
    let outcome = mirror.eval_outcome(&round, &plan, now);
    scheduler::evals::apply(cluster, &outcome, leader_key, leader_revision)
        .await
        .unwrap();
    let planned = (plan.place.len(), round.jobs_planned());
    mirror.finished(round, &plan, true);
    planned
}

/// Applies the watch's changes to `mirror` until it holds `revision`.
async fn catch_up(mirror: &mut Mirror, changes: &mut Receiver<Change>, revision: i64) {
    while mirror.revision() < revision {
        let change = changes.recv().await.expect("the watch runs");
        mirror.apply(&change);
    }
}

/// Rounds of the mirror until what it wrote comes back and plans nothing more.
async fn settle(
    cluster: &Arc<Cluster>,
    mirror: &mut Mirror,
    changes: &mut Receiver<Change>,
    leader_key: &str,
    leader_revision: i64,
) {
    for _ in 0..5 {
        let now = cluster.store().revision(leader_key).await.unwrap();
        catch_up(mirror, changes, now).await;
        if !mirror.wants_round(berth_cluster::now_ms()) {
            return;
        }
        mirror_round(cluster, mirror, leader_key, leader_revision).await;
    }
}

/// Removes every placement (so the next round places them all again).
async fn clear_placements(cluster: &Arc<Cluster>) {
    let prefix = format!("{}/", cluster.key(&["allocs"]));
    let etcd = cluster.store();
    let (entries, _) = etcd.list(&prefix).await.unwrap();
    for chunk in entries.chunks(100) {
        let writes = chunk
            .iter()
            .map(|e| berth_cluster::etcd::Write::Delete(e.key.clone()))
            .collect();
        etcd.transaction(Vec::new(), writes).await.unwrap();
    }
}

fn main() {
    // The jobspec reader, as the `berth` binary installs it at its start.
    berth_jobspec_hcl::install();
    common::block_on(async {
        let etcd = EtcdServer::start();
        let scratch = tempfile::tempdir().unwrap();

        // Claim + release: etcd next to redb, interleaved.
        let member = {
            let settings = settings(&etcd, "/bench-claims");
            let dir = scratch.path().join("claims");
            std::fs::create_dir_all(&dir).unwrap();
            tokio::task::spawn_blocking(move || Cluster::join(&settings, &dir, node(0)))
                .await
                .unwrap()
                .unwrap()
        };
        let on_etcd = EtcdCatalog::new(member.clone());
        let (store, _) = berth_state::StateStore::open(&scratch.path().join("state.db")).unwrap();
        let embedded = EmbeddedCatalog::new(Arc::new(store));
        on_etcd.register_volume(volume()).unwrap();
        embedded.register_volume(volume()).unwrap();
        let rounds = sized(20, 4);
        let per_round = sized(50, 10);
        let (mut etcd_times, mut embedded_times) = (Vec::new(), Vec::new());
        tokio::task::block_in_place(|| {
            for _ in 0..rounds {
                etcd_times.extend(claim_release(&on_etcd, per_round));
                embedded_times.extend(claim_release(&embedded, per_round));
            }
        });
        let claim_etcd = median(etcd_times);
        let claim_embedded = median(embedded_times);
        println!(
            "claim + release: etcd {:.0} µs, embedded {:.0} µs (median of {} each)",
            micros(claim_etcd),
            micros(claim_embedded),
            rounds * per_round
        );

        // Placement throughput: many allocs over many nodes, etcd next to redb.
        let nodes = sized(1_000, 100);
        let allocs = sized(10_000, 1_000);
        let cluster = {
            let settings = settings(&etcd, "/bench-place");
            let dir = scratch.path().join("place");
            std::fs::create_dir_all(&dir).unwrap();
            tokio::task::spawn_blocking(move || Cluster::join(&settings, &dir, node(0)))
                .await
                .unwrap()
                .unwrap()
        };
        // The simulated nodes: each under its own lease, kept alive from here.
        let requests_before = etcd_requests(&etcd);
        let registered = Instant::now();
        let mut leases = Vec::new();
        for index in 1..nodes {
            let lease = cluster
                .store()
                .grant_lease(Duration::from_secs(10))
                .await
                .unwrap();
            let record = node(index);
            cluster
                .store()
                .put(
                    &cluster.key(&["nodes", &record.id]),
                    serde_json::to_vec(&record).unwrap(),
                    lease,
                )
                .await
                .unwrap();
            leases.push(lease);
        }
        let registration = registered.elapsed();
        let keeper = {
            let etcd = cluster.store().clone();
            let leases = leases.clone();
            tokio::spawn(async move {
                // Each lease renewed every TTL/3, spread evenly, as agents would.
                let period = Duration::from_secs(10) / 3;
                let gap = period / u32::try_from(leases.len().max(1)).unwrap_or(1);
                loop {
                    for lease in &leases {
                        let _ = etcd.keep_alive_once(*lease).await;
                        tokio::time::sleep(gap).await;
                    }
                }
            })
        };
        cluster.put_job(&job(allocs)).unwrap();
        let leader = cluster
            .store()
            .campaign(
                &cluster.key(&["leader"]),
                cluster.lease(),
                cluster.node_id(),
            )
            .await
            .unwrap();
        let leader_key = String::from_utf8_lossy(&leader.key).into_owned();
        let place_rounds = sized(5, 2);
        let (mut cluster_times, mut embedded_place_times) = (Vec::new(), Vec::new());
        let mut placed = 0;
        let window = Instant::now();
        let requests_at_window = etcd_requests(&etcd);
        for round in 0..place_rounds {
            clear_placements(&cluster).await;
            let (count, took) = place_round(&cluster, &leader_key, leader.rev).await;
            assert_eq!(count, allocs, "every alloc placed");
            placed = count;
            cluster_times.push(took);
            // One node placing the same allocs: every alloc record in one transaction.
            let (store, _) =
                berth_state::StateStore::open(&scratch.path().join(format!("place-{round}.db")))
                    .unwrap();
            let records: Vec<berth_state::AllocRecord> = (0..allocs)
                .map(|i| berth_state::AllocRecord {
                    id: berth_cluster::random_id(),
                    job_id: "bench".into(),
                    group_index: 0,
                    alloc_index: u32::try_from(i).unwrap(),
                    name: format!("bench.g[{i}]"),
                    desired_status: berth_model::status::DesiredStatus::Run,
                    client_status: berth_model::status::ClientStatus::Pending,
                    ports: Default::default(),
                })
                .collect();
            let record = berth_state::JobRecord {
                id: "bench".into(),
                source_name: "bench.hcl".into(),
                source: job(allocs).source,
                variables: Default::default(),
                submitted_ms: 0,
                stopped: false,
                child_of: None,
                by_operator: false,
                owner: None,
                last_launch_ms: None,
            };
            let started = Instant::now();
            tokio::task::block_in_place(|| store.put_job_and_allocs(&record, &records).unwrap());
            embedded_place_times.push(started.elapsed());
        }
        let requests_in_window = etcd_requests(&etcd) - requests_at_window;
        let window = window.elapsed();

        // Scale: many jobs of 10 allocs each placed, then one round after one change
        // (a job of 10 more allocs submitted): the scheduler's read, plan and write.
        let scale_jobs = sized(10_000, 200);
        cluster
            .store()
            .delete(&cluster.key(&["jobs", "bench"]))
            .await
            .unwrap();
        clear_placements(&cluster).await;
        let records: Vec<ClusterJob> = (0..scale_jobs)
            .map(|i| small_job(&format!("j{i}")))
            .collect();
        for chunk in records.chunks(100) {
            let writes = chunk
                .iter()
                .map(|job| berth_cluster::etcd::Write::Put {
                    key: cluster.key(&["jobs", &job.id]),
                    value: serde_json::to_vec(job).unwrap(),
                    lease: 0,
                })
                .collect();
            cluster
                .store()
                .transaction(Vec::new(), writes)
                .await
                .unwrap();
        }
        let (at_scale, took) = place_round(&cluster, &leader_key, leader.rev).await;
        assert_eq!(at_scale, scale_jobs * 10, "every alloc placed");
        let scale_rate = at_scale as f64 / took.as_secs_f64();
        // The leader's mirror, read once as an agent does when it becomes the leader,
        // then kept from its watch. Interleaved with it, the same change handled by a
        // round that reads the whole cluster (what every round did before the mirror).
        let prefix = cluster.settings().prefix.clone();
        let (entries, revision) = cluster.store().list(&format!("{prefix}/")).await.unwrap();
        let mut changes = cluster.store().watch(&format!("{prefix}/"), revision + 1);
        let loading = Instant::now();
        let mut mirror = tokio::task::block_in_place(|| Mirror::load(&prefix, &entries, revision));
        drop(entries);
        let loaded_in = loading.elapsed();
        // Its first round plans everything (nothing to place: all placed).
        let first = mirror_round(&cluster, &mut mirror, &leader_key, leader.rev).await;
        assert_eq!(first.0, 0, "all placed already");
        settle(&cluster, &mut mirror, &mut changes, &leader_key, leader.rev).await;
        let (mut after_one_change, mut full_read_after_one_change) = (Vec::new(), Vec::new());
        for change in 0..sized(9, 3) {
            let writer = cluster.clone();
            let job = small_job(&format!("change{change}"));
            let at = tokio::task::spawn_blocking(move || writer.put_job(&job).unwrap())
                .await
                .unwrap();
            let started = Instant::now();
            catch_up(&mut mirror, &mut changes, at).await;
            let (count, jobs) = mirror_round(&cluster, &mut mirror, &leader_key, leader.rev).await;
            after_one_change.push(started.elapsed());
            assert_eq!(count, 10, "the changed job's allocs placed");
            assert!(jobs < 10, "a round of what changed planned {jobs} jobs");
            settle(&cluster, &mut mirror, &mut changes, &leader_key, leader.rev).await;
            // The same change, handled by reading the whole cluster.
            let writer = cluster.clone();
            let job = small_job(&format!("full-read{change}"));
            tokio::task::spawn_blocking(move || writer.put_job(&job).unwrap())
                .await
                .unwrap();
            let (count, took) = place_round(&cluster, &leader_key, leader.rev).await;
            assert_eq!(count, 10, "the changed job's allocs placed");
            full_read_after_one_change.push(took);
            settle(&cluster, &mut mirror, &mut changes, &leader_key, leader.rev).await;
        }
        let round_after_change = median(after_one_change);
        let full_read_round = median(full_read_after_one_change);
        println!(
            "scale: {scale_jobs} jobs of 10 allocs over {nodes} nodes placed in one round at \
             {scale_rate:.0}/s; a round after one change (10 allocs more) took {:.1} ms with \
             the leader's mirror (read once in {:.1} s), {:.1} ms reading the whole cluster \
             (medians, interleaved)",
            round_after_change.as_secs_f64() * 1000.0,
            loaded_in.as_secs_f64(),
            full_read_round.as_secs_f64() * 1000.0,
        );
        keeper.abort();
        let per_placement = median(cluster_times.clone()) / u32::try_from(placed).unwrap_or(1);
        let cluster_rate = placed as f64 / median(cluster_times).as_secs_f64();
        let embedded_rate = placed as f64 / median(embedded_place_times).as_secs_f64();
        println!(
            "placement: {placed} allocs over {nodes} nodes: cluster {cluster_rate:.0}/s \
             ({:.1} µs each: read, plan, write), one node's records {embedded_rate:.0}/s",
            micros(per_placement)
        );
        println!(
            "{nodes} nodes registered in {:.2} s; etcd answered {:.0} requests/s while they \
             kept their leases and the scheduler placed ({:.0} requests in {:.1} s, {:.0} \
             since the start)",
            registration.as_secs_f64(),
            requests_in_window / window.as_secs_f64(),
            requests_in_window,
            window.as_secs_f64(),
            etcd_requests(&etcd) - requests_before,
        );
        let etcd_rate = requests_in_window / window.as_secs_f64();
        let claim_ratio = ratio(claim_etcd, claim_embedded);
        // How much slower a cluster placement is than one node's record of it.
        let placement_ratio = embedded_rate / cluster_rate;
        summary("simulated_nodes", nodes as f64);
        summary("etcd_requests_per_second", etcd_rate);
        summary("scheduler_us_per_placement", micros(per_placement));
        summary("claim_release_etcd_us", micros(claim_etcd));
        summary("claim_release_embedded_us", micros(claim_embedded));
        summary("placements_per_second_etcd", cluster_rate);
        summary("placements_per_second_embedded", embedded_rate);
        summary("scale_jobs", scale_jobs as f64);
        summary("placements_per_second_at_scale", scale_rate);
        summary(
            "round_after_one_change_ms",
            round_after_change.as_secs_f64() * 1000.0,
        );
        summary(
            "round_after_one_change_full_read_ms",
            full_read_round.as_secs_f64() * 1000.0,
        );
        summary("mirror_load_s", loaded_in.as_secs_f64());
        // The same-run comparisons, last, as every bench ends.
        summary("claim_release_etcd_over_embedded", claim_ratio);
        summary("placement_time_etcd_over_embedded", placement_ratio);
        summary(
            "round_after_one_change_full_read_over_mirror",
            ratio(full_read_round, round_after_change),
        );
    });
}
