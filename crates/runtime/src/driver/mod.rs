//! Task drivers as components: loading (with world-version negotiation), and every
//! driver call, each in a fresh sandboxed instance.
//!
//! # Versions
//!
//! A component is bound as the version of `berth:driver/driver` it exports (0.2.1, 0.2.0
//! or 0.1.0), and refused when its export does not match that version's WIT; the checks
//! happen before anything is instantiated. A 0.1.0 driver has no `capabilities`
//! function, and the host assumes mount-configs `all` for it ("supports all"), so
//! community drivers built before capabilities keep working. One built before 0.2.1 has
//! no `spawn-isolation`: its spawns are held to its `fs-isolation` and the operator's
//! `allow_unconfined` alone, and `job validate` cannot tell whether it will spawn
//! unconfined.

mod declarations;
mod error;
mod exec;
mod types;

use std::path::{Path, PathBuf};
use std::time::Duration;

use tracing::Instrument;

use berth_model::text::clip;
use wasmtime::Store;
use wasmtime::component::Linker;

pub use error::{DriverError, LoadError};
pub use exec::ExecError;

use super::bindings::{driver_types as wit, driver_v0_1, driver_v0_2, driver_v0_2_1};
use super::sandbox::{self, PluginCtx, PluginIdentity, TaskScope};
use super::{Runtime, SlotUse};
use berth_model::driver::{
    Capabilities, ConfigField, DriverInfo, ExitResult, Fingerprint, MountConfigs, ProcessRef,
    TaskHandle, TaskRequest, TaskStatus, WorldVersion,
};
use declarations::{is_attribute_name, one_spaced_line, spawn_isolation};

/// What a call may do besides its own work.
enum CallScope {
    /// Nothing with processes but wait on and signal the driver's own.
    Plain,
    /// Start a task: spawn its processes with what the host handed over.
    Start(Box<TaskScope>),
    /// Recover a task after an agent restart: adopt these processes (the ones the host
    /// recorded for it), no others.
    Recover(Vec<ProcessRef>),
}

/// What a call spawned, which of it the driver said the task ends with, and when the
/// driver said the task ends (`timer.task-ends-after`).
struct Spawned {
    spawned: Vec<ProcessRef>,
    ends_with: Option<ProcessRef>,
    ends_at_ms: Option<u64>,
}

/// The most config fields a driver may describe (`config-schema`).
pub const MAX_CONFIG_FIELDS: usize = 256;

/// Largest driver state the host persists per task.
pub const MAX_DRIVER_STATE: usize = 1 << 20;

/// The most characters of any text a driver returns (an error, a handle id, a health
/// description) that the host keeps; the rest is cut, with a note.
pub const MAX_GUEST_TEXT: usize = 4096;
/// Wall-clock bound on calls that have no reason to block for long.
const QUICK_CALL_WALL: Duration = Duration::from_secs(60);
/// Wall-clock bound on the calls made while loading a driver (`plugin-info`,
/// `capabilities`): a driver that takes longer is refused, and holds up no other plugin
/// (the plugin dir loads in parallel) nor the agent's start for longer than this.
pub const LOAD_CALL_WALL: Duration = Duration::from_secs(5);

/// Where a driver component came from, for messages.
#[derive(Debug, Clone)]
pub enum DriverOrigin {
    Builtin,
    File(PathBuf),
}

impl std::fmt::Display for DriverOrigin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DriverOrigin::Builtin => f.write_str("built-in"),
            DriverOrigin::File(path) => write!(f, "{}", path.display()),
        }
    }
}

enum DriverPre {
    V0_2_1(driver_v0_2_1::PluginPre<PluginCtx>),
    V0_2(driver_v0_2::PluginPre<PluginCtx>),
    V0_1(driver_v0_1::PluginPre<PluginCtx>),
}

enum Bindings {
    V0_2_1(driver_v0_2_1::Plugin),
    V0_2(driver_v0_2::Plugin),
    V0_1(driver_v0_1::Plugin),
}

