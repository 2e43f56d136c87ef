//! The agent's stop is bounded whatever is stuck: asked to stop (SIGTERM), it exits
//! within `SHUTDOWN_BOUND` (plus a margin for a loaded machine) though a call of its own
//! will never return, and its tasks keep running for the next agent to recover.
//!
//! - A mount in an alloc's directory whose server stopped answering (as an NFS volume's
//!   does when its server goes away; here a FUSE mount whose server never answers)
//!   holds the thread that measures the directory's disk use, in the kernel, for good.
//!   Dropping the tokio runtime waits for every such thread: without the bound the agent
//!   never exits.
//! - A store that hangs (the etcd process stopped: connections open, nothing answered)
//!   holds the agent's calls to it in flight.

use std::fs::File;
use std::os::fd::AsRawFd as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use berth_harness::AgentProcess;
use berth_model::status::ClientStatus;
use berth_testkit::etcd::EtcdServer;

use crate::cluster;

const ONE_SLEEPER: &str = r#"
job "sleeper" {
  group "g" {
    task "sleep" {
      driver = "exec"
      config {
        command = "/bin/sleep"
        args    = ["600"]
      }
      resources {
        cpu    = 50
        memory = 16
      }
    }
  }
}
"#;

/// How long the agent may take to stop.
fn stop_bound() -> Duration {
    berth::cli::SHUTDOWN_BOUND + Duration::from_secs(5)
}

/// A FUSE mount whose server never answers, not even the kernel's first request: every
/// call that reaches it waits (killable only). Dropping it ends the connection, which
/// fails those calls, and detaches the mount.
struct HungMount {
    target: PathBuf,
    device: Option<File>,
}

impl HungMount {
    fn at(target: &Path) -> HungMount {
        use std::os::unix::fs::FileTypeExt as _;
        let fuse = Path::new("/dev/fuse");
        if !fuse
            .metadata()
            .is_ok_and(|m| m.file_type().is_char_device())
        {
            // The node is missing in some containers; the kernel's fuse is 10:229.
            rustix::fs::mknodat(
                rustix::fs::CWD,
                fuse,
                rustix::fs::FileType::CharacterDevice,
                rustix::fs::Mode::from_raw_mode(0o600),
                rustix::fs::makedev(10, 229),
            )
            .expect("making /dev/fuse");
        }
        let device = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(fuse)
            .expect("opening /dev/fuse");
        std::fs::create_dir_all(target).unwrap();
        let options = format!(
            "fd={},rootmode=40000,user_id=0,group_id=0",
            device.as_raw_fd()
        );
        rustix::mount::mount(
            "berth-hung",
            target,
            "fuse.berth-hung",
            rustix::mount::MountFlags::NOSUID | rustix::mount::MountFlags::NODEV,
            Some(std::ffi::CString::new(options).unwrap().as_c_str()),
        )
        .expect("mounting a FUSE filesystem");
        HungMount {
            target: target.to_path_buf(),
            device: Some(device),
        }
    }
}

impl Drop for HungMount {
    fn drop(&mut self) {
        drop(self.device.take());
        let _ = rustix::mount::unmount(&self.target, rustix::mount::UnmountFlags::DETACH);
    }
}

/// The agent's threads waiting in the kernel on a FUSE server.
fn threads_waiting_on_fuse(pid: u32) -> usize {
    let Ok(threads) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    threads
        .flatten()
        .filter(|thread| {
            // Where it sleeps, or (a kernel that hides it there) its kernel stack.
            ["wchan", "stack"].iter().any(|file| {
                std::fs::read_to_string(thread.path().join(file))
                    .is_ok_and(|text| text.contains("fuse") || text.contains("request_wait"))
            })
        })
        .count()
}

