//! Third-party WASM lifecycle hooks end to end: the example hooks change what a task
//! sees, and hostile ones are contained with a readable event while a healthy alloc on
//! the same agent is unaffected.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use berth_builtin::test_components as components;
use berth_client::agent::Agent;
use berth_client::alloc_runner::AllocStatus;
use berth_client::config::AgentConfig;
use berth_client::driver_set::DriverSet;
use berth_client::hook_set::HookSet;
use berth_harness::InProcessAgent;
use berth_model::events::EventKind;
use berth_model::hook::{HookSpec, OnFailure};
use berth_model::status::ClientStatus;

use crate::support;

fn spec(name: &str, path: &str, config: &[(&str, &str)]) -> HookSpec {
    HookSpec {
        name: name.to_string(),
        path: PathBuf::from(path),
        config: config
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        timeout: Duration::from_millis(500),
        memory_max: 16 << 20,
        on_failure: OnFailure::Fail,
        all_tasks: false,
        sha256: None,
        quota: Default::default(),
    }
}

async fn agent_with(hooks: Vec<HookSpec>) -> InProcessAgent {
    let runtime = support::runtime();
    let (drivers, _) = DriverSet::load(&runtime, None, &Default::default()).await;
    let hook_set = HookSet::load(&runtime, &hooks, false).await;
    // raw_exec on: the policy hooks below are what refuses it.
    let enabled = |name: &str| berth_client::config::PluginConfig {
        name: name.into(),
        enabled: Some(true),
        ..Default::default()
    };
    let config = AgentConfig {
        hooks,
        plugins: vec![enabled("raw_exec"), enabled("mock")],
        ..AgentConfig::default()
    };
    InProcessAgent::start_with("berth-e2e-hooks", config, drivers, hook_set)
        .await
        .unwrap()
}

/// Runs a job to the end and returns its first alloc.
async fn run(agent: &Agent, source: &str) -> AllocStatus {
    let submitted = agent.submit("job.hcl", source).await.unwrap();
    tokio::time::timeout(Duration::from_secs(60), agent.wait_job(&submitted.job_id))
        .await
        .expect("the job finished");
    agent.alloc(&submitted.alloc_ids[0]).unwrap()
}

fn messages(status: &AllocStatus, task: &str) -> Vec<String> {
    status.tasks[task]
        .events
        .iter()
        .map(|e| format!("{}: {}", e.kind, e.message))
        .collect()
}

/// A service alloc that runs for an hour beside the hostile ones; the tests check it
/// never noticed them.
async fn submit_healthy(agent: &Agent) -> berth_client::agent::Submitted {
    let job = "job \"healthy\" {\n  group \"g\" {\n    task \"t\" {\n      driver = \"mock\"\n      config { run_for = \"1h\" }\n    }\n  }\n}\n";
    agent.submit("healthy.hcl", job).await.unwrap()
}

