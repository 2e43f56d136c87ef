//! The WebAssembly runtime: one wasmtime [`Engine`] (pooling allocator, epoch
//! interruption), the on-disk cache of compiled components, and the sandbox every guest
//! call runs in.
//!
//! # Per-call instances
//!
//! Drivers are stateless between calls (their state travels in task handles), so every
//! call gets a fresh store and instance from the pooling allocator (a few µs). A guest
//! that traps or overruns its deadline poisons only that instance, which is dropped with
//! its store; the next call starts clean.

pub mod bindings;
pub mod cache;
pub mod component_check;
pub mod driver;
pub mod hook;
pub mod host_api;
pub mod images;
pub mod sandbox;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use berth_sys::process::ProcessTable;
use cache::ComponentCache;

/// How often the epoch advances: the granularity of deadlines and of yielding to tokio.
pub const EPOCH_TICK: Duration = Duration::from_millis(5);

/// Limits every guest call runs under.
#[derive(Debug, Clone)]
pub struct SandboxLimits {
    /// Guest compute time allowed per call. Time the guest spends blocked in host
    /// waits (`process.wait`, `timer.sleep`) does not count.
    pub call_deadline: Duration,
    /// Linear memory a single instance may grow to.
    pub memory_max: usize,
}

impl Default for SandboxLimits {
    fn default() -> Self {
        SandboxLimits {
            call_deadline: Duration::from_secs(5),
            memory_max: 256 << 20,
        }
    }
}

/// Instances at once unless the operator says otherwise (`max_plugin_instances`). A call
/// holds one while it runs; a running task holds one only if its driver waits in its own
/// code instead of saying what the task ends with (`process.task-ends-with`, which exec
/// and raw_exec do, or `timer.task-ends-after`, which mock does). Every slot is a
/// reserved region of the agent's address space, and more regions make every fork of the
/// agent (each task start) slower: 256 slots are about 600 mappings, 1280 about 2,600.
pub const DEFAULT_MAX_INSTANCES: u32 = 256;

/// How long a call waits for a slot by default. Long enough for a burst of starts to
/// drain through the pool; short enough that a pool held by waiting tasks is reported.
pub const DEFAULT_SLOT_WAIT: Duration = Duration::from_secs(30);

/// What a call needs a slot for, which decides which slots it may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotUse {
    /// A short check that answers someone waiting (a submission's `validate-task-config`,
    /// a fingerprint, loading a plugin, inspecting or signalling a task): it may take any
    /// slot, including those kept back for checks.
    Check,
    /// Part of running a task (start, wait, stop, recover, destroy, a lifecycle hook).
    /// A driver that waits in its own code holds its slot for the task's whole run, so
    /// these never take the slots kept back for checks: however many tasks run, a
    /// submission can still be checked.
    Task,
}

/// The slots of `max_instances` that task calls leave to checks ([`SlotUse::Check`]):
/// an eighth, at least one when there are two or more.
pub fn slots_kept_for_checks(max_instances: u32) -> u32 {
    if max_instances < 2 {
        return 0;
    }
    (max_instances / 8).max(1)
}

/// No slot came free within the wait: the error names the setting to raise.
#[derive(Debug, thiserror::Error)]
pub struct NoSlot {
    pub limit: u32,
    /// The slots this call could not take because they are kept for checks.
    pub kept_for_checks: u32,
    pub waited: Duration,
}

impl std::fmt::Display for NoSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "maximum concurrent limit of {} for component instances reached",
            self.limit
        )?;
        if self.kept_for_checks > 0 {
            write!(f, " ({} of them kept for checks)", self.kept_for_checks)?;
        }
        write!(f, ", waited {:?}", self.waited)
    }
}

/// A call's slot: given back when dropped, after the call's store is gone.
pub struct InstanceSlot {
    _slot: tokio::sync::OwnedSemaphorePermit,
    _task_share: Option<tokio::sync::OwnedSemaphorePermit>,
}

#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    /// Where compiled components are cached; `None` compiles in memory every time.
    pub cache_dir: Option<PathBuf>,
    pub limits: SandboxLimits,
    /// Instances that may exist at once (pooling allocator slots).
    pub max_instances: u32,
    /// How long a call waits for a free slot before it fails: a burst of calls (a job
    /// of count 1,000 starting) queues for slots instead of failing past the pool size.
    pub slot_wait: Duration,
    /// Where calls, their latency and the log messages plugins dropped are recorded:
    /// the agent's registry.
    pub metrics: berth_telemetry::Metrics,
    /// The largest component file read and compiled (`max_component_size`): past it, a
    /// file is refused with its size before it is read.
    pub max_component_bytes: u64,
    /// Told before a large component is compiled.
    pub compile_progress: Option<cache::CompileProgress>,
}

