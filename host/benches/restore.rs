//! An agent killed with `kill -9` while N exec tasks run, and started again: the time
//! until every task is recovered (its driver re-attached and its process supervised
//! again), next to the same agent's start on an empty node, measured in the same run
//! (empty starts before and after the restore; their median is the baseline). Also the
//! real agent's resident memory with all N running, before and after the restart.
//!
//! Runs the `berth` binary (`berth agent -dev` on a free port, its own data dir).
//! `BERTH_RESTORE_TASKS` (1000) sets N. Run as root:
//! `cargo bench -p berth --bench restore`. It ends with `summary: name = value` lines.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use berth_api::SubmitRequest;
use berth_api::client::Client;
use berth_client::agent::{AllocSummary, Submitted};
use berth_model::status::ClientStatus;
use common::{median, micros, summary};

fn main() {
    common::block_on(run());
}

/// An agent process on a data dir of its own.
struct Agent {
    dir: PathBuf,
    port: u16,
    child: Option<Child>,
    runs: usize,
}

impl Agent {
    fn new(dir: PathBuf) -> Agent {
        std::fs::create_dir_all(dir.join("data")).unwrap();
        // The compiled drivers are the other benches': no agent start here compiles.
        let cache = std::env::temp_dir().join("berth-bench-cache");
        std::fs::create_dir_all(&cache).unwrap();
        let _ = std::os::unix::fs::symlink(&cache, dir.join("data/component-cache"));
        std::fs::write(dir.join("agent.hcl"), "").unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        Agent {
            dir,
            port,
            child: None,
            runs: 0,
        }
    }

    fn client(&self) -> Client {
        Client::new(&format!("http://127.0.0.1:{}", self.port)).unwrap()
    }

    fn log(&self) -> PathBuf {
        self.dir.join(format!("agent-{}.log", self.runs))
    }

