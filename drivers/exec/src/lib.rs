//! The `exec` driver: runs a command in its own mount namespace, chrooted into the task
//! directory with the host's system directories bound read-only, and honours volume
//! mounts (mount-configs `all`).

use berth_plugin_sdk::host::process::{self, Isolation, SpawnRequest};
use berth_plugin_sdk::{
    DriverCapabilities, DriverFingerprint, DriverInfo, FsIsolation, HealthState, MountConfigs,
    ProcessDriver, TaskConfig, TaskHandle, export_driver, process_task,
};
use serde::Deserialize;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ExecConfig {
    command: String,
    #[serde(default)]
    args: Vec<String>,
}

fn parse_config(json: &str) -> Result<ExecConfig, String> {
    let config: ExecConfig =
        berth_plugin_sdk::config::parse(json).map_err(|e| format!("invalid exec config: {e}"))?;
    // A bare name is looked up in the task's PATH inside its chroot, as Nomad does; a
    // relative path would depend on a working directory the task does not choose.
    if config.command.is_empty()
        || (!config.command.starts_with('/') && config.command.contains('/'))
    {
        return Err(format!(
            "command {:?} must be an absolute path inside the task's chroot, or a bare \
             name looked up in the task's PATH",
            config.command
        ));
    }
    Ok(config)
}

struct Exec;

impl ProcessDriver for Exec {
    type Config = ExecConfig;

    fn plugin_info() -> DriverInfo {
        DriverInfo {
            name: "exec".into(),
            version: env!("CARGO_PKG_VERSION").into(),
        }
    }

    fn capabilities() -> DriverCapabilities {
        DriverCapabilities {
            send_signals: true,
            // The host runs commands inside the task's process (`alloc exec`, a
            // template's change script): it spawned that process itself.
            exec: true,
            fs_isolation: FsIsolation::Chroot,
            mount_configs: MountConfigs::All,
        }
    }

    fn fingerprint() -> DriverFingerprint {
        DriverFingerprint {
            health: HealthState::Healthy,
            health_description: "healthy".into(),
            attributes: vec![("driver.exec".into(), "1".into())],
        }
    }

    fn validate_task_config(config: String) -> Result<(), String> {
        parse_config(&config).map(|_| ())
    }

    fn start_task(config: TaskConfig) -> Result<TaskHandle, String> {
        let exec = parse_config(&config.config)?;
        let mut argv = vec![exec.command];
        argv.extend(exec.args);
        let mounts = process_task::bind_mounts(&config.mounts);
        let process = process::spawn(&SpawnRequest {
            argv,
            env: config.env,
            cwd: None,
            isolation: Isolation::Chroot,
            mounts,
        })?;
        Ok(process_task::handle(config.id, process))
    }
}

export_driver!(Exec);
