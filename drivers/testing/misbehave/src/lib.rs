//! A hostile driver for tests. It declares mount-configs `none` and fs-isolation
//! `chroot`, and what it does wrong is chosen by the `behave` field of the task config:
//!
//! - `trap`: panics (a trap) in the call;
//! - `loop`: spins forever without yielding to the host;
//! - `spin-between-sleeps`: spins forever, with a 1 ms host sleep after every bit of work;
//! - `hog`: allocates memory until the host's cap stops it;
//! - `undeclared-mounts`: passes on the mounts it was handed although it declared `none`;
//! - `invented-mount`: same, but on a path the host never handed it (as if it were `all`);
//! - `wrong-id`: returns a task handle for another task;
//! - `huge-state`: returns 8 MiB of driver state;
//! - `downgrade`: spawns `/bin/true` without isolation, below the `chroot` it declared;
//! - `huge-error`: fails with an 8 MiB error message;
//! - `huge-argv`: spawns with 100 000 arguments;
//! - `adopt`: adopts the process `pid` (started at `start_time`) while starting a task;
//! - `spawn-then-fail`: spawns a long `sleep` for the task, then fails the start;
//! - `ends-with-foreign`: spawns `/bin/true`, then says the task ends with the process
//!   `pid` (started at `start_time`) instead;
//! - `flood-log`: logs 100 000 messages, each with a line break and a forged line;
//! - `wait-in-guest`: starts, then waits in its own `wait-task` (host sleeps of an hour)
//!   instead of saying when the task ends, as a driver built before 0.1.2 may;
//! - `ends-after-outside-start`: says when a task ends (`timer.task-ends-after`) from
//!   `validate-task-config`, where there is no task;
//! - `ends-after-forever`: starts a task that ends after `u64::MAX` milliseconds;
//! - `ok`: behaves (so the host can be shown to keep serving).

use berth_plugin_sdk::host::process::{self, BindMount, Isolation, Propagation, SpawnRequest};
use berth_plugin_sdk::{
    Driver, DriverCapabilities, DriverFingerprint, DriverInfo, ExitResult, FsIsolation,
    HealthState, MountConfigs, TaskConfig, TaskHandle, TaskState, TaskStatus, export_driver,
};

#[derive(serde::Deserialize)]
struct Config {
    behave: String,
    #[serde(default)]
    pid: u32,
    #[serde(default)]
    start_time: u64,
}

fn misbehave(config_json: &str) -> Result<(), String> {
    let config: Config = serde_json::from_str(config_json).map_err(|e| e.to_string())?;
    match config.behave.as_str() {
        "trap" => panic!("misbehave: deliberate panic"),
        "ends-after-outside-start" => berth_plugin_sdk::host::timer::task_ends_after(1),
        "flood-log" => {
            for i in 0..100_000 {
                berth_plugin_sdk::host::log::log(
                    berth_plugin_sdk::host::log::Level::Warn,
                    &format!("flood {i}\nFORGED ERROR the agent was compromised"),
                );
            }
            Ok(())
        }
        "loop" => {
            let mut counter: u64 = 0;
            loop {
                counter = std::hint::black_box(counter.wrapping_add(1));
            }
        }
        "spin-between-sleeps" => {
            // Most of its wall time in host sleeps, which are not its time; the spinning
            // between them is, and adds up to the deadline.
            let mut counter: u64 = 0;
            loop {
                for _ in 0..200_000 {
                    counter = std::hint::black_box(counter.wrapping_add(1));
                }
                berth_plugin_sdk::host::timer::sleep(1);
            }
        }
        "hog" => {
            let mut hoard: Vec<Vec<u8>> = Vec::new();
            loop {
                hoard.push(vec![1u8; 4 << 20]);
                std::hint::black_box(&hoard);
            }
        }
        _ => Ok(()),
    }
}

/// The driver state of a `wait-in-guest` task.
const WAIT_IN_GUEST: &[u8] = b"wait-in-guest";

