//! What every guest call runs inside: the store data ([`PluginCtx`]), its memory cap,
//! its deadline clock, and the classification of what went wrong.
//!
//! The deadline counts guest time only: the epoch callback compares the time since the
//! call began, minus the time the guest spent blocked in host waits, with the budget.
//! A guest spinning in a loop is stopped; a driver waiting on its task is not.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use wasmtime::component::ResourceTable;
use wasmtime::{ResourceLimiter, Store, UpdateDeadline};
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use super::{Runtime, SandboxLimits};
use berth_model::driver::FsIsolation;
use berth_model::mount::HandedMount;
use berth_sys::process::ProcessTable;

/// What the host knows about the plugin a store belongs to.
#[derive(Debug, Clone)]
pub struct PluginIdentity {
    pub name: Arc<str>,
    /// False for drivers that declared mount-configs `none`.
    pub may_mount: bool,
    /// The isolation the driver declared: it may not spawn with less.
    pub isolation: FsIsolation,
    /// Every isolation the driver said its spawns use (world 0.2.1): it may spawn with
    /// no other. `None`: it did not say.
    pub spawns: Option<Vec<berth_model::driver::SpawnIsolation>>,
    /// Set for `recover-task` after an agent restart, the only time a driver may adopt a
    /// process it did not spawn in this agent's lifetime: the processes the host
    /// recorded spawning for the task being recovered, the only ones it may adopt.
    pub adoptable: Option<Vec<berth_model::driver::ProcessRef>>,
}

/// The task a call is about, with what the host handed the driver for it. Spawning is
/// only possible within such a scope and only with what it holds.
#[derive(Debug, Clone)]
pub struct TaskScope {
    pub task_id: String,
    pub task_dir: PathBuf,
    pub mounts: Vec<HandedMount>,
    pub stdout: PathBuf,
    pub stderr: PathBuf,
    pub logs: berth_model::driver::LogRotation,
    /// The task may keep root's capabilities (an operator-approved CSI plugin).
    pub privileged: bool,
    /// The user every spawn of the task runs as.
    pub user: Option<berth_model::driver::TaskUser>,
    /// The operator lets the driver spawn this task's processes unconfined.
    pub allow_unconfined: bool,
    /// The task's cgroup, joined by every spawn.
    pub cgroup_procs: Vec<PathBuf>,
    /// The alloc's log collectors' cgroup, joined by each spawn's collector.
    pub collector_cgroup_procs: Vec<PathBuf>,
    /// The group's network namespace, joined by every spawn (`None`: the host's).
    pub network_namespace: Option<PathBuf>,
    /// The group's own `/etc` files, over the host's in every confined spawn.
    pub etc_files: Vec<PathBuf>,
    /// An image task's own user namespace.
    pub image_user_namespace: Option<berth_model::driver::ImageUserNamespace>,
    /// The task's events, for what the host does while the driver starts it.
    pub progress: Option<berth_model::driver::TaskProgress>,
    /// Makes the task's own network (an image task's Docker default, in a host-mode
    /// group).
    pub own_network: Option<berth_model::driver::TaskNetworkMaker>,
}

/// Guest time bookkeeping for one call: the CPU time the guest's thread spent running
/// it, so that neither the host's work and waits inside the call nor a busy node count
/// against the guest. With a thousand tasks starting on two cores, a worker thread gets
/// a sliver of the CPU, and wall time inflated a microseconds-long start-task past its
/// 5 s budget.
///
/// Time is counted in intervals between checkpoints: the start of the guest, each epoch
/// check (the guest was running when the epoch moved, or is resuming from a yield), and
/// the start and end of each host call that does real work or waits. An interval that
/// began and ended on one thread counts that thread's CPU time. One that moved (a guest
/// resumed by another worker after a yield) counts its wall time, at most
/// [`MAX_PER_TICK`].
#[derive(Debug)]
pub struct CallClock {
    /// Guest time of the closed intervals.
    counted: Duration,
    /// The open interval: its thread, that thread's CPU time and the wall time then.
    open: Option<(i32, Duration, Instant)>,
    budget: Duration,
}

/// The most guest time an interval that moved between threads counts: one epoch tick,
/// with room for the ticker thread's lateness.
const MAX_PER_TICK: Duration = Duration::from_millis(2 * super::EPOCH_TICK.as_millis() as u64);

/// The calling thread's id and CPU time.
fn thread_cpu() -> (i32, Duration) {
    let tid = rustix::thread::gettid().as_raw_nonzero().get();
    let cpu = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    (tid, Duration::new(cpu.tv_sec as u64, cpu.tv_nsec as u32))
}

impl CallClock {
    fn new(budget: Duration) -> Self {
        let mut clock = CallClock {
            counted: Duration::ZERO,
            open: None,
            budget,
        };
        clock.open_interval();
        clock
    }

