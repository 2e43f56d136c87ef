//! Write berth task drivers and lifecycle hooks as WebAssembly components.
//!
//! Drivers: the crate root (feature `driver`, on by default). Hooks: the [`hook`]
//! module and [`export_hook!`] (feature `hook`).
//!
//! A berth task driver is a component that exports the `berth:driver/driver@0.2.1`
//! interface and imports what the host offers (`berth:host/log`, `timer`, `process`).
//! This crate generates the bindings once, gives you the [`Driver`] trait with sensible
//! defaults, and the [`export_driver!`] macro that wires your type to the component's
//! exports. Build with `cargo build --target wasm32-wasip2`: that target emits a
//! component directly.
//!
//! # Contract in one paragraph
//!
//! A driver is **stateless between calls**: the host may instantiate it afresh for every
//! call. Whatever a driver must remember about a task goes into
//! [`TaskHandle::driver_state`], bytes the host persists and hands back on every later
//! call for that task, including [`Driver::recover_task`] after an agent restart. Drivers
//! never make syscalls: they ask the host to spawn, wait on and signal processes through
//! [`host::process`], and the host checks every request against the driver's declared
//! [`DriverCapabilities`] and the task it is working on.
//!
//! # Example
//!
//! ```no_run
//! use berth_plugin_sdk::{
//!     export_driver, host, Driver, ExitResult, DriverFingerprint, HealthState, DriverInfo,
//!     TaskConfig, TaskHandle, TaskState, TaskStatus,
//! };
//!
//! struct Hello;
//!
//! impl Driver for Hello {
//!     // No config: a task naming any field in its `config` block is refused at validate.
//!     type Config = berth_plugin_sdk::config::NoConfig;
//!
//!     fn plugin_info() -> DriverInfo {
//!         DriverInfo { name: "hello".into(), version: "0.1.0".into() }
//!     }
//!
//!     fn fingerprint() -> DriverFingerprint {
//!         DriverFingerprint {
//!             health: HealthState::Healthy,
//!             health_description: "ready".into(),
//!             attributes: vec![],
//!         }
//!     }
//!
//!     // It spawns in the host's namespaces, which the operator must allow.
//!     fn spawn_isolation() -> Vec<host::process::Isolation> {
//!         vec![host::process::Isolation::None]
//!     }
//!
//!     fn start_task(config: TaskConfig) -> Result<TaskHandle, String> {
//!         let process = host::process::spawn(&host::process::SpawnRequest {
//!             argv: vec!["/bin/echo".into(), format!("hello from {}", config.name)],
//!             env: config.env.clone(),
//!             cwd: None,
//!             isolation: host::process::Isolation::None,
//!             mounts: vec![],
//!         })?;
//!         let state = format!("{} {}", process.pid, process.start_time);
//!         Ok(TaskHandle { id: config.id, driver_state: state.into_bytes() })
//!     }
//!
//!     fn wait_task(handle: TaskHandle) -> Result<ExitResult, String> {
//!         let process = parse(&handle)?;
//!         let status = host::process::wait(process, None)?.expect("no timeout was given");
//!         Ok(ExitResult {
//!             exit_code: status.code.unwrap_or(-1),
//!             signal: status.signal.unwrap_or(0),
//!             oom_killed: false,
//!         })
//!     }
//!
//!     fn stop_task(handle: TaskHandle, _timeout_millis: u64, signal: String) -> Result<(), String> {
//!         host::process::signal(parse(&handle)?, &signal)
//!     }
//!
//!     fn inspect_task(handle: TaskHandle) -> Result<TaskStatus, String> {
//!         Ok(TaskStatus { id: handle.id, state: TaskState::Unknown, exit_result: None })
//!     }
//! }
//!
//! fn parse(handle: &TaskHandle) -> Result<host::process::ProcessRef, String> {
//!     let text = String::from_utf8_lossy(&handle.driver_state);
//!     let (pid, start) = text.split_once(' ').ok_or("corrupt driver state")?;
//!     Ok(host::process::ProcessRef {
//!         pid: pid.parse().map_err(|_| "corrupt pid")?,
//!         start_time: start.parse().map_err(|_| "corrupt start time")?,
//!     })
//! }
//!
//! export_driver!(Hello);
//! ```