/// The default `max_component_size`: far past a Python hook (18 MB) or a JavaScript
/// driver, short of what would hold the agent compiling for minutes.
pub const DEFAULT_MAX_COMPONENT_BYTES: u64 = 256 * 1024 * 1024;

impl RuntimeConfig {
    pub fn new(cache_dir: Option<PathBuf>) -> Self {
        RuntimeConfig {
            cache_dir,
            limits: SandboxLimits::default(),
            max_instances: DEFAULT_MAX_INSTANCES,
            slot_wait: DEFAULT_SLOT_WAIT,
            metrics: berth_telemetry::Metrics::default(),
            max_component_bytes: DEFAULT_MAX_COMPONENT_BYTES,
            compile_progress: None,
        }
    }
}

/// wasmtime refused the engine configuration (the pooling allocator could not reserve
/// its address space, say).
#[derive(Debug, thiserror::Error)]
#[error("creating the WebAssembly engine: {0}")]
pub struct EngineError(String);

/// Shared by every plugin the agent loads. Cheap to clone.
#[derive(Clone)]
pub struct Runtime {
    inner: Arc<RuntimeInner>,
}

struct RuntimeInner {
    engine: Engine,
    cache: ComponentCache,
    limits: SandboxLimits,
    processes: Arc<ProcessTable>,
    ticker_stop: Arc<AtomicBool>,
    /// One permit per pool slot: a call holds one from before it instantiates until its
    /// store is gone, so the pool itself is never what refuses an instance.
    slots: Arc<tokio::sync::Semaphore>,
    /// The slots task calls may hold at once (all but those kept for checks): a task
    /// call takes one of these before its slot.
    task_slots: Arc<tokio::sync::Semaphore>,
    max_instances: u32,
    slot_wait: Duration,
    metrics: berth_telemetry::Metrics,
    max_component_bytes: u64,
    /// The node's image store, once the agent has opened it.
    images: std::sync::OnceLock<Arc<dyn images::ImageSource>>,
}

impl Drop for RuntimeInner {
    fn drop(&mut self) {
        self.ticker_stop.store(true, Ordering::Relaxed);
    }
}

impl Runtime {
    /// A runtime whose drivers cannot start processes (its process table has no
    /// `berth-keeper`: a spawn fails saying so); [`Runtime::with_processes`] gives it
    /// one.
    pub fn new(config: RuntimeConfig) -> Result<Runtime, EngineError> {
        Self::with_processes(config, Arc::new(ProcessTable::default()))
    }

    /// A runtime whose drivers share `processes` with other parts of the agent.
    pub fn with_processes(
        config: RuntimeConfig,
        processes: Arc<ProcessTable>,
    ) -> Result<Runtime, EngineError> {
        let engine =
            Engine::new(&engine_config(&config)).map_err(|e| EngineError(format!("{e:#}")))?;
        let ticker_stop = Arc::new(AtomicBool::new(false));
        spawn_epoch_ticker(&engine, ticker_stop.clone());
        let cache = ComponentCache::new(config.cache_dir.clone(), config.compile_progress.clone());
        Ok(Runtime {
            inner: Arc::new(RuntimeInner {
                engine,
                cache,
                limits: config.limits,
                processes,
                ticker_stop,
                slots: Arc::new(tokio::sync::Semaphore::new(config.max_instances as usize)),
                task_slots: Arc::new(tokio::sync::Semaphore::new(
                    (config.max_instances - slots_kept_for_checks(config.max_instances)) as usize,
                )),
                max_instances: config.max_instances,
                slot_wait: config.slot_wait,
                metrics: config.metrics,
                max_component_bytes: config.max_component_bytes,
                images: std::sync::OnceLock::new(),
            }),
        })
    }

    pub fn engine(&self) -> &Engine {
        &self.inner.engine
    }

    pub fn cache(&self) -> &ComponentCache {
        &self.inner.cache
    }

    pub fn limits(&self) -> &SandboxLimits {
        &self.inner.limits
    }

    /// Instances that may exist at once (`max_plugin_instances`).
    pub fn max_instances(&self) -> u32 {
        self.inner.max_instances
    }

    /// How long a call waits for a free instance slot before it fails.
    pub fn slot_wait(&self) -> Duration {
        self.inner.slot_wait
    }