    fn guest_time(&self) -> Duration {
        self.counted
    }

    fn open_interval(&mut self) {
        let (tid, cpu) = thread_cpu();
        self.open = Some((tid, cpu, Instant::now()));
    }

    fn close_interval(&mut self) {
        let Some((tid, cpu_then, wall_then)) = self.open.take() else {
            return;
        };
        let (now_tid, cpu_now) = thread_cpu();
        self.counted += if now_tid == tid {
            cpu_now.saturating_sub(cpu_then)
        } else {
            wall_then.elapsed().min(MAX_PER_TICK)
        };
    }

    /// At an epoch check.
    fn epoch_check(&mut self) {
        self.close_interval();
        self.open_interval();
    }

    /// Runs a host wait without counting its time against the guest.
    pub async fn exempt<F: std::future::Future>(&mut self, wait: F) -> F::Output {
        self.close_interval();
        let output = wait.await;
        self.open_interval();
        output
    }

    /// Runs host work (a spawn: forks, mounts, a cgroup join) without counting its time
    /// against the guest.
    pub fn exempt_work<T>(&mut self, work: impl FnOnce() -> T) -> T {
        self.close_interval();
        let output = work();
        self.open_interval();
        output
    }

    /// Starts counting from now: what came before (instantiating the component) was the
    /// host's.
    pub fn restart(&mut self) {
        *self = CallClock::new(self.budget);
    }
}

/// Caps linear memory and remembers that the cap was hit, for a clear error.
#[derive(Debug)]
pub struct MemoryCap {
    max: usize,
    hit: bool,
}

impl ResourceLimiter for MemoryCap {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.max {
            self.hit = true;
            return Err(wasmtime::format_err!(
                "memory cap of {} MiB reached",
                self.max >> 20
            ));
        }
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= 1_000_000)
    }
}

/// The store data of every plugin instance.
pub struct PluginCtx {
    wasi: WasiCtx,
    table: ResourceTable,
    memory: MemoryCap,
    stderr: MemoryOutputPipe,
    pub(crate) clock: CallClock,
    pub(crate) plugin: PluginIdentity,
    pub(crate) task: Option<TaskScope>,
    pub(crate) processes: Arc<ProcessTable>,
    /// Requests the host refused; they fail the call even if the guest ignores them.
    pub(crate) violations: Vec<String>,
    /// What this call spawned, recorded in the task's handle.
    pub(crate) spawned: Vec<berth_model::driver::ProcessRef>,
    /// The process the driver said its task ends with (`process.task-ends-with`).
    pub(crate) task_ends_with: Option<berth_model::driver::ProcessRef>,
    /// When the driver said its task ends (`timer.task-ends-after`), in Unix milliseconds.
    pub(crate) task_ends_at_ms: Option<u64>,
    /// What this call may still log through `berth:host/log`.
    pub(crate) log: crate::host_api::log::LogBudget,
    /// The node's images (`berth:host/image`), when the agent has a store.
    pub(crate) images: Option<Arc<dyn crate::images::ImageSource>>,
    /// The images this call pulled: the only ones it may spawn on.
    pub(crate) pulled: Vec<crate::images::PulledImage>,
    /// The task's own network as this call was given it, with the ports asked for
    /// (sorted): every later spawn of the call gets the same, or is refused.
    pub(crate) own_network: Option<(Vec<String>, berth_model::driver::TaskNetwork)>,
}

