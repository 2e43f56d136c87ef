//! A driver built against `berth:driver@0.1.0`, the interface before `capabilities`
//! existed, written the way a community driver of that time would be: straight on
//! wit-bindgen, no SDK. The host must load it and treat it as mount-configs `all`.
//!
//! It runs `config.command` chrooted in the task dir and passes the task's mounts on.

wit_bindgen::generate!({
    world: "berth:driver/plugin@0.1.0",
    path: ["../../../wit/host-0.1.0", "../../../wit/driver-0.1"],
    generate_all,
});

use berth::driver::types::{
    DriverFingerprint, DriverInfo, ExitResult, HealthState, TaskConfig, TaskHandle, TaskState,
    TaskStatus,
};
use berth::host::process::{self, BindMount, Isolation, ProcessRef, SpawnRequest};
use exports::berth::driver::driver::Guest;

#[derive(serde::Deserialize)]
struct Config {
    command: String,
    #[serde(default)]
    args: Vec<String>,
}

fn process_of(handle: &TaskHandle) -> Result<ProcessRef, String> {
    let state: (u32, u64) =
        serde_json::from_slice(&handle.driver_state).map_err(|e| e.to_string())?;
    Ok(ProcessRef {
        pid: state.0,
        start_time: state.1,
    })
}

fn exit(status: process::ExitStatus) -> ExitResult {
    ExitResult {
        exit_code: status.code.unwrap_or(-1),
        signal: status.signal.unwrap_or(0),
        oom_killed: false,
    }
}

struct Legacy;

impl Guest for Legacy {
    fn plugin_info() -> DriverInfo {
        DriverInfo {
            name: "legacy_exec".into(),
            version: "0.1.0".into(),
        }
    }

    fn fingerprint() -> DriverFingerprint {
        DriverFingerprint {
            health: HealthState::Healthy,
            health_description: "healthy".into(),
            attributes: vec![],
        }
    }

    fn validate_task_config(config: String) -> Result<(), String> {
        serde_json::from_str::<Config>(&config)
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    fn start_task(config: TaskConfig) -> Result<TaskHandle, String> {
        let parsed: Config = serde_json::from_str(&config.config).map_err(|e| e.to_string())?;
        let mut argv = vec![parsed.command];
        argv.extend(parsed.args);
        let mounts = config
            .mounts
            .iter()
            .map(|m| BindMount {
                host_path: m.host_path.clone(),
                task_path: m.task_path.clone(),
                read_only: m.read_only,
                propagation: m.propagation,
            })
            .collect();
        let process = process::spawn(&SpawnRequest {
            argv,
            env: config.env,
            cwd: None,
            isolation: Isolation::Chroot,
            mounts,
        })?;
        let driver_state = serde_json::to_vec(&(process.pid, process.start_time)).unwrap();
        Ok(TaskHandle {
            id: config.id,
            driver_state,
        })
    }

    fn recover_task(handle: TaskHandle) -> Result<(), String> {
        process::adopt(process_of(&handle)?)
    }

    fn wait_task(handle: TaskHandle) -> Result<ExitResult, String> {
        let status = process::wait(process_of(&handle)?, None)?.ok_or("no status")?;
        Ok(exit(status))
    }

    fn stop_task(handle: TaskHandle, timeout_millis: u64, signal: String) -> Result<(), String> {
        let process = process_of(&handle)?;
        process::signal(process, &signal)?;
        if process::wait(process, Some(timeout_millis))?.is_none() {
            process::signal(process, "SIGKILL")?;
        }
        Ok(())
    }

    fn destroy_task(_handle: TaskHandle, _force: bool) -> Result<(), String> {
        Ok(())
    }

    fn inspect_task(handle: TaskHandle) -> Result<TaskStatus, String> {
        let status = process::wait(process_of(&handle)?, Some(0))?;
        Ok(TaskStatus {
            id: handle.id,
            state: if status.is_some() {
                TaskState::Exited
            } else {
                TaskState::Running
            },
            exit_result: status.map(exit),
        })
    }

    fn signal_task(handle: TaskHandle, signal: String) -> Result<(), String> {
        process::signal(process_of(&handle)?, &signal)
    }
}

export!(Legacy);
