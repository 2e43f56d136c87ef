//! `ephemeral_disk { size }` held by the kernel (issue 35): the alloc's directory is a
//! filesystem of its own (an image here: this node's data dir has no project quotas), so
//! bytes hidden from a walk (unlinked and held, passed to another process, kept by a
//! memory mapping) and inodes (empty files) count and are refused past the size, as a
//! root task and as a non-root one; the alloc is then stopped ("Disk Resources
//! Exceeded"), and another job runs on unharmed.

use berth_harness::AgentProcess;
use berth_model::events::EventKind;
use berth_model::status::ClientStatus;

/// A batch job of one exec task running `script` with `ephemeral_disk { size = 10 }` and
/// logs of 1 x 1 MB, as `user` (`None`: the default).
fn job(name: &str, user: Option<&str>, script: &str) -> String {
    let user = user
        .map(|u| format!("      user = \"{u}\"\n"))
        .unwrap_or_default();
    format!(
        "job \"{name}\" {{\n  type = \"batch\"\n  group \"g\" {{\n    ephemeral_disk {{\n      size = 10\n    }}\n    restart {{\n      attempts = 0\n    }}\n    task \"t\" {{\n      driver = \"exec\"\n{user}      logs {{\n        max_files     = 1\n        max_file_size = 1\n      }}\n      config {{\n        command = \"/bin/sh\"\n        args = [\"-c\", {}]\n      }}\n    }}\n  }}\n}}\n",
        serde_json::to_string(script).unwrap()
    )
}

/// Writes 30 MB into a file it unlinked and holds open.
const HIDDEN: &str = "exec 3>/local/hidden; rm /local/hidden; head -c 30000000 /dev/zero >&3; echo refused; sleep 60";

/// Fills a file, hands it over a Unix socket to a child, closes and unlinks it, and
/// exits: only the child holds it.
const PASSED: &str = r#"/usr/bin/python3 -c '
import os, socket, time
a, b = socket.socketpair()
if os.fork() == 0:
    a.close()
    msg, fds, flags, addr = socket.recv_fds(b, 16, 1)
    time.sleep(60)
    os._exit(0)
f = open("/local/passed", "wb")
try:
    while True:
        f.write(b"x" * (1 << 20)); f.flush()
except OSError as e:
    print("refused", e.errno, flush=True)
socket.send_fds(a, [b"fd"], [f.fileno()])
os.unlink("/local/passed")
f.close()
time.sleep(60)
'"#;

/// Fills a file, maps it, unlinks and closes it: only the mapping holds it.
const MAPPED: &str = r#"/usr/bin/python3 -c '
import mmap, os, time
f = open("/local/mapped", "w+b")
try:
    while True:
        f.write(b"x" * (1 << 20)); f.flush()
except OSError as e:
    print("refused", e.errno, flush=True)
m = mmap.mmap(f.fileno(), 0)
os.unlink("/local/mapped")
f.close()
time.sleep(60)
'"#;

/// 30,000 empty files: no blocks, every inode.
const EMPTY_FILES: &str = "cd /local; i=0; while [ $i -lt 30000 ]; do printf '' > f$i 2>/dev/null || break; i=$((i+1)); done; echo made $i; sleep 60";

