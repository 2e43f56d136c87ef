//! Host overhead to start an allocation, next to the bare syscalls a task start needs,
//! measured in the same run, interleaved: each round starts one alloc of each kind and
//! one bare process, so a noisy neighbour slows them all alike.
//!
//! - **berth, mock driver**: an alloc with one host volume; time from creating the alloc
//!   to the task's Started event (alloc record, alloc hooks, task hooks, a driver call
//!   in a fresh instance, the task's cgroup, and every state write, made durable in a
//!   redb file as the agent does). The same with state in memory shows what durability
//!   costs.
//! - **berth, exec driver**: the same with a real process confined as every exec task
//!   is: its cgroup (memory, cpu, pids, devices), mount, IPC, UTS and PID namespaces
//!   with the shim and init forks, pivot_root into the task dir (bound onto itself;
//!   system dirs bound read-only, the volume bound, all nosuid,nodev), a minimal /dev, procfs with its knobs read-only, capabilities dropped, the
//!   seccomp filter.
//! - **berth, confined spawn alone**: the same process through `ProcessTable::spawn` and
//!   its cgroup, without the alloc runner, the driver or the state; and the same spawn
//!   without a cgroup: where the time goes.
//! - **berth, exec driver, disk an image**: the same exec alloc on a node whose allocs'
//!   disks are images (`disk`): a sparse file made, `mkfs.ext4`, loop-mounted, before
//!   the alloc dir; its release (unmount, remove) is outside the timing.
//! - **berth, exec driver, bridge network**: the same exec alloc in
//!   `network { mode = "bridge" }`: its namespace made and attached to the node's
//!   bridge by the CNI reference plugins (loopback, bridge, firewall, portmap) before the
//!   task starts; the detach (DEL) is outside the timing. Only where the plugins are.
//! - **berth, docker driver**: the same alloc with the `docker` driver on a busybox image
//!   the node's store already holds (pulled in the warm-up rounds from a loopback
//!   registry), on the host's network (`network_mode = "host"`): the cached pull, the
//!   image's overlayfs root (its layer as the lower dir, the task's upper and work dirs
//!   made), then the exec task's confinement.
//! - **berth, docker driver, its own network**: the same with Docker's default network,
//!   the task's own namespace made and attached by the CNI plugins at its spawn (what a
//!   docker task in a host-mode group gets unless it asks for the host's). Only where
//!   the plugins are.
//! - **bare**: fork, `unshare(CLONE_NEWNS)`, make `/` rslave, one bind mount, exec
//!   `/bin/true`, wait: the least a task start with one volume costs.
//!
//! On cgroup v1, moving a process into a cgroup (the first write to `cgroup.procs`)
//! waits for an RCU grace period when no migration happened just before: 5-20 ms on
//! these machines after a quiet moment, next to nothing right after another one. The
//! exec alloc start pays it (its spawn follows two mock allocs that move no process);
//! the confined spawn alone, right after it, usually does not, and its "join" row is
//! then near zero. `clone3(CLONE_INTO_CGROUP)` on cgroup v2 avoids the migration.
//!
//! The kernel's `favordynmods` option removes that wait (0.35 ms a join instead of a
//! 5 ms median, measured on these machines); an operator turns it on with
//! `cgroups { favor_dynmods = true }` (`cgroup::favor`). This bench measures the
//! agent configured so, and says whether the option was on. `BERTH_BENCH_FAVOR_DYNMODS=0`
//! measures without it, but only on a node where nothing turned it on since boot: on a
//! 6.18 kernel it stays on until reboot once any hierarchy carried it (this bench, or
//! the end-to-end test of the setting).
//!
//! On these (virtual) machines the non-spawn part of an alloc start, hooks and driver
//! call above all, drifts between periods of a session by up to 2x (the mock alloc
//! start from 2.9 to 5.6 ms), while the spawn alone stays put: compare builds with runs
//! made one after the other, alternating, and read the spawn's own ratio beside the
//! alloc's.
//!
//! Run as root: `cargo bench -p berth --bench alloc_start`.
//!
//! It ends with `summary: name = value` lines, one figure each (`common::summary`).

mod common;

