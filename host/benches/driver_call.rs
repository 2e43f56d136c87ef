//! What a driver call costs: a call into a warm WebAssembly instance, a fresh instance
//! from the pooling allocator, the whole per-call path berth takes (store + instance +
//! call + drop), and, measured in the same run, a unary gRPC call over a Unix socket:
//! the transport of the go-plugin mechanism Nomad's task drivers use.
//!
//! Run with `cargo bench -p berth --bench driver_call`. It prints medians and ratios.
//!
//! It ends with `summary: name = value` lines, one figure each (`common::summary`).

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use berth_proto::bench::driver_plugin_client::DriverPluginClient;
use berth_proto::bench::driver_plugin_server::{DriverPlugin, DriverPluginServer};
use berth_proto::bench::{CapabilitiesRequest, CapabilitiesResponse};
use berth_runtime::bindings::driver_v0_2_1::PluginPre;
use berth_runtime::driver::{Driver, DriverOrigin};
use berth_runtime::sandbox::{self, PluginIdentity};
use berth_runtime::{Runtime, RuntimeConfig};
use common::{median, micros, ratio, summary};
use wasmtime::component::Linker;

fn samples() -> usize {
    common::sized(2_000, 50)
}
const WARM_BATCH: usize = 100;

fn main() {
    // The jobspec reader, as the `berth` binary installs it at its start.
    berth_jobspec_hcl::install();
    common::block_on(run());
}

async fn run() {
    let cache = berth_harness::binaries::component_cache();
    let runtime = Runtime::new(RuntimeConfig::new(Some(cache))).unwrap();
    let bytes = berth_builtin::DRIVERS
        .iter()
        .find(|(n, _)| *n == "mock")
        .unwrap()
        .1;

    let (component, _) = runtime
        .cache()
        .load(runtime.engine(), bytes, "mock")
        .unwrap();
    let mut linker = Linker::new(runtime.engine());
    berth_runtime::host_api::add_to_linker(&mut linker).unwrap();
    let pre = PluginPre::new(linker.instantiate_pre(&component).unwrap()).unwrap();
    let identity = PluginIdentity {
        name: "mock".into(),
        may_mount: true,
        isolation: berth_model::driver::FsIsolation::None,
        spawns: Some(Vec::new()),
        adoptable: None,
    };
    let budget = Duration::from_secs(60);

    // A call into an instance that already exists (per call, from batches).
    let mut store = sandbox::new_store(&runtime, identity.clone(), None, budget);
    let instance = pre.instantiate_async(&mut store).await.unwrap();
    let driver = instance.berth_driver_driver();
    for _ in 0..1_000 {
        driver.call_capabilities(&mut store).await.unwrap();
    }
    let warm_call = median_of(samples() / 10, async || {
        let started = Instant::now();
        for _ in 0..WARM_BATCH {
            driver.call_capabilities(&mut store).await.unwrap();
        }
        started.elapsed() / WARM_BATCH as u32
    })
    .await;
    drop(store);

    // A fresh instance from the pooling allocator: new store, instantiate, drop.
    let instantiate = median_of(samples(), async || {
        let started = Instant::now();
        let mut store = sandbox::new_store(&runtime, identity.clone(), None, budget);
        pre.instantiate_async(&mut store).await.unwrap();
        drop(store);
        started.elapsed()
    })
    .await;

    // What berth does per driver call: all of the above plus the call and checks.
    let mock = Driver::load(&runtime, DriverOrigin::Builtin, bytes)
        .await
        .unwrap();
    let berth_call = median_of(samples(), async || {
        let started = Instant::now();
        mock.fingerprint().await.unwrap();
        started.elapsed()
    })
    .await;

    let grpc = grpc_unary_over_unix_socket().await;

    let samples = samples();
    println!("driver call cost, medians of {samples} samples (mock driver, release build)");
    println!(
        "  call into a warm instance (capabilities) {:>10.2} µs",
        micros(warm_call)
    );
    println!(
        "  fresh instance, pooling allocator        {:>10.2} µs",
        micros(instantiate)
    );
    println!(
        "  berth per-call path (instance + call)    {:>10.2} µs",
        micros(berth_call)
    );
    println!(
        "  gRPC unary over a Unix socket (tonic)    {:>10.2} µs",
        micros(grpc)
    );
    println!("ratios (same run)");
    println!(
        "  gRPC / warm call         {:>8.0}x  (target >= 100x)",
        ratio(grpc, warm_call)
    );
    println!(
        "  gRPC / berth per-call    {:>8.1}x",
        ratio(grpc, berth_call)
    );
    println!(
        "  fresh instance           {:>8.2} µs (target < 10 µs: {})",
        micros(instantiate),
        if instantiate < Duration::from_micros(10) {
            "met"
        } else {
            "missed"
        }
    );
    summary("warm_call_us", micros(warm_call));
    summary("fresh_instance_us", micros(instantiate));
    summary("berth_call_us", micros(berth_call));
    summary("grpc_call_us", micros(grpc));
    summary("grpc_over_warm_call", ratio(grpc, warm_call));
    summary("grpc_over_berth_call", ratio(grpc, berth_call));
}

async fn median_of(samples: usize, mut sample: impl AsyncFnMut() -> Duration) -> Duration {
    let mut times = Vec::with_capacity(samples);
    for _ in 0..samples {
        times.push(sample().await);
    }
    median(times)
}

/// A go-plugin-shaped driver service answering `Capabilities`.
struct CapabilitiesService;

#[tonic::async_trait]
impl DriverPlugin for CapabilitiesService {
    async fn capabilities(
        &self,
        _request: tonic::Request<CapabilitiesRequest>,
    ) -> Result<tonic::Response<CapabilitiesResponse>, tonic::Status> {
        Ok(tonic::Response::new(CapabilitiesResponse {
            send_signals: true,
            exec: false,
            fs_isolation: 1,
            mount_configs: 0,
        }))
    }
}

async fn grpc_unary_over_unix_socket() -> Duration {
    let dir = tempfile::tempdir().unwrap();
    let socket: PathBuf = dir.path().join("plugin.sock");
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(DriverPluginServer::new(CapabilitiesService))
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
    );
    let path = socket.clone();
    let channel = tonic::transport::Endpoint::try_from("http://[::]:50051")
        .unwrap()
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let path = path.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
            }
        }))
        .await
        .unwrap();
    let mut client = DriverPluginClient::new(channel);
    for _ in 0..200 {
        client.capabilities(CapabilitiesRequest {}).await.unwrap();
    }
    let median = median_of(samples(), async || {
        let started = Instant::now();
        client.capabilities(CapabilitiesRequest {}).await.unwrap();
        started.elapsed()
    })
    .await;
    server.abort();
    median
}