struct Misbehave;

impl Driver for Misbehave {
    type Config = Config;

    fn plugin_info() -> DriverInfo {
        DriverInfo {
            name: "misbehave".into(),
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
            health_description: "pretending".into(),
            attributes: vec![],
        }
    }

    fn validate_task_config(config: String) -> Result<(), String> {
        misbehave(&config)
    }

    fn start_task(config: TaskConfig) -> Result<TaskHandle, String> {
        misbehave(&config.config)?;
        let behave: Config = serde_json::from_str(&config.config).map_err(|e| e.to_string())?;
        let mount = |host_path: &str| BindMount {
            host_path: host_path.into(),
            task_path: "/mnt".into(),
            read_only: false,
            propagation: Propagation::Private,
        };
        let spawn = |mounts| {
            process::spawn(&SpawnRequest {
                argv: vec!["/bin/true".into()],
                env: vec![],
                cwd: None,
                isolation: Isolation::Chroot,
                mounts,
            })
        };
        match behave.behave.as_str() {
            "undeclared-mounts" => {
                let handed = config.mounts.iter().map(|m| mount(&m.host_path)).collect();
                spawn(handed)?;
            }
            "invented-mount" => {
                spawn(vec![mount("/etc")])?;
            }
            "downgrade" => {
                process::spawn(&SpawnRequest {
                    argv: vec!["/bin/true".into()],
                    env: vec![],
                    cwd: None,
                    isolation: Isolation::None,
                    mounts: vec![],
                })?;
            }
            "huge-error" => return Err("e".repeat(8 << 20)),
            "spawn-then-fail" => {
                process::spawn(&SpawnRequest {
                    argv: vec!["/bin/sleep".into(), "7779".into()],
                    env: vec![],
                    cwd: None,
                    isolation: Isolation::Chroot,
                    mounts: vec![],
                })?;
                return Err("misbehave: failing the start after a spawn".into());
            }
            "ends-with-foreign" => {
                process::spawn(&SpawnRequest {
                    argv: vec!["/bin/true".into()],
                    env: vec![],
                    cwd: None,
                    isolation: Isolation::Chroot,
                    mounts: vec![],
                })?;
                process::task_ends_with(process::ProcessRef {
                    pid: behave.pid,
                    start_time: behave.start_time,
                })?;
            }
            "adopt" => {
                process::adopt(process::ProcessRef {
                    pid: behave.pid,
                    start_time: behave.start_time,
                })?;
            }
            "huge-argv" => {
                process::spawn(&SpawnRequest {
                    argv: (0..100_000).map(|i| format!("/arg{i}")).collect(),
                    env: vec![],
                    cwd: None,
                    isolation: Isolation::Chroot,
                    mounts: vec![],
                })?;
            }
            "wrong-id" => {
                return Ok(TaskHandle {
                    id: "someone-else".into(),
                    driver_state: vec![],
                });
            }
            "wait-in-guest" => {
                return Ok(TaskHandle {
                    id: config.id,
                    driver_state: WAIT_IN_GUEST.to_vec(),
                });
            }
            "ends-after-forever" => berth_plugin_sdk::host::timer::task_ends_after(u64::MAX)?,
            "huge-state" => {
                return Ok(TaskHandle {
                    id: config.id,
                    driver_state: vec![7u8; 8 << 20],
                });
            }
            _ => {}
        }
        Ok(TaskHandle {
            id: config.id,
            driver_state: vec![],
        })
    }

    fn wait_task(handle: TaskHandle) -> Result<ExitResult, String> {
        if handle.driver_state == WAIT_IN_GUEST {
            loop {
                berth_plugin_sdk::host::timer::sleep(3_600_000);
            }
        }
        Ok(ExitResult {
            exit_code: 0,
            signal: 0,
            oom_killed: false,
        })
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

export_driver!(Misbehave);
