//! The `mock` driver: simulates a task from its config, like Nomad's mock driver. It
//! spawns nothing; the task "runs" for `run_for` and exits with `exit_code`. It tells
//! the host when the task ends (`timer.task-ends-after`), so the host waits for that
//! time itself and a running mock task holds no WebAssembly instance slot.
//!
//! A development driver: off unless the operator enables it with
//! `plugin "mock" { config { enabled = true } }`.
//!
//! ```hcl
//! config {
//!   run_for         = "2s"    # how long the task runs (default 0s)
//!   exit_code       = 3       # what it exits with (default 0)
//!   exit_signal     = 9       # the signal it reports (default 0)
//!   start_error     = "boom"  # fail start-task with this message
//!   start_block_for = "100ms" # take this long to start
//! }
//! ```

use std::time::{SystemTime, UNIX_EPOCH};

use berth_plugin_sdk::host::{self, timer};
use berth_plugin_sdk::{
    Driver, DriverCapabilities, DriverFingerprint, DriverInfo, ExitResult, FsIsolation,
    HealthState, Isolation, MountConfigs, TaskConfig, TaskHandle, TaskState, TaskStatus,
    export_driver,
};
use serde::{Deserialize, Serialize};

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct MockConfig {
    #[serde(default)]
    run_for: Option<String>,
    #[serde(default)]
    exit_code: i32,
    #[serde(default)]
    exit_signal: i32,
    #[serde(default)]
    start_error: Option<String>,
    #[serde(default)]
    start_block_for: Option<String>,
}

/// The signal a mock task stopped before its end reports (SIGKILL).
const STOPPED_SIGNAL: i32 = 9;

/// What the mock keeps in the task handle.
#[derive(Serialize, Deserialize)]
struct MockState {
    started_at_ms: u64,
    run_for_ms: u64,
    exit_code: i32,
    exit_signal: i32,
}

/// Parses durations in Nomad's style: `250ms`, `5s`, `2m`, `1h`.
fn parse_duration_ms(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("invalid duration {text:?}"))?;
    let scale = match unit {
        "ms" => 1,
        "s" | "" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => {
            return Err(format!(
                "invalid duration {text:?}: unit must be ms, s, m or h"
            ));
        }
    };
    number
        .checked_mul(scale)
        .ok_or_else(|| format!("invalid duration {text:?}: too long"))
}

fn parse_config(json: &str) -> Result<MockConfig, String> {
    let config: MockConfig =
        berth_plugin_sdk::config::parse(json).map_err(|e| format!("invalid mock config: {e}"))?;
    for duration in [&config.run_for, &config.start_block_for]
        .into_iter()
        .flatten()
    {
        parse_duration_ms(duration)?;
    }
    Ok(config)
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn state_of(handle: &TaskHandle) -> Result<MockState, String> {
    serde_json::from_slice(&handle.driver_state)
        .map_err(|e| format!("task {}: corrupt mock state: {e}", handle.id))
}

fn exit_result(state: &MockState) -> ExitResult {
    ExitResult {
        exit_code: state.exit_code,
        signal: state.exit_signal,
        oom_killed: false,
    }
}

struct Mock;

impl Driver for Mock {
    type Config = MockConfig;

    fn plugin_info() -> DriverInfo {
        DriverInfo {
            name: "mock".into(),
            version: env!("CARGO_PKG_VERSION").into(),
        }
    }

    fn capabilities() -> DriverCapabilities {
        DriverCapabilities {
            send_signals: true,
            exec: false,
            fs_isolation: FsIsolation::None,
            mount_configs: MountConfigs::All,
        }
    }

    /// It spawns nothing, so no spawn of it is allowed.
    fn spawn_isolation() -> Vec<Isolation> {
        Vec::new()
    }

    fn fingerprint() -> DriverFingerprint {
        DriverFingerprint {
            health: HealthState::Healthy,
            health_description: "healthy".into(),
            attributes: vec![("driver.mock".into(), "1".into())],
        }
    }

    fn validate_task_config(config: String) -> Result<(), String> {
        parse_config(&config).map(|_| ())
    }

    fn start_task(config: TaskConfig) -> Result<TaskHandle, String> {
        let mock = parse_config(&config.config)?;
        host::info(&format!("starting mock task {}", config.name));
        if let Some(block) = &mock.start_block_for {
            timer::sleep(parse_duration_ms(block)?);
        }
        if let Some(message) = mock.start_error {
            return Err(message);
        }
        let state = MockState {
            started_at_ms: now_ms(),
            run_for_ms: mock
                .run_for
                .as_deref()
                .map(parse_duration_ms)
                .transpose()?
                .unwrap_or(0),
            exit_code: mock.exit_code,
            exit_signal: mock.exit_signal,
        };
        let driver_state = serde_json::to_vec(&state).map_err(|e| e.to_string())?;
        // Said after `started_at_ms` was read: the host's end is never before ours, so
        // our `wait-task` returns at once when the host calls it.
        timer::task_ends_after(state.run_for_ms)?;
        Ok(TaskHandle {
            id: config.id,
            driver_state,
        })
    }

    fn recover_task(handle: TaskHandle) -> Result<(), String> {
        let state = state_of(&handle)?;
        // Said again for a task started before the mock said when its tasks end.
        let ends_at = state.started_at_ms.saturating_add(state.run_for_ms);
        timer::task_ends_after(ends_at.saturating_sub(now_ms()))
    }

    /// Returns at once: the host calls it once the task's end has passed (it waited for
    /// it, holding no instance), or after it stopped the task, which ends a mock task
    /// then; a task stopped before its end reports SIGKILL.
    fn wait_task(handle: TaskHandle) -> Result<ExitResult, String> {
        let state = state_of(&handle)?;
        if now_ms() < state.started_at_ms.saturating_add(state.run_for_ms) {
            return Ok(ExitResult {
                exit_code: 0,
                signal: STOPPED_SIGNAL,
                oom_killed: false,
            });
        }
        Ok(exit_result(&state))
    }

    fn stop_task(_handle: TaskHandle, _timeout_millis: u64, _signal: String) -> Result<(), String> {
        // A mock task has nothing to signal: stopped, it has ended.
        Ok(())
    }

    fn inspect_task(handle: TaskHandle) -> Result<TaskStatus, String> {
        let state = state_of(&handle)?;
        let exited = now_ms() >= state.started_at_ms.saturating_add(state.run_for_ms);
        Ok(TaskStatus {
            id: handle.id,
            state: if exited {
                TaskState::Exited
            } else {
                TaskState::Running
            },
            exit_result: exited.then(|| exit_result(&state)),
        })
    }

    fn signal_task(_handle: TaskHandle, _signal: String) -> Result<(), String> {
        Ok(())
    }
}

export_driver!(Mock);