fn batch(name: &str, task: &str) -> String {
    format!(
        "job \"{name}\" {{\n  type = \"batch\"\n  group \"g\" {{\n    restart {{\n      attempts = 0\n      mode = \"fail\"\n    }}\n{task}  }}\n}}\n"
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn example_hooks_inject_env_render_a_file_and_enforce_a_policy() {
    let mut policy = spec(
        "policy",
        components::DENY_POLICY_HOOK,
        &[("deny_drivers", "raw_exec")],
    );
    policy.all_tasks = true;
    let hooks = vec![
        policy,
        spec("inject-env", components::INJECT_ENV_HOOK, &[]),
        spec(
            "render",
            components::RENDER_TEMPLATE_HOOK,
            &[
                (
                    "template",
                    "job={{ job }} tier={{ meta.tier }} seen={{ env.APP_TIER }}\n",
                ),
                ("destination", "conf/app.conf"),
            ],
        ),
    ];
    let h = agent_with(hooks).await;
    let task = r#"    task "app" {
      driver = "exec"
      hooks  = ["inject-env", "render"]
      meta { tier = "gold" }
      config {
        command = "/bin/sh"
        args    = ["-c", "echo env=$APP_TIER; cat /local/conf/app.conf; echo \"$0\"", "config=${APP_TIER}"]
      }
    }
    task "pinned" {
      driver = "exec"
      hooks  = ["inject-env"]
      meta { tier = "gold" }
      env { APP_TIER = "set-by-job" }
      config {
        command = "/bin/sh"
        args    = ["-c", "echo \"env=$APP_TIER $0\"", "config=${APP_TIER}"]
      }
    }
"#;
    let status = run(&h, &batch("hooked", task)).await;
    assert_eq!(status.client_status, ClientStatus::Complete, "{status:#?}");
    let stdout = std::fs::read_to_string(status.alloc_dir.join("alloc/logs/app.stdout.0")).unwrap();
    // The last line is the driver config's `${APP_TIER}`, which only the hook defines:
    // the config is interpolated with the env the hooks added to, as Nomad's task env.
    assert_eq!(
        stdout,
        "env=gold\njob=hooked tier=gold seen=gold\nconfig=gold\n"
    );
    // A name the job defined keeps the job's value in the driver config: a hook (its
    // author untrusted) fills names nothing defined, and redefines none in the config.
    let pinned =
        std::fs::read_to_string(status.alloc_dir.join("alloc/logs/pinned.stdout.0")).unwrap();
    assert_eq!(pinned, "env=gold config=set-by-job\n");
    let events = messages(&status, "app");
    assert!(
        events.contains(&"Task Hook: hook \"inject-env\": injected 1 variable(s) from meta".into()),
        "{events:#?}"
    );
    assert!(
        events.contains(&"Task Hook: hook \"render\" wrote local/conf/app.conf".into()),
        "{events:#?}"
    );

    // The policy applies to every task and refuses raw_exec, with its reason.
    let denied = r#"    task "shell" {
      driver = "raw_exec"
      config { command = "/bin/true" }
    }
"#;
    let status = run(&h, &batch("denied", denied)).await;
    assert_eq!(status.client_status, ClientStatus::Failed);
    let events = messages(&status, "shell");
    assert!(
        events
            .iter()
            .any(|e| e.starts_with("Setup Failure: hook \"policy\"")
                && e.ends_with(
                    "task \"shell\" uses driver \"raw_exec\", which this node's policy denies"
                )),
        "{events:#?}"
    );
    assert!(!events.iter().any(|e| e.starts_with("Started")));

    // A job naming a hook the agent does not have is refused at submit.
    let unknown = "    task \"t\" {\n      driver = \"mock\"\n      hooks = [\"nope\"]\n    }\n";
    let error = h
        .agent()
        .submit("unknown.hcl", &batch("unknown", unknown))
        .await
        .unwrap_err();
    assert!(
        error
            .to_string()
            .contains("unknown hook \"nope\" (this agent has: policy, inject-env, render)"),
        "{error}"
    );
}

/// Each hostile behaviour, the words its Setup Failure must contain, and whether it is
/// stopped at the hook's deadline (it would run for an hour or forever): such a run may
/// take the deadline and some slack more than the slowest of the others, which fail as
/// soon as the hook returns and run beside it on the same (perhaps busy) node.
const HOSTILE: &[(&str, &str, bool)] = &[
    (
        "loop",
        "ran past its deadline of 500ms and was stopped (during prestart)",
        true,
    ),
    (
        "sleep",
        "ran past its deadline of 500ms and was stopped (during prestart)",
        true,
    ),
    (
        "hog",
        "tried to use more than its memory cap of 16 MiB",
        false,
    ),
    ("trap", "crashed: ", false),
    (
        "flood",
        "returned too much: 100000 environment variables (at most 64)",
        false,
    ),
    (
        "escape-dotdot",
        "file path \"../escaped\" leaves (or wanders in) local/",
        false,
    ),
    (
        "escape-absolute",
        "file path \"/tmp/escaped\" is absolute",
        false,
    ),
    (
        "escape-symlink",
        "file path \"link/escaped\" goes through a symlink",
        false,
    ),
];