/// The agent's task processes, once they are in their roots and settled: the same set
/// twice, 300 ms apart. A snapshot taken while the keeper was still setting the task up
/// (an alloc reads running before its task starts) held a short-lived process of that
/// setup, which then "did not outlive" the agent's stop.
async fn task_processes(agent: &AgentProcess) -> Vec<rustix::process::Pid> {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let task = crate::support::processes_rooted_under(agent.path());
        tokio::time::sleep(Duration::from_millis(300)).await;
        if !task.is_empty() && task == crate::support::processes_rooted_under(agent.path()) {
            return task;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no task process under the agent's dir"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_mount_that_hangs_in_an_alloc_dir_does_not_hold_the_agents_stop() {
    let mut agent = AgentProcess::new();
    agent.start().await;
    let submitted = agent.submit("sleeper.hcl", ONE_SLEEPER).await.unwrap();
    let id = submitted.alloc_ids[0].clone();
    agent
        .wait_alloc(&id, "running", |s| s.client_status == ClientStatus::Running)
        .await;
    let status = agent.alloc(&id).await;
    // With their command lines, for a failure to say what each was.
    let task: Vec<_> = task_processes(&agent)
        .await
        .into_iter()
        .map(|pid| {
            let cmdline = std::fs::read(format!("/proc/{}/cmdline", pid.as_raw_nonzero()))
                .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
                .unwrap_or_default();
            (pid, cmdline)
        })
        .collect();

    let hung = HungMount::at(&status.alloc_dir.join("alloc/data/hung"));
    // A request that reads into it waits there, on one of the agent's threads (the
    // disk's usage comes from the kernel in one call and no longer walks into it).
    let mut request =
        std::os::unix::net::UnixStream::connect(agent.path().join("data/api.sock")).unwrap();
    std::io::Write::write_all(
        &mut request,
        format!("GET /v1/client/fs/ls/{id}?path=/alloc/data/hung HTTP/1.1\r\nHost: berth\r\n\r\n")
            .as_bytes(),
    )
    .unwrap();
    let pid = agent.pid();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while threads_waiting_on_fuse(pid) == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "no thread of the agent waits on the hung mount: the test proves nothing"
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    let took = agent.terminate(stop_bound() * 2);
    drop(hung);
    let took = took.expect("the agent did not exit at all");
    eprintln!("the agent stopped in {took:?}");
    assert!(took < stop_bound(), "the agent took {took:?} to stop");
    for (pid, cmdline) in task {
        assert!(
            rustix::process::test_kill_process(pid).is_ok(),
            "the task's process {pid:?} ({cmdline:?}) did not outlive the agent's stop"
        );
    }
}

/// A store that hangs (the etcd process stopped: connections open, nothing answered)
/// holds calls of the agent in flight, some on blocking threads; asked to stop, the
/// agent still exits within its bound (`SHUTDOWN_BOUND`, plus a margin for a loaded
/// machine), and its task keeps running for the next agent.
#[tokio::test(flavor = "multi_thread")]
async fn an_agent_whose_store_hangs_still_stops_within_its_bound() {
    let etcd = EtcdServer::start();
    let mut a = cluster::member(&etcd, "node-a");
    a.start().await;
    let one = ONE_SLEEPER.replace("\"sleeper\"", "\"one\"");
    a.submit("one.hcl", &one).await.unwrap();
    cluster::wait_allocs(&a, "one", "1 running", Duration::from_secs(30), |all| {
        cluster::running_per_node(all).values().sum::<usize>() == 1
    })
    .await;
    let task = task_processes(&a).await;

    etcd.freeze();
    // Longer than the heartbeat TTL: the agent's calls to the store are in flight.
    tokio::time::sleep(Duration::from_secs(cluster::TTL_SECS + 1)).await;
    let took = a.terminate(stop_bound() * 2);
    etcd.thaw();
    let took = took.expect("the agent did not exit at all");
    eprintln!("the agent stopped in {took:?}");
    assert!(took < stop_bound(), "the agent took {took:?} to stop");
    for pid in task {
        assert!(
            rustix::process::test_kill_process(pid).is_ok(),
            "the task's process {pid:?} did not outlive the agent's stop"
        );
    }
}
