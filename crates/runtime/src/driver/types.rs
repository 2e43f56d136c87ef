//! The host's own driver types: what the rest of the agent (and its persisted state)
//! uses, independent of the WIT version a driver was built against. Conversions to and
//! from the generated types live at the bottom.

use crate::bindings::driver_types as wit;
use berth_model::driver::{
    Capabilities, DriverInfo, ExitResult, Fingerprint, FsIsolation, Health, MountConfigs,
    TaskHandle, TaskRequest, TaskState, TaskStatus,
};

// Conversions from and to the generated types.

impl From<wit::DriverInfo> for DriverInfo {
    fn from(info: wit::DriverInfo) -> Self {
        DriverInfo {
            name: info.name,
            version: info.version,
        }
    }
}

impl From<wit::DriverCapabilities> for Capabilities {
    fn from(caps: wit::DriverCapabilities) -> Self {
        Capabilities {
            send_signals: caps.send_signals,
            exec: caps.exec,
            fs_isolation: match caps.fs_isolation {
                wit::FsIsolation::None => FsIsolation::None,
                wit::FsIsolation::Chroot => FsIsolation::Chroot,
                wit::FsIsolation::Image => FsIsolation::Image,
            },
            mount_configs: match caps.mount_configs {
                wit::MountConfigs::All => MountConfigs::All,
                wit::MountConfigs::None => MountConfigs::None,
            },
            // Asked separately (`spawn-isolation`), of drivers that have it.
            spawn_isolation: None,
            declared: true,
        }
    }
}

impl From<wit::DriverFingerprint> for Fingerprint {
    fn from(fingerprint: wit::DriverFingerprint) -> Self {
        Fingerprint {
            health: match fingerprint.health {
                wit::HealthState::Undetected => Health::Undetected,
                wit::HealthState::Unhealthy => Health::Unhealthy,
                wit::HealthState::Healthy => Health::Healthy,
            },
            description: fingerprint.health_description,
            attributes: fingerprint.attributes,
        }
    }
}

impl From<&TaskRequest> for wit::TaskConfig {
    fn from(request: &TaskRequest) -> Self {
        wit::TaskConfig {
            id: request.id.clone(),
            name: request.name.clone(),
            alloc_id: request.alloc_id.clone(),
            job_name: request.job_name.clone(),
            group_name: request.group_name.clone(),
            config: request.config.clone(),
            env: request.env.clone(),
            task_dir: request.task_dir.to_string_lossy().into_owned(),
            mounts: request
                .mounts
                .iter()
                .map(|m| wit::MountConfig {
                    host_path: m.host_path.to_string_lossy().into_owned(),
                    task_path: m.task_path.to_string_lossy().into_owned(),
                    read_only: m.read_only,
                    propagation: crate::host_api::to_wit_propagation(m.propagation),
                })
                .collect(),
        }
    }
}

impl From<&TaskHandle> for wit::TaskHandle {
    fn from(handle: &TaskHandle) -> Self {
        wit::TaskHandle {
            id: handle.id.clone(),
            driver_state: handle.driver_state.clone(),
        }
    }
}

impl From<wit::ExitResult> for ExitResult {
    fn from(exit: wit::ExitResult) -> Self {
        ExitResult {
            exit_code: exit.exit_code,
            signal: exit.signal,
            oom_killed: exit.oom_killed,
        }
    }
}

impl From<wit::TaskStatus> for TaskStatus {
    fn from(status: wit::TaskStatus) -> Self {
        TaskStatus {
            id: status.id,
            state: match status.state {
                wit::TaskState::Unknown => TaskState::Unknown,
                wit::TaskState::Running => TaskState::Running,
                wit::TaskState::Exited => TaskState::Exited,
            },
            exit: status.exit_result.map(Into::into),
        }
    }
}
