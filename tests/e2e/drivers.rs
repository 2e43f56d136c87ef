//! The first-party drivers, the 0.1.0 driver and the Python driver, running real tasks.

use std::time::{Duration, Instant};

use berth_model::driver::{MountConfigs, TaskState, WorldVersion};
use berth_model::mount::Propagation;
use berth_runtime::driver::DriverError;
use serde_json::json;

use crate::support::{self, TaskDir, mount};

#[tokio::test(flavor = "multi_thread")]
async fn exec_runs_in_its_chroot_with_read_only_and_read_write_mounts() {
    let runtime = support::runtime();
    let exec = support::builtin(&runtime, "exec").await;
    let sources = tempfile::tempdir_in("/tmp").unwrap();
    let ro = sources.path().join("ro");
    let rw = sources.path().join("rw");
    std::fs::create_dir_all(&ro).unwrap();
    std::fs::create_dir_all(&rw).unwrap();
    std::fs::write(ro.join("hello.txt"), "from the host\n").unwrap();
    // A file next to the task dir that the chrooted task must not see.
    let outside = sources.path().join("outside-marker");
    std::fs::write(&outside, "secret").unwrap();

    let task = TaskDir::new();
    let script = format!(
        "cat /local/ro/hello.txt; echo \"env=$GREETING\"; \
         echo written > /local/rw/out.txt && echo rw-ok; \
         if echo x > /local/ro/nope 2>/dev/null; then echo RO-WRITABLE; else echo ro-refused; fi; \
         if [ -e {outside} ]; then echo ESCAPED; else echo confined; fi; \
         if [ -e /usr/bin/env ]; then echo has-usr; fi; \
         if touch /usr/berth-probe 2>/dev/null; then echo USR-WRITABLE; else echo usr-readonly; fi",
        outside = outside.display()
    );
    let request = task.request(
        "web",
        json!({"command": "/bin/sh", "args": ["-c", script]}),
        vec![
            mount(&ro, "/local/ro", true, Propagation::Private),
            mount(&rw, "/local/rw", false, Propagation::Private),
        ],
    );
    let handle = exec.start_task(&request).await.unwrap();
    let exit = exec.wait_task(&handle).await.unwrap();
    let stdout = task.read_stdout();
    assert!(
        exit.successful(),
        "exit {exit:?}, stdout {stdout}, stderr {}",
        task.read_stderr()
    );
    assert_eq!(
        stdout.lines().collect::<Vec<_>>(),
        [
            "from the host",
            "env=hello",
            "rw-ok",
            "ro-refused",
            "confined",
            "has-usr",
            "usr-readonly"
        ],
    );
    assert_eq!(
        std::fs::read_to_string(rw.join("out.txt")).unwrap(),
        "written\n"
    );
    assert!(!ro.join("nope").exists());
    assert!(!std::path::Path::new("/usr/berth-probe").exists());
    // The task's mounts lived in its own namespace: nothing is left on the host.
    assert!(support::host_mounts_under(task.path()).is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn raw_exec_runs_in_the_task_dir_without_isolation() {
    let runtime = support::runtime();
    let raw = support::builtin(&runtime, "raw_exec").await;
    assert_eq!(raw.capabilities().mount_configs, MountConfigs::None);
    let task = TaskDir::new();
    let request = task.unconfined_request(
        "raw",
        json!({"command": "/bin/sh", "args": ["-c", "pwd; exit 7"]}),
    );
    let handle = raw.start_task(&request).await.unwrap();
    let exit = raw.wait_task(&handle).await.unwrap();
    assert_eq!(exit.exit_code, 7);
    assert_eq!(task.read_stdout().trim(), task.path().to_str().unwrap());
}

/// A running task of a driver that waits in its own code (the misbehave driver's
/// `wait-in-guest` sleeps through the host's timer) keeps an instance, but never one of
/// the slots kept for checks. With every other slot taken, a task call waits for one for
/// the runtime's slot_wait, then fails with an error that names the setting to raise;
/// checks still run meanwhile; and task calls work again once a slot is free.
#[tokio::test(flavor = "multi_thread")]
async fn a_full_instance_pool_gives_a_clear_error_keeps_checks_running_and_recovers() {
    let mut config = berth_runtime::RuntimeConfig::new(Some(support::cache_dir()));
    config.max_instances = 4;
    config.slot_wait = Duration::from_millis(300);
    assert_eq!(berth_runtime::slots_kept_for_checks(4), 1);
    let runtime = berth_runtime::Runtime::with_processes(config, support::processes()).unwrap();
    let waiter = std::sync::Arc::new(
        support::from_file(&runtime, berth_builtin::test_components::MISBEHAVE).await,
    );
    let task = TaskDir::new();
    let wait_in_guest = json!({"behave": "wait-in-guest"});
    let mut waits = Vec::new();
    for index in 0..3 {
        let handle = waiter
            .start_task(&task.request(&format!("w{index}"), wait_in_guest.clone(), vec![]))
            .await
            .unwrap();
        let driver = waiter.clone();
        waits.push(tokio::spawn(async move { driver.wait_task(&handle).await }));
    }
    // The task slots are full once the three waits hold their instances.
    let live = || {
        runtime
            .engine()
            .pooling_allocator_metrics()
            .map_or(0, |m| m.component_instances())
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while live() < 3 {
        assert!(
            Instant::now() < deadline,
            "the waits never held their instances"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let error = waiter
        .start_task(&task.request("w3", wait_in_guest.clone(), vec![]))
        .await
        .unwrap_err();
    assert!(
        error.to_string().contains(
            "could not run: no free WebAssembly instance slot (maximum concurrent limit of 4 \
             for component instances reached (1 of them kept for checks)"
        ) && error
            .to_string()
            .contains("raise max_plugin_instances in the agent config"),
        "{error}"
    );
    // A submission's check and a fingerprint take the slot kept for them, at once.
    let started = Instant::now();
    waiter
        .validate_task_config(&json!({"behave": "ok"}).to_string())
        .await
        .unwrap();
    waiter.fingerprint().await.unwrap();
    assert!(
        started.elapsed() < Duration::from_millis(250),
        "checks waited for a slot: {:?}",
        started.elapsed()
    );
    for wait in &waits {
        wait.abort();
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while waiter
        .start_task(&task.request("w4", json!({"behave": "ok"}), vec![]))
        .await
        .is_err()
    {
        assert!(Instant::now() < deadline, "slots were not given back");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A running mock task holds no instance: the mock says when its task ends
/// (`timer.task-ends-after`) and the host waits for that time itself, so far more mock
/// tasks than slots wait at once, and each wait still ends at its time with its exit.
#[tokio::test(flavor = "multi_thread")]
async fn mock_tasks_wait_without_an_instance() {
    let mut config = berth_runtime::RuntimeConfig::new(Some(support::cache_dir()));
    config.max_instances = 4;
    config.slot_wait = Duration::from_millis(300);
    let runtime = berth_runtime::Runtime::with_processes(config, support::processes()).unwrap();
    let mock = std::sync::Arc::new(support::builtin(&runtime, "mock").await);
    let task = TaskDir::new();
    let started = Instant::now();
    let mut waits = Vec::new();
    for index in 0..12 {
        let handle = mock
            .start_task(&task.request(
                &format!("m{index}"),
                json!({"run_for": "1s", "exit_code": index}),
                vec![],
            ))
            .await
            .unwrap();
        assert!(
            handle.ends_at_ms.is_some(),
            "the mock did not say when it ends"
        );
        let driver = mock.clone();
        waits.push(tokio::spawn(async move { driver.wait_task(&handle).await }));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let live = runtime
        .engine()
        .pooling_allocator_metrics()
        .map_or(0, |m| m.component_instances());
    assert_eq!(live, 0, "waiting mock tasks hold instances");
    mock.fingerprint().await.unwrap();
    for (index, wait) in waits.into_iter().enumerate() {
        let exit = wait.await.unwrap().unwrap();
        assert_eq!(exit.exit_code, index as i32);
    }
    assert!(started.elapsed() >= Duration::from_secs(1));
}

/// A driver that said which process its task ends with (exec, through the SDK) leaves
/// the waiting to the host: three times more exec tasks than the pool has slots start at
/// once (the starts queue for slots), no slot is held while they run, other calls find
/// one, and each task's end still comes through its driver's wait-task.
#[tokio::test(flavor = "multi_thread")]
async fn running_exec_tasks_hold_no_instance_slot() {
    const SLOTS: u32 = 4;
    let mut config = berth_runtime::RuntimeConfig::new(Some(support::cache_dir()));
    config.max_instances = SLOTS;
    let runtime = berth_runtime::Runtime::with_processes(config, support::processes()).unwrap();
    let exec = std::sync::Arc::new(support::builtin(&runtime, "exec").await);
    let live = || {
        runtime
            .engine()
            .pooling_allocator_metrics()
            .map_or(0, |m| m.component_instances())
    };
    // A task dir each, as the agent gives every task: chroot spawns prepare their root.
    let tasks: Vec<_> = (0..SLOTS * 3)
        .map(|_| std::sync::Arc::new(TaskDir::new()))
        .collect();
    let starts: Vec<_> = tasks
        .iter()
        .enumerate()
        .map(|(index, task)| {
            let (exec, task) = (exec.clone(), task.clone());
            tokio::spawn(async move {
                let request = task.request(
                    &format!("e{index}"),
                    json!({"command": "/bin/sleep", "args": ["60"]}),
                    vec![],
                );
                exec.start_task(&request).await
            })
        })
        .collect();
    let mut running = Vec::new();
    for start in starts {
        let handle = start.await.unwrap().unwrap();
        assert!(handle.ends_with.is_some(), "{handle:?}");
        let driver = exec.clone();
        let waited = handle.clone();
        running.push((
            handle,
            tokio::spawn(async move { driver.wait_task(&waited).await }),
        ));
    }
    // Twelve tasks wait; give any wait that would take a slot the time to take it.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(live(), 0, "running tasks hold instances");
    exec.fingerprint().await.unwrap();
    for (handle, wait) in &running {
        assert!(!wait.is_finished(), "{} ended early", handle.id);
    }
    for (handle, _) in &running {
        exec.stop_task(handle, Duration::from_secs(5), "SIGTERM")
            .await
            .unwrap();
    }
    for (handle, wait) in running {
        let exit = tokio::time::timeout(Duration::from_secs(10), wait)
            .await
            .expect("wait-task after the task ended")
            .unwrap()
            .unwrap();
        assert_eq!(exit.signal, 15, "{}: {exit:?}", handle.id);
        exec.destroy_task(&handle, true).await.unwrap();
        exec.release(&handle);
    }
    assert_eq!(live(), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn mock_exit_codes_start_errors_and_run_time_come_through() {
    let runtime = support::runtime();
    let mock = support::builtin(&runtime, "mock").await;
    let task = TaskDir::new();

    let started = Instant::now();
    let handle = mock
        .start_task(&task.request("m", json!({"run_for": "300ms", "exit_code": 3}), vec![]))
        .await
        .unwrap();
    assert_eq!(
        mock.inspect_task(&handle).await.unwrap().state,
        TaskState::Running
    );
    let exit = mock.wait_task(&handle).await.unwrap();
    assert_eq!(exit.exit_code, 3);
    assert!(started.elapsed() >= Duration::from_millis(300));
    let status = mock.inspect_task(&handle).await.unwrap();
    assert_eq!(status.state, TaskState::Exited);
    assert_eq!(status.exit.unwrap().exit_code, 3);

    let error = mock
        .start_task(&task.request("m", json!({"start_error": "disk on fire"}), vec![]))
        .await
        .unwrap_err();
    assert!(matches!(error, DriverError::Refused { .. }));
    assert_eq!(
        error.to_string(),
        "driver \"mock\" (built-in): start-task: disk on fire"
    );

    let error = mock
        .validate_task_config(&json!({"run_for": "soon"}).to_string())
        .await
        .unwrap_err();
    assert!(
        error.to_string().contains("invalid duration \"soon\""),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn stop_task_signals_and_the_exit_reports_the_signal() {
    let runtime = support::runtime();
    let exec = support::builtin(&runtime, "exec").await;
    let task = TaskDir::new();
    let request = task.request(
        "sleepy",
        json!({"command": "/bin/sleep", "args": ["30"]}),
        vec![],
    );
    let handle = exec.start_task(&request).await.unwrap();
    assert_eq!(
        exec.inspect_task(&handle).await.unwrap().state,
        TaskState::Running
    );
    let started = Instant::now();
    exec.stop_task(&handle, Duration::from_secs(5), "SIGTERM")
        .await
        .unwrap();
    let exit = exec.wait_task(&handle).await.unwrap();
    assert_eq!(exit.signal, 15);
    assert!(started.elapsed() < Duration::from_secs(5));
}

/// A task is started by `berth-keeper`. Without one, or with a program in its place that
/// is not one (an install that lost it, a wrong path), the start fails with an error that
/// names the keeper, and leaves nothing running.
#[tokio::test(flavor = "multi_thread")]
async fn a_task_without_a_working_keeper_fails_to_start_saying_why() {
    let without = berth_runtime::Runtime::new(berth_runtime::RuntimeConfig::new(Some(
        support::cache_dir(),
    )))
    .unwrap();
    let not_a_keeper = berth_runtime::Runtime::with_processes(
        berth_runtime::RuntimeConfig::new(Some(support::cache_dir())),
        std::sync::Arc::new(
            berth_sys::process::ProcessTable::default().supervised_by("/bin/true".into()),
        ),
    )
    .unwrap();
    for (runtime, expected) in [
        (&without, "no berth-keeper to start the task with"),
        (
            &not_a_keeper,
            "starting the task's keeper /bin/true: it ended before it took the task",
        ),
    ] {
        let exec = support::builtin(runtime, "exec").await;
        let task = TaskDir::new();
        let request = task.request(
            "sleeps",
            json!({"command": "/bin/sleep", "args": ["30"]}),
            vec![],
        );
        let error = exec.start_task(&request).await.unwrap_err().to_string();
        assert!(error.contains(expected), "{error}");
        assert_eq!(runtime.processes().len(), 0, "{error}");
    }
}

/// A task's keeper reports how far it got: a start that fails names the step that
/// failed, or the program that is not in the task's root, and leaves no process behind
/// (keeper, shim, init and task end with the failure and are collected).
#[tokio::test(flavor = "multi_thread")]
async fn a_failed_spawn_names_its_step_or_program_and_leaves_no_process() {
    let runtime = support::runtime();
    let exec = support::builtin(&runtime, "exec").await;
    let missing_volume = TaskDir::new();
    let gone = missing_volume.path().join("removed-before-the-start");
    let missing_program = TaskDir::new();
    let cases = [
        (
            &missing_volume,
            missing_volume.request(
                "volume",
                json!({"command": "/bin/true"}),
                vec![mount(&gone, "/data", false, Propagation::Private)],
            ),
            format!(
                "setting up the task failed at step \"bind {} to ",
                gone.display()
            ),
        ),
        (
            &missing_program,
            missing_program.request("program", json!({"command": "no-such-program"}), vec![]),
            "starting \"no-such-program\": no such program (paths are resolved inside the \
             task's root)"
                .to_string(),
        ),
    ];
    for (task, request, expected) in cases {
        let error = exec.start_task(&request).await.unwrap_err().to_string();
        assert!(error.contains(&expected), "{error}");
        assert_eq!(runtime.processes().len(), 0, "{error}");
        let deadline = Instant::now() + Duration::from_secs(5);
        while !support::processes_rooted_under(task.path()).is_empty() {
            assert!(
                Instant::now() < deadline,
                "a process of the failed start is left"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_task_is_recovered_by_a_new_agent_and_its_exit_observed() {
    let task = TaskDir::new();
    // Runs until the test makes `stop`, however long the recovery takes on a busy node.
    let stop = task.path().join("stop");
    let handle = {
        let first_agent = support::runtime();
        let raw = support::builtin(&first_agent, "raw_exec").await;
        let script = format!("while [ ! -e {} ]; do sleep 0.1; done", stop.display());
        let request = task.unconfined_request(
            "long",
            json!({"command": "/bin/sh", "args": ["-c", script]}),
        );
        raw.start_task(&request).await.unwrap()
    };
    // A new runtime has an empty process table, as after a restart.
    let second_agent = support::runtime();
    let raw = support::builtin(&second_agent, "raw_exec").await;
    raw.recover_task(&mut handle.clone()).await.unwrap();
    assert_eq!(
        raw.inspect_task(&handle).await.unwrap().state,
        TaskState::Running
    );
    std::fs::write(&stop, "").unwrap();
    let exit = tokio::time::timeout(Duration::from_secs(60), raw.wait_task(&handle))
        .await
        .unwrap()
        .unwrap();
    // Only the real parent could collect the exit code of an adopted process.
    assert_eq!(exit.exit_code, -1);

    let mut forged = handle.clone();
    forged.driver_state = format!("{} 1", std::process::id()).into_bytes();
    let error = raw.recover_task(&mut forged).await.unwrap_err();
    assert!(
        error.to_string().contains(&format!(
            "driver \"raw_exec\" tried to adopt process {}, which berth did not spawn for \
             the task it recovers",
            std::process::id()
        )),
        "{error}"
    );
    // A recorded process whose pid was reused since is refused too.
    let mut reused = handle.clone();
    reused.driver_state = format!("{} 1", std::process::id()).into_bytes();
    reused.spawned = vec![berth_sys::process::ProcessRef {
        pid: std::process::id(),
        start_time: 1,
    }];
    let error = raw.recover_task(&mut reused).await.unwrap_err();
    assert!(
        error.to_string().contains("is gone or its pid was reused"),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_driver_built_against_0_1_0_loads_as_mount_configs_all_and_mounts() {
    let runtime = support::runtime();
    let legacy = support::from_file(&runtime, berth_builtin::test_components::LEGACY_V01).await;
    assert_eq!(legacy.world(), WorldVersion::V0_1);
    assert_eq!(legacy.capabilities().mount_configs, MountConfigs::All);
    assert!(!legacy.capabilities().declared);

    let data = tempfile::tempdir_in("/tmp").unwrap();
    std::fs::write(data.path().join("v"), "legacy can mount\n").unwrap();
    let task = TaskDir::new();
    let request = task.request(
        "old",
        json!({"command": "/bin/cat", "args": ["/data/v"]}),
        vec![mount(data.path(), "/data", true, Propagation::Private)],
    );
    let handle = legacy.start_task(&request).await.unwrap();
    assert!(
        legacy.wait_task(&handle).await.unwrap().successful(),
        "{}",
        task.read_stderr()
    );
    assert_eq!(task.read_stdout(), "legacy can mount\n");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_driver_written_in_python_runs_a_task() {
    let runtime = support::runtime();
    let python = support::from_file(&runtime, support::python_driver().to_str().unwrap()).await;
    assert_eq!(python.info().name, "pyexec");
    assert_eq!(python.capabilities().mount_configs, MountConfigs::None);
    // Built against 0.2.0: it could not say how it spawns, nor describe its config, and
    // its spawns are held to its fs-isolation and the operator's word alone.
    assert_eq!(python.world(), WorldVersion::V0_2);
    assert_eq!(python.capabilities().spawn_isolation, None);
    assert_eq!(python.config_schema().await.unwrap(), None);
    let fingerprint = python.fingerprint().await.unwrap();
    assert_eq!(
        fingerprint.attributes,
        [("driver.pyexec.language".to_string(), "python".to_string())]
    );

    let task = TaskDir::new();
    let request = task.unconfined_request(
        "py",
        json!({"command": "/bin/sh", "args": ["-c", "echo \"python says $GREETING\"; exit 4"]}),
    );
    let handle = python.start_task(&request).await.unwrap();
    assert_eq!(python.wait_task(&handle).await.unwrap().exit_code, 4);
    assert_eq!(task.read_stdout(), "python says hello\n");

    let error = python
        .validate_task_config("{\"command\": \"relative\"}")
        .await
        .unwrap_err();
    assert!(
        error
            .to_string()
            .ends_with("validate-task-config: pyexec needs an absolute `command`"),
        "{error}"
    );
}
