//! The host's overhead per CSI volume, next to the bare gRPC calls and mount syscalls it
//! wraps, measured in the same run against the reference plugin (`csi-hostpath`, a real
//! process serving gRPC on a Unix socket and making real bind mounts).
//!
//! - **berth mount**: catalog claim + `CsiManager::mount_volume` (plugin lookup,
//!   ControllerPublish, NodeStage, NodePublish, the host-side checks, and the usage
//!   record written durably to redb after each step). **berth unmount**: the reverse
//!   plus the claim release. The same with the state in memory shows what the durable
//!   writes cost.
//! - **bare gRPC**: the same three (three) RPCs straight from a client, with the
//!   directories made by hand: what any CO pays.
//! - **bare syscalls**: the two bind mounts (two unmounts) the plugin makes, in-process.
//!
//! Run as root: `cargo bench -p berth --bench csi_volume`.
//!
//! It ends with `summary: name = value` lines, one figure each (`common::summary`).

mod common;
#[path = "../../tests/e2e/fixture_bins.rs"]
mod fixture_bins;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use berth_csi::CsiNode;
use berth_csi::client::{CsiClient, NodeVolume};
use berth_csi::layout::PluginDirs;
use berth_csi::registry::PluginRegistration;
use berth_model::csi::{AccessMode, AttachmentMode, PluginKind, Timeouts, Usage};
use berth_state::StateStore;
use berth_state::catalog::{Capability, Claim, ClaimMode, Volume};
use common::{median, micros, ratio, summary};

fn volumes() -> usize {
    common::sized(100, 10)
}

fn main() {
    common::block_on(run());
}

fn usage() -> Usage {
    Usage {
        access_mode: AccessMode::SingleNodeWriter,
        attachment_mode: AttachmentMode::FileSystem,
        read_only: false,
    }
}

fn volume(id: &str) -> Volume {
    Volume {
        id: id.into(),
        name: id.into(),
        plugin_id: "hostpath".into(),
        external_id: id.into(),
        capabilities: vec![Capability {
            access_mode: AccessMode::SingleNodeWriter,
            attachment_mode: AttachmentMode::FileSystem,
        }],
        capacity_bytes: 0,
        parameters: HashMap::new(),
        context: HashMap::new(),
        secrets: HashMap::new(),
        origin: "registered".into(),
        accessible_topology: Vec::new(),
    }
}

struct Plugin(std::process::Child);

