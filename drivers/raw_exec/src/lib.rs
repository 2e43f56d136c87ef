//! The `raw_exec` driver: runs a command with no isolation, in the task directory, as the
//! agent's user. It cannot honour volume mounts, and says so (mount-configs `none`).

use berth_plugin_sdk::host::process::{self, Isolation, SpawnRequest};
use berth_plugin_sdk::{
    DriverCapabilities, DriverFingerprint, DriverInfo, FsIsolation, HealthState, MountConfigs,
    ProcessDriver, TaskConfig, TaskHandle, export_driver, process_task,
};
use serde::Deserialize;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawExecConfig {
    command: String,
    #[serde(default)]
    args: Vec<String>,
}

fn parse_config(json: &str) -> Result<RawExecConfig, String> {
    let config: RawExecConfig = berth_plugin_sdk::config::parse(json)
        .map_err(|e| format!("invalid raw_exec config: {e}"))?;
    if config.command.is_empty() {
        return Err("command must not be empty".into());
    }
    Ok(config)
}

struct RawExec;

impl ProcessDriver for RawExec {
    type Config = RawExecConfig;

    fn plugin_info() -> DriverInfo {
        DriverInfo {
            name: "raw_exec".into(),
            version: env!("CARGO_PKG_VERSION").into(),
        }
    }

    fn capabilities() -> DriverCapabilities {
        DriverCapabilities {
            send_signals: true,
            // The host runs commands inside the task's process (`alloc exec`, a
            // template's change script): it spawned that process itself.
            exec: true,
            fs_isolation: FsIsolation::None,
            mount_configs: MountConfigs::None,
        }
    }

    /// Its tasks run in the host's namespaces: only where the operator enabled it.
    fn spawn_isolation() -> Vec<Isolation> {
        vec![Isolation::None]
    }

    fn fingerprint() -> DriverFingerprint {
        DriverFingerprint {
            health: HealthState::Healthy,
            health_description: "healthy".into(),
            attributes: vec![("driver.raw_exec".into(), "1".into())],
        }
    }

    fn validate_task_config(config: String) -> Result<(), String> {
        parse_config(&config).map(|_| ())
    }

    fn start_task(config: TaskConfig) -> Result<TaskHandle, String> {
        let raw = parse_config(&config.config)?;
        let mut argv = vec![raw.command];
        argv.extend(raw.args);
        let process = process::spawn(&SpawnRequest {
            argv,
            env: config.env,
            cwd: Some(config.task_dir),
            isolation: Isolation::None,
            mounts: vec![],
        })?;
        Ok(process_task::handle(config.id, process))
    }
}

export_driver!(RawExec);
