//! A thousand tasks on one node: what it takes berth to run N exec tasks at once, next
//! to N bare processes started in the same run, interleaved round by round.
//!
//! - **berth**: N allocs of one exec task each (`/bin/sleep`), created at once as a job
//!   with `count = N` is, with the agent's default `max_plugin_instances` (256): time
//!   from creating the first alloc to the N-th task's Started event; then, with all N
//!   running, the proportional memory (PSS) of every process berth runs for them (per
//!   task: its shim, its init, the task itself, its log collector), the agent's own
//!   resident memory (this process runs the agent's runners, drivers and state) and its
//!   growth, and how many WebAssembly instances are live (a running exec
//!   task holds none: the host waits on its process, not the driver). Then every alloc
//!   is stopped and the bench checks that no process is left.
//! - **berth, disks images**: the same on a node whose allocs' disks are images
//!   (`disk`; each alloc's `ephemeral_disk` 10 MB): N sparse files formatted and
//!   loop-mounted before their alloc dirs. Interleaved with the plain round.
//! - **bare**: N `sleep` processes forked and executed straight from this process, no
//!   confinement, no logs, no state: the least a node could pay for N tasks.
//!
//! `BERTH_DENSITY_TASKS` (1000) and `BERTH_DENSITY_ROUNDS` (3) change the size. Run as
//! root: `cargo bench -p berth --bench density`. It ends with `summary: name = value`
//! lines (`common::summary`).

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use berth_client::alloc_runner::{AllocRunner, NodeContext};
use berth_client::config::AgentConfig;
use berth_client::driver_set::DriverSet;
use berth_model::events::EventKind;
use berth_runtime::{Runtime, RuntimeConfig};
use berth_state::StateStore;
use common::{median, micros, summary};

fn main() {
    // The jobspec reader, as the `berth` binary installs it at its start.
    berth_jobspec_hcl::install();
    common::block_on(run());
}