use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use berth_client::alloc_runner::{AllocRunner, NodeContext};
use berth_client::config::{AgentConfig, HostVolume};
use berth_client::driver_set::DriverSet;
use berth_model::events::EventKind;
use berth_runtime::{Runtime, RuntimeConfig};
use berth_state::StateStore;
use common::{median, micros, ratio, summary};

fn allocs() -> usize {
    common::sized(100, 10)
}

fn main() {
    // The jobspec reader, as the `berth` binary installs it at its start.
    berth_jobspec_hcl::install();
    common::block_on(run());
}

fn job(driver: &str, config: &str) -> String {
    job_with(driver, config, "")
}

/// The job with `group` added to its group (a `network` block).
fn job_with(driver: &str, config: &str, group: &str) -> String {
    format!(
        r#"job "bench" {{
  type = "batch"
  group "g" {{
{group}
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
    // The agent's tasks are started by berth-keeper; so are these.
    let processes = Arc::new(
        berth_sys::process::ProcessTable::default()
            .supervised_by(env!("CARGO_BIN_EXE_berth-keeper").into()),
    );
    let runtime = Runtime::with_processes(
        RuntimeConfig::new(Some(berth_harness::binaries::component_cache())),
        processes.clone(),
    )
    .unwrap();
    // The docker task's image, in a registry on loopback, pulled into the node's store
    // by the first (warm-up) round.
    let registry = berth_testkit::registry::Registry::start();
    let layout = berth_testkit::registry::OciLayout::new();
    layout.busybox(
        "base",
        &[],
        &berth_testkit::registry::ImageSpec {
            entrypoint: &["/bin/true"],
            ..Default::default()
        },
    );
    registry.push(&layout, "base", "bench/busybox:1");
    let images = berth_client::images::NodeImages::open(scratch.path(), &Default::default())
        .expect("the image store opens");
    runtime.set_images(Arc::new(images));
    let (drivers, _) = DriverSet::load(&runtime, None, &Default::default()).await;
    let config = Arc::new(AgentConfig {
        host_volumes: vec![HostVolume {
            name: "data".into(),
            path: source.clone(),
            read_only: false,
            allow_setuid: false,
        }],
        // The mock driver is off unless the operator enables it.
        plugins: vec![berth_client::config::PluginConfig {
            name: "mock".into(),
            enabled: Some(true),
            ..Default::default()
        }],
        ..AgentConfig::default()
    });

    let (on_disk, _) = StateStore::open(&scratch.path().join("state.db")).unwrap();
    let on_disk = Arc::new(on_disk);
    let in_memory = Arc::new(StateStore::in_memory());
    let cgroups = Arc::new(berth_sys::cgroup::Cgroups::detect(config.cgroups.clone()));
    let favor = std::env::var("BERTH_BENCH_FAVOR_DYNMODS").map_or(true, |v| v != "0");
    let favoured = if favor {
        match cgroups.favor_dynamic_modifications(&scratch.path().join("cgroup-favordynmods")) {
            Ok(step) => step.map_or("no cgroups".to_string(), |s| s.to_string()),
            Err(error) => format!("could not be turned on: {error}"),
        }
    } else {
        "not asked for (BERTH_BENCH_FAVOR_DYNMODS=0)".to_string()
    };
    let node = |store: &Arc<StateStore>| {
        berth_harness::node_context(
            scratch.path(),
            drivers.clone(),
            config.clone(),
            store.clone(),
            &cgroups,
        )
    };
    // The exec alloc again on a node whose allocs' disks are images (what these nodes
    // use): the image made, formatted and loop-mounted before the alloc dir is built.
    let image_node = common::with_image_disks(node(&on_disk), &cgroups);
    let mock_job = parse(&job("mock", "run_for = \"0s\""));
    let exec_job = parse(&job("exec", "command = \"/bin/true\""));
    let docker_job = parse(&job(
        "docker",
        &format!(
            "\n        image = \"{}/bench/busybox:1\"\n        network_mode = \"host\"\n",
            registry.address
        ),
    ));
    let docker_own_job = parse(&job(
        "docker",
        &format!("image = \"{}/bench/busybox:1\"", registry.address),
    ));
    // The exec alloc in bridge mode: a network namespace made and attached by the CNI
    // plugins (ADD) before the task starts; its DEL is outside the timing. Measured only
    // where the plugins are installed.
    let bridge_job = parse(&job_with(
        "exec",
        "command = \"/bin/true\"",
        "    network {\n      mode = \"bridge\"\n    }",
    ));
    let cni = config
        .bridge
        .cni_path
        .split(':')
        .any(|dir| Path::new(dir).join("bridge").is_file());
    let (on_disk_node, in_memory_node) = (node(&on_disk), node(&in_memory));
    let target = scratch.path().join("target");
    std::fs::create_dir_all(&target).unwrap();
    let spawn_root = scratch.path().join("spawn-root");
    let mut rounds = Rounds::default();
    // The same spawn on a node without cgroups: what creating and joining one costs.
    let none = berth_sys::cgroup::Cgroups::with_layout(
        None,
        berth_model::limits::CgroupSettings {
            allow_missing_controllers: true,
            ..Default::default()
        },
    );
    // The first rounds warm the component cache and the pooling allocator's slots.
    for index in 0..allocs() + 5 {
        let mock = alloc_start(&mock_job, &on_disk_node, index).await;
        let mock_memory = alloc_start(&mock_job, &in_memory_node, index).await;
        let exec = alloc_start(&exec_job, &on_disk_node, index).await;
        let docker = alloc_start(&docker_job, &on_disk_node, index).await;
        let exec_image = alloc_start(&exec_job, &image_node, index).await;
        let (exec_bridge, docker_own) = if cni {
            (
                Some(alloc_start(&bridge_job, &on_disk_node, index).await),
                Some(alloc_start(&docker_own_job, &on_disk_node, index).await),
            )
        } else {
            (None, None)
        };
        let spawn = confined_spawn(processes.as_ref(), &cgroups, &spawn_root, &source).await;
        let uncgrouped = confined_spawn(processes.as_ref(), &none, &spawn_root, &source).await;
        let bare = bare_start(&source, &target);
        if index >= 5 {
            rounds.push(mock, mock_memory, exec, spawn, bare);
            rounds.uncgrouped.push(uncgrouped.total);
            rounds.exec_image.push(exec_image);
            rounds.docker.push(docker);
            rounds.exec_bridge.extend(exec_bridge);
            rounds.docker_own.extend(docker_own);
        }
    }
    let Rounds {
        mock,
        mock_memory,
        exec,
        spawn,
        cgroup_create,
        cgroup_remove,
        uncgrouped,
        bare,
        exec_image,
        exec_bridge,
        docker,
        docker_own,
    } = rounds;
    let docker = median(docker);
    let docker_own = (!docker_own.is_empty()).then(|| median(docker_own));
    let exec_bridge = (!exec_bridge.is_empty()).then(|| median(exec_bridge));
    let exec_image = median(exec_image);
    let uncgrouped = median(uncgrouped);
    let (mock, mock_memory, exec, spawn, bare) = (
        median(mock),
        median(mock_memory),
        median(exec),
        median(spawn),
        median(bare),
    );
    let (cgroup_create, cgroup_remove) = (median(cgroup_create), median(cgroup_remove));

    let build = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    let allocs = allocs();
    println!("alloc start, medians of {allocs} (one host volume each, {build} build)");
    println!("  favordynmods: {favoured}");
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
        "  berth, exec driver, disk an image             {:>9.1} µs",
        micros(exec_image)
    );
    println!(
        "  berth, docker driver (image root, cached)     {:>9.1} µs",
        micros(docker)
    );
    if let Some(own) = docker_own {
        println!(
            "  berth, docker driver, its own network         {:>9.1} µs",
            micros(own)
        );
    }
    match exec_bridge {
        Some(bridge) => println!(
            "  berth, exec driver, bridge network            {:>9.1} µs",
            micros(bridge)
        ),
        None => {
            println!("  berth, exec driver, bridge network            (no CNI plugins on cni_path)")
        }
    }
    println!(
        "  berth, confined spawn + cgroup alone          {:>9.1} µs",
        micros(spawn)
    );
    println!(
        "  bare: fork + unshare + bind mount + exec      {:>9.1} µs",
        micros(bare)
    );
    println!("ratios (same run)");
    println!(
        "  exec alloc start / bare syscalls   {:>6.2}x",
        ratio(exec, bare)
    );
    println!(
        "  mock alloc start / bare syscalls   {:>6.2}x",
        ratio(mock, bare)
    );
    println!("where the exec alloc start goes");
    println!(
        "  the task's cgroup: create (in the start)      {:>9.1} µs",
        micros(cgroup_create)
    );
    println!(
        "  the task's cgroup: join (spawn - uncgrouped - create) {:>5.1} µs",
        micros(
            spawn
                .saturating_sub(uncgrouped)
                .saturating_sub(cgroup_create)
        )
    );
    println!(
        "  namespaces, mounts, forks (uncgrouped - bare) {:>9.1} µs",
        micros(uncgrouped.saturating_sub(bare))
    );
    println!(
        "  the task's cgroup: kill and remove (after)    {:>9.1} µs",
        micros(cgroup_remove)
    );
    println!(
        "  runner, driver call, state (exec - spawn)     {:>9.1} µs",
        micros(exec.saturating_sub(spawn))
    );
    summary("mock_alloc_start_us", micros(mock));
    summary("mock_alloc_start_in_memory_us", micros(mock_memory));
    summary("exec_alloc_start_us", micros(exec));
    summary("exec_alloc_start_disk_image_us", micros(exec_image));
    summary(
        "disk_image_added_per_alloc_us",
        micros(exec_image.saturating_sub(exec)),
    );
    summary("exec_disk_image_over_exec", ratio(exec_image, exec));
    summary("docker_alloc_start_us", micros(docker));
    summary("docker_over_exec", ratio(docker, exec));
    if let Some(own) = docker_own {
        summary("docker_own_network_alloc_start_us", micros(own));
        summary(
            "own_network_added_per_alloc_us",
            micros(own.saturating_sub(docker)),
        );
        summary("docker_own_network_over_docker", ratio(own, docker));
    }
    if let Some(bridge) = exec_bridge {
        summary("exec_alloc_start_bridge_us", micros(bridge));
        summary(
            "bridge_added_per_alloc_us",
            micros(bridge.saturating_sub(exec)),
        );
        summary("exec_bridge_over_exec", ratio(bridge, exec));
    }
    summary("confined_spawn_us", micros(spawn));
    summary("cgroup_create_us", micros(cgroup_create));
    summary("confined_spawn_without_cgroup_us", micros(uncgrouped));
    summary("cgroup_remove_us", micros(cgroup_remove));
    summary("bare_syscalls_us", micros(bare));
    summary("spawn_over_bare", ratio(spawn, bare));
    summary("exec_over_bare", ratio(exec, bare));
    summary("mock_over_bare", ratio(mock, bare));
    summary("favordynmods_asked", f64::from(u8::from(favor)));
    if let Some(carrier) = berth_sys::mount::mountinfo::read_self()
        .unwrap_or_default()
        .into_iter()
        .find(|m| m.mount_point == scratch.path().join("cgroup-favordynmods"))
    {
        let _ = berth_sys::mount::cgroupfs::unmount(&carrier.mount_point);
    }
}

/// Every round's times, by kind.
#[derive(Default)]
struct Rounds {
    mock: Vec<Duration>,
    mock_memory: Vec<Duration>,
    exec: Vec<Duration>,
    spawn: Vec<Duration>,
    cgroup_create: Vec<Duration>,
    cgroup_remove: Vec<Duration>,
    uncgrouped: Vec<Duration>,
    bare: Vec<Duration>,
    exec_image: Vec<Duration>,
    exec_bridge: Vec<Duration>,
    docker: Vec<Duration>,
    docker_own: Vec<Duration>,
}

impl Rounds {
    fn push(
        &mut self,
        mock: Duration,
        mock_memory: Duration,
        exec: Duration,
        spawn: SpawnTimes,
        bare: Duration,
    ) {
        self.mock.push(mock);
        self.mock_memory.push(mock_memory);
        self.exec.push(exec);
        self.spawn.push(spawn.total);
        self.cgroup_create.push(spawn.cgroup_create);
        self.cgroup_remove.push(spawn.cgroup_remove);
        self.bare.push(bare);
    }
}

fn parse(jobspec: &str) -> Arc<berth_jobspec::Job> {
    Arc::new(berth_jobspec_hcl::parse("bench.hcl", jobspec).unwrap())
}

/// One alloc, from its creation to its task's Started event; then it is run to the end
/// and its directory and records removed.
async fn alloc_start(
    job: &Arc<berth_jobspec::Job>,
    shared: &NodeContext,
    index: usize,
) -> Duration {
    let (sender, mut events) = tokio::sync::broadcast::channel(64);
    let node = NodeContext {
        events: sender,
        ..shared.clone()
    };
    let started = Instant::now();
    let alloc = AllocRunner::new(job.clone(), 0, index as u32, node).unwrap();
    let running = tokio::spawn(alloc.clone().run());
    let mut start_time = None;
    let mut seen = Vec::new();
    while let Ok(Ok(event)) = tokio::time::timeout(Duration::from_secs(60), events.recv()).await {
        if event.event.kind == EventKind::Started {
            start_time = Some(started.elapsed());
            break;
        }
        seen.push(event.event.message.clone());
    }
    assert!(start_time.is_some(), "the task never started: {seen:?}");
    running.await.unwrap();
    let root = alloc.alloc_dir.root();
    let mut remove = || std::fs::remove_dir_all(root);
    let _ = shared.sys.release_alloc_disk(&alloc.id, root, &mut remove);
    let _ = shared.store.remove_alloc(&alloc.id);
    // As the agent's collector does: the alloc's uids are free again.
    alloc.release_users();
    start_time.expect("the task never started")
}

/// The exec task's process alone: its cgroup, then a confined spawn of `/bin/true` with
/// the volume, until the spawn returns (the task runs); then it is reaped and the cgroup
/// removed, outside the timing.
async fn confined_spawn(
    processes: &berth_sys::process::ProcessTable,
    cgroups: &berth_sys::cgroup::Cgroups,
    root: &Path,
    volume: &Path,
) -> SpawnTimes {
    use berth_model::mount::Propagation;
    use berth_sys::process::isolation::{ChrootSpec, VolumeMount};
    use berth_sys::process::{Isolation, SpawnSpec};
    std::fs::create_dir_all(root).unwrap();
    let owner: Arc<str> = "bench".into();
    let limits = berth_model::limits::TaskLimits {
        memory_bytes: 300 << 20,
        memory_soft_bytes: None,
        cpu_shares: 100,
        pids_max: 4096,
        restrict_devices: true,
    };
    let started = Instant::now();
    let cgroup = cgroups.create("bench-spawn.t", &limits).unwrap();
    let created = started.elapsed();
    let spec = SpawnSpec {
        argv: vec!["/bin/true".into()],
        env: Vec::new(),
        isolation: Isolation::Chroot(ChrootSpec {
            root: root.to_path_buf(),
            cwd: "/".into(),
            mounts: vec![VolumeMount {
                host_path: volume.to_path_buf(),
                task_path: "/data".into(),
                read_only: false,
                propagation: Propagation::Private,
                source_below: None,
                allow_setuid: false,
            }],
            privileged: false,
            mount_refusals: None,
            etc_files: Vec::new(),
            image: None,
        }),
        stdout: root.join("t.stdout.0"),
        stderr: root.join("t.stderr.0"),
        logs: Default::default(),
        user: None,
        user_namespace: None,
        capabilities: None,
        cgroup_procs: cgroup.procs_files().to_vec(),
        collector_cgroup_procs: Vec::new(),
        network_namespace: None,
    };
    let process = processes.spawn(&owner, &spec).unwrap();
    let elapsed = started.elapsed();
    let exit = processes.wait(&owner, process, None).await.unwrap();
    assert_eq!(exit.and_then(|e| e.code), Some(0), "{exit:?}");
    processes.forget(process);
    let removing = Instant::now();
    cgroup.kill_and_remove().unwrap();
    SpawnTimes {
        total: elapsed,
        cgroup_create: created,
        cgroup_remove: removing.elapsed(),
    }
}

/// One confined spawn: the whole of it, and its cgroup's share.
struct SpawnTimes {
    total: Duration,
    cgroup_create: Duration,
    cgroup_remove: Duration,
}

fn bare_start(source: &Path, target: &Path) -> Duration {
    let source = berth_sys::mount::c_path(source).unwrap();
    let target = berth_sys::mount::c_path(target).unwrap();
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
    started.elapsed()
}
