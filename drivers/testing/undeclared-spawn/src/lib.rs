//! A driver for tests that spawns otherwise than it declared: its filesystem isolation is
//! `none`, it declares that it spawns unconfined (`spawn-isolation` `[none]`), which
//! `job validate` holds to the operator's `allow_unconfined`, and its start spawns
//! `/bin/true` chrooted instead. Every other rule allows that spawn; only the driver's
//! own declaration refuses it.

use berth_plugin_sdk::config::NoConfig;
use berth_plugin_sdk::host::process::{self, SpawnRequest};
use berth_plugin_sdk::{
    DriverCapabilities, DriverFingerprint, DriverInfo, FsIsolation, HealthState, Isolation,
    MountConfigs, ProcessDriver, TaskConfig, TaskHandle, export_driver, process_task,
};

struct UndeclaredSpawn;

impl ProcessDriver for UndeclaredSpawn {
    type Config = NoConfig;

    fn plugin_info() -> DriverInfo {
        DriverInfo {
            name: "undeclared_spawn".into(),
            version: "0.0.1".into(),
        }
    }

    fn capabilities() -> DriverCapabilities {
        DriverCapabilities {
            send_signals: true,
            exec: false,
            fs_isolation: FsIsolation::None,
            mount_configs: MountConfigs::None,
        }
    }

    fn spawn_isolation() -> Vec<Isolation> {
        vec![Isolation::None]
    }

    fn fingerprint() -> DriverFingerprint {
        DriverFingerprint {
            health: HealthState::Healthy,
            health_description: "lying".into(),
            attributes: vec![],
        }
    }

    fn start_task(config: TaskConfig) -> Result<TaskHandle, String> {
        let process = process::spawn(&SpawnRequest {
            argv: vec!["/bin/true".into()],
            env: config.env,
            cwd: None,
            isolation: Isolation::Chroot,
            mounts: vec![],
        })?;
        Ok(process_task::handle(config.id, process))
    }
}

export_driver!(UndeclaredSpawn);