/// Calls the same export on whichever world version the driver speaks.
macro_rules! on_driver {
    ($bindings:expr, $store:expr, $method:ident($($arg:expr),*)) => {
        match $bindings {
            Bindings::V0_2_1(b) => b.berth_driver_driver().$method($store, $($arg),*).await,
            Bindings::V0_2(b) => b.berth_driver_driver().$method($store, $($arg),*).await,
            Bindings::V0_1(b) => b.berth_driver_driver().$method($store, $($arg),*).await,
        }
    };
}

/// A loaded task driver.
pub struct Driver {
    runtime: Runtime,
    origin: DriverOrigin,
    pre: DriverPre,
    info: DriverInfo,
    capabilities: Capabilities,
    /// The component's SHA-256 (hex), for pins and `berth driver list`.
    digest: String,
    /// Whether this load compiled it, for `berth driver inspect`.
    compiled: crate::cache::Compiled,
}

impl Driver {
    /// Loads a driver from a `.wasm` file.
    pub async fn load_file(runtime: &Runtime, path: &Path) -> Result<Driver, LoadError> {
        let origin = DriverOrigin::File(path.to_path_buf());
        let bytes = runtime
            .read_component(path)
            .map_err(|source| LoadError::Read {
                origin: origin.to_string(),
                source,
            })?
            .map_err(|mismatch| LoadError::Mismatch {
                origin: origin.to_string(),
                mismatch,
            })?;
        Self::load(runtime, origin, &bytes).await
    }

    /// Loads a driver from component bytes.
    pub async fn load(
        runtime: &Runtime,
        origin: DriverOrigin,
        bytes: &[u8],
    ) -> Result<Driver, LoadError> {
        let shown = origin.to_string();
        let refused = |mismatch| LoadError::Mismatch {
            origin: shown.clone(),
            mismatch,
        };
        let surface = crate::component_check::surface(bytes).map_err(refused)?;
        crate::component_check::check(&surface, crate::component_check::Role::Driver)
            .map_err(refused)?;
        let (component, compiled) = runtime
            .cache()
            .load(runtime.engine(), bytes, &shown)
            .map_err(|e| LoadError::Invalid {
                origin: shown.clone(),
                reason: format!("{e:#}"),
            })?;
        let mut linker = Linker::new(runtime.engine());
        crate::host_api::add_to_linker(&mut linker).map_err(|e| LoadError::Invalid {
            origin: shown.clone(),
            reason: format!("{e:#}"),
        })?;
        let instance_pre =
            linker
                .instantiate_pre(&component)
                .map_err(|e| LoadError::WrongWorld {
                    origin: shown.clone(),
                    reason: format!("it imports something the host does not offer: {e:#}"),
                })?;
        // The bindings of the version it says it exports, and only those: wasmtime finds
        // an export by a semver-compatible name, so a broken 0.2.1 export would otherwise
        // pass as 0.2.0 and lose its declarations without a word.
        let exported = crate::component_check::driver_export_version(&surface);
        let pre = match exported {
            Some("0.2.1") => driver_v0_2_1::PluginPre::new(instance_pre).map(DriverPre::V0_2_1),
            Some("0.2.0") => driver_v0_2::PluginPre::new(instance_pre).map(DriverPre::V0_2),
            _ => driver_v0_1::PluginPre::new(instance_pre).map(DriverPre::V0_1),
        }
        .map_err(|error| LoadError::WrongWorld {
            origin: shown.clone(),
            reason: format!(
                "its berth:driver/driver@{} export does not match that version's WIT ({error:#})",
                exported.unwrap_or("0.1.0")
            ),
        })?;
        // Name and capabilities are asked once, under a provisional identity.
        let mut driver = Driver {
            runtime: runtime.clone(),
            origin,
            pre,
            info: DriverInfo {
                name: "(loading)".into(),
                version: String::new(),
            },
            capabilities: Capabilities::assumed_for_legacy(),
            digest: berth_model::pins::sha256_hex(bytes),
            compiled,
        };
        let info: DriverInfo = driver
            .call(
                "plugin-info",
                SlotUse::Check,
                CallScope::Plain,
                Some(LOAD_CALL_WALL),
                async |store, b| on_driver!(b, store, call_plugin_info()),
            )
            .await
            .map_err(|e| LoadError::Call {
                origin: shown.clone(),
                source: Box::new(e),
            })?
            .into();
        check_info(&info).map_err(|problem| LoadError::Nonsense {
            origin: shown.clone(),
            problem: problem.to_string(),
        })?;
        driver.info = info;
        let call_failed = |e| LoadError::Call {
            origin: shown.clone(),
            source: Box::new(e),
        };
        if !matches!(driver.pre, DriverPre::V0_1(_)) {
            driver.capabilities = driver
                .call(
                    "capabilities",
                    SlotUse::Check,
                    CallScope::Plain,
                    Some(LOAD_CALL_WALL),
                    async |store, b| match b {
                        Bindings::V0_2_1(b) => {
                            b.berth_driver_driver().call_capabilities(store).await
                        }
                        Bindings::V0_2(b) => b.berth_driver_driver().call_capabilities(store).await,
                        Bindings::V0_1(_) => unreachable!("checked above"),
                    },
                )
                .await
                .map_err(call_failed)?
                .into();
        }
        if matches!(driver.pre, DriverPre::V0_2_1(_)) {
            let listed = driver
                .call(
                    "spawn-isolation",
                    SlotUse::Check,
                    CallScope::Plain,
                    Some(LOAD_CALL_WALL),
                    async |store, b| match b {
                        Bindings::V0_2_1(b) => {
                            b.berth_driver_driver().call_spawn_isolation(store).await
                        }
                        Bindings::V0_2(_) | Bindings::V0_1(_) => unreachable!("checked above"),
                    },
                )
                .await
                .map_err(call_failed)?;
            let spawns =
                spawn_isolation(&listed, driver.capabilities.fs_isolation).map_err(|problem| {
                    LoadError::Nonsense {
                        origin: shown.clone(),
                        problem: problem.to_string(),
                    }
                })?;
            driver.capabilities.spawn_isolation = Some(spawns);
        }
        Ok(driver)
    }

