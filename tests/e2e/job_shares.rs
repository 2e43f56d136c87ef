//! What one job may take of the node, as the kernel counts it: each job's pids share
//! (`job_pids_max`, a cgroup level per job inside the node-wide ceiling), and the log
//! collectors of an alloc, which run in a cgroup of the alloc's beside its tasks', never
//! in the agent's, and end with the alloc.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use berth_harness::AgentProcess;
use berth_model::events::EventKind;
use berth_model::status::ClientStatus;

/// Kills what is left in the cgroups under `parent` (each hierarchy) and removes them,
/// deepest first, when dropped: the test's parent is its own.
struct CgroupTree(String);

impl Drop for CgroupTree {
    fn drop(&mut self) {
        for root in ["memory", "cpu", "cpu,cpuacct", "pids", "devices", ""] {
            remove_tree(&Path::new("/sys/fs/cgroup").join(root).join(&self.0));
        }
    }
}

fn remove_tree(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                remove_tree(&entry.path());
            }
        }
    }
    for _ in 0..200 {
        let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
        for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
            if let Some(pid) = rustix::process::Pid::from_raw(pid) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
        }
        match std::fs::remove_dir(dir) {
            Ok(()) => return,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

fn stdout_of(status: &berth_client::alloc_runner::AllocStatus, task: &str) -> String {
    std::fs::read_to_string(status.alloc_dir.join(format!("alloc/logs/{task}.stdout.0")))
        .unwrap_or_default()
}

/// Two tasks of job "hog" take threads until refused, and hold them; then job "other"'s
/// task starts and runs. The node-wide ceiling is 600 and each task may have 400: without
/// a share per job, "hog" takes all 600 and "other" fails with "fork into the pid
/// namespace: Resource temporarily unavailable". With it, "hog" stops at its share (300,
/// half the ceiling), and its tasks' ends say that the job's pids share was used up,
/// naming it. The job's cgroup is gone with its alloc.
#[tokio::test(flavor = "multi_thread")]
async fn a_job_that_uses_up_its_pids_share_leaves_another_job_room_to_start() {
    let parent = format!("berth-share-{}", std::process::id());
    let _tree = CgroupTree(parent.clone());
    let mut agent = AgentProcess::with_config(&format!(
        "cgroups {{\n  parent = \"{parent}\"\n  pids_max = 400\n  all_tasks_pids_max = 600\n}}\n"
    ));
    agent.start().await;
    let pids = Path::new("/sys/fs/cgroup/pids").join(&parent);
    let hog_script = "import os, threading, time\nthreading.stack_size(64 * 1024)\nhold = threading.Event()\nn = 0\ntry:\n    while n < 400:\n        threading.Thread(target=hold.wait, daemon=True).start()\n        n += 1\nexcept RuntimeError:\n    pass\nprint('peak', n, flush=True)\nwhile not os.path.exists('/alloc/data/go'):\n    time.sleep(0.1)\nos._exit(1)\n";
    let task = |name: &str| {
        format!(
            "    task \"{name}\" {{\n      driver = \"exec\"\n      config {{\n        command = \"/usr/bin/python3\"\n        args = [\"-c\", {}]\n      }}\n      resources {{\n        memory = 512\n      }}\n    }}\n",
            serde_json::to_string(hog_script).unwrap()
        )
    };
    let hog = format!(
        "job \"hog\" {{\n  type = \"batch\"\n  group \"g\" {{\n    restart {{\n      attempts = 0\n    }}\n{}{}  }}\n}}\n",
        task("a"),
        task("b")
    );
    let submitted = agent.submit("hog.hcl", &hog).await.unwrap();
    let hog_id = submitted.alloc_ids[0].clone();
    let started = Instant::now();
    let hog_status = loop {
        let status = agent.alloc(&hog_id).await;
        if ["a", "b"]
            .iter()
            .all(|t| stdout_of(&status, t).starts_with("peak"))
        {
            break status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the hog's tasks never reported: {status:#?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let job_dir = pids.join("job-hog");
    assert_eq!(
        std::fs::read_to_string(job_dir.join("pids.max"))
            .unwrap()
            .trim(),
        "300"
    );
    let held: u64 = std::fs::read_to_string(pids.join("pids.current"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    eprintln!(
        "hog holds {held} pids: a {:?}, b {:?}",
        stdout_of(&hog_status, "a"),
        stdout_of(&hog_status, "b")
    );

    let other = "job \"other\" {\n  group \"g\" {\n    restart {\n      attempts = 0\n      mode = \"fail\"\n    }\n    task \"t\" {\n      driver = \"exec\"\n      config {\n        command = \"/bin/sh\"\n        args = [\"-c\", \"echo started; sleep 1 & wait; echo forked; sleep 300\"]\n      }\n    }\n  }\n}\n";
    let submitted = agent.submit("other.hcl", other).await.unwrap();
    let other_id = submitted.alloc_ids[0].clone();
    let started = Instant::now();
    loop {
        let status = agent.alloc(&other_id).await;
        if stdout_of(&status, "t").contains("forked") {
            break;
        }
        assert!(
            status.client_status != ClientStatus::Failed
                && started.elapsed() < Duration::from_secs(30),
            "the other job's task did not start and fork while the hog held its pids: \
             {:#?}",
            status.tasks["t"].events
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    std::fs::write(hog_status.alloc_dir.join("alloc/data/go"), "").unwrap();
    let hog_status = agent.finished(&hog_id).await;
    for task in ["a", "b"] {
        let events = &hog_status.tasks[task].events;
        let ended = events
            .iter()
            .find(|e| e.kind == EventKind::Terminated)
            .unwrap_or_else(|| panic!("{events:#?}"));
        assert!(
            ended.message.contains("the job's pids share is used up")
                && ended.message.contains("job_pids_max = 300"),
            "{ended:?}"
        );
    }
    assert!(!job_dir.exists(), "the hog's job cgroup outlived its alloc");
    let _ = agent
        .client()
        .delete::<serde_json::Value>("/v1/berth/job/other")
        .await;
    agent.finished(&other_id).await;
    assert!(!pids.join("job-other").exists());
}

/// The processes that are this agent's children and berth log collectors.
fn collectors_of(agent: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
            let parent = status
                .lines()
                .find_map(|l| l.strip_prefix("PPid:"))
                .and_then(|p| p.trim().parse::<u32>().ok());
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            parent == Some(agent) && String::from_utf8_lossy(&cmdline).contains("__task-logmon")
        })
        .collect()
}

/// The `cgroup.procs` files of the cgroups `pid` is in (each hierarchy).
fn cgroup_procs_of(pid: u32) -> Vec<PathBuf> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            let mut parts = line.splitn(3, ':');
            let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            let mount = if controllers.is_empty() {
                "/sys/fs/cgroup".to_string()
            } else if controllers.split(',').any(|c| c == "pids") {
                "/sys/fs/cgroup/pids".to_string()
            } else {
                return None;
            };
            Some(
                PathBuf::from(mount)
                    .join(path.trim_start_matches('/'))
                    .join("cgroup.procs"),
            )
        })
        .collect()
}

/// A task hands its stdout and stderr to a sidecar task of its group over a socket in
/// `/alloc/data`, exits, and is restarted, a few times: each run's log collector then
/// lives on, held by the sidecar. No collector stays in the agent's cgroup (they are in
/// the alloc's collectors' cgroup, in its job's share, from the moment after their
/// spawn), and once the alloc stops none is left and their cgroup is gone.
#[tokio::test(flavor = "multi_thread")]
async fn handed_off_output_leaves_no_collector_behind_nor_in_the_agents_cgroup() {
    let parent = format!("berth-collectors-{}", std::process::id());
    let _tree = CgroupTree(parent.clone());
    let mut agent =
        AgentProcess::with_config(&format!("cgroups {{\n  parent = \"{parent}\"\n}}\n"));
    agent.start().await;
    let agent_pid = agent.pid();
    let agent_procs = cgroup_procs_of(agent_pid);
    assert!(!agent_procs.is_empty(), "the agent's cgroup was not found");
    // Each task is a user of its own in the alloc's group: a socket is the group's to
    // connect to once its maker says so (af_unix applies the umask, not the default ACL).
    let sidecar = "import socket, os, time\npath = '/alloc/data/s'\ntry:\n    os.unlink(path)\nexcept FileNotFoundError:\n    pass\nserver = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\nserver.bind(path)\nos.chmod(path, 0o770)\nserver.listen(16)\nkept = []\nwhile True:\n    conn, _ = server.accept()\n    msg, fds, _, _ = socket.recv_fds(conn, 16, 4)\n    kept.extend(fds)\n    conn.close()\n    print('kept', len(kept), flush=True)\n";
    let writer = "import socket, os, time, sys\nwhile not os.path.exists('/alloc/data/s'):\n    time.sleep(0.05)\nc = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\nc.connect('/alloc/data/s')\nsocket.send_fds(c, [b'x'], [1, 2])\nc.close()\nprint('handed', flush=True)\ntime.sleep(1)\nsys.exit(1)\n";
    let source = format!(
        "job \"handoff\" {{\n  group \"g\" {{\n    restart {{\n      attempts = 5\n      delay    = \"0s\"\n      mode     = \"fail\"\n    }}\n    task \"sidecar\" {{\n      driver = \"exec\"\n      config {{\n        command = \"/usr/bin/python3\"\n        args = [\"-c\", {}]\n      }}\n    }}\n    task \"writer\" {{\n      driver = \"exec\"\n      config {{\n        command = \"/usr/bin/python3\"\n        args = [\"-c\", {}]\n      }}\n    }}\n  }}\n}}\n",
        serde_json::to_string(sidecar).unwrap(),
        serde_json::to_string(writer).unwrap()
    );
    let submitted = agent.submit("handoff.hcl", &source).await.unwrap();
    let id = submitted.alloc_ids[0].clone();
    let collectors_dir = Path::new("/sys/fs/cgroup/pids")
        .join(&parent)
        .join("job-handoff")
        .join(format!("{id}-logs"));
    let mut in_agent = Vec::new();
    let mut most = 0;
    let started = Instant::now();
    loop {
        for procs in &agent_procs {
            let text = std::fs::read_to_string(procs).unwrap_or_default();
            let there: Vec<u32> = text.lines().filter_map(|l| l.trim().parse().ok()).collect();
            in_agent.extend(
                collectors_of(agent_pid)
                    .into_iter()
                    .filter(|p| there.contains(p)),
            );
        }
        most = most.max(collectors_of(agent_pid).len());
        let status = agent.alloc(&id).await;
        let kept = stdout_of(&status, "sidecar");
        if kept.contains("kept 8") {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the writer did not hand off its output four times: {kept:?} {:#?}",
            status.tasks
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    in_agent.sort_unstable();
    in_agent.dedup();
    // A collector is spawned by the agent, in its cgroup, and moved at once (the move
    // cannot precede the spawn): one caught in that moment must be out of it a moment
    // later. One that stays is the leak this test is about.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let stayed: Vec<u32> = in_agent
        .iter()
        .copied()
        .filter(|pid| {
            agent_procs.iter().any(|procs| {
                std::fs::read_to_string(procs)
                    .unwrap_or_default()
                    .lines()
                    .any(|l| l.trim().parse::<u32>().ok() == Some(*pid))
            })
        })
        .collect();
    assert!(
        stayed.is_empty(),
        "log collectors stayed in the agent's cgroup: {stayed:?} (seen there: {in_agent:?})"
    );
    // The writer's four runs' collectors live on, held by the sidecar, with the
    // sidecar's own.
    let in_alloc: Vec<u32> = std::fs::read_to_string(collectors_dir.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect();
    assert!(
        in_alloc.len() >= 4,
        "the collectors are not in the alloc's cgroup {}: {in_alloc:?} (the agent has {most})",
        collectors_dir.display()
    );
    let _ = agent
        .client()
        .delete::<serde_json::Value>("/v1/berth/job/handoff")
        .await;
    let status = agent.finished(&id).await;
    assert_ne!(status.client_status, ClientStatus::Pending);
    let left = collectors_of(agent_pid);
    assert!(left.is_empty(), "collectors outlived their alloc: {left:?}");
    assert!(
        !collectors_dir.exists(),
        "the collectors' cgroup outlived its alloc"
    );
}
