//! `echo`: a task driver that prints a message, as a first driver to copy.
//!
//! The task is one host process (`/bin/echo`), so the driver implements
//! [`ProcessDriver`]: it says how to start the process, and the SDK supplies waiting,
//! stopping, signalling, inspecting and recovery after an agent restart. The process runs
//! chrooted into the task's directory, with the host's system directories bound
//! read-only, and the host confines it (cgroup, user, limits) as it does any task.

use berth_plugin_sdk::host::process::{self, Isolation, SpawnRequest};
use berth_plugin_sdk::{
    DriverCapabilities, DriverFingerprint, DriverInfo, FsIsolation, HealthState, MountConfigs,
    ProcessDriver, TaskConfig, TaskHandle, config, export_driver, process_task,
};

/// The task's `config` block. The SDK reads it strictly: a field not named here is
/// refused at `job validate`, at its line, with the closest name below.
#[derive(serde::Deserialize)]
struct EchoConfig {
    /// What the task prints.
    message: String,
    /// How many times it prints it (1 when not given).
    #[serde(default = "once")]
    times: u32,
}

fn once() -> u32 {
    1
}

/// At most this many lines: a job author's number becomes the size of an argument.
const MAX_TIMES: u32 = 100;

struct Echo;

impl ProcessDriver for Echo {
    type Config = EchoConfig;

    fn plugin_info() -> DriverInfo {
        DriverInfo {
            name: "echo".into(),
            version: env!("CARGO_PKG_VERSION").into(),
        }
    }

    fn capabilities() -> DriverCapabilities {
        DriverCapabilities {
            send_signals: true,
            exec: false,
            // Every task runs chrooted (`Isolation::Chroot` below).
            fs_isolation: FsIsolation::Chroot,
            // Volume mounts are bound into the chroot as the host hands them.
            mount_configs: MountConfigs::All,
        }
    }

    fn fingerprint() -> DriverFingerprint {
        DriverFingerprint {
            health: HealthState::Healthy,
            health_description: "ready".into(),
            attributes: vec![("driver.echo".into(), "1".into())],
        }
    }

    fn validate_task_config(json: String) -> Result<(), String> {
        // The typed read refuses unknown fields and wrong types; this adds what a type
        // cannot say.
        let echo: EchoConfig = config::parse(&json)?;
        if !(1..=MAX_TIMES).contains(&echo.times) {
            return Err(format!(
                "`times` is {}; it must be 1 to {MAX_TIMES}",
                echo.times
            ));
        }
        Ok(())
    }

    fn start_task(task: TaskConfig) -> Result<TaskHandle, String> {
        let echo: EchoConfig = config::of_task(&task)?;
        let times = echo.times.clamp(1, MAX_TIMES) as usize;
        let text = vec![echo.message; times].join("\n");
        let process = process::spawn(&SpawnRequest {
            argv: vec!["/bin/echo".into(), text],
            env: task.env,
            cwd: None,
            isolation: Isolation::Chroot,
            mounts: process_task::bind_mounts(&task.mounts),
        })?;
        Ok(process_task::handle(task.id, process))
    }
}

export_driver!(Echo);
