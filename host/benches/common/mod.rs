//! Helpers the benchmarks share: medians and how figures are printed.

use std::future::Future;
use std::time::Duration;

/// Runs a benchmark's body on a multi-threaded tokio runtime, as the agent does.
#[allow(dead_code, reason = "template_render is synchronous")]
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

/// A node (`berth_harness::node_context`) with each alloc's disk an image (what these nodes use): a sparse ext4 file of
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