    /// The fields of a task's `config` block the driver reads, as it describes them
    /// (world 0.2.1); `None` when it does not describe them or predates 0.2.1. A name
    /// must be an attribute name, and a type is made one line with its whitespace runs
    /// collapsed, and clipped; more than [`MAX_CONFIG_FIELDS`] fields is nonsense.
    pub async fn config_schema(&self) -> Result<Option<Vec<ConfigField>>, DriverError> {
        if !matches!(self.pre, DriverPre::V0_2_1(_)) {
            return Ok(None);
        }
        let fields = self
            .call(
                "config-schema",
                SlotUse::Check,
                CallScope::Plain,
                Some(QUICK_CALL_WALL),
                async |store, b| match b {
                    Bindings::V0_2_1(b) => b.berth_driver_driver().call_config_schema(store).await,
                    Bindings::V0_2(_) | Bindings::V0_1(_) => unreachable!("checked above"),
                },
            )
            .await?;
        let Some(fields) = fields else {
            return Ok(None);
        };
        if fields.len() > MAX_CONFIG_FIELDS {
            return Err(self.nonsense(
                "config-schema",
                &format!(
                    "{} config fields (a driver may describe at most {MAX_CONFIG_FIELDS})",
                    fields.len()
                ),
            ));
        }
        // A name is a jobspec attribute name; anything else is no field of a config block,
        // and could be padded to draw rows of its own under `driver inspect`.
        if let Some(field) = fields.iter().find(|f| !is_attribute_name(&f.name)) {
            return Err(self.nonsense(
                "config-schema",
                &format!(
                    "a config field named {:?} (a name is 1 to 64 letters, digits, '_' and '-')",
                    clip(&field.name, 64)
                ),
            ));
        }
        Ok(Some(
            fields
                .into_iter()
                .map(|field| ConfigField {
                    name: field.name,
                    hcl_type: one_spaced_line(&field.hcl_type, 1024),
                    required: field.required,
                })
                .collect(),
        ))
    }