    /// Reads a component file, refused with its size past `max_component_size`, before
    /// a byte of it is read.
    pub fn read_component(
        &self,
        path: &std::path::Path,
    ) -> std::io::Result<Result<Vec<u8>, component_check::Mismatch>> {
        use std::io::Read as _;
        let file = std::fs::File::open(path)?;
        let size = file.metadata()?.len();
        let max = self.inner.max_component_bytes;
        if let Err(refused) = component_check::check_size(size, max) {
            return Ok(Err(refused));
        }
        let mut bytes = Vec::with_capacity(size as usize);
        // A file that grew since it was measured is read no further than the limit.
        file.take(max.saturating_add(1)).read_to_end(&mut bytes)?;
        Ok(component_check::check_size(bytes.len() as u64, max).map(|()| bytes))
    }

    /// Gives drivers the node's images (`berth:host/image`); the first store given stays.
    pub fn set_images(&self, images: Arc<dyn images::ImageSource>) {
        let _ = self.inner.images.set(images);
    }

    pub(crate) fn images(&self) -> Option<Arc<dyn images::ImageSource>> {
        self.inner.images.get().cloned()
    }

    pub fn processes(&self) -> &Arc<ProcessTable> {
        &self.inner.processes
    }

    /// The registry every call of this runtime's plugins is recorded in.
    pub fn metrics(&self) -> &berth_telemetry::Metrics {
        &self.inner.metrics
    }

    /// A slot of the instance pool, for one call: waits for one to come free, at most
    /// the configured `slot_wait`. A [`SlotUse::Task`] call never takes the slots kept
    /// for checks. Drop it after the call's store.
    pub async fn instance_slot(&self, used_for: SlotUse) -> Result<InstanceSlot, NoSlot> {
        let inner = &self.inner;
        let kept_for_checks = match used_for {
            SlotUse::Check => 0,
            SlotUse::Task => slots_kept_for_checks(inner.max_instances),
        };
        let no_slot = || NoSlot {
            limit: inner.max_instances,
            kept_for_checks,
            waited: inner.slot_wait,
        };
        let acquire = async {
            let task_share = match used_for {
                SlotUse::Check => None,
                SlotUse::Task => Some(inner.task_slots.clone().acquire_owned().await?),
            };
            let slot = inner.slots.clone().acquire_owned().await?;
            Ok::<_, tokio::sync::AcquireError>(InstanceSlot {
                _slot: slot,
                _task_share: task_share,
            })
        };
        match tokio::time::timeout(inner.slot_wait, acquire).await {
            Ok(Ok(slot)) => Ok(slot),
            // Closed (never: the runtime owns the semaphores) or timed out.
            Ok(Err(_)) | Err(_) => Err(no_slot()),
        }
    }
}

fn engine_config(config: &RuntimeConfig) -> Config {
    let mut wasm = Config::new();
    wasm.wasm_component_model(true);
    wasm.epoch_interruption(true);
    // Guests get a bounded stack; a runaway recursion traps instead of growing.
    wasm.max_wasm_stack(1 << 20);
    wasm.async_stack_size(2 << 20);

    let mut pooling = PoolingAllocationConfig::default();
    let slots = config.max_instances;
    pooling.total_component_instances(slots);
    pooling.total_core_instances(slots * 8);
    pooling.total_memories(slots * 2);
    pooling.total_tables(slots * 4);
    pooling.total_stacks(slots);
    pooling.max_core_instances_per_component(64);
    pooling.max_memories_per_component(8);
    pooling.max_tables_per_component(16);
    pooling.max_core_instance_size(4 << 20);
    pooling.max_component_instance_size(4 << 20);
    pooling.table_elements(100_000);
    pooling.max_memory_size(config.limits.memory_max.max(64 << 20) * 2);
    // Keep some slots warm: reusing a slot skips the page faults of a fresh one.
    pooling.max_unused_warm_slots(16);
    // Reset small regions with memset instead of madvise: a per-call instance touches
    // little memory, and giving pages back to the kernel on every call costs more
    // than the call itself.
    pooling.linear_memory_keep_resident(64 << 10);
    pooling.table_keep_resident(16 << 10);
    pooling.async_stack_keep_resident(128 << 10);
    wasm.allocation_strategy(InstanceAllocationStrategy::Pooling(pooling));
    wasm
}

/// Advances the engine's epoch every [`EPOCH_TICK`] until the runtime is dropped.
/// Holds only a weak reference, so it never keeps the engine alive.
fn spawn_epoch_ticker(engine: &Engine, stop: Arc<AtomicBool>) {
    let weak = engine.weak();
    std::thread::Builder::new()
        .name("berth-epoch".into())
        .spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(EPOCH_TICK);
                match weak.upgrade() {
                    Some(engine) => engine.increment_epoch(),
                    None => return,
                }
            }
        })
        .expect("spawning the epoch ticker thread");
}