pub mod config;

/// The generated bindings for the driver world. Prefer the re-exports at the crate root.
#[cfg(feature = "driver")]
#[doc(hidden)]
pub mod bindings {
    wit_bindgen::generate!({
        world: "berth:driver/plugin@0.2.1",
        path: ["wit/host", "wit/driver"],
        pub_export_macro: true,
        export_macro_name: "__export_driver_world",
        default_bindings_module: "berth_plugin_sdk::bindings",
        generate_all,
    });
}

/// What the host offers to drivers: logging, timers, processes and images.
#[cfg(feature = "driver")]
pub mod host {
    pub use crate::bindings::berth::host::{image, log, process, timer};

    /// Logs `message` into the agent's log at info level, tagged with the driver's name.
    pub fn info(message: &str) {
        log::log(log::Level::Info, message);
    }

    /// Logs `message` into the agent's log at warn level.
    pub fn warn(message: &str) {
        log::log(log::Level::Warn, message);
    }
}

#[cfg(feature = "driver")]
pub use bindings::berth::driver::types::{
    ConfigField, DriverCapabilities, DriverFingerprint, DriverInfo, ExitResult, FsIsolation,
    HealthState, MountConfig, MountConfigs, TaskConfig, TaskHandle, TaskState, TaskStatus,
};
#[cfg(feature = "driver")]
pub use bindings::berth::host::process::Isolation;

/// A task driver. Implement the required methods; the rest have defaults that suit a
/// simple driver. Export the type with [`export_driver!`].
#[cfg(feature = "driver")]
pub trait Driver {
    /// The task's `config` block, as this driver reads it. [`validate_task_config`]
    /// reads it strictly by default ([`config::parse`]): a field the type does not name
    /// is refused at `job validate`, with the closest name it has. A driver without
    /// config says [`config::NoConfig`]; one that reads config loosely says
    /// `serde_json::Value`.
    ///
    /// [`validate_task_config`]: Driver::validate_task_config
    type Config: serde::de::DeserializeOwned;

    /// Name and version, as shown by `berth driver list`.
    fn plugin_info() -> DriverInfo;

    /// What the driver can do. The default declares mount-configs `all`, signals, no exec
    /// and no filesystem isolation. A driver that cannot honour volume mounts must
    /// declare [`MountConfigs::None`]: the host then rejects jobs that ask it for mounts.
    fn capabilities() -> DriverCapabilities {
        default_capabilities()
    }

    /// Every [`Isolation`] this driver's [`host::process::spawn`] calls use; the host
    /// refuses a spawn with any other. The default is `[Isolation::Chroot]`. A driver that
    /// spawns in the host's namespaces ([`Isolation::None`], as the agent's user) says
    /// so, and `job validate` then refuses its tasks unless the operator allows it
    /// (`allow_unconfined = true` in its plugin block); one that spawns nothing says
    /// `vec![]`.
    fn spawn_isolation() -> Vec<Isolation> {
        vec![Isolation::Chroot]
    }

    /// The fields of the task's `config` block, for `berth driver inspect`. The default
    /// reads them from [`Driver::Config`] ([`config::schema`]); a driver that reads its
    /// config by hand describes it here, or says `None`.
    fn config_schema() -> Option<Vec<ConfigField>> {
        config::schema::<Self::Config>()
    }

    /// Health and attributes of the driver on this node.
    fn fingerprint() -> DriverFingerprint;

    /// Checks a task's `config` block (JSON) at job submit. The default reads it as
    /// [`Driver::Config`], strictly; override it to check more than the type can say.
    fn validate_task_config(config: String) -> Result<(), String> {
        config::parse::<Self::Config>(&config).map(drop)
    }