fn setting(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// One round's figures for one side.
struct Round {
    start_all: Duration,
    pss_per_task_kib: u64,
    agent_growth_per_task_kib: u64,
    /// The agent's (this process's) resident memory with all N running.
    agent_rss_kib: u64,
    instances_live: u64,
}

async fn run() {
    let tasks = setting("BERTH_DENSITY_TASKS", common::sized(1000, 20));
    let rounds = setting("BERTH_DENSITY_ROUNDS", common::sized(3, 1));
    let scratch = tempfile::Builder::new()
        .prefix("berth-density")
        .tempdir_in("/tmp")
        .unwrap();
    let processes = Arc::new(
        berth_sys::process::ProcessTable::default()
            .supervised_by(env!("CARGO_BIN_EXE_berth-keeper").into()),
    );
    let runtime = Runtime::with_processes(
        RuntimeConfig::new(Some(berth_harness::binaries::component_cache())),
        processes.clone(),
    )
    .unwrap();
    let (drivers, _) = DriverSet::load(&runtime, None, &Default::default()).await;
    let config = Arc::new(AgentConfig::default());
    let (store, _) = StateStore::open(&scratch.path().join("state.db")).unwrap();
    let store = Arc::new(store);
    let cgroups = Arc::new(berth_sys::cgroup::Cgroups::detect(config.cgroups.clone()));
    let (events, _) = tokio::sync::broadcast::channel(tasks * 16 + 1024);
    let node = NodeContext {
        events,
        ..berth_harness::node_context(scratch.path(), drivers, config, store.clone(), &cgroups)
    };
    // The same node with each alloc's disk an image (what these nodes use): a sparse
    // ext4 file of the alloc's 10 MB, loop-mounted at its start.
    let image_node = common::with_image_disks(node.clone(), &cgroups);
    let job = Arc::new(
        berth_jobspec_hcl::parse(
            "density.hcl",
            r#"job "density" {
  group "g" {
    ephemeral_disk {
      size = 10
    }
    task "t" {
      driver = "exec"
      logs {
        max_files     = 1
        max_file_size = 1
      }
      config {
        command = "/bin/sleep"
        args    = ["3600"]
      }
    }
  }
}"#,
        )
        .unwrap(),
    );

    let mut berth_rounds = Vec::new();
    let mut image_rounds = Vec::new();
    let mut bare_rounds = Vec::new();
    for round in 0..rounds {
        berth_rounds.push(berth_round(&job, &node, &runtime, tasks, 2 * round).await);
        image_rounds.push(berth_round(&job, &image_node, &runtime, tasks, 2 * round + 1).await);
        bare_rounds.push(bare_round(tasks));
    }
    let image_start = median(image_rounds.iter().map(|r| r.start_all).collect());

    let pick = |rounds: &[Round], f: &dyn Fn(&Round) -> u64| {
        let mut values: Vec<u64> = rounds.iter().map(f).collect();
        values.sort();
        values[values.len() / 2]
    };
    let berth_start = median(berth_rounds.iter().map(|r| r.start_all).collect());
    let bare_start = median(bare_rounds.iter().map(|r| r.start_all).collect());
    let berth_pss = pick(&berth_rounds, &|r| r.pss_per_task_kib);
    let bare_pss = pick(&bare_rounds, &|r| r.pss_per_task_kib);
    let growth = pick(&berth_rounds, &|r| r.agent_growth_per_task_kib);
    let agent_rss = pick(&berth_rounds, &|r| r.agent_rss_kib);
    let instances = berth_rounds
        .iter()
        .map(|r| r.instances_live)
        .max()
        .unwrap_or(0);
    let build = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    println!("{tasks} tasks at once, medians of {rounds} rounds ({build} build)");
    println!(
        "  berth: all running after            {:>9.0} ms",
        berth_start.as_secs_f64() * 1e3
    );
    println!(
        "  berth, disks images: all running    {:>9.0} ms",
        image_start.as_secs_f64() * 1e3
    );
    println!(
        "  bare:  all running after            {:>9.0} ms",
        bare_start.as_secs_f64() * 1e3
    );
    println!(
        "  berth: memory per task (PSS)        {berth_pss:>9} KiB  (shim, init, task, log collector)"
    );
    println!("  bare:  memory per task (PSS)        {bare_pss:>9} KiB  (the process)");
    println!("  berth: agent growth per task (RSS)  {growth:>9} KiB");
    println!(
        "  berth: agent RSS with all running   {:>9} MiB",
        agent_rss >> 10
    );
    println!("  berth: WebAssembly instances live while all run: {instances}");
    summary("density_tasks", tasks as f64);
    summary("berth_start_all_ms", micros(berth_start) / 1e3);
    summary("bare_start_all_ms", micros(bare_start) / 1e3);
    summary("berth_disk_images_start_all_ms", micros(image_start) / 1e3);
    summary(
        "disk_images_start_all_over_plain",
        common::ratio(image_start, berth_start),
    );
    summary(
        "start_all_over_bare",
        common::ratio(berth_start, bare_start),
    );
    summary("berth_pss_per_task_kib", berth_pss as f64);
    summary("bare_pss_per_task_kib", bare_pss as f64);
    summary("agent_rss_growth_per_task_kib", growth as f64);
    summary("agent_rss_all_running_mib", (agent_rss >> 10) as f64);
    summary("instances_live_while_running", instances as f64);
}

