//! The cost of the task hook pipeline per task start with 1, 5 and 20 WASM hooks, next
//! to the same pipeline with as many native no-op hooks, measured in the same run.
//!
//! The WASM hook is a minimal one (it adds one env var); each call instantiates it in a
//! fresh sandbox (WASI with the task's `local/` preopened, deadline, memory cap), passes
//! the task context, checks what comes back and merges it, exactly as a task start does.
//!
//! `cargo bench -p berth --bench hook_pipeline`
//!
//! It ends with `summary: name = value` lines, one figure each (`common::summary`).

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use berth_builtin::test_components;
use berth_client::config::AgentConfig;
use berth_client::task_runner::hooks::{
    BoxFuture, HookError, TaskHook, TaskHookContext, TaskPrepare,
};
use berth_client::task_runner::wasm_hooks::WasmHooks;
use berth_model::hook::{HookSpec, OnFailure};
use berth_model::hook_resources::HookResources;
use berth_runtime::driver::{Driver, DriverOrigin};
use berth_runtime::hook::Hook;
use berth_runtime::{Runtime, RuntimeConfig};
use berth_sys::alloc_dir::AllocDir;
use common::{median, micros, ratio, summary};

fn runs() -> usize {
    common::sized(300, 20)
}

/// A native hook that does nothing, to price the pipeline itself.
struct NativeNoop;

impl TaskHook for NativeNoop {
    fn name(&self) -> &'static str {
        "noop"
    }

    fn prestart<'a>(
        &'a self,
        _ctx: &'a TaskHookContext,
        prepare: &'a mut TaskPrepare,
    ) -> BoxFuture<'a, Result<(), HookError>> {
        Box::pin(async move {
            std::hint::black_box(&prepare.env);
            Ok(())
        })
    }
}

fn main() {
    // The jobspec reader, as the `berth` binary installs it at its start.
    berth_jobspec_hcl::install();
    common::block_on(run());
}

async fn run() {
    let scratch = tempfile::tempdir().unwrap();
    let runtime = Runtime::new(RuntimeConfig::new(Some(
        berth_harness::binaries::component_cache(),
    )))
    .unwrap();
    let mock = berth_builtin::DRIVERS
        .iter()
        .find(|(name, _)| *name == "mock")
        .unwrap()
        .1;
    let driver = Arc::new(
        Driver::load(&runtime, DriverOrigin::Builtin, mock)
            .await
            .unwrap(),
    );
    let job = Arc::new(
        berth_jobspec_hcl::parse(
            "bench.hcl",
            "job \"bench\" {\n  group \"g\" {\n    task \"t\" {\n      driver = \"mock\"\n      meta { tier = \"gold\" }\n    }\n  }\n}\n",
        )
        .unwrap(),
    );
    let alloc_dir = AllocDir::new(scratch.path(), "bench-alloc");
    alloc_dir.build().unwrap();
    let task_dir = alloc_dir.build_task("t").unwrap();
    let mut hooks = Vec::new();
    for i in 0..20 {
        let spec = HookSpec {
            name: format!("h{i}"),
            path: test_components::HOSTILE_HOOK.into(),
            config: vec![("behave".into(), "ok".into())],
            timeout: Duration::from_secs(2),
            memory_max: 32 << 20,
            on_failure: OnFailure::Fail,
            all_tasks: true,
            sha256: None,
            quota: Default::default(),
        };
        hooks.push(Arc::new(Hook::load(&runtime, spec, false).await.unwrap()));
    }
    let csi = berth_csi::CsiNode::start(
        &task_dir,
        Arc::new(berth_state::StateStore::in_memory()),
        Default::default(),
    );
    let sys: Arc<dyn berth_sys::Sys> = Arc::new(berth_sys::LinuxSys::new(
        berth_sys::cgroup::Cgroups::detect(Default::default()),
    ));
    let context = |plugin_hooks: Vec<Arc<Hook>>| TaskHookContext {
        alloc_id: "bench-alloc".into(),
        job: job.clone(),
        group: Arc::new(job.groups[0].clone()),
        task: job.groups[0].tasks[0].clone(),
        dynamic_user: None,
        alloc_dir: alloc_dir.clone(),
        driver: driver.clone(),
        config: Arc::new(AgentConfig::default()),
        resources: Arc::new(HookResources::default()),
        plugin_hooks,
        reports: Arc::default(),
        csi: csi.clone(),
        sys: sys.clone(),
        services: Arc::new(berth_client::consul::ServiceClient::disabled()),
        identities: Arc::new(berth_client::identity::Keyring::detached()),
        facts: berth_client::node::facts(&Default::default()),
        events: None,
        restart: None,
        control: None,
        own_network: None,
        release_own_network: None,
    };
    let prepare = TaskPrepare {
        task_dir,
        env: (0..12)
            .map(|i| (format!("VAR_{i}"), "value".to_string()))
            .collect(),
        mounts: Vec::new(),
        config: None,
        interpolated_env: Vec::new(),
    };

    let build = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    let runs = runs();
    println!("task hook pipeline per task start, medians of {runs} ({build} build)");
    let mut rows = Vec::new();
    for n in [1, 5, 20] {
        let wasm_ctx = context(hooks[..n].to_vec());
        let wasm_pipeline: Vec<Box<dyn TaskHook>> = vec![Box::new(WasmHooks)];
        let wasm = time_pipeline(&wasm_pipeline, &wasm_ctx, &prepare).await;
        let native_ctx = context(Vec::new());
        let native_pipeline: Vec<Box<dyn TaskHook>> = (0..n)
            .map(|_| Box::new(NativeNoop) as Box<dyn TaskHook>)
            .collect();
        let native = time_pipeline(&native_pipeline, &native_ctx, &prepare).await;
        println!(
            "  {n:>2} hook(s): WASM {:>9.1} µs ({:>6.1} µs per hook)   native no-op {:>7.2} µs",
            micros(wasm),
            micros(wasm) / n as f64,
            micros(native)
        );
        rows.push((n, wasm, native));
    }
    println!("ratios (same run)");
    for &(n, wasm, native) in &rows {
        println!(
            "  {n:>2} hook(s): WASM / native no-op  {:>9.0}x   (added per task start: {:.1} µs)",
            ratio(wasm, native),
            micros(wasm.saturating_sub(native))
        );
    }
    for (n, wasm, native) in rows {
        summary(&format!("wasm_{n}_hooks_us"), micros(wasm));
        summary(&format!("native_{n}_hooks_us"), micros(native));
        summary(
            &format!("wasm_{n}_hooks_added_us"),
            micros(wasm.saturating_sub(native)),
        );
    }
}

async fn time_pipeline(
    pipeline: &[Box<dyn TaskHook>],
    ctx: &TaskHookContext,
    prepare: &TaskPrepare,
) -> Duration {
    let mut times = Vec::with_capacity(runs());
    for run in 0..runs() + 10 {
        let mut prepare = prepare.clone();
        let started = Instant::now();
        for hook in pipeline {
            hook.prestart(ctx, &mut prepare).await.unwrap();
        }
        let took = started.elapsed();
        ctx.reports.lock().unwrap().clear();
        if run >= 10 {
            times.push(took);
        }
    }
    median(times)
}