    /// Starts the task and returns the handle the host persists. Read the config with
    /// [`config::of_task`].
    fn start_task(config: TaskConfig) -> Result<TaskHandle, String>;

    /// Re-attaches to a task after an agent restart. The default fails, which makes the
    /// host treat the task as lost.
    fn recover_task(handle: TaskHandle) -> Result<(), String> {
        Err(format!(
            "task {} cannot be recovered by this driver",
            handle.id
        ))
    }

    /// Blocks until the task exits.
    fn wait_task(handle: TaskHandle) -> Result<ExitResult, String>;

    /// Asks the task to stop with `signal`, killing it after `timeout_millis`.
    fn stop_task(handle: TaskHandle, timeout_millis: u64, signal: String) -> Result<(), String>;

    /// Releases what the driver holds for the task. The default has nothing to release.
    fn destroy_task(handle: TaskHandle, force: bool) -> Result<(), String> {
        let _ = (handle, force);
        Ok(())
    }

    /// Reports the task's state.
    fn inspect_task(handle: TaskHandle) -> Result<TaskStatus, String>;

    /// Sends a signal to the task. The default refuses.
    fn signal_task(handle: TaskHandle, signal: String) -> Result<(), String> {
        let _ = handle;
        Err(format!("this driver cannot send signals ({signal})"))
    }
}

/// What a driver that declares nothing gets: signals, no exec, no filesystem isolation,
/// and mount-configs `all`.
#[cfg(feature = "driver")]
pub fn default_capabilities() -> DriverCapabilities {
    DriverCapabilities {
        send_signals: true,
        exec: false,
        fs_isolation: FsIsolation::None,
        mount_configs: MountConfigs::All,
    }
}

/// A driver whose task is one host process: implement how to start it, and waiting,
/// stopping, inspecting, signalling and recovering come from [`process_task`]. Every
/// `ProcessDriver` is a [`Driver`]; export it with [`export_driver!`].
#[cfg(feature = "driver")]
pub trait ProcessDriver {
    /// As [`Driver::Config`]: the task's `config` block, read strictly by default.
    type Config: serde::de::DeserializeOwned;

    /// Name and version, as shown by `berth driver list`.
    fn plugin_info() -> DriverInfo;

    /// As [`Driver::capabilities`]; the default declares mount-configs `all`.
    fn capabilities() -> DriverCapabilities {
        default_capabilities()
    }

    /// As [`Driver::spawn_isolation`]: the default is `[Isolation::Chroot]`.
    fn spawn_isolation() -> Vec<Isolation> {
        vec![Isolation::Chroot]
    }

    /// As [`Driver::config_schema`]: the default reads [`ProcessDriver::Config`].
    fn config_schema() -> Option<Vec<ConfigField>> {
        config::schema::<Self::Config>()
    }

    /// Health and attributes of the driver on this node.
    fn fingerprint() -> DriverFingerprint;

    /// As [`Driver::validate_task_config`]: the default reads the config as
    /// [`ProcessDriver::Config`], strictly.
    fn validate_task_config(config: String) -> Result<(), String> {
        config::parse::<Self::Config>(&config).map(drop)
    }

    /// Spawns the task's process and returns [`process_task::handle`] for it. The task
    /// then ends with that process ([`process_task::ends_with`] is called for you), and
    /// a running task holds no instance of the driver.
    fn start_task(config: TaskConfig) -> Result<TaskHandle, String>;
}

#[cfg(feature = "driver")]
impl<T: ProcessDriver> Driver for T {
    type Config = <T as ProcessDriver>::Config;

