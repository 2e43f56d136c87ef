//! Dynamic workload users (issue 35, item 4): an `exec` task whose job names no user runs
//! as a uid of its own from `user { dynamic_range }`, so host processes of other users,
//! `nobody` included, cannot read its secrets, trace or signal it; its group's tasks
//! still share `/alloc/data`; an exhausted range makes an alloc wait, saying why; a range
//! a host user holds is refused at start. Each test's agent has a range of its own, so
//! tests running at once never share ids.

use std::os::unix::fs::MetadataExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::time::{Duration, Instant};

use berth_harness::AgentProcess;
use berth_model::status::ClientStatus;

fn job(name: &str, tasks: &str) -> String {
    format!(
        "job \"{name}\" {{\n  type = \"batch\"\n  group \"g\" {{\n    restart {{\n      attempts = 0\n    }}\n{tasks}  }}\n}}\n"
    )
}

fn task(name: &str, extra: &str, script: &str) -> String {
    format!(
        "    task \"{name}\" {{\n      driver = \"exec\"\n{extra}      config {{\n        command = \"/bin/sh\"\n        args = [\"-c\", {}]\n      }}\n    }}\n",
        serde_json::to_string(script).unwrap()
    )
}

fn stdout(alloc_dir: &Path, task: &str) -> String {
    std::fs::read_to_string(alloc_dir.join(format!("alloc/logs/{task}.stdout.0")))
        .unwrap_or_default()
}

fn owner(path: &Path) -> (u32, u32) {
    let meta = std::fs::metadata(path).unwrap();
    (meta.uid(), meta.gid())
}

/// The host pid of the process whose command line is exactly `argv`.
fn pid_of(argv: &[&str]) -> Option<u32> {
    let wanted: Vec<u8> = argv
        .iter()
        .flat_map(|a| [a.as_bytes(), b"\0"].concat())
        .collect();
    std::fs::read_dir("/proc").ok()?.find_map(|entry| {
        let pid: u32 = entry.ok()?.file_name().to_str()?.parse().ok()?;
        (std::fs::read(format!("/proc/{pid}/cmdline")).ok()? == wanted).then_some(pid)
    })
}