async fn berth_round(
    job: &Arc<berth_jobspec::Job>,
    node: &NodeContext,
    runtime: &Runtime,
    tasks: usize,
    round: usize,
) -> Round {
    let agent_before = resident_kib(std::process::id());
    let mut events = node.events.subscribe();
    let started = Instant::now();
    let mut allocs = Vec::with_capacity(tasks);
    for index in 0..tasks {
        let alloc =
            AllocRunner::new(job.clone(), 0, (round * tasks + index) as u32, node.clone()).unwrap();
        let running = tokio::spawn(alloc.clone().run());
        allocs.push((alloc, running));
    }
    let mut running = 0;
    while running < tasks {
        match events.recv().await {
            Ok(event) if event.event.kind == EventKind::Started => running += 1,
            Ok(event)
                if matches!(
                    event.event.kind,
                    EventKind::DriverFailure | EventKind::SetupFailure
                ) =>
            {
                panic!("a task failed to start: {}", event.event.message)
            }
            Ok(_) => {}
            Err(error) => panic!("lost task events: {error}"),
        }
    }
    let start_all = started.elapsed();
    // Let every collector and shim settle before memory is read.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let me = std::process::id();
    let descendants = descendants_of(me);
    let pss: u64 = descendants.iter().map(|&pid| pss_kib(pid)).sum();
    let agent_rss_kib = resident_kib(me);
    let agent_growth = agent_rss_kib.saturating_sub(agent_before);
    let instances_live = runtime
        .engine()
        .pooling_allocator_metrics()
        .map_or(0, |m| m.component_instances());
    for (alloc, _) in &allocs {
        alloc.stop();
    }
    for (alloc, running) in allocs {
        running.await.unwrap();
        let root = alloc.alloc_dir.root();
        let mut remove = || std::fs::remove_dir_all(root);
        let _ = node.sys.release_alloc_disk(&alloc.id, root, &mut remove);
        let _ = node.store.remove_alloc(&alloc.id);
        alloc.release_users();
    }
    let left = descendants_of(me);
    assert!(
        left.is_empty(),
        "processes left after every alloc stopped: {left:?}"
    );
    Round {
        start_all,
        pss_per_task_kib: pss / tasks as u64,
        agent_growth_per_task_kib: agent_growth / tasks as u64,
        agent_rss_kib,
        instances_live,
    }
}

fn bare_round(tasks: usize) -> Round {
    let started = Instant::now();
    let mut children = Vec::with_capacity(tasks);
    for _ in 0..tasks {
        children.push(
            std::process::Command::new("/bin/sleep")
                .arg("3600")
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap(),
        );
    }
    let start_all = started.elapsed();
    std::thread::sleep(Duration::from_millis(500));
    let pss: u64 = children.iter().map(|c| pss_kib(c.id())).sum();
    for child in &mut children {
        let _ = child.kill();
    }
    for mut child in children {
        let _ = child.wait();
    }
    Round {
        start_all,
        pss_per_task_kib: pss / tasks as u64,
        agent_growth_per_task_kib: 0,
        agent_rss_kib: 0,
        instances_live: 0,
    }
}

/// Every process below `root` (not `root` itself), from `/proc/<pid>/stat`'s parents.
fn descendants_of(root: u32) -> Vec<u32> {
    let mut parents = HashMap::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let after_name = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or("");
        if let Some(parent) = after_name
            .split_whitespace()
            .nth(1)
            .and_then(|p| p.parse::<u32>().ok())
        {
            parents.insert(pid, parent);
        }
    }
    let mut found = Vec::new();
    for &pid in parents.keys() {
        let mut at = pid;
        while let Some(&parent) = parents.get(&at) {
            if parent == root {
                found.push(pid);
                break;
            }
            at = parent;
        }
    }
    found
}

/// A `/proc/<pid>` status field in KiB (`Pss:` of `smaps_rollup`, `VmRSS:` of `status`).
fn field_kib(path: String, field: &str) -> u64 {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .find_map(|line| line.strip_prefix(field))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kib| kib.parse().ok())
        .unwrap_or(0)
}

fn pss_kib(pid: u32) -> u64 {
    field_kib(format!("/proc/{pid}/smaps_rollup"), "Pss:")
}

fn resident_kib(pid: u32) -> u64 {
    field_kib(format!("/proc/{pid}/status"), "VmRSS:")
}