    fn plugin_info() -> DriverInfo {
        <T as ProcessDriver>::plugin_info()
    }
    fn capabilities() -> DriverCapabilities {
        <T as ProcessDriver>::capabilities()
    }
    fn spawn_isolation() -> Vec<Isolation> {
        <T as ProcessDriver>::spawn_isolation()
    }
    fn config_schema() -> Option<Vec<ConfigField>> {
        <T as ProcessDriver>::config_schema()
    }
    fn fingerprint() -> DriverFingerprint {
        <T as ProcessDriver>::fingerprint()
    }
    fn validate_task_config(config: String) -> Result<(), String> {
        <T as ProcessDriver>::validate_task_config(config)
    }
    fn start_task(config: TaskConfig) -> Result<TaskHandle, String> {
        let handle = <T as ProcessDriver>::start_task(config)?;
        process_task::ends_with(&handle)?;
        Ok(handle)
    }
    fn recover_task(handle: TaskHandle) -> Result<(), String> {
        process_task::recover(&handle)
    }
    fn wait_task(handle: TaskHandle) -> Result<ExitResult, String> {
        process_task::wait(&handle)
    }
    fn stop_task(handle: TaskHandle, timeout_millis: u64, signal: String) -> Result<(), String> {
        process_task::stop(&handle, timeout_millis, &signal)
    }
    fn inspect_task(handle: TaskHandle) -> Result<TaskStatus, String> {
        process_task::inspect(&handle)
    }
    fn signal_task(handle: TaskHandle, signal: String) -> Result<(), String> {
        process_task::signal(&handle, &signal)
    }
}

#[cfg(feature = "driver")]
#[doc(hidden)]
pub mod __private {
    pub use crate::bindings::exports::berth::driver::driver::Guest as DriverGuest;
}

/// Exports a [`Driver`] implementation as the component's `berth:driver/driver` interface.
#[cfg(feature = "driver")]
#[macro_export]
macro_rules! export_driver {
    ($driver:ty) => {
        const _: () = {
            struct __BerthDriverExport;

            impl $crate::__private::DriverGuest for __BerthDriverExport {
                fn plugin_info() -> $crate::DriverInfo {
                    <$driver as $crate::Driver>::plugin_info()
                }
                fn capabilities() -> $crate::DriverCapabilities {
                    <$driver as $crate::Driver>::capabilities()
                }
                fn spawn_isolation() -> Vec<$crate::Isolation> {
                    <$driver as $crate::Driver>::spawn_isolation()
                }
                fn config_schema() -> Option<Vec<$crate::ConfigField>> {
                    <$driver as $crate::Driver>::config_schema()
                }
                fn fingerprint() -> $crate::DriverFingerprint {
                    <$driver as $crate::Driver>::fingerprint()
                }
                fn validate_task_config(config: String) -> Result<(), String> {
                    <$driver as $crate::Driver>::validate_task_config(config)
                }
                fn start_task(config: $crate::TaskConfig) -> Result<$crate::TaskHandle, String> {
                    <$driver as $crate::Driver>::start_task(config)
                }
                fn recover_task(handle: $crate::TaskHandle) -> Result<(), String> {
                    <$driver as $crate::Driver>::recover_task(handle)
                }
                fn wait_task(handle: $crate::TaskHandle) -> Result<$crate::ExitResult, String> {
                    <$driver as $crate::Driver>::wait_task(handle)
                }
                fn stop_task(
                    handle: $crate::TaskHandle,
                    timeout_millis: u64,
                    signal: String,
                ) -> Result<(), String> {
                    <$driver as $crate::Driver>::stop_task(handle, timeout_millis, signal)
                }
                fn destroy_task(handle: $crate::TaskHandle, force: bool) -> Result<(), String> {
                    <$driver as $crate::Driver>::destroy_task(handle, force)
                }
                fn inspect_task(handle: $crate::TaskHandle) -> Result<$crate::TaskStatus, String> {
                    <$driver as $crate::Driver>::inspect_task(handle)
                }
                fn signal_task(handle: $crate::TaskHandle, signal: String) -> Result<(), String> {
                    <$driver as $crate::Driver>::signal_task(handle, signal)
                }
            }

            $crate::bindings::__export_driver_world!(
                __BerthDriverExport with_types_in $crate::bindings
            );
        };
    };
}