    pub fn name(&self) -> &str {
        &self.info.name
    }

    pub fn info(&self) -> &DriverInfo {
        &self.info
    }

    pub fn capabilities(&self) -> &Capabilities {
        &self.capabilities
    }

    /// The component's SHA-256, as `sha256sum` prints it.
    pub fn digest(&self) -> &str {
        &self.digest
    }

    /// Whether loading it compiled it now, or read the compile cache.
    pub fn compiled(&self) -> crate::cache::Compiled {
        self.compiled
    }

    pub fn origin(&self) -> &DriverOrigin {
        &self.origin
    }

    pub fn world(&self) -> WorldVersion {
        match self.pre {
            DriverPre::V0_2_1(_) => WorldVersion::V0_2_1,
            DriverPre::V0_2(_) => WorldVersion::V0_2,
            DriverPre::V0_1(_) => WorldVersion::V0_1,
        }
    }

    pub async fn fingerprint(&self) -> Result<Fingerprint, DriverError> {
        let fingerprint: Fingerprint = self
            .call(
                "fingerprint",
                SlotUse::Check,
                CallScope::Plain,
                Some(QUICK_CALL_WALL),
                async |store, b| on_driver!(b, store, call_fingerprint()),
            )
            .await?
            .into();
        let mut fingerprint = fingerprint;
        fingerprint.description = clip(&fingerprint.description, MAX_GUEST_TEXT);
        if fingerprint.attributes.len() > 256
            || fingerprint
                .attributes
                .iter()
                .any(|(k, v)| k.len() + v.len() > 4096)
        {
            return Err(self.nonsense(
                "fingerprint",
                "more than 256 attributes or an attribute over 4 KiB",
            ));
        }
        Ok(fingerprint)
    }

    /// Runs the driver's check of a task's `config` block (JSON).
    pub async fn validate_task_config(&self, config: &str) -> Result<(), DriverError> {
        let result = self
            .call(
                "validate-task-config",
                SlotUse::Check,
                CallScope::Plain,
                Some(QUICK_CALL_WALL),
                async |store, b| on_driver!(b, store, call_validate_task_config(config)),
            )
            .await?;
        result.map_err(|message| self.refused("validate-task-config", message))
    }

    pub async fn start_task(&self, request: &TaskRequest) -> Result<TaskHandle, DriverError> {
        let scope = TaskScope {
            task_id: request.id.clone(),
            task_dir: request.task_dir.clone(),
            mounts: request.mounts.clone(),
            stdout: request.stdout.clone(),
            stderr: request.stderr.clone(),
            logs: request.logs,
            privileged: request.privileged,
            user: request.user,
            allow_unconfined: request.allow_unconfined,
            cgroup_procs: request.cgroup_procs.clone(),
            collector_cgroup_procs: request.collector_cgroup_procs.clone(),
            network_namespace: request.network_namespace.clone(),
            etc_files: request.etc_files.clone(),
            image_user_namespace: request.image_user_namespace.clone(),
            progress: request.progress.clone(),
            own_network: request.own_network.clone(),
        };
        let config = wit::TaskConfig::from(request);
        let (
            started,
            Spawned {
                spawned,
                ends_with,
                ends_at_ms,
            },
        ) = self
            .call_recording_spawns(
                "start-task",
                SlotUse::Task,
                CallScope::Start(Box::new(scope)),
                Some(QUICK_CALL_WALL * 5),
                async |store, b| on_driver!(b, store, call_start_task(&config)),
            )
            .await?;
        let checked = started
            .map_err(|message| self.refused("start-task", message))
            .and_then(|handle| self.check_started(request, handle));
        match checked {
            Ok(handle) => Ok(TaskHandle {
                id: handle.id,
                driver_state: handle.driver_state,
                spawned,
                ends_with,
                ends_at_ms,
            }),
            Err(error) => {
                self.forget_all(&spawned);
                Err(error)
            }
        }
    }