/// What a host process running as `uid` can do to task process `pid`: one line per try.
fn attack_as(uid: u32, pid: u32) -> String {
    let script = format!(
        "cat /proc/{pid}/root/secrets/key 2>/dev/null || echo no-secrets; \
         cat /proc/{pid}/environ >/dev/null 2>&1 && echo read-environ || echo no-environ; \
         (exec 3</proc/{pid}/mem) 2>/dev/null && echo opened-mem || echo no-mem; \
         kill -0 {pid} 2>/dev/null && echo signalled || echo no-signal; \
         echo x 2>/dev/null > /proc/{pid}/root/local/planted && echo wrote-local || echo no-local"
    );
    let output = std::process::Command::new("/bin/sh")
        .args(["-c", &script])
        .uid(uid)
        .gid(uid)
        .output()
        .unwrap();
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn host_users_nobody_included_cannot_read_trace_or_signal_a_task() {
    let mut agent = AgentProcess::with_config("user {\n  dynamic_range = \"81000-81099\"\n}\n");
    agent.start().await;
    let script = "echo s3cret > /secrets/key && chmod 600 /secrets/key && echo ready; \
                  exec sleep 3171";
    let submitted = agent
        .submit("victim.hcl", &job("victim", &task("t", "", script)))
        .await
        .unwrap();
    let alloc_id = &submitted.alloc_ids[0];
    let deadline = Instant::now() + Duration::from_secs(30);
    let pid = loop {
        let status = agent.alloc(alloc_id).await;
        if let Some(pid) = pid_of(&["sleep", "3171"])
            && stdout(&status.alloc_dir, "t") == "ready\n"
        {
            break pid;
        }
        assert!(
            Instant::now() < deadline,
            "the task never got ready: {status:#?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let status = agent.alloc(alloc_id).await;
    let (uid, gid) = owner(&status.alloc_dir.join("tasks/t/secrets"));
    assert!((81_000..=81_099).contains(&uid), "the task's uid {uid}");
    assert!(
        (81_000..=81_099).contains(&gid) && gid != uid,
        "the alloc's gid {gid}"
    );
    // Root (the test) sees what the task is: its own uid.
    let task_uid = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    assert!(
        task_uid.contains(&format!("\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")),
        "{task_uid}"
    );
    for attacker in [65534, 1] {
        assert_eq!(
            attack_as(attacker, pid),
            "no-secrets\nno-environ\nno-mem\nno-signal\nno-local\n",
            "as uid {attacker}"
        );
    }
    // The alloc's shared directories are its gid's alone (the data dir's 0700 already
    // keeps host users out; this also holds where a path to them is open).
    let data = std::fs::metadata(status.alloc_dir.join("alloc/data")).unwrap();
    assert_eq!(
        (data.uid(), data.gid(), data.mode() & 0o7777),
        (0, gid, 0o3770)
    );
    let _ = rustix::process::kill_process(
        rustix::process::Pid::from_raw(pid as i32).unwrap(),
        rustix::process::Signal::KILL,
    );
    agent.finished(alloc_id).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn two_dynamic_tasks_of_a_group_share_alloc_data_and_allocs_differ() {
    let mut agent = AgentProcess::with_config("user {\n  dynamic_range = \"81100-81199\"\n}\n");
    agent.start().await;
    let prestart = "      lifecycle {\n        hook = \"prestart\"\n      }\n";
    let tasks = [
        task(
            "writer",
            prestart,
            "echo handed > /alloc/data/f && echo tmp > /alloc/tmp/f && echo done",
        ),
        task(
            "reader",
            "",
            "cat /alloc/data/f /alloc/tmp/f; echo reply > /alloc/data/r && echo replied",
        ),
    ]
    .concat();
    let mut uids = Vec::new();
    for name in ["share-a", "share-b"] {
        let submitted = agent
            .submit(&format!("{name}.hcl"), &job(name, &tasks))
            .await
            .unwrap();
        let status = agent.finished(&submitted.alloc_ids[0]).await;
        let dir = &status.alloc_dir;
        assert_eq!(stdout(dir, "writer"), "done\n", "{status:#?}");
        assert_eq!(
            stdout(dir, "reader"),
            "handed\ntmp\nreplied\n",
            "{status:#?}"
        );
        assert_eq!(status.client_status, ClientStatus::Complete, "{status:#?}");
        let (writer, gid) = owner(&dir.join("tasks/writer/secrets"));
        let (reader, reader_gid) = owner(&dir.join("tasks/reader/secrets"));
        assert_ne!(writer, reader, "each task is a user of its own");
        assert_eq!(gid, reader_gid, "the alloc's tasks share its gid");
        assert_eq!(owner(&dir.join("alloc/data/f")), (writer, gid));
        uids.extend([writer, reader, gid]);
    }
    let distinct: std::collections::BTreeSet<_> = uids.iter().collect();
    assert_eq!(
        distinct.len(),
        uids.len(),
        "two allocs share no id: {uids:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_alloc_waits_for_an_exhausted_range_and_starts_once_ids_come_back() {
    // Four ids: two allocs' gids and their tasks' uids. Finished allocs are collected
    // within 1 s.
    let mut agent = AgentProcess::with_config(
        "user {\n  dynamic_range = \"81200-81203\"\n}\ngc {\n  interval = \"1s\"\n  max_allocs = 0\n}\n",
    );
    agent.start().await;
    for holder in ["first", "holder"] {
        let held = agent
            .submit(
                &format!("{holder}.hcl"),
                &job(holder, &task("t", "", "echo ready; sleep 4")),
            )
            .await
            .unwrap();
        agent
            .wait_alloc(&held.alloc_ids[0], "running", |s| {
                s.client_status == ClientStatus::Running
            })
            .await;
    }
    let second = agent
        .submit("second.hcl", &job("second", &task("t", "", "id -u")))
        .await
        .unwrap();
    let waiting = "Waiting for user ids: the alloc needs 2 from user { dynamic_range = \
                   \"81200-81203\" }";
    agent
        .wait_alloc(&second.alloc_ids[0], "waiting for ids", |s| {
            s.tasks["t"]
                .events
                .iter()
                .any(|e| e.message.starts_with(waiting))
        })
        .await;
    assert_eq!(
        agent.alloc(&second.alloc_ids[0]).await.client_status,
        ClientStatus::Pending
    );
    let status = agent.finished(&second.alloc_ids[0]).await;
    assert_eq!(status.client_status, ClientStatus::Complete, "{status:#?}");
    let uid: u32 = stdout(&status.alloc_dir, "t").trim().parse().unwrap();
    assert!((81_200..=81_203).contains(&uid), "{uid}");
}

/// Finished allocs keep their ids until collected, and `gc { max_allocs }` keeps up to
/// 50 of them: without collecting under id pressure, an alloc waiting for ids would wait
/// for good behind finished ones (attack review: one job's finished allocs held the whole
/// range). Both ways in: an alloc placed while finished ones hold the ids, and one
/// already waiting when the holder finishes.
#[tokio::test(flavor = "multi_thread")]
async fn finished_allocs_holding_ids_are_collected_for_allocs_that_need_them() {
    let mut agent = AgentProcess::with_config("user {\n  dynamic_range = \"81400-81403\"\n}\n");
    agent.start().await;
    let run = |name: &'static str, script: &'static str| {
        let agent = &agent;
        async move {
            agent
                .submit(&format!("{name}.hcl"), &job(name, &task("t", "", script)))
                .await
                .unwrap()
                .alloc_ids[0]
                .clone()
        }
    };
    // A finished alloc that holds no ids is never collected for them.
    let plain = agent
        .submit(
            "plain.hcl",
            &job("plain", &task("t", "      user = \"nobody\"\n", "id -u")),
        )
        .await
        .unwrap()
        .alloc_ids[0]
        .clone();
    agent.finished(&plain).await;
    for name in ["a", "b"] {
        let status = agent.finished(&run(name, "id -u").await).await;
        assert_eq!(status.client_status, ClientStatus::Complete, "{status:#?}");
    }
    // Placed while the finished a and b hold all four ids.
    for name in ["c", "d"] {
        let id = run(name, "id -u; sleep 2").await;
        agent
            .wait_alloc(&id, "running", |s| s.client_status == ClientStatus::Running)
            .await;
    }
    // Waiting while the running c and d hold them; started once one finished.
    let status = agent.finished(&run("e", "id -u").await).await;
    assert_eq!(status.client_status, ClientStatus::Complete, "{status:#?}");
    let uid: u32 = stdout(&status.alloc_dir, "t").trim().parse().unwrap();
    assert!((81_400..=81_403).contains(&uid), "{uid}");
    assert!(
        agent.alloc(&plain).await.alloc_dir.exists(),
        "the finished alloc holding no ids was collected"
    );
}

/// An alloc needing more ids than a job may hold (half the range) fails at once, saying
/// why, instead of waiting for good (attack review: it waited, and finished allocs of
/// every job were collected for it meanwhile).
#[tokio::test(flavor = "multi_thread")]
async fn an_alloc_needing_more_than_a_jobs_share_fails_at_once_saying_why() {
    let mut agent = AgentProcess::with_config("user {\n  dynamic_range = \"81500-81503\"\n}\n");
    agent.start().await;
    let tasks = [task("one", "", "id -u"), task("two", "", "id -u")].concat();
    let submitted = agent
        .submit("wide.hcl", &job("wide", &tasks))
        .await
        .unwrap();
    let status = agent.finished(&submitted.alloc_ids[0]).await;
    assert_eq!(status.client_status, ClientStatus::Failed, "{status:#?}");
    let said = &status.tasks["one"].events.last().unwrap().message;
    assert!(
        said.contains("the alloc needs 3 user ids")
            && said.contains(
                "a job may hold at most 2, half of user { dynamic_range = \"81500-81503\" }"
            ),
        "{said}"
    );
}

/// Ids outlive an agent restart both ways: a running alloc's ids stay its own, and ids
/// released before the restart rest behind the fresh ones, as before it (attack review:
/// the release order lived in memory, so a restarted agent handed out first the ids just
/// released, whose setgid files may still lie in a volume).
#[tokio::test(flavor = "multi_thread")]
async fn ids_and_their_release_order_survive_an_agent_restart() {
    let mut agent = AgentProcess::with_config(
        "user {\n  dynamic_range = \"81300-81305\"\n}\ngc {\n  interval = \"1s\"\n  max_allocs = 0\n}\n",
    );
    agent.start().await;
    let ids = "echo $(id -u) $(id -g)";
    let running = agent
        .submit(
            "running.hcl",
            &job("running", &task("t", "", &format!("{ids}; sleep 600"))),
        )
        .await
        .unwrap();
    let running_id = running.alloc_ids[0].clone();
    agent
        .wait_alloc(&running_id, "running with its ids", |s| {
            !stdout(&s.alloc_dir, "t").is_empty()
        })
        .await;
    let running_dir = agent.alloc(&running_id).await.alloc_dir;
    assert_eq!(stdout(&running_dir, "t"), "81301 81300\n");

    let released = agent
        .submit("released.hcl", &job("released", &task("t", "", ids)))
        .await
        .unwrap();
    let status = agent.finished(&released.alloc_ids[0]).await;
    assert_eq!(stdout(&status.alloc_dir, "t"), "81303 81302\n");
    // Collected (max_allocs = 0): its ids go back to the pool.
    let deadline = Instant::now() + Duration::from_secs(30);
    while status.alloc_dir.exists() {
        assert!(
            Instant::now() < deadline,
            "the finished alloc was never collected"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    agent.kill9();
    agent.start().await;
    // Fresh ids first, as before the restart: not the two just released.
    let after = agent
        .submit("after.hcl", &job("after", &task("t", "", ids)))
        .await
        .unwrap();
    let status = agent.finished(&after.alloc_ids[0]).await;
    assert_eq!(
        stdout(&status.alloc_dir, "t"),
        "81305 81304\n",
        "{status:#?}"
    );
    // Then the released ones; never the running alloc's.
    let last = agent
        .submit("last.hcl", &job("last", &task("t", "", ids)))
        .await
        .unwrap();
    let status = agent.finished(&last.alloc_ids[0]).await;
    assert_eq!(
        stdout(&status.alloc_dir, "t"),
        "81303 81302\n",
        "{status:#?}"
    );
    let running = agent.alloc(&running_id).await;
    assert_eq!(running.client_status, ClientStatus::Running, "{running:#?}");
}

/// A data dir is one berth's: `berth run` (or a second agent) on a running agent's data
/// dir is refused, naming why (second attack review: `berth run` on the agent's default
/// data dir held the agent's lease identity and handed out a uid an agent task had).
#[tokio::test(flavor = "multi_thread")]
async fn a_second_berth_on_a_data_dir_in_use_is_refused() {
    let mut agent = AgentProcess::new();
    agent.start().await;
    let jobspec = agent.path().join("once.hcl");
    std::fs::write(&jobspec, job("once", &task("t", "", "id -u"))).unwrap();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_berth"))
        .arg("run")
        .arg("--data-dir")
        .arg(agent.path().join("data"))
        .arg(&jobspec)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(
        stderr.contains("is in use by another berth (an agent, or `berth run`)"),
        "{stderr}"
    );
}

#[test]
fn a_range_that_a_host_user_holds_is_refused_at_start() {
    let dir = tempfile::Builder::new()
        .prefix("users-helper-refused")
        .tempdir_in("/tmp")
        .unwrap();
    let config = dir.path().join("agent.hcl");
    std::fs::write(&config, "user {\n  dynamic_range = \"65000-65535\"\n}\n").unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_berth"))
        .arg("--config")
        .arg(&config)
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .args(["agent", "-dev", "--http-addr", "127.0.0.1:0"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the agent started with a range that holds nobody");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let output = child.wait_with_output().unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(
            "user { dynamic_range } (65000-65535) overlaps user \"nobody\" (id 65534) of \
             /etc/passwd"
        ),
        "{stderr}"
    );
}