/// Helpers for drivers whose tasks are one host process: keep the [`ProcessRef`] in the
/// task handle, and wait, stop, signal and inspect through the host.
///
/// [`ProcessRef`]: host::process::ProcessRef
#[cfg(feature = "driver")]
pub mod process_task {
    use crate::host::process::{self, ProcessRef};
    use crate::{ExitResult, TaskHandle, TaskState, TaskStatus};

    /// The mounts the host handed the task, as a spawn asks for them: all of them, as
    /// handed (a spawn may only ask for what was handed, or less).
    pub fn bind_mounts(mounts: &[crate::MountConfig]) -> Vec<process::BindMount> {
        mounts
            .iter()
            .map(|m| process::BindMount {
                host_path: m.host_path.clone(),
                task_path: m.task_path.clone(),
                read_only: m.read_only,
                propagation: m.propagation,
            })
            .collect()
    }

    /// Encodes the process in the handle's driver state (`"<pid> <start-time>"`).
    pub fn handle(task_id: String, process: ProcessRef) -> TaskHandle {
        TaskHandle {
            id: task_id,
            driver_state: format!("{} {}", process.pid, process.start_time).into_bytes(),
        }
    }

    /// Decodes what [`handle`] encoded.
    pub fn process_of(handle: &TaskHandle) -> Result<ProcessRef, String> {
        let corrupt = || {
            format!(
                "task {}: driver state is not a process reference",
                handle.id
            )
        };
        let text = std::str::from_utf8(&handle.driver_state).map_err(|_| corrupt())?;
        let (pid, start_time) = text.split_once(' ').ok_or_else(corrupt)?;
        Ok(ProcessRef {
            pid: pid.parse().map_err(|_| corrupt())?,
            start_time: start_time.parse().map_err(|_| corrupt())?,
        })
    }

    /// Turns a host exit status into the driver's exit result.
    pub fn exit_result(status: process::ExitStatus) -> ExitResult {
        ExitResult {
            exit_code: status.code.unwrap_or(-1),
            signal: status.signal.unwrap_or(0),
            oom_killed: false,
        }
    }

    /// Blocks until the process exits.
    pub fn wait(handle: &TaskHandle) -> Result<ExitResult, String> {
        let status = process::wait(process_of(handle)?, None)?.ok_or_else(|| {
            format!(
                "task {}: host returned from an untimed wait early",
                handle.id
            )
        })?;
        Ok(exit_result(status))
    }

    /// Sends `signal`, waits up to `timeout_millis`, then sends `SIGKILL`.
    pub fn stop(handle: &TaskHandle, timeout_millis: u64, signal: &str) -> Result<(), String> {
        let process = process_of(handle)?;
        let signal = if signal.is_empty() { "SIGTERM" } else { signal };
        process::signal(process, signal)?;
        if process::wait(process, Some(timeout_millis))?.is_none() {
            process::signal(process, "SIGKILL")?;
            process::wait(process, None)?;
        }
        Ok(())
    }

    /// Reports running or exited, with the exit result when known.
    pub fn inspect(handle: &TaskHandle) -> Result<TaskStatus, String> {
        let status = process::wait(process_of(handle)?, Some(0))?;
        Ok(TaskStatus {
            id: handle.id.clone(),
            state: if status.is_some() {
                TaskState::Exited
            } else {
                TaskState::Running
            },
            exit_result: status.map(exit_result),
        })
    }

    /// Tells the host that the task ends with the handle's process, so that the host
    /// waits for it without keeping an instance of the driver for the task's life.
    /// Call it in `start-task`, after the spawn.
    pub fn ends_with(handle: &TaskHandle) -> Result<(), String> {
        process::task_ends_with(process_of(handle)?)
    }

    /// Takes the process back after an agent restart.
    pub fn recover(handle: &TaskHandle) -> Result<(), String> {
        process::adopt(process_of(handle)?)
    }