#[tokio::test(flavor = "multi_thread")]
async fn hostile_hooks_are_contained_and_a_healthy_alloc_is_unaffected() {
    let outside = tempfile::Builder::new()
        .prefix("berth-e2e-outside")
        .tempdir_in("/tmp")
        .unwrap();
    let mut hooks: Vec<HookSpec> = HOSTILE
        .iter()
        .map(|(behave, _, _)| spec(behave, components::HOSTILE_HOOK, &[("behave", behave)]))
        .collect();
    hooks.push(spec(
        "wasi-escape",
        components::HOSTILE_HOOK,
        &[("behave", "wasi-escape")],
    ));
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let address = listener.local_addr().unwrap().to_string();
    hooks.push(spec(
        "net",
        components::HOSTILE_HOOK,
        &[("behave", "net"), ("address", &address)],
    ));
    let mut ignored = spec("ignored", components::HOSTILE_HOOK, &[("behave", "trap")]);
    ignored.on_failure = OnFailure::Ignore;
    hooks.push(ignored);
    let h = agent_with(hooks).await;

    // A healthy service alloc keeps running beside the hostile ones.
    let healthy = submit_healthy(&h).await;

    // The prestart task plants `local/link` -> a dir outside, before the hooks run.
    let plant = |victim: &str| {
        format!(
            "    task \"plant\" {{\n      driver = \"raw_exec\"\n      lifecycle {{ hook = \"prestart\" }}\n      config {{\n        command = \"/bin/sh\"\n        args = [\"-c\", \"mkdir -p $NOMAD_ALLOC_DIR/../tasks/{victim}/local && ln -s {} $NOMAD_ALLOC_DIR/../tasks/{victim}/local/link\"]\n      }}\n    }}\n",
            outside.path().display()
        )
    };
    let mut runs = Vec::new();
    for (behave, expected, at_deadline) in HOSTILE {
        let task = format!(
            "{}    task \"victim\" {{\n      driver = \"exec\"\n      hooks = [\"{behave}\"]\n      config {{ command = \"/bin/true\" }}\n    }}\n",
            plant("victim")
        );
        let agent = h.agent().clone();
        let source = batch(&format!("hostile-{behave}"), &task);
        runs.push(tokio::spawn(async move {
            let started = Instant::now();
            let status = run(&agent, &source).await;
            (*behave, *expected, *at_deadline, started.elapsed(), status)
        }));
    }
    let mut finished = Vec::new();
    for run in runs {
        finished.push(run.await.unwrap());
    }
    let slowest_immediate = finished
        .iter()
        .filter(|(_, _, at_deadline, _, _)| !at_deadline)
        .map(|(_, _, _, took, _)| *took)
        .max()
        .unwrap();
    for (behave, expected, at_deadline, took, status) in finished {
        assert_eq!(status.client_status, ClientStatus::Failed, "{behave}");
        let events = messages(&status, "victim");
        let failure = events
            .iter()
            .find(|e| e.starts_with("Setup Failure: "))
            .unwrap_or_else(|| panic!("{behave}: {events:#?}"));
        assert!(
            failure.contains(&format!("hook \"{behave}\"")) && failure.contains(expected),
            "{behave}: {failure}"
        );
        if at_deadline {
            assert!(
                took < slowest_immediate + Duration::from_secs(5),
                "{behave} took {took:?}; the slowest of the others {slowest_immediate:?}"
            );
        }
        assert!(!events.iter().any(|e| e.starts_with("Started")), "{behave}");
    }
    assert_eq!(
        std::fs::read_dir(outside.path()).unwrap().count(),
        0,
        "something was written outside local/"
    );

    // Through WASI itself the hook reaches nothing outside /local either.
    let task = format!(
        "{}    task \"victim\" {{\n      driver = \"mock\"\n      hooks = [\"wasi-escape\"]\n      config {{ run_for = \"0s\" }}\n    }}\n",
        plant("victim")
    );
    let status = run(&h, &batch("wasi", &task)).await;
    assert_eq!(status.client_status, ClientStatus::Complete, "{status:#?}");
    let events = messages(&status, "victim");
    assert!(
        events.iter().any(|e| e.contains(
            "hook \"wasi-escape\": contained: 4 attempts outside /local denied; inside write ok: false"
        )),
        "{events:#?}"
    );
    assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);

    // No network: the connection attempt fails inside the sandbox and nothing arrives.
    let task = "    task \"t\" {\n      driver = \"mock\"\n      hooks = [\"net\"]\n      config { run_for = \"0s\" }\n    }\n";
    let status = run(&h, &batch("net", task)).await;
    let events = messages(&status, "t");
    assert!(
        events
            .iter()
            .any(|e| e.starts_with("Task Hook: hook \"net\": network denied: ")),
        "{events:#?}"
    );
    // Non-blocking: "would block" means no connection is waiting; any other answer
    // (a connection, or a broken listener) would not prove the hook was kept off.
    let accepted = listener.accept();
    assert!(
        matches!(&accepted, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "the hook reached the network: {accepted:?}"
    );

    // on_failure = "ignore": the task runs, and the event says the hook was ignored.
    let task = "    task \"t\" {\n      driver = \"mock\"\n      hooks = [\"ignored\"]\n      config { run_for = \"0s\" }\n    }\n";
    let status = run(&h, &batch("ignoring", task)).await;
    assert_eq!(status.client_status, ClientStatus::Complete);
    let events = messages(&status, "t");
    assert!(
        events
            .iter()
            .any(|e| e.starts_with("Task Hook: hook \"ignored\"")
                && e.contains("failed and was ignored (on_failure = \"ignore\"): crashed: ")),
        "{events:#?}"
    );

    // The healthy alloc never noticed.
    let status = h.agent().alloc(&healthy.alloc_ids[0]).unwrap();
    assert_eq!(status.client_status, ClientStatus::Running);
    assert_eq!(status.tasks["t"].restarts, 0);
    assert!(
        status.tasks["t"]
            .events
            .iter()
            .all(|e| e.kind != EventKind::SetupFailure)
    );
    h.agent().stop_job("healthy").await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_hook_files_are_refused_at_load_and_the_rest_keeps_working() {
    let dir = tempfile::tempdir().unwrap();
    let garbage = dir.path().join("garbage.wasm");
    std::fs::write(&garbage, "not a component").unwrap();
    let runtime = support::runtime();
    let hooks = HookSet::load(
        &runtime,
        &[
            spec("missing", "/nonexistent/hook.wasm", &[]),
            spec("garbage", garbage.to_str().unwrap(), &[]),
            // A driver imports berth:host/process, which hooks are not offered.
            spec("a-driver", components::MISBEHAVE, &[]),
            spec("fine", components::INJECT_ENV_HOOK, &[]),
        ],
        false,
    )
    .await;
    let names: Vec<&str> = hooks.loaded().iter().map(|h| h.name()).collect();
    assert_eq!(names, vec!["fine"]);
    let reasons: Vec<&str> = hooks.refused().iter().map(|(_, r)| r.as_str()).collect();
    assert!(
        reasons[0].starts_with("hook \"missing\": cannot read /nonexistent/hook.wasm"),
        "{}",
        reasons[0]
    );
    assert!(
        reasons[1].contains("not a valid WebAssembly component (15 bytes)"),
        "{}",
        reasons[1]
    );
    // Named for what it is, before it is compiled.
    assert!(
        reasons[2].ends_with(
            "is a task driver, not a hook (it exports berth:driver/driver@0.2.1): put it in the plugin dir (`plugin_dir`)"
        ),
        "{}",
        reasons[2]
    );
    assert_eq!(
        hooks.problem_with("garbage").unwrap().split(':').next(),
        Some("hook \"garbage\" did not load on this agent")
    );
}

/// A hook author trying to reach root through what the task is given: a preloaded shared
/// object, the variables a shell or loader reads first, variables berth owns, names that
/// are not names, unbounded writes through WASI or through returned files, and an
/// executable the task will run. Each is refused with an event naming the hook and the
/// rule, or contained; the task beside them runs as before.
#[tokio::test(flavor = "multi_thread")]
async fn a_hook_cannot_hand_the_task_a_loader_a_shell_or_an_executable() {
    let env_cases: &[(&str, &str, &str)] = &[
        (
            "env-path",
            "PATH",
            "environment variable \"PATH\": it changes how the task's shell, loader or runtime starts",
        ),
        (
            "env-bash",
            "BASH_ENV",
            "environment variable \"BASH_ENV\": it changes how the task's shell",
        ),
        (
            "env-python",
            "PYTHONSTARTUP",
            "environment variable \"PYTHONSTARTUP\": PYTHON* variables change",
        ),
        (
            "env-nomad",
            "NOMAD_ALLOC_DIR",
            "environment variable \"NOMAD_ALLOC_DIR\": NOMAD_* variables are set by berth",
        ),
        (
            "env-berth",
            "BERTH_TASK",
            "environment variable \"BERTH_TASK\": BERTH_* variables are set by berth",
        ),
        (
            "env-equals",
            "A=B",
            "environment variable \"A=B\": a name is 1 to 128 of [A-Za-z0-9_]",
        ),
        (
            "env-newline",
            "A\\nB",
            "environment variable \"A\\nB\": a name is 1 to 128 of [A-Za-z0-9_]",
        ),
    ];
    let mut hooks: Vec<HookSpec> = env_cases
        .iter()
        .map(|(hook, name, _)| {
            spec(
                hook,
                components::HOSTILE_HOOK,
                &[("behave", "env"), ("name", name), ("value", "/local")],
            )
        })
        .collect();
    for behave in ["ld-preload", "wasi-flood", "file-flood", "overwrite"] {
        hooks.push(spec(
            behave,
            components::HOSTILE_HOOK,
            &[("behave", behave)],
        ));
    }
    let h = agent_with(hooks).await;
    let healthy = submit_healthy(&h).await;

    let mut refusals: Vec<(&str, &str)> = env_cases.iter().map(|(h, _, e)| (*h, *e)).collect();
    refusals.push((
        "ld-preload",
        "environment variable \"LD_PRELOAD\": LD_* variables change how the task's loader or runtime starts; hooks may not set them",
    ));
    refusals.push((
        "file-flood",
        "files of 8388608 bytes in all (this hook's quota_bytes is 4194304)",
    ));
    for (hook, expected) in refusals {
        let task = format!(
            "    task \"victim\" {{\n      driver = \"exec\"\n      hooks = [\"{hook}\"]\n      config {{ command = \"/bin/true\" }}\n    }}\n"
        );
        let status = run(&h, &batch(&format!("hostile-{hook}"), &task)).await;
        assert_eq!(status.client_status, ClientStatus::Failed, "{hook}");
        let events = messages(&status, "victim");
        let failure = events
            .iter()
            .find(|e| e.starts_with("Setup Failure: "))
            .unwrap_or_else(|| panic!("{hook}: {events:#?}"));
        assert!(
            failure.contains(&format!("hook \"{hook}\"")) && failure.contains(expected),
            "{hook}: expected {expected:?} in {failure:?}"
        );
        assert!(!events.iter().any(|e| e.starts_with("Started")), "{hook}");
        // Nothing of a refused answer reaches the disk: no shared object, no flood.
        let local = status.alloc_dir.join("tasks/victim/local");
        assert!(!local.join("evil.so").exists(), "{hook}");
        assert!(!local.join("a0").exists(), "{hook}");
    }

    // WASI writes are not a way around the quota: local/ is read-only to the hook.
    let task = "    task \"victim\" {\n      driver = \"mock\"\n      hooks = [\"wasi-flood\"]\n      config { run_for = \"0s\" }\n    }\n";
    let status = run(&h, &batch("hostile-wasi-flood", task)).await;
    assert_eq!(status.client_status, ClientStatus::Complete, "{status:#?}");
    let events = messages(&status, "victim");
    assert!(
        events.contains(&"Task Hook: hook \"wasi-flood\": wasi-flood wrote 0 files".to_string()),
        "{events:#?}"
    );
    let flooded = std::fs::read_dir(status.alloc_dir.join("tasks/victim/local"))
        .unwrap()
        .count();
    assert_eq!(flooded, 0, "the hook wrote into local/ through WASI");

    // A file a hook returns is never executable, even over a file that was.
    let task = "    task \"prep\" {\n      driver = \"raw_exec\"\n      lifecycle { hook = \"prestart\" }\n      config {\n        command = \"/bin/sh\"\n        args = [\"-c\", \"mkdir -p $NOMAD_ALLOC_DIR/../tasks/victim/local && printf '#!/bin/sh\\\\necho original\\\\n' > $NOMAD_ALLOC_DIR/../tasks/victim/local/run.sh && chmod 755 $NOMAD_ALLOC_DIR/../tasks/victim/local/run.sh\"]\n      }\n    }\n    task \"victim\" {\n      driver = \"exec\"\n      hooks = [\"overwrite\"]\n      config {\n        command = \"/bin/sh\"\n        args = [\"-c\", \"stat -c %a /local/run.sh; /local/run.sh || echo refused to run\"]\n      }\n    }\n";
    let status = run(&h, &batch("hostile-overwrite", task)).await;
    let stdout =
        std::fs::read_to_string(status.alloc_dir.join("alloc/logs/victim.stdout.0")).unwrap();
    assert_eq!(stdout, "644\nrefused to run\n", "{status:#?}");

    // The healthy alloc never noticed.
    let status = h.agent().alloc(&healthy.alloc_ids[0]).unwrap();
    assert_eq!(status.client_status, ClientStatus::Running);
    h.agent().stop_job("healthy").await.unwrap();
}