#[tokio::test(flavor = "multi_thread")]
async fn hidden_passed_mapped_bytes_and_empty_files_are_refused_past_the_size_root_or_not() {
    let mut agent = AgentProcess::with_config("user {\n  denylist = []\n}\n");
    agent.start().await;
    // The node says how it holds allocs to their disks.
    let nodes: serde_json::Value = agent.client().get("/v1/nodes").await.unwrap();
    let node_id = nodes[0]["ID"].as_str().unwrap().to_string();
    let node: serde_json::Value = agent
        .client()
        .get(&format!("/v1/node/{node_id}"))
        .await
        .unwrap();
    assert_eq!(
        node["Attributes"]["storage.ephemeral_disk_limit"], "image",
        "{node:#}"
    );
    let mut submitted = Vec::new();
    for (attack, script) in [
        ("hidden", HIDDEN),
        ("passed", PASSED),
        ("mapped", MAPPED),
        ("empty", EMPTY_FILES),
    ] {
        for user in [None, Some("root")] {
            let name = format!("{attack}-{}", user.unwrap_or("default"));
            let result = agent
                .submit(&format!("{name}.hcl"), &job(&name, user, script))
                .await
                .unwrap();
            submitted.push((name, result.alloc_ids[0].clone()));
        }
    }
    // Another job, meanwhile: its alloc writes what it needs and completes.
    let neighbour = agent
        .submit(
            "neighbour.hcl",
            &job(
                "neighbour",
                None,
                "head -c 4000000 /dev/urandom > /alloc/data/mine && cat /alloc/data/mine | wc -c",
            ),
        )
        .await
        .unwrap();
    let started = std::time::Instant::now();
    for (name, id) in &submitted {
        let status = agent.finished(id).await;
        assert_eq!(
            status.client_status,
            ClientStatus::Failed,
            "{name}: {status:#?}"
        );
        let events = &status.tasks["t"].events;
        let full = events
            .iter()
            .find(|e| e.kind == EventKind::DiskExceeded)
            .unwrap_or_else(|| panic!("{name}: {events:#?}"));
        assert!(
            full.message.contains("the alloc's disk is full")
                && full.message.contains("ephemeral_disk size of 10 MB"),
            "{name}: {full:?}"
        );
        assert_eq!(
            EventKind::DiskExceeded.to_string(),
            "Disk Resources Exceeded"
        );
        assert_eq!(status.disk_limited_by.as_deref(), Some("image"), "{name}");
        let stdout = std::fs::read_to_string(status.alloc_dir.join("alloc/logs/t.stdout.0"))
            .unwrap_or_else(|e| {
                let listing = std::process::Command::new("ls")
                    .args(["-laR"])
                    .arg(&status.alloc_dir)
                    .output()
                    .map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
                panic!("{name}: reading its stdout: {e}; {listing:?}")
            });
        if name.starts_with("empty") {
            // Refused by the kernel well before 30,000: the alloc's inodes are 2,560.
            let made: u64 = stdout
                .trim()
                .strip_prefix("made ")
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("{name}: {stdout:?}"));
            assert!((2000..2560).contains(&made), "{name}: made {made}");
        } else {
            // The task tried to write 30 MB (or until refused); the kernel held it to the
            // image (a little over the size). Its last lines, if any, met a full disk too.
            let held: u64 = full
                .message
                .split("it holds ")
                .nth(1)
                .and_then(|rest| rest.split(' ').next())
                .and_then(|mb| mb.parse().ok())
                .unwrap_or_else(|| panic!("{name}: {full:?}"));
            assert!((10..=14).contains(&held), "{name}: held {held} MB");
        }
    }
    assert!(
        started.elapsed() < std::time::Duration::from_secs(50),
        "allocs ran on with full disks"
    );
    let status = agent.finished(&neighbour.alloc_ids[0]).await;
    assert_eq!(status.client_status, ClientStatus::Complete, "{status:#?}");
    let stdout = std::fs::read_to_string(status.alloc_dir.join("alloc/logs/t.stdout.0")).unwrap();
    assert_eq!(stdout.trim(), "4000000");
}