    /// The handle a driver returned from start-task, checked.
    fn check_started(
        &self,
        request: &TaskRequest,
        handle: wit::TaskHandle,
    ) -> Result<wit::TaskHandle, DriverError> {
        if handle.id != request.id {
            return Err(self.nonsense(
                "start-task",
                &format!(
                    "a handle for task {:?} when starting {:?}",
                    clip(&handle.id, 256),
                    request.id
                ),
            ));
        }
        if handle.driver_state.len() > MAX_DRIVER_STATE {
            return Err(self.nonsense(
                "start-task",
                &format!(
                    "{} bytes of driver state (the limit is {} KiB)",
                    handle.driver_state.len(),
                    MAX_DRIVER_STATE >> 10
                ),
            ));
        }
        Ok(handle)
    }

    /// Recovers a task after an agent restart. A driver may say again when the task
    /// ends (`timer.task-ends-after`); `handle` then keeps that end.
    pub async fn recover_task(&self, handle: &mut TaskHandle) -> Result<(), DriverError> {
        let adoptable = handle.spawned.clone();
        let wit_handle = wit::TaskHandle::from(&*handle);
        let (recovered, said) = self
            .call_recording_spawns(
                "recover-task",
                SlotUse::Task,
                CallScope::Recover(adoptable),
                Some(QUICK_CALL_WALL),
                async |store, b| on_driver!(b, store, call_recover_task(&wit_handle)),
            )
            .await?;
        recovered.map_err(|message| self.refused("recover-task", message))?;
        if said.ends_at_ms.is_some() {
            handle.ends_at_ms = said.ends_at_ms;
        }
        Ok(())
    }

    /// Blocks until the task exits. No wall-clock bound: only guest compute time counts.
    ///
    /// When the driver said which process the task ends with, or when it ends, the host
    /// waits for that process or time itself first, holding no instance: a running task
    /// costs no slot of the instance pool, and the driver's `wait-task` then returns at
    /// once.
    pub async fn wait_task(&self, handle: &TaskHandle) -> Result<ExitResult, DriverError> {
        if handle.ends_with.is_none()
            && let Some(ends_at_ms) = handle.ends_at_ms
        {
            sleep_until_unix_ms(ends_at_ms).await;
        }
        self.wait_stopped_task(handle).await
    }

    /// Waits for a task that `stop-task` stopped: for the process it ends with, if any,
    /// but not for the time it would have ended at (a task that ends at a time ends when
    /// stopped); then asks the driver's `wait-task`.
    pub async fn wait_stopped_task(&self, handle: &TaskHandle) -> Result<ExitResult, DriverError> {
        if let Some(process) = handle.ends_with {
            // An error (a process this table no longer tracks) is the driver's to report.
            let owner: std::sync::Arc<str> = self.info.name.as_str().into();
            let _ = self.runtime.processes().wait(&owner, process, None).await;
        }
        let handle = wit::TaskHandle::from(handle);
        let exit = self
            .call(
                "wait-task",
                SlotUse::Task,
                CallScope::Plain,
                None,
                async |store, b| on_driver!(b, store, call_wait_task(&handle)),
            )
            .await?
            .map_err(|message| self.refused("wait-task", message))?;
        Ok(exit.into())
    }

    pub async fn stop_task(
        &self,
        handle: &TaskHandle,
        timeout: Duration,
        signal: &str,
    ) -> Result<(), DriverError> {
        let handle = wit::TaskHandle::from(handle);
        let millis = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
        self.call(
            "stop-task",
            SlotUse::Task,
            CallScope::Plain,
            Some(timeout.saturating_add(QUICK_CALL_WALL)),
            async |store, b| on_driver!(b, store, call_stop_task(&handle, millis, signal)),
        )
        .await?
        .map_err(|message| self.refused("stop-task", message))
    }

    pub async fn destroy_task(&self, handle: &TaskHandle, force: bool) -> Result<(), DriverError> {
        let handle = wit::TaskHandle::from(handle);
        self.call(
            "destroy-task",
            SlotUse::Task,
            CallScope::Plain,
            Some(QUICK_CALL_WALL),
            async |store, b| on_driver!(b, store, call_destroy_task(&handle, force)),
        )
        .await?
        .map_err(|message| self.refused("destroy-task", message))
    }