impl WasiView for PluginCtx {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

/// Bytes of guest stderr kept per call (panic messages land there).
const STDERR_CAPACITY: usize = 16 << 10;

/// A store for one call: no preopened dirs, no env, no args, no network; stderr captured.
pub fn new_store(
    runtime: &Runtime,
    plugin: PluginIdentity,
    task: Option<TaskScope>,
    budget: Duration,
) -> Store<PluginCtx> {
    let SandboxLimits { memory_max, .. } = *runtime.limits();
    let stderr = MemoryOutputPipe::new(STDERR_CAPACITY);
    let wasi = WasiCtx::builder().stderr(stderr.clone()).build();
    build_store(runtime, plugin, task, budget, memory_max, wasi, stderr)
}

/// A store for one hook call: like [`new_store`], with the hook's own limits and one
/// directory (the task's `local/`) preopened at `/local`.
pub fn new_hook_store(
    runtime: &Runtime,
    plugin: PluginIdentity,
    budget: Duration,
    memory_max: usize,
    local_dir: &std::path::Path,
) -> wasmtime::Result<Store<PluginCtx>> {
    // A hook's open of a FIFO the task left would block a thread of the blocking pool
    // for good (WASI opens without O_NONBLOCK): a hook is not run over one.
    if let Some(special) = special_file_below(local_dir) {
        wasmtime::bail!(
            "local/ holds {special}, which a hook could block on forever: the hook is not run \
             (remove it, or leave such files outside local/)"
        );
    }
    let stderr = MemoryOutputPipe::new(STDERR_CAPACITY);
    let wasi = WasiCtx::builder()
        .stderr(stderr.clone())
        // Read-only: a hook changes what is on disk only through the files it returns,
        // which the host checks, bounds and writes (a WASI write would be unbounded).
        .preopened_dir(
            local_dir,
            "/local",
            wasmtime_wasi::filesystem::FsPerms::ReadOnly,
        )?
        .build();
    Ok(build_store(
        runtime, plugin, None, budget, memory_max, wasi, stderr,
    ))
}

/// The most entries and depth of `local/` looked at for special files.
const SCAN_ENTRIES: usize = 65_536;
const SCAN_DEPTH: usize = 64;

/// A FIFO, socket or device below `dir` (its path, for the message), read through
/// descriptors (no path grows long, no link is followed); a tree past the scan's bounds
/// counts as one, since what is beyond them is unknown.
fn special_file_below(dir: &std::path::Path) -> Option<String> {
    use rustix::fs::{AtFlags, FileType, Mode, OFlags};
    fn walk(
        dir: &std::os::fd::OwnedFd,
        shown: &str,
        depth: usize,
        seen: &mut usize,
    ) -> Option<String> {
        let entries = rustix::fs::Dir::read_from(dir).ok()?;
        for entry in entries.flatten() {
            let name = entry.file_name();
            if name == c"." || name == c".." {
                continue;
            }
            *seen += 1;
            let path = format!("{shown}/{}", name.to_string_lossy());
            if *seen > SCAN_ENTRIES {
                return Some(format!("more than {SCAN_ENTRIES} entries (at {path})"));
            }
            let Ok(stat) = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) else {
                continue;
            };
            match FileType::from_raw_mode(stat.st_mode) {
                FileType::Fifo => return Some(format!("a FIFO ({path})")),
                FileType::Socket => return Some(format!("a socket ({path})")),
                FileType::CharacterDevice | FileType::BlockDevice => {
                    return Some(format!("a device node ({path})"));
                }
                FileType::Directory if depth >= SCAN_DEPTH => {
                    return Some(format!("directories deeper than {SCAN_DEPTH} (at {path})"));
                }
                FileType::Directory => {
                    let child = rustix::fs::openat(
                        dir,
                        name,
                        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                        Mode::empty(),
                    )
                    .ok()?;
                    if let Some(found) = walk(&child, &path, depth + 1, seen) {
                        return Some(found);
                    }
                }
                _ => {}
            }
        }
        None
    }
    let root = rustix::fs::open(
        dir,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .ok()?;
    walk(&root, "local", 0, &mut 0)
}

fn build_store(
    runtime: &Runtime,
    plugin: PluginIdentity,
    task: Option<TaskScope>,
    budget: Duration,
    memory_max: usize,
    wasi: WasiCtx,
    stderr: MemoryOutputPipe,
) -> Store<PluginCtx> {
    let ctx = PluginCtx {
        wasi,
        table: ResourceTable::new(),
        memory: MemoryCap {
            max: memory_max,
            hit: false,
        },
        stderr,
        clock: CallClock::new(budget),
        log: crate::host_api::log::LogBudget::new(plugin.name.clone(), runtime.metrics().clone()),
        plugin,
        task,
        processes: runtime.processes().clone(),
        violations: Vec::new(),
        spawned: Vec::new(),
        task_ends_with: None,
        task_ends_at_ms: None,
        images: runtime.images(),
        pulled: Vec::new(),
        own_network: None,
    };
    let mut store = Store::new(runtime.engine(), ctx);
    store.limiter(|ctx| &mut ctx.memory);
    store.set_epoch_deadline(1);
    store.epoch_deadline_callback(|mut ctx| {
        let clock = &mut ctx.data_mut().clock;
        clock.epoch_check();
        if clock.guest_time() > clock.budget {
            return Err(wasmtime::Error::new(DeadlineExceeded(clock.budget)));
        }
        Ok(UpdateDeadline::Yield(1))
    });
    store
}

/// The trap raised when a call overruns its guest-time budget.
#[derive(Debug, thiserror::Error)]
#[error("exceeded its deadline of {0:?}")]
pub struct DeadlineExceeded(pub Duration);

/// Why a guest call failed, as far as the sandbox can tell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    Deadline(Duration),
    Memory(usize),
    /// A trap: a panic, an unreachable, a bad memory access. Holds what the guest last
    /// wrote to stderr (the panic message) or the trap's text.
    Trap(String),
    /// No instance could be made: every slot of the pool stayed taken for the runtime's
    /// `slot_wait`.
    NoInstanceSlot(String),
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fault::Deadline(budget) => {
                write!(f, "ran past its deadline of {budget:?} and was stopped")
            }
            Fault::Memory(max) => write!(
                f,
                "tried to use more than its memory cap of {} MiB",
                max >> 20
            ),
            Fault::Trap(message) => write!(f, "crashed: {message}"),
            Fault::NoInstanceSlot(limit) => write!(
                f,
                "could not run: no free WebAssembly instance slot ({limit}); every call in \
                 flight, and every running task whose driver waits on it in its own code, \
                 holds one, so raise max_plugin_instances in the agent config"
            ),
        }
    }
}