    /// Starts the agent; returns when its API answers, with the time that took.
    async fn start(&mut self) -> Duration {
        self.runs += 1;
        let log = std::fs::File::create(self.log()).unwrap();
        let started = Instant::now();
        let child = Command::new(env!("CARGO_BIN_EXE_berth"))
            .arg("--config")
            .arg(self.dir.join("agent.hcl"))
            .arg("--data-dir")
            .arg(self.dir.join("data"))
            .args(["agent", "-dev", "--http-addr"])
            .arg(format!("127.0.0.1:{}", self.port))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
        let client = self.client();
        loop {
            if client
                .get::<serde_json::Value>("/v1/berth/agent/self")
                .await
                .is_ok()
            {
                return started.elapsed();
            }
            assert!(
                started.elapsed() < Duration::from_secs(120),
                "the agent did not come up:\n{}",
                std::fs::read_to_string(self.log()).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    fn kill_9(&mut self) {
        let mut child = self.child.take().expect("the agent runs");
        child.kill().unwrap();
        child.wait().unwrap();
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().expect("the agent runs").id()
    }

    /// How many times the current run's log says `what`.
    fn logged(&self, what: &str) -> usize {
        std::fs::read_to_string(self.log())
            .unwrap_or_default()
            .matches(what)
            .count()
    }

    async fn running(&self) -> usize {
        let allocs: Vec<AllocSummary> = self.client().get("/v1/berth/allocations").await.unwrap();
        allocs
            .iter()
            .filter(|a| a.client_status == ClientStatus::Running)
            .count()
    }
}

impl Drop for Agent {
    /// Also on a failed run: tasks outlive a killed agent by design, so its tasks are
    /// killed here too.
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        for pid in processes_under(&self.dir) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
        }
        // So do its allocs' disks (an image mounted at each alloc's directory).
        let dir = self.dir.canonicalize().unwrap_or_else(|_| self.dir.clone());
        let mounts = berth_sys::mount::mountinfo::read_self().unwrap_or_default();
        for mount in mounts
            .iter()
            .rev()
            .filter(|m| m.mount_point.starts_with(&dir))
        {
            let _ = berth_sys::mount::shared::unmount_all_below(&dir, &mount.mount_point);
        }
    }
}

async fn run() {
    let tasks: usize = std::env::var("BERTH_RESTORE_TASKS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(common::sized(1000, 20));
    let scratch = tempfile::Builder::new()
        .prefix("berth-restore")
        .tempdir_in("/tmp")
        .unwrap();
    let mut empty_starts = Vec::new();
    let mut empty = Agent::new(scratch.path().join("empty"));
    let empty_start = async |empty: &mut Agent| {
        let took = empty.start().await;
        empty.kill_9();
        took
    };
    empty_starts.push(empty_start(&mut empty).await);
    empty_starts.push(empty_start(&mut empty).await);

    let mut agent = Agent::new(scratch.path().join("busy"));
    agent.start().await;
    let job = format!(
        "job \"restore\" {{\n  group \"g\" {{\n    count = {tasks}\n    task \"t\" {{\n      driver = \"exec\"\n      config {{\n        command = \"/bin/sleep\"\n        args    = [\"3600\"]\n      }}\n    }}\n  }}\n}}\n"
    );
    let request = SubmitRequest {
        source_name: "restore.hcl".into(),
        source: job,
        variables: Default::default(),
    };
    let submitted: Submitted = agent
        .client()
        .post("/v1/berth/jobs", &request)
        .await
        .unwrap();
    assert_eq!(submitted.alloc_ids.len(), tasks);
    // An alloc is "running" as soon as its runner is; its task has started when the
    // log says so.
    wait_for(Duration::from_secs(600), "every task running", async || {
        agent.logged("kind=Started") >= tasks
    })
    .await;
    let rss_before = resident_mib(agent.pid());

    agent.kill_9();
    let started = Instant::now();
    let api_up = agent.start().await;
    wait_for(
        Duration::from_secs(600),
        "every task recovered",
        async || agent.logged("recovered the task after an agent restart") >= tasks,
    )
    .await;
    let restored = started.elapsed();
    let still_running = agent.running().await;
    let started_anew = agent.logged("kind=Started");
    let rss_after = resident_mib(agent.pid());

    empty_starts.push(empty_start(&mut empty).await);
    empty_starts.push(empty_start(&mut empty).await);
    let empty = median(empty_starts);

    let _: serde_json::Value = agent
        .client()
        .delete("/v1/berth/job/restore")
        .await
        .unwrap();
    wait_for(Duration::from_secs(600), "every task stopped", async || {
        agent.running().await == 0
    })
    .await;
    let left = processes_under(scratch.path()).len();
    agent.kill_9();
    assert_eq!(still_running, tasks, "tasks lost in the restart");
    assert_eq!(started_anew, 0, "tasks started again instead of recovered");
    assert_eq!(left, 0, "processes left after the job stopped");

    println!("kill -9 and restart of an agent running {tasks} exec tasks (release build)");
    println!(
        "  API answers again after          {:>9.0} ms",
        api_up.as_secs_f64() * 1e3
    );
    println!(
        "  every task recovered after       {:>9.0} ms",
        restored.as_secs_f64() * 1e3
    );
    println!(
        "  an empty agent's start (median)  {:>9.0} ms",
        empty.as_secs_f64() * 1e3
    );
    println!("  agent RSS with all running: {rss_before} MiB before, {rss_after} MiB after");
    summary("restore_tasks", tasks as f64);
    summary("restore_all_recovered_ms", micros(restored) / 1e3);
    summary("restore_api_up_ms", micros(api_up) / 1e3);
    summary("empty_agent_start_ms", micros(empty) / 1e3);
    summary("restore_over_empty_start", common::ratio(restored, empty));
    summary("agent_rss_all_running_mib", rss_before as f64);
    summary("agent_rss_after_restore_mib", rss_after as f64);
}

async fn wait_for(limit: Duration, what: &str, mut done: impl AsyncFnMut() -> bool) {
    let started = Instant::now();
    while !done().await {
        assert!(started.elapsed() < limit, "never got to {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn resident_mib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kib| kib.parse::<u64>().ok())
        .unwrap_or(0)
        >> 10
}

/// Processes whose working directory or root is below `dir` (tasks chroot into their
/// task dirs there).
fn processes_under(dir: &Path) -> Vec<rustix::process::Pid> {
    let Ok(dir) = dir.canonicalize() else {
        return Vec::new();
    };
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let pid = e.file_name().to_str()?.parse::<i32>().ok()?;
            Some((rustix::process::Pid::from_raw(pid)?, e))
        })
        .filter(|(_, e)| {
            ["root", "cwd"].iter().any(|link| {
                std::fs::read_link(e.path().join(link)).is_ok_and(|target| target.starts_with(&dir))
            })
        })
        .map(|(pid, _)| pid)
        .collect()
}
