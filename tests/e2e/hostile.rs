//! Drivers that misbehave: each is contained with a clear error naming the driver, and
//! the host keeps serving other calls.

use std::time::{Duration, Instant};

use berth_model::mount::Propagation;
use berth_runtime::driver::{Driver, DriverError, LoadError};
use berth_runtime::sandbox::Fault;
use serde_json::json;

use crate::support::{self, TaskDir, mount};

const MISBEHAVE: &str = berth_builtin::test_components::MISBEHAVE;

fn behave(what: &str) -> String {
    json!({ "behave": what }).to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_trapping_driver_gives_its_panic_message_and_the_next_call_works() {
    let runtime = support::runtime();
    let driver = support::from_file(&runtime, MISBEHAVE).await;
    let error = driver
        .validate_task_config(&behave("trap"))
        .await
        .unwrap_err();
    let DriverError::Fault {
        fault: Fault::Trap(message),
        ..
    } = &error
    else {
        panic!("expected a trap, got {error:?}");
    };
    assert!(message.contains("misbehave: deliberate panic"), "{message}");
    assert!(
        error
            .to_string()
            .starts_with(&format!("driver \"misbehave\" ({MISBEHAVE}) crashed:")),
        "{error}"
    );
    driver.validate_task_config(&behave("ok")).await.unwrap();
}

/// Host waits are not a guest's time, but what it computes between them is: a guest that
/// spins a little between many short host sleeps still runs out of its deadline (its
/// CPU time is counted up to each host call, and again from its end).
#[tokio::test(flavor = "multi_thread")]
async fn a_driver_spinning_between_host_sleeps_is_stopped_at_its_deadline() {
    let deadline = Duration::from_millis(300);
    let runtime = support::strict_runtime(deadline, 64 << 20);
    let driver = support::from_file(&runtime, MISBEHAVE).await;
    let started = Instant::now();
    let error = tokio::time::timeout(
        Duration::from_secs(20),
        driver.validate_task_config(&behave("spin-between-sleeps")),
    )
    .await
    .expect("the guest's spinning was never counted against its deadline")
    .unwrap_err();
    assert!(
        matches!(error, DriverError::Fault { fault: Fault::Deadline(d), .. } if d == deadline),
        "{error:?} after {:?}",
        started.elapsed()
    );
}

/// A guest that spins is stopped at its deadline, not before and not long after, and
/// another guest's calls are answered while it spins: each of them before the spinning
/// call ends (had they waited for the spinning guest, they would be answered after it).
///
/// The deadline counts the guest's CPU time, so on a busy node it ends later in wall
/// time: "not long after" is measured in this process's CPU time (which is the guest's
/// and little else here), the wall clock only says it was stopped at all. The others
/// are checked by order, with a deadline long enough for five small calls, rather than
/// by how fast they were.
#[tokio::test(flavor = "multi_thread")]
async fn a_looping_driver_is_stopped_at_its_deadline_while_others_are_served() {
    let deadline = Duration::from_secs(1);
    let runtime = support::strict_runtime(deadline, 64 << 20);
    let driver = support::from_file(&runtime, MISBEHAVE).await;
    let mock = support::builtin(&runtime, "mock").await;

    let process_cpu = || {
        let now = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
        Duration::new(now.tv_sec as u64, now.tv_nsec as u32)
    };
    let started = Instant::now();
    let cpu_before = process_cpu();
    let spin = behave("loop");
    let looping = async {
        let looped = driver.validate_task_config(&spin).await;
        (looped, Instant::now())
    };
    let others = async {
        let mut answered = Vec::new();
        for _ in 0..5 {
            mock.fingerprint().await.unwrap();
            answered.push(Instant::now());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        answered
    };
    let ((looped, stopped_at), answered) = tokio::join!(looping, others);
    let cpu = process_cpu() - cpu_before;
    let elapsed = stopped_at - started;
    let error = looped.unwrap_err();
    assert!(
        matches!(error, DriverError::Fault { fault: Fault::Deadline(d), .. } if d == deadline),
        "{error:?}"
    );
    assert!(
        elapsed >= deadline && elapsed < Duration::from_secs(30),
        "stopped after {elapsed:?}"
    );
    assert!(
        cpu >= deadline && cpu < deadline * 4,
        "stopped after {cpu:?} of CPU ({elapsed:?})"
    );
    let late: Vec<Duration> = answered
        .iter()
        .filter(|at| **at >= stopped_at)
        .map(|at| *at - started)
        .collect();
    assert!(
        late.is_empty(),
        "other calls answered only once the spinning guest was stopped (after {elapsed:?}): \
         at {late:?}"
    );
    assert!(
        error.to_string().contains("ran past its deadline of 1s"),
        "{error}"
    );
    driver.validate_task_config(&behave("ok")).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_memory_hog_is_stopped_at_its_cap() {
    let runtime = support::strict_runtime(Duration::from_secs(10), 64 << 20);
    let driver = support::from_file(&runtime, MISBEHAVE).await;
    let error = driver
        .validate_task_config(&behave("hog"))
        .await
        .unwrap_err();
    assert!(
        matches!(
            error,
            DriverError::Fault {
                fault: Fault::Memory(_),
                ..
            }
        ),
        "{error:?}"
    );
    assert!(
        error
            .to_string()
            .contains("more than its memory cap of 64 MiB"),
        "{error}"
    );
    driver.validate_task_config(&behave("ok")).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_driver_that_declared_none_cannot_pass_mounts() {
    let runtime = support::runtime();
    let driver = support::from_file(&runtime, MISBEHAVE).await;
    let data = tempfile::tempdir_in("/tmp").unwrap();
    let task = TaskDir::new();
    // The host hands the mount (as a job that skipped submit checks would get it); the
    // driver declared `none`, so passing it on is refused.
    let request = task.request(
        "t",
        json!({"behave": "undeclared-mounts"}),
        vec![mount(data.path(), "/mnt", false, Propagation::Private)],
    );
    let error = driver.start_task(&request).await.unwrap_err();
    assert!(matches!(error, DriverError::Violation { .. }), "{error:?}");
    assert_eq!(
        error.to_string(),
        format!(
            "driver \"misbehave\" ({MISBEHAVE}) was refused during start-task: \
             driver \"misbehave\" declared mount-configs \"none\" but asked to mount {} at /mnt",
            data.path().display()
        )
    );
    assert_nothing_spawned(&runtime, &task);
}

/// The refusal is real: no process was started (none tracked for the driver, and its
/// log file, which a spawn opens first, does not exist).
fn assert_nothing_spawned(runtime: &berth_runtime::Runtime, task: &TaskDir) {
    assert_eq!(
        runtime.processes().owned_by("misbehave"),
        0,
        "a process was spawned"
    );
    assert!(
        !task.stdout().exists(),
        "a spawn got as far as opening the task's log"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_driver_cannot_mount_what_it_was_not_handed() {
    let runtime = support::runtime();
    let driver = support::from_file(&runtime, MISBEHAVE).await;
    let task = TaskDir::new();
    let error = driver
        .start_task(&task.request("t", json!({"behave": "invented-mount"}), vec![]))
        .await
        .unwrap_err();
    assert!(matches!(error, DriverError::Violation { .. }), "{error:?}");
    assert_eq!(
        error.to_string(),
        format!(
            "driver \"misbehave\" ({MISBEHAVE}) was refused during start-task: \
             driver \"misbehave\" asked to mount /etc at /mnt (private), which the host did \
             not hand it for task alloc-1/t"
        )
    );
    assert_nothing_spawned(&runtime, &task);
}

#[tokio::test(flavor = "multi_thread")]
async fn nonsense_handles_are_refused() {
    let runtime = support::runtime();
    let driver = support::from_file(&runtime, MISBEHAVE).await;
    let task = TaskDir::new();
    let error = driver
        .start_task(&task.request("t", json!({"behave": "wrong-id"}), vec![]))
        .await
        .unwrap_err();
    assert!(
        error
            .to_string()
            .contains("a handle for task \"someone-else\""),
        "{error}"
    );
    let error = driver
        .start_task(&task.request("t", json!({"behave": "huge-state"}), vec![]))
        .await
        .unwrap_err();
    assert!(
        error.to_string().contains("8388608 bytes of driver state"),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_files_are_refused_at_load_with_the_file_named() {
    let runtime = support::runtime();
    let hook = berth_builtin::test_components::HOSTILE_HOOK;
    let error = Driver::load_file(&runtime, hook.as_ref())
        .await
        .err()
        .unwrap();
    // Named for what it is, before it is compiled.
    assert!(matches!(error, LoadError::Mismatch { .. }), "{error:?}");
    assert!(
        error.to_string().starts_with(&format!(
            "{hook}: is a hook, not a task driver (it exports berth:hook/lifecycle@0.1.0)"
        )),
        "{error}"
    );

    let dir = tempfile::tempdir().unwrap();
    let garbage = dir.path().join("garbage.wasm");
    std::fs::write(&garbage, "definitely not wasm").unwrap();
    let error = Driver::load_file(&runtime, &garbage).await.err().unwrap();
    assert_eq!(
        error.to_string(),
        format!(
            "{}: not a valid WebAssembly component (19 bytes): it does not start with WebAssembly's magic number",
            garbage.display()
        )
    );

    let module = dir.path().join("module.wasm");
    std::fs::write(&module, b"\0asm\x01\0\0\0").unwrap();
    let error = Driver::load_file(&runtime, &module).await.err().unwrap();
    assert!(
        error
            .to_string()
            .contains("is a core WebAssembly module, not a component"),
        "{error}"
    );

    let missing = dir.path().join("missing.wasm");
    let error = Driver::load_file(&runtime, &missing).await.err().unwrap();
    assert!(
        error
            .to_string()
            .starts_with(&format!("{}: cannot read the driver", missing.display()))
    );
}

/// A driver that declared `chroot` asks for a process without any isolation (which, with
/// the agent as root, would be root on the host), even on a task the operator would let
/// run unconfined: refused, and nothing runs.
#[tokio::test(flavor = "multi_thread")]
async fn a_driver_cannot_spawn_below_the_isolation_it_declared() {
    let runtime = support::runtime();
    let driver = support::from_file(&runtime, MISBEHAVE).await;
    let task = TaskDir::new();
    let error = driver
        .start_task(&task.unconfined_request("t", json!({"behave": "downgrade"})))
        .await
        .unwrap_err();
    assert!(matches!(error, DriverError::Violation { .. }), "{error:?}");
    assert!(
        error.to_string().ends_with(
            "driver \"misbehave\" asked to spawn with isolation \"none\", which it did not \
             declare (spawn-isolation [\"chroot\"]): a driver spawns only as it said it would"
        ),
        "{error}"
    );
    assert_nothing_spawned(&runtime, &task);
}

/// A driver said it spawns unconfined, then spawns chrooted, on a task the operator lets
/// it run unconfined: every other rule allows that spawn, and its own declaration refuses
/// it. `job validate` took the declaration at its word; a spawn beyond it runs what
/// nobody checked.
#[tokio::test(flavor = "multi_thread")]
async fn a_driver_cannot_spawn_with_an_isolation_it_did_not_declare() {
    let runtime = support::runtime();
    let driver =
        support::from_file(&runtime, berth_builtin::test_components::UNDECLARED_SPAWN).await;
    assert_eq!(
        driver.capabilities().spawn_isolation,
        Some(vec![berth_model::driver::SpawnIsolation::None])
    );
    assert!(driver.capabilities().declares_unconfined());
    let task = TaskDir::new();
    let error = driver
        .start_task(&task.unconfined_request("t", json!({})))
        .await
        .unwrap_err();
    assert!(matches!(error, DriverError::Violation { .. }), "{error:?}");
    assert!(
        error.to_string().ends_with(
            "driver \"undeclared_spawn\" asked to spawn with isolation \"chroot\", which it \
             did not declare (spawn-isolation [\"none\"]): a driver spawns only as it said it \
             would"
        ),
        "{error}"
    );
    assert_eq!(runtime.processes().owned_by("undeclared_spawn"), 0);
    assert!(
        !task.stdout().exists(),
        "a spawn got as far as opening the task's log"
    );
}

/// A driver that declared no isolation (raw_exec here, called as a third-party driver
/// would be) asks for a process as root in the host's namespaces, on an agent whose
/// operator did not allow that driver to: refused, and nothing runs.
#[tokio::test(flavor = "multi_thread")]
async fn a_driver_that_declared_no_isolation_spawns_nothing_the_operator_did_not_allow() {
    let runtime = support::runtime();
    let raw = support::builtin(&runtime, "raw_exec").await;
    let task = TaskDir::new();
    let error = raw
        .start_task(&task.request("t", json!({"command": "/bin/true"}), vec![]))
        .await
        .unwrap_err();
    assert!(matches!(error, DriverError::Violation { .. }), "{error:?}");
    assert!(
        error.to_string().ends_with(
            "driver \"raw_exec\" asked to spawn without isolation (as root, in the host's \
             namespaces), which the operator has not allowed for this driver: plugin \
             \"raw_exec\" { allow_unconfined = true } allows it (for raw_exec, \
             config { enabled = true })"
        ),
        "{error}"
    );
    assert_eq!(runtime.processes().owned_by("raw_exec"), 0);
    assert!(!task.stdout().exists());
}

/// What a driver returns or asks for is bounded: an 8 MiB error is kept as 4 KiB and a
/// note; 100 000 arguments are refused before anything is spawned.
#[tokio::test(flavor = "multi_thread")]
async fn a_drivers_huge_error_is_clipped_and_huge_argv_refused() {
    let runtime = support::runtime();
    let driver = support::from_file(&runtime, MISBEHAVE).await;
    let task = TaskDir::new();
    let error = driver
        .start_task(&task.request("t", json!({"behave": "huge-error"}), vec![]))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        error.len() < 5_000,
        "an error of {} bytes was kept",
        error.len()
    );
    assert!(
        error.ends_with(&format!("… ({} more bytes cut)", (8 << 20) - 4096)),
        "{}",
        &error[error.len().saturating_sub(200)..]
    );
    let error = driver
        .start_task(&task.request("t", json!({"behave": "huge-argv"}), vec![]))
        .await
        .unwrap_err();
    assert!(matches!(error, DriverError::Violation { .. }), "{error:?}");
    assert!(
        error
            .to_string()
            .contains("asked to spawn with 100000 arguments"),
        "{error}"
    );
    assert_nothing_spawned(&runtime, &task);
}

/// A driver that knows (or guesses) a host process's pid and start time cannot adopt it
/// while starting a task, so it can never signal it: adopting is for recover-task only.
#[tokio::test(flavor = "multi_thread")]
async fn a_driver_cannot_adopt_a_host_process_outside_recovery() {
    let runtime = support::runtime();
    let driver = support::from_file(&runtime, MISBEHAVE).await;
    let task = TaskDir::new();
    // This test process: its real pid and start time, the best guess a driver could make.
    let pid = std::process::id();
    let start_time = berth_sys::process::start_time(pid).unwrap();
    let error = driver
        .start_task(&task.request(
            "t",
            json!({"behave": "adopt", "pid": pid, "start_time": start_time}),
            vec![],
        ))
        .await
        .unwrap_err();
    assert!(matches!(error, DriverError::Violation { .. }), "{error:?}");
    assert!(
        error.to_string().ends_with(&format!(
            "driver \"misbehave\" tried to adopt process {pid} outside recover-task: a driver \
             adopts only the processes of a task it recovers after an agent restart"
        )),
        "{error}"
    );
    assert_eq!(runtime.processes().owned_by("misbehave"), 0);
}

/// A driver may say its task ends with a process only for one it spawned while starting
/// that task: the host would otherwise wait on, and report the end of, a process that is
/// not the task's (here, the agent's own).
#[tokio::test(flavor = "multi_thread")]
async fn a_driver_cannot_make_its_task_end_with_a_process_it_did_not_spawn() {
    let runtime = support::runtime();
    let driver = support::from_file(&runtime, MISBEHAVE).await;
    let task = TaskDir::new();
    let pid = std::process::id();
    let start_time = berth_sys::process::start_time(pid).unwrap();
    let error = driver
        .start_task(&task.request(
            "t",
            json!({"behave": "ends-with-foreign", "pid": pid, "start_time": start_time}),
            vec![],
        ))
        .await
        .unwrap_err();
    assert!(matches!(error, DriverError::Violation { .. }), "{error:?}");
    assert!(
        error.to_string().ends_with(&format!(
            "driver \"misbehave\" said its task ends with process {pid}, which it did not \
             spawn while starting this task"
        )),
        "{error}"
    );
    // What the call spawned is released with the failed start.
    assert_eq!(runtime.processes().owned_by("misbehave"), 0);
}

/// `timer.task-ends-after` makes the host wait for a task: only a call that starts or
/// recovers one may say it. From a check it is refused, and the call fails as a
/// violation. A far end (`u64::MAX` milliseconds) is kept as it is and waited for
/// without a panic or a wrapped clock.
#[tokio::test(flavor = "multi_thread")]
async fn a_driver_says_when_a_task_ends_only_for_a_task_it_starts() {
    let runtime = support::runtime();
    let driver = support::from_file(&runtime, MISBEHAVE).await;
    let error = driver
        .validate_task_config(&behave("ends-after-outside-start"))
        .await
        .unwrap_err();
    assert!(matches!(error, DriverError::Violation { .. }), "{error:?}");
    assert!(
        error.to_string().ends_with(
            "driver \"misbehave\" said when its task ends outside start-task and \
             recover-task: only a task being started or recovered can say so"
        ),
        "{error}"
    );

    let task = TaskDir::new();
    let handle = driver
        .start_task(&task.request("t", json!({"behave": "ends-after-forever"}), vec![]))
        .await
        .unwrap();
    assert_eq!(handle.ends_at_ms, Some(u64::MAX));
    let waited = tokio::time::timeout(Duration::from_millis(300), driver.wait_task(&handle)).await;
    assert!(
        waited.is_err(),
        "a task that ends at the end of time ended: {waited:?}"
    );
    // Stopped, it is asked at once.
    driver.wait_stopped_task(&handle).await.unwrap();
    driver.fingerprint().await.unwrap();
}

/// The agent's log as a test reads it.
#[derive(Clone, Default)]
struct CapturedLog(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for CapturedLog {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for CapturedLog {
    type Writer = CapturedLog;

    fn make_writer(&'a self) -> CapturedLog {
        self.clone()
    }
}

/// A driver that logs 100,000 messages in one call, each with a line break and a forged
/// line after it: a thousand are logged, one line each, and one warning counts the rest.
/// (The guest runs on this test's one thread, where the capturing subscriber is.)
#[tokio::test]
async fn a_driver_that_floods_the_log_is_cut_at_its_budget_and_forges_no_line() {
    let log = CapturedLog::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(log.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::WARN)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let runtime = support::runtime();
    let driver = support::from_file(&runtime, MISBEHAVE).await;
    driver
        .validate_task_config(&behave("flood-log"))
        .await
        .unwrap();
    let text = String::from_utf8(log.0.lock().unwrap().clone()).unwrap();
    let logged = text.lines().filter(|l| l.contains("flood ")).count();
    assert_eq!(
        logged,
        berth_runtime::host_api::log::MAX_MESSAGES_PER_CALL as usize,
        "{}",
        &text[..text.len().min(2000)]
    );
    assert!(
        !text.lines().any(|l| l.starts_with("FORGED")),
        "a guest's line break started a line of its own"
    );
    assert!(
        text.contains("dropped=99000"),
        "{}",
        &text[text.len().saturating_sub(2000)..]
    );
}
