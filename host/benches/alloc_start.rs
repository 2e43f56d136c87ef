//! Host overhead to start an allocation, next to the bare syscalls a task start needs,
//! measured in the same run.
//!
//! - **berth, mock driver**: 100 allocs, one host volume each; time from creating the
//!   alloc to the task's Started event (alloc record, alloc hooks, task hooks, a driver
//!   call in a fresh instance, and every state write, made durable in a redb file as the
//!   agent does). The same with state in memory shows what durability costs.
//! - **berth, exec driver**: the same with a real process confined as every exec task
//!   is: mount, IPC and UTS namespaces, chroot (system dirs bound read-only, the volume
//!   bound), a minimal /dev, procfs with its knobs read-only, capabilities dropped.
//! - **bare**: fork, `unshare(CLONE_NEWNS)`, make `/` rslave, one bind mount, exec
//!   `/bin/true`, wait: the least a task start with one volume costs.
//!
//! Run as root: `cargo bench -p berth --bench alloc_start`.
//!
//! It ends with `summary: name = value` lines, one figure each (`common::summary`).

mod common;

use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use berth::alloc_runner::{AllocRunner, NodeContext};
use berth::config::{AgentConfig, HostVolume};
use berth::driver_set::DriverSet;
use berth::model::events::EventKind;
use berth::runtime::{Runtime, RuntimeConfig};
use berth::state::StateStore;
use common::{median, micros, ratio, summary};

const ALLOCS: usize = 100;

fn main() {
    common::block_on(run());
}

fn job(driver: &str, config: &str) -> String {
    format!(
        r#"job "bench" {{
  type = "batch"
  group "g" {{
    volume "data" {{
      type   = "host"
      source = "data"
    }}
    task "t" {{
      driver = "{driver}"
      config {{ {config} }}
      volume_mount {{
        volume      = "data"
        destination = "/data"
      }}
    }}
  }}
}}"#
    )
}

async fn run() {
    let scratch = tempfile::Builder::new()
        .prefix("berth-bench")
        .tempdir_in("/tmp")
        .unwrap();
    let source = scratch.path().join("volume");
    std::fs::create_dir_all(&source).unwrap();
    let runtime = Runtime::new(RuntimeConfig::new(Some(
        std::env::temp_dir().join("berth-bench-cache"),
    )))
    .unwrap();
    let (drivers, _) = DriverSet::load(&runtime, None, &Default::default()).await;
    let config = Arc::new(AgentConfig {
        host_volumes: vec![HostVolume {
            name: "data".into(),
            path: source.clone(),
            read_only: false,
        }],
        ..AgentConfig::default()
    });

    let (on_disk, _) = StateStore::open(&scratch.path().join("state.db")).unwrap();
    let on_disk = Arc::new(on_disk);
    let in_memory = Arc::new(StateStore::in_memory());
    let cgroups = Arc::new(berth::cgroup::Cgroups::detect(config.cgroups.clone()));
    let node = |store: &Arc<StateStore>| NodeContext {
        data_dir: scratch.path().to_path_buf(),
        drivers: drivers.clone(),
        hooks: berth::hook_set::HookSet::default(),
        config: config.clone(),
        store: store.clone(),
        events: tokio::sync::broadcast::channel(16).0,
        csi: berth::csi::CsiNode::start(scratch.path(), store.clone(), Default::default()),
        cgroups: cgroups.clone(),
    };
    let mock = alloc_starts(&job("mock", "run_for = \"0s\""), &node(&on_disk)).await;
    let mock_memory = alloc_starts(&job("mock", "run_for = \"0s\""), &node(&in_memory)).await;
    let exec = alloc_starts(&job("exec", "command = \"/bin/true\""), &node(&on_disk)).await;
    let bare = bare_starts(&source, &scratch.path().join("target"));

    let build = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    println!("alloc start, medians of {ALLOCS} (one host volume each, {build} build)");
    println!(
        "  berth, mock driver (hooks + driver call)      {:>9.1} µs",
        micros(mock)
    );
    println!(
        "  berth, mock driver, state in memory           {:>9.1} µs",
        micros(mock_memory)
    );
    println!(
        "  berth, exec driver (all of it + namespace)    {:>9.1} µs",
        micros(exec)
    );
    println!(
        "  bare: fork + unshare + bind mount + exec      {:>9.1} µs",
        micros(bare)
    );
    println!("ratios (same run)");
    println!(
        "  exec alloc start / bare syscalls   {:>6.2}x  (target <= 2x)",
        ratio(exec, bare)
    );
    println!(
        "  mock alloc start / bare syscalls   {:>6.2}x",
        ratio(mock, bare)
    );
    summary("mock_alloc_start_us", micros(mock));
    summary("mock_alloc_start_in_memory_us", micros(mock_memory));
    summary("exec_alloc_start_us", micros(exec));
    summary("bare_syscalls_us", micros(bare));
    summary("exec_over_bare", ratio(exec, bare));
    summary("mock_over_bare", ratio(mock, bare));
}

async fn alloc_starts(jobspec: &str, shared: &NodeContext) -> Duration {
    let job = Arc::new(berth::jobspec::parse("bench.hcl", jobspec).unwrap());
    let mut times = Vec::with_capacity(ALLOCS);
    for index in 0..ALLOCS + 5 {
        let (sender, mut events) = tokio::sync::broadcast::channel(64);
        let node = NodeContext {
            events: sender,
            ..shared.clone()
        };
        let started = Instant::now();
        let alloc = AllocRunner::new(job.clone(), 0, index as u32, node).unwrap();
        let running = tokio::spawn(alloc.clone().run());
        let mut start_time = None;
        while let Ok(event) = events.recv().await {
            if event.event.kind == EventKind::Started {
                start_time = Some(started.elapsed());
                break;
            }
        }
        running.await.unwrap();
        // The first few warm the component cache and the pooling allocator's slots.
        if index >= 5 {
            times.push(start_time.expect("the task never started"));
        }
        let _ = std::fs::remove_dir_all(alloc.alloc_dir.root());
        let _ = shared.store.remove_alloc(&alloc.id);
    }
    median(times)
}

fn bare_starts(source: &Path, target: &Path) -> Duration {
    std::fs::create_dir_all(target).unwrap();
    let mut times = Vec::with_capacity(ALLOCS);
    for index in 0..ALLOCS + 5 {
        let source = berth::mount::c_path(source).unwrap();
        let target = berth::mount::c_path(target).unwrap();
        let started = Instant::now();
        let mut command = std::process::Command::new("/bin/true");
        // SAFETY: only syscalls on prepared C strings run in the child.
        unsafe {
            command.pre_exec(move || {
                rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWNS)?;
                rustix::mount::mount_change(
                    c"/",
                    rustix::mount::MountPropagationFlags::DOWNSTREAM
                        | rustix::mount::MountPropagationFlags::REC,
                )?;
                rustix::mount::mount_bind_recursive(source.as_c_str(), target.as_c_str())?;
                Ok(())
            });
        }
        let status = command.status().unwrap();
        assert!(status.success());
        if index >= 5 {
            times.push(started.elapsed());
        }
    }
    median(times)
}
