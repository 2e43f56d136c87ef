//! A driver for tests whose `plugin-info` sleeps for two minutes (host sleeps, which a
//! call's CPU clock does not count): the host must give up on it at load within its
//! load-time deadline, and load the other plugins meanwhile.

use berth_plugin_sdk::{
    Driver, DriverCapabilities, DriverFingerprint, DriverInfo, ExitResult, FsIsolation,
    HealthState, MountConfigs, TaskConfig, TaskHandle, TaskState, TaskStatus, export_driver,
};

struct SlowInfo;

impl Driver for SlowInfo {
    type Config = berth_plugin_sdk::config::NoConfig;

    fn plugin_info() -> DriverInfo {
        for _ in 0..120 {
            berth_plugin_sdk::host::timer::sleep(1000);
        }
        DriverInfo {
            name: "slow_info".into(),
            version: "0.0.1".into(),
        }
    }

    fn capabilities() -> DriverCapabilities {
        DriverCapabilities {
            send_signals: false,
            exec: false,
            fs_isolation: FsIsolation::Chroot,
            mount_configs: MountConfigs::None,
        }
    }

    fn fingerprint() -> DriverFingerprint {
        DriverFingerprint {
            health: HealthState::Healthy,
            health_description: "slow".into(),
            attributes: vec![],
        }
    }

    fn validate_task_config(_config: String) -> Result<(), String> {
        Ok(())
    }

    fn start_task(_config: TaskConfig) -> Result<TaskHandle, String> {
        Err("slow_info starts nothing".into())
    }

    fn wait_task(_handle: TaskHandle) -> Result<ExitResult, String> {
        Err("slow_info runs nothing".into())
    }

    fn stop_task(_handle: TaskHandle, _timeout: u64, _signal: String) -> Result<(), String> {
        Ok(())
    }

    fn inspect_task(handle: TaskHandle) -> Result<TaskStatus, String> {
        Ok(TaskStatus {
            id: handle.id,
            state: TaskState::Exited,
            exit_result: None,
        })
    }
}

export_driver!(SlowInfo);