    /// Stops tracking the task's processes (closing their pidfds): after the task was
    /// destroyed and its cgroup emptied, nothing of them is left to wait on or signal.
    pub fn release(&self, handle: &TaskHandle) {
        self.forget_all(&handle.spawned);
    }

    pub async fn inspect_task(&self, handle: &TaskHandle) -> Result<TaskStatus, DriverError> {
        let handle = wit::TaskHandle::from(handle);
        let status = self
            .call(
                "inspect-task",
                SlotUse::Check,
                CallScope::Plain,
                Some(QUICK_CALL_WALL),
                async |store, b| on_driver!(b, store, call_inspect_task(&handle)),
            )
            .await?
            .map_err(|message| self.refused("inspect-task", message))?;
        Ok(status.into())
    }

    pub async fn signal_task(&self, handle: &TaskHandle, signal: &str) -> Result<(), DriverError> {
        let handle = wit::TaskHandle::from(handle);
        self.call(
            "signal-task",
            SlotUse::Check,
            CallScope::Plain,
            Some(QUICK_CALL_WALL),
            async |store, b| on_driver!(b, store, call_signal_task(&handle, signal)),
        )
        .await?
        .map_err(|message| self.refused("signal-task", message))
    }

    /// One guest call in a fresh instance: instantiate, run `body`, then turn traps,
    /// deadline overruns, memory cap hits and refused host requests into a
    /// [`DriverError`] that names the driver and the call.
    async fn call<R>(
        &self,
        call: &'static str,
        used_for: SlotUse,
        scope: CallScope,
        wall: Option<Duration>,
        body: impl AsyncFnOnce(&mut Store<PluginCtx>, &Bindings) -> wasmtime::Result<R>,
    ) -> Result<R, DriverError> {
        let (result, _) = self
            .call_recording_spawns(call, used_for, scope, wall, body)
            .await?;
        Ok(result)
    }

    /// A call, with the processes the driver spawned during it.
    async fn call_recording_spawns<R>(
        &self,
        call: &'static str,
        used_for: SlotUse,
        scope: CallScope,
        wall: Option<Duration>,
        body: impl AsyncFnOnce(&mut Store<PluginCtx>, &Bindings) -> wasmtime::Result<R>,
    ) -> Result<(R, Spawned), DriverError> {
        let span = tracing::info_span!("plugin_call", plugin = %self.info.name, function = %call);
        let started = std::time::Instant::now();
        let result = self
            .call_in_span(call, used_for, scope, wall, body)
            .instrument(span)
            .await;
        self.runtime.metrics().plugin_call(
            "driver",
            &self.info.name,
            call,
            started.elapsed(),
            result.is_ok(),
        );
        result
    }