impl Drop for Plugin {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn run() {
    let scratch = tempfile::Builder::new()
        .prefix("berth-bench-csi")
        .tempdir_in("/tmp")
        .unwrap();
    let root = scratch.path().canonicalize().unwrap();
    let data = root.join("data");
    let socket_dir = root.join("csi/plugins/bench");
    std::fs::create_dir_all(&socket_dir).unwrap();
    let socket = socket_dir.join("csi.sock");
    for i in 0..=volumes() {
        for kind in ["berth", "mem", "bare"] {
            std::fs::create_dir_all(data.join(format!("{kind}-{i}"))).unwrap();
        }
    }
    let _plugin = Plugin(
        std::process::Command::new(fixture_bins::csi_hostpath())
            .args(["--data-dir", data.to_str().unwrap(), "--node-id", "bench"])
            .args(["--endpoint", &format!("unix://{}", socket.display())])
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("starting csi-hostpath"),
    );
    let client = CsiClient::new("hostpath", &socket, Timeouts::OPERATIONS);
    let deadline = Instant::now() + Duration::from_secs(10);
    while client.probe().await.is_err() {
        assert!(Instant::now() < deadline, "the plugin never answered");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let (store, _) = StateStore::open(&root.join("state.db")).unwrap();
    let on_disk = CsiNode::start(&root.join("disk"), Arc::new(store), Default::default());
    let in_memory = CsiNode::start(
        &root.join("mem"),
        Arc::new(StateStore::in_memory()),
        Default::default(),
    );
    for (csi, prefix) in [(&on_disk, "berth"), (&in_memory, "mem")] {
        // The plugin runs on the host here, so it sees host paths.
        let dirs = PluginDirs {
            host: csi.root.join("node/hostpath"),
            plugin: csi.root.join("node/hostpath"),
        };
        for kind in [PluginKind::Node, PluginKind::Controller] {
            csi.registry.register(PluginRegistration {
                id: "hostpath".into(),
                kind,
                alloc_id: "bench-plugin".into(),
                task: "plugin".into(),
                socket: socket.clone(),
                dirs: dirs.clone(),
                healthy: true,
                health: "probe succeeded".into(),
            });
        }
        for i in 0..=volumes() {
            csi.catalog
                .register_volume(volume(&format!("{prefix}-{i}")))
                .unwrap();
        }
    }

    let berth_mount = async |csi: &CsiNode, prefix: &str, i: usize| -> (Duration, Duration) {
        let alloc = format!("alloc-{i}");
        let v = volume(&format!("{prefix}-{i}"));
        let started = Instant::now();
        let claim = Claim {
            alloc_id: alloc.clone(),
            alloc_name: format!("bench.g[{i}]"),
            mode: ClaimMode::Write,
            access_mode: AccessMode::SingleNodeWriter,
            node: csi.node_name.clone(),
            since: 0,
            external_node_id: None,
        };
        csi.catalog.claim(&v.id, claim).unwrap();
        let path = csi.manager.mount_volume(&alloc, &v, usage()).await.unwrap();
        let mount = started.elapsed();
        assert!(path.is_dir());
        let started = Instant::now();
        csi.manager
            .unmount_volume(&alloc, &v.id, usage())
            .await
            .unwrap();
        csi.catalog.release(&v.id, &alloc).unwrap();
        (mount, started.elapsed())
    };
    let bare_grpc = async |i: usize| -> (Duration, Duration) {
        let id = format!("bare-{i}");
        let empty = HashMap::new();
        let staging = root.join(format!("bare/staging/{id}"));
        let target = root.join(format!("bare/per-alloc/{id}/target"));
        let started = Instant::now();
        std::fs::create_dir_all(&staging).unwrap();
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        let request = NodeVolume {
            external_id: &id,
            usage: usage(),
            publish_context: &empty,
            volume_context: &empty,
            secrets: &empty,
        };
        let context = client.controller_publish(&request, "bench").await.unwrap();
        let request = NodeVolume {
            publish_context: &context,
            ..request
        };
        client.node_stage(&request, &staging).await.unwrap();
        client
            .node_publish(&request, Some(&staging), &target)
            .await
            .unwrap();
        let mount = started.elapsed();
        let started = Instant::now();
        client.node_unpublish(&id, &target).await.unwrap();
        client.node_unstage(&id, &staging).await.unwrap();
        client
            .controller_unpublish(&id, "bench", &empty)
            .await
            .unwrap();
        (mount, started.elapsed())
    };
    let syscalls = |i: usize| -> (Duration, Duration) {
        let source = data.join(format!("bare-{i}"));
        let staging = root.join(format!("sys/staging/{i}"));
        let target = root.join(format!("sys/target/{i}"));
        std::fs::create_dir_all(&staging).unwrap();
        std::fs::create_dir_all(&target).unwrap();
        let started = Instant::now();
        bind(&source, &staging);
        bind(&staging, &target);
        let mount = started.elapsed();
        let started = Instant::now();
        rustix::mount::unmount(&target, rustix::mount::UnmountFlags::empty()).unwrap();
        rustix::mount::unmount(&staging, rustix::mount::UnmountFlags::empty()).unwrap();
        (mount, started.elapsed())
    };

    // Warm-up: connection, fingerprint, page cache.
    berth_mount(&on_disk, "berth", volumes()).await;
    berth_mount(&in_memory, "mem", volumes()).await;
    bare_grpc(volumes()).await;
    syscalls(volumes());
    let mut samples: [Vec<Duration>; 8] = Default::default();
    // Interleaved, in an order that changes every volume, so drift and position in the
    // round do not favour one of them.
    for i in 0..volumes() {
        for step in 0..4 {
            match (i + step) % 4 {
                0 => {
                    let (m, u) = berth_mount(&on_disk, "berth", i).await;
                    samples[0].push(m);
                    samples[1].push(u);
                }
                1 => {
                    let (m, u) = berth_mount(&in_memory, "mem", i).await;
                    samples[6].push(m);
                    samples[7].push(u);
                }
                2 => {
                    let (m, u) = bare_grpc(i).await;
                    samples[2].push(m);
                    samples[3].push(u);
                }
                _ => {
                    let (m, u) = syscalls(i);
                    samples[4].push(m);
                    samples[5].push(u);
                }
            }
        }
    }
    let [berth_m, berth_u, grpc_m, grpc_u, sys_m, sys_u, mem_m, mem_u] = samples.map(median);
    let leftover = berth_sys::mount::mountinfo::read_self()
        .unwrap()
        .into_iter()
        .filter(|m| m.mount_point.starts_with(&root))
        .count();
    let volumes = volumes();
    println!("csi_volume: medians of {volumes} volumes, each mounted and unmounted once");
    println!("                         mount (claim+publish+stage+publish)   unmount");
    println!(
        "berth (CsiManager)       {:>10.1} µs {:>28.1} µs",
        micros(berth_m),
        micros(berth_u)
    );
    println!(
        "berth, state in memory   {:>10.1} µs {:>28.1} µs",
        micros(mem_m),
        micros(mem_u)
    );
    println!(
        "bare gRPC (3 RPCs)       {:>10.1} µs {:>28.1} µs",
        micros(grpc_m),
        micros(grpc_u)
    );
    println!(
        "bare syscalls (2 binds)  {:>10.1} µs {:>28.1} µs",
        micros(sys_m),
        micros(sys_u)
    );
    println!(
        "host overhead per volume: mount {:+.1} µs ({:.2}× bare gRPC), unmount {:+.1} µs ({:.2}×)",
        micros(berth_m) - micros(grpc_m),
        ratio(berth_m, grpc_m),
        micros(berth_u) - micros(grpc_u),
        ratio(berth_u, grpc_u)
    );
    println!("mounts left behind: {leftover}");
    assert_eq!(leftover, 0);
    summary("mount_us", micros(berth_m));
    summary("unmount_us", micros(berth_u));
    summary("mount_in_memory_us", micros(mem_m));
    summary("unmount_in_memory_us", micros(mem_u));
    summary("bare_grpc_mount_us", micros(grpc_m));
    summary("bare_grpc_unmount_us", micros(grpc_u));
    summary("mount_over_bare_grpc", ratio(berth_m, grpc_m));
    summary("unmount_over_bare_grpc", ratio(berth_u, grpc_u));
    summary("mounts_left_behind", leftover as f64);
}

fn bind(source: &Path, target: &PathBuf) {
    rustix::mount::mount_bind(source, target).unwrap();
}
