//! Helpers the benchmarks share: medians and how figures are printed.

use std::future::Future;
use std::time::Duration;

/// Runs a benchmark's body on a multi-threaded tokio runtime, as the agent does.
pub fn block_on<F: Future>(body: F) -> F::Output {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("starting the tokio runtime")
        .block_on(body)
}

/// `full`, or `small` when `BERTH_BENCH_SMALL=1`: CI runs every bench at a small size
/// (`host/benches/small.sh`) so its assertions run on every change; its figures are not
/// the ones to quote.
pub fn sized(full: usize, small: usize) -> usize {
    if std::env::var("BERTH_BENCH_SMALL").is_ok_and(|v| v == "1") {
        small
    } else {
        full
    }
}

pub fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

pub fn micros(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e6
}

pub fn ratio(a: Duration, b: Duration) -> f64 {
    a.as_secs_f64() / b.as_secs_f64()
}

/// The closing lines every bench prints, one figure each, for scripts and CI logs:
/// `summary: name = value`. Durations are in µs; ratios are berth over its baseline
/// unless the name says otherwise.
pub fn summary(name: &str, value: f64) {
    println!("summary: {name} = {value:.2}");
}

/// A node for benches that run alloc runners in this process: the host's cgroups,
/// plain directories for the allocs' disks, no Consul, the default user id range.
#[allow(dead_code, reason = "used by alloc_start and density only")]
pub fn node(
    data_dir: &std::path::Path,
    drivers: berth_client::driver_set::DriverSet,
    config: std::sync::Arc<berth_client::config::AgentConfig>,
    store: &std::sync::Arc<berth_state::StateStore>,
    cgroups: &berth_sys::cgroup::Cgroups,
) -> berth_client::alloc_runner::NodeContext {
    use std::sync::Arc;
    berth_client::alloc_runner::NodeContext {
        data_dir: data_dir.to_path_buf(),
        drivers,
        hooks: berth_client::hook_set::HookSet::default(),
        config,
        store: store.clone(),
        events: tokio::sync::broadcast::channel(16).0,
        csi: berth_csi::CsiNode::start(data_dir, store.clone(), Default::default()),
        sys: Arc::new(berth_sys::LinuxSys::new(cgroups.clone())),
        services: Arc::new(berth_client::consul::ServiceClient::disabled()),
        dynamic_users: Arc::new(berth_sys::process::dynamic_users::DynamicUsers::new(
            berth_client::config::DEFAULT_DYNAMIC_RANGE,
        )),
        facts: berth_client::node::facts(&Default::default()),
    }
}

/// `node` with each alloc's disk an image (what these nodes use): a sparse ext4 file of
/// the alloc's size, loop-mounted at its start.
#[allow(dead_code, reason = "used by alloc_start and density only")]
pub fn with_image_disks(
    node: berth_client::alloc_runner::NodeContext,
    cgroups: &berth_sys::cgroup::Cgroups,
) -> berth_client::alloc_runner::NodeContext {
    let disks = berth_sys::disk::DiskLimits::with_mechanism(
        berth_sys::disk::Mechanism::Image,
        &node.data_dir,
        None,
    );
    berth_client::alloc_runner::NodeContext {
        sys: std::sync::Arc::new(berth_sys::LinuxSys::with_disk(cgroups.clone(), disks)),
        ..node
    }
}