    async fn call_in_span<R>(
        &self,
        call: &'static str,
        used_for: SlotUse,
        scope: CallScope,
        wall: Option<Duration>,
        body: impl AsyncFnOnce(&mut Store<PluginCtx>, &Bindings) -> wasmtime::Result<R>,
    ) -> Result<(R, Spawned), DriverError> {
        let (task, adoptable) = match scope {
            CallScope::Plain => (None, None),
            CallScope::Start(task) => (Some(*task), None),
            CallScope::Recover(adoptable) => (None, Some(adoptable)),
        };
        let identity = PluginIdentity {
            name: self.info.name.as_str().into(),
            may_mount: self.capabilities.mount_configs == MountConfigs::All,
            isolation: self.capabilities.fs_isolation,
            spawns: self.capabilities.spawn_isolation.clone(),
            adoptable,
        };
        // Declared before the store, so it is given back after the store is gone.
        let _slot = self
            .runtime
            .instance_slot(used_for)
            .await
            .map_err(|no_slot| DriverError::Fault {
                driver: self.label(),
                call,
                fault: sandbox::Fault::NoInstanceSlot(no_slot.to_string()),
            })?;
        let mut store = sandbox::new_store(
            &self.runtime,
            identity,
            task,
            self.runtime.limits().call_deadline,
        );
        let run = async {
            let bindings = match &self.pre {
                DriverPre::V0_2_1(pre) => {
                    Bindings::V0_2_1(pre.instantiate_async(&mut store).await?)
                }
                DriverPre::V0_2(pre) => Bindings::V0_2(pre.instantiate_async(&mut store).await?),
                DriverPre::V0_1(pre) => Bindings::V0_1(pre.instantiate_async(&mut store).await?),
            };
            store.data_mut().clock.restart();
            body(&mut store, &bindings).await
        };
        let outcome = match wall {
            Some(limit) => tokio::time::timeout(limit, run).await.ok(),
            None => Some(run.await),
        };
        let spawned = std::mem::take(&mut store.data_mut().spawned);
        let ends_with = store.data().task_ends_with;
        let ends_at_ms = store.data().task_ends_at_ms;
        let failure = match &outcome {
            None => Some(DriverError::WallTimeout {
                driver: self.label(),
                call,
                limit: wall.unwrap_or_default(),
            }),
            Some(_) if !store.data().violations.is_empty() => Some(DriverError::Violation {
                driver: self.label(),
                call,
                violation: store.data().violations[0].clone(),
            }),
            Some(Err(error)) => Some(DriverError::Fault {
                driver: self.label(),
                call,
                fault: sandbox::classify(error, store.data()),
            }),
            Some(Ok(_)) => None,
        };
        match (failure, outcome) {
            (None, Some(Ok(result))) => Ok((
                result,
                Spawned {
                    spawned,
                    ends_with,
                    ends_at_ms,
                },
            )),
            (failure, _) => {
                // A failed call hands no process to anyone: stop tracking what it spawned
                // (the task's cgroup ends the processes themselves).
                self.forget_all(&spawned);
                Err(failure.unwrap_or_else(|| self.nonsense(call, "no outcome")))
            }
        }
    }

    fn forget_all(&self, spawned: &[ProcessRef]) {
        for process in spawned {
            self.runtime.processes().forget(*process);
        }
    }

    /// `driver "exec" (built-in)`, `driver "x" (/plugins/x.wasm)`: how errors name us.
    pub fn label(&self) -> String {
        format!("driver {:?} ({})", self.info.name, self.origin)
    }

    /// The driver's own error, clipped: it is stored in task events and shown.
    fn refused(&self, call: &'static str, message: String) -> DriverError {
        DriverError::Refused {
            driver: self.label(),
            call,
            message: clip(&message, MAX_GUEST_TEXT),
        }
    }

    fn nonsense(&self, call: &'static str, problem: &str) -> DriverError {
        DriverError::Nonsense {
            driver: self.label(),
            call,
            problem: problem.to_string(),
        }
    }
}

/// Sleeps until the wall clock reads `ends_at_ms` (Unix milliseconds), in steps of at
/// most an hour: a clock set forward or back while it waits is seen within the hour, and
/// no step is too far for the runtime's timer.
async fn sleep_until_unix_ms(ends_at_ms: u64) {
    const STEP: Duration = Duration::from_secs(3600);
    loop {
        let left = ends_at_ms.saturating_sub(berth_model::driver::unix_ms_now());
        if left == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(left).min(STEP)).await;
    }
}

/// What is wrong with the name or version a driver reports.
#[derive(Debug, thiserror::Error)]
enum InfoProblem {
    #[error("driver name {0:?} (use 1 to 64 of a-z, 0-9, '_' and '-')")]
    Name(String),
    #[error("version {0:?} (must be 1 to 64 characters)")]
    Version(String),
}

/// Names must be usable in jobspecs and paths.
fn check_info(info: &DriverInfo) -> Result<(), InfoProblem> {
    let valid_name = !info.name.is_empty()
        && info.name.len() <= 64
        && info
            .name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-');
    if !valid_name {
        return Err(InfoProblem::Name(info.name.clone()));
    }
    if info.version.is_empty() || info.version.len() > 64 {
        return Err(InfoProblem::Version(info.version.clone()));
    }
    Ok(())
}