    /// Sends a signal by name.
    pub fn signal(handle: &TaskHandle, signal: &str) -> Result<(), String> {
        process::signal(process_of(handle)?, signal)
    }
}

/// Lifecycle hooks: implement [`hook::Hook`] and export it with [`export_hook!`].
///
/// A hook runs sandboxed: WASI with only the task's `local/` directory (at `/local`), no
/// network, no environment of its own, a deadline per call and a memory cap, all set by
/// the operator. It is instantiated afresh for every call. In `prestart` it can add
/// environment variables, ask the host to write files into `local/`, emit events, or
/// refuse the task with a reason the user sees.
///
/// ```no_run
/// use berth_plugin_sdk::export_hook;
/// use berth_plugin_sdk::hook::{Hook, PrestartResponse, TaskContext};
///
/// struct Greeting;
///
/// impl Hook for Greeting {
///     fn prestart(context: TaskContext) -> Result<PrestartResponse, String> {
///         let mut response = berth_plugin_sdk::hook::response();
///         response.env.push(("GREETING".into(), format!("hello {}", context.task_name)));
///         Ok(response)
///     }
/// }
///
/// export_hook!(Greeting);
/// ```
#[cfg(feature = "hook")]
pub mod hook {
    /// The generated bindings for the hook world. Prefer the re-exports below.
    #[doc(hidden)]
    pub mod bindings {
        wit_bindgen::generate!({
            world: "berth:hook/hook@0.1.0",
            path: ["wit/host", "wit/hook"],
            pub_export_macro: true,
            export_macro_name: "__export_hook_world",
            default_bindings_module: "berth_plugin_sdk::hook::bindings",
            generate_all,
        });
    }

    pub use bindings::berth::hook::types::{ExitInfo, File, PrestartResponse, TaskContext, Volume};
    pub use bindings::berth::host::log;

    /// A lifecycle hook. Every method has a do-nothing default.
    pub trait Hook {
        /// Before the driver starts the task. `Err(reason)` refuses the task.
        fn prestart(_context: TaskContext) -> Result<PrestartResponse, String> {
            Ok(response())
        }
        fn poststart(_context: TaskContext) {}
        fn exited(_context: TaskContext, _exit: ExitInfo) {}
        fn stop(_context: TaskContext) {}
    }

    /// A prestart response that changes nothing; push onto its fields.
    pub fn response() -> PrestartResponse {
        PrestartResponse {
            env: Vec::new(),
            files: Vec::new(),
            events: Vec::new(),
        }
    }

    /// Looks a key up in one of the context's key/value lists.
    pub fn lookup<'a>(pairs: &'a [(String, String)], key: &str) -> Option<&'a str> {
        pairs
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    #[doc(hidden)]
    pub use bindings::exports::berth::hook::lifecycle::Guest as HookGuest;
}

/// Exports a [`hook::Hook`] implementation as the component's `berth:hook/lifecycle`.
#[cfg(feature = "hook")]
#[macro_export]
macro_rules! export_hook {
    ($hook:ty) => {
        const _: () = {
            struct __BerthHookExport;

            impl $crate::hook::HookGuest for __BerthHookExport {
                fn prestart(
                    context: $crate::hook::TaskContext,
                ) -> Result<$crate::hook::PrestartResponse, String> {
                    <$hook as $crate::hook::Hook>::prestart(context)
                }
                fn poststart(context: $crate::hook::TaskContext) {
                    <$hook as $crate::hook::Hook>::poststart(context)
                }
                fn exited(context: $crate::hook::TaskContext, exit: $crate::hook::ExitInfo) {
                    <$hook as $crate::hook::Hook>::exited(context, exit)
                }
                fn stop(context: $crate::hook::TaskContext) {
                    <$hook as $crate::hook::Hook>::stop(context)
                }
            }

            $crate::hook::bindings::__export_hook_world!(
                __BerthHookExport with_types_in $crate::hook::bindings
            );
        };
    };
}