/// Classifies a failed call from its error and the store it ran in.
pub fn classify(error: &wasmtime::Error, ctx: &PluginCtx) -> Fault {
    if let Some(deadline) = error.downcast_ref::<DeadlineExceeded>() {
        return Fault::Deadline(deadline.0);
    }
    if ctx.memory.hit {
        return Fault::Memory(ctx.memory.max);
    }
    if let Some(limit) = error.downcast_ref::<wasmtime::PoolConcurrencyLimitError>() {
        return Fault::NoInstanceSlot(limit.to_string());
    }
    let stderr = ctx.stderr.contents();
    let stderr = String::from_utf8_lossy(&stderr);
    let mut lines = stderr
        .lines()
        .rev()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with("note: "));
    match lines.next() {
        Some(line) if line.contains(JS_ABORT) => {
            // The engine's complaint is its first line; a stack follows it.
            let first = stderr.lines().map(str::trim).find(|l| !l.is_empty());
            Fault::Trap(js_abort(first.unwrap_or(line)))
        }
        Some(line) => Fault::Trap(line.chars().take(500).collect()),
        None => Fault::Trap(format!("{error}")),
    }
}

/// What StarlingMonkey (componentize-js) prints as it aborts.
const JS_ABORT: &str = "mozalloc_abort";

/// A JavaScript component aborts when an export that returns a `result` throws
/// something other than its error value (an `Error`, say: "expected a string, received
/// [object]"): the author is told what to throw, with what the engine said.
fn js_abort(said: &str) -> String {
    let said: String = said.chars().take(300).collect();
    format!(
        "the JavaScript engine aborted ({said}): an export that returns a result must throw \
         its error value, for berth's calls a string (`throw String(error.message)`); see \
         plugins-sdk/README.md"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn special_files_a_task_leaves_in_local_are_found() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("conf/d")).unwrap();
        std::fs::write(dir.path().join("conf/d/app.conf"), "x").unwrap();
        std::os::unix::fs::symlink("/dev/null", dir.path().join("conf/null")).unwrap();
        assert_eq!(special_file_below(dir.path()), None);
        rustix::fs::mknodat(
            rustix::fs::CWD,
            dir.path().join("conf/d/pipe"),
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o644),
            0,
        )
        .unwrap();
        assert_eq!(
            special_file_below(dir.path()).as_deref(),
            Some("a FIFO (local/conf/d/pipe)")
        );
    }

    /// Runs on this thread's CPU for at least `cpu` (however long that takes in wall
    /// time, with other tests beside it).
    fn spin(cpu: Duration) {
        let (_, started) = thread_cpu();
        while thread_cpu().1.saturating_sub(started) < cpu {
            std::hint::black_box(0u64);
        }
    }

    /// What the guest's thread ran counts; host work inside the call, what came before
    /// the guest ran (instantiation), time the thread was off the CPU, and time yielded
    /// before another thread resumed the guest do not.
    #[test]
    fn a_calls_clock_counts_the_guests_running_only() {
        let mut clock = CallClock::new(Duration::from_millis(100));
        spin(Duration::from_millis(150));
        clock.epoch_check();
        assert!(
            clock.guest_time() >= Duration::from_millis(140),
            "{clock:?}"
        );
        clock.restart();
        clock.exempt_work(|| spin(Duration::from_millis(150)));
        // Off the CPU (a busy node): not the guest's.
        std::thread::sleep(Duration::from_millis(300));
        clock.epoch_check();
        assert!(clock.guest_time() < Duration::from_millis(20), "{clock:?}");
        // Yielded, then resumed on another thread: one tick at most.
        std::thread::scope(|scope| {
            scope.spawn(|| {
                std::thread::sleep(Duration::from_millis(300));
                clock.epoch_check();
            });
        });
        assert!(clock.guest_time() < Duration::from_millis(40), "{clock:?}");
        // Running, on one thread: all of it counts, and the budget runs out.
        clock.epoch_check();
        spin(Duration::from_millis(120));
        clock.epoch_check();
        assert!(clock.guest_time() > clock.budget, "{clock:?}");
    }
}