/// An alloc that writes past its size is stopped with an event that says why, what its
/// tasks wrote is removed, its logs stay, and `alloc status` shows the usage and the
/// mechanism. Garbage collection unmounts its filesystem and frees the image. A size
/// larger than the node's disk is refused at submit.
#[tokio::test(flavor = "multi_thread")]
async fn an_alloc_past_its_ephemeral_disk_is_stopped_its_files_removed_and_its_image_freed() {
    let mut agent = AgentProcess::with_config("gc {\n  max_allocs = 0\n}\n");
    agent.start().await;
    let source = job(
        "filler",
        None,
        "echo filling; head -c 6000000 /dev/zero > /local/a; head -c 6000000 /dev/zero > /alloc/data/b; sleep 60; echo survived",
    );
    let submitted = agent.submit("filler.hcl", &source).await.unwrap();
    let id = &submitted.alloc_ids[0];
    let started = std::time::Instant::now();
    let status = agent.finished(id).await;
    assert!(
        started.elapsed() < std::time::Duration::from_secs(30),
        "the alloc ran on past its disk size"
    );
    assert_eq!(status.client_status, ClientStatus::Failed, "{status:#?}");
    let events = &status.tasks["t"].events;
    let exceeded = events
        .iter()
        .find(|e| e.kind == EventKind::DiskExceeded)
        .unwrap_or_else(|| panic!("{events:#?}"));
    assert!(
        exceeded.message.contains("ephemeral_disk size of 10 MB"),
        "{exceeded:?}"
    );
    assert!(
        !status.alloc_dir.join("tasks/t").exists(),
        "the task's dir stayed"
    );
    assert!(!status.alloc_dir.join("alloc/data").exists());
    let logs = std::fs::read_to_string(status.alloc_dir.join("alloc/logs/t.stdout.0")).unwrap();
    assert_eq!(logs, "filling\n");
    assert_eq!(status.disk_limit_bytes, 10 << 20);
    assert!(
        status.disk_used_bytes.is_some_and(|used| used < 1 << 20),
        "{status:#?}"
    );
    let (code, shown, _) = agent.cli(&["alloc", "status", id]);
    assert_eq!(code, 0);
    assert!(shown.contains(" MB used of 10 MB"), "{shown}");
    assert!(shown.contains("limited by: image"), "{shown}");
    assert!(shown.contains("Disk Inodes    = "), "{shown}");

    let image = agent.path().join(format!("data/alloc-disks/{id}.ext4"));
    assert!(image.exists());
    let root = status.alloc_dir.canonicalize().unwrap();
    assert!(crate::support::host_mounts_under(&root).len() == 1);
    let (code, out, err) = agent.cli(&["system", "gc"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        crate::support::host_mounts_under(&root).is_empty(),
        "{out}{err}\n{}",
        std::fs::read_to_string(agent.path().join("agent-1.log")).unwrap_or_default()
    );
    assert!(!image.exists(), "the image stayed after GC");
    assert!(!root.exists());

    // A disk larger than the node is the scheduler's to refuse, as in Nomad: accepted,
    // never placed, its evaluation saying the disk was exhausted.
    let huge = source.replace("size = 10", "size = 1000000000");
    let waiting = agent.submit("huge.hcl", &huge).await.unwrap();
    assert!(waiting.alloc_ids.is_empty(), "{waiting:?}");
    let evaluation: serde_json::Value = agent
        .client()
        .get(&format!("/v1/evaluation/{}", waiting.eval_id))
        .await
        .unwrap();
    assert_eq!(
        evaluation["FailedTGAllocs"]["g"]["DimensionExhausted"]["disk"], 1,
        "{evaluation:#}"
    );
}

/// A kill -9 of the agent leaves the alloc's filesystem mounted where the restarted
/// agent finds it: the task keeps writing into the same filesystem (not one mounted
/// anew over it), the limit still holds, and GC frees it. An image no record names
/// (the agent died between making it and recording its alloc) is removed at start.
#[tokio::test(flavor = "multi_thread")]
async fn after_a_kill_9_the_alloc_keeps_its_filesystem_and_an_orphan_image_goes() {
    let mut agent = AgentProcess::with_config("gc {\n  max_allocs = 0\n}\n");
    agent.start().await;
    let source = job(
        "keeper",
        None,
        "echo before > /local/kept; while [ ! -e /local/stop ]; do sleep 0.1; done; cat /local/kept; head -c 30000000 /dev/zero > /local/fill; sleep 60",
    );
    let id = agent.submit("keeper.hcl", &source).await.unwrap().alloc_ids[0].clone();
    agent
        .wait_alloc(&id, "running", |s| s.client_status == ClientStatus::Running)
        .await;
    let status = agent.alloc(&id).await;
    let root = status.alloc_dir.canonicalize().unwrap();
    let kept = root.join("tasks/t/local/kept");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !kept.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the task wrote nothing"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    agent.kill9();
    let orphan = agent
        .path()
        .join("data/alloc-disks/0badcafe-0000-0000-0000-000000000000.ext4");
    std::fs::write(&orphan, "").unwrap();
    agent.start().await;
    assert!(!orphan.exists(), "an image no alloc record names stayed");
    assert_eq!(
        crate::support::host_mounts_under(&root).len(),
        1,
        "the alloc's filesystem was mounted again over itself"
    );
    std::fs::write(root.join("tasks/t/local/stop"), "").unwrap();
    let status = agent.finished(&id).await;
    assert_eq!(status.disk_limited_by.as_deref(), Some("image"));
    let events = &status.tasks["t"].events;
    assert!(
        events.iter().any(|e| e.kind == EventKind::DiskExceeded),
        "{events:#?}"
    );
    let stdout = std::fs::read_to_string(status.alloc_dir.join("alloc/logs/t.stdout.0")).unwrap();
    assert_eq!(stdout, "before\n");
    let (code, out, err) = agent.cli(&["system", "gc"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(crate::support::host_mounts_under(&root).is_empty());
    assert!(
        !agent
            .path()
            .join(format!("data/alloc-disks/{id}.ext4"))
            .exists()
    );
}

/// A finished alloc's image keeps its size promised until the alloc is collected: a new
/// alloc that then finds no room has finished allocs collected first, oldest first,
/// instead of failing (or of one large job keeping every later one off the node).
#[tokio::test(flavor = "multi_thread")]
async fn a_new_alloc_short_of_room_has_finished_allocs_collected_first() {
    let mut agent = AgentProcess::new();
    agent.start().await;
    let stat = rustix::fs::statvfs(agent.path()).unwrap();
    let free_mb = (stat.f_bavail * stat.f_frsize) >> 20;
    // An image takes its size and a sixteenth (inode tables): the hog's leaves ~3 GB.
    let hog_mb = (free_mb.saturating_sub(3000)) * 16 / 17;
    let other_mb = 4000;
    let hog = job("hog", None, "echo ran")
        .replace("size = 10", &format!("size = {hog_mb}"))
        .replace("max_file_size = 1", "max_file_size = 10");
    let hog_id = agent.submit("hog.hcl", &hog).await.unwrap().alloc_ids[0].clone();
    let status = agent.finished(&hog_id).await;
    assert_eq!(status.client_status, ClientStatus::Complete, "{status:#?}");
    let other = job("other", None, "echo ran too")
        .replace("size = 10", &format!("size = {other_mb}"))
        .replace("max_file_size = 1", "max_file_size = 10");
    let other_id = agent.submit("other.hcl", &other).await.unwrap().alloc_ids[0].clone();
    let status = agent.finished(&other_id).await;
    assert_eq!(status.client_status, ClientStatus::Complete, "{status:#?}");
    assert!(
        !agent
            .path()
            .join(format!("data/alloc-disks/{hog_id}.ext4"))
            .exists(),
        "the finished hog kept its image"
    );
}
