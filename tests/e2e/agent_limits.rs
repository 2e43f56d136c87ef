//! What hostile requests cost the agent: a small jobspec that asks for gigabytes, and
//! (below) connections held open by another local user. The agent refuses, stays within
//! its budget, and keeps answering its operator.

use std::path::PathBuf;

use crate::agent_process::AgentProcess;

/// A cgroup v1 memory cgroup around a process, removed on drop.
struct MemoryCage {
    dir: PathBuf,
}

impl MemoryCage {
    fn around(pid: u32, limit: u64) -> MemoryCage {
        let dir = PathBuf::from(format!(
            "/sys/fs/cgroup/memory/berth-e2e-cage-{}-{pid}",
            std::process::id()
        ));
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("memory.limit_in_bytes"), limit.to_string()).unwrap();
        std::fs::write(dir.join("cgroup.procs"), pid.to_string()).unwrap();
        MemoryCage { dir }
    }

    /// The most memory the processes in it used since they entered (what they were
    /// charged before stays where it was).
    fn peak(&self) -> u64 {
        std::fs::read_to_string(self.dir.join("memory.max_usage_in_bytes"))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    }

    fn oom_kills(&self) -> u64 {
        let text = std::fs::read_to_string(self.dir.join("memory.oom_control")).unwrap();
        berth::cgroup::layout::keyed_value(&text, "oom_kill").unwrap_or(0)
    }
}

impl Drop for MemoryCage {
    fn drop(&mut self) {
        if let Ok(pids) = std::fs::read_to_string(self.dir.join("cgroup.procs")) {
            for pid in pids.lines() {
                let _ = std::fs::write("/sys/fs/cgroup/memory/cgroup.procs", pid);
            }
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// `replace()` of 60,000 `a`s by 60,000 `b`s: 3.6 GB if built, in a 120 KB jobspec.
fn replace_bomb(name: &str) -> String {
    let (many, long) = ("a".repeat(60_000), "b".repeat(60_000));
    format!(
        "locals {{\n  huge = replace(\"{many}\", \"a\", \"{long}\")\n}}\njob \"{name}\" {{\n  group \"g\" {{\n    task \"t\" {{\n      driver = \"mock\"\n      env {{\n        X = local.huge\n      }}\n    }}\n  }}\n}}\n"
    )
}

/// The most a jobspec can build by design: a 60 KB variable referenced a thousand times
/// in one template (the reference bound), 60 MB, refused as a local's value.
fn wide_template(name: &str) -> String {
    let big = "c".repeat(60_000);
    let template = "${var.big}".repeat(1000);
    format!(
        "variable \"big\" {{\n  default = \"{big}\"\n}}\nlocals {{\n  wide = \"{template}\"\n}}\njob \"{name}\" {{\n  group \"g\" {{\n    task \"t\" {{\n      driver = \"mock\"\n      env {{\n        X = local.wide\n      }}\n    }}\n  }}\n}}\n"
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn an_agent_in_256_mib_survives_jobspecs_that_ask_for_gigabytes() {
    let mut agent = AgentProcess::new();
    agent.start().await;
    let cage = MemoryCage::around(agent.pid(), 256 << 20);
    let (bomb1, bomb2) = (replace_bomb("bomb1"), replace_bomb("bomb2"));
    let (first, second) = tokio::join!(
        agent.submit("bomb1.hcl", &bomb1),
        agent.submit("bomb2.hcl", &bomb2)
    );
    for refused in [first, second] {
        let Err(berth::api::client::ClientError::Api(error, _)) = refused else {
            panic!("the replace() bomb was accepted: {refused:?}");
        };
        assert!(
            error
                .problems
                .iter()
                .any(|p| p.contains("the result would be 3600000000 bytes long")),
            "{error:?}"
        );
    }
    let after_replace = cage.peak();
    let (wide1, wide2) = (wide_template("wide1"), wide_template("wide2"));
    let (first, second) = tokio::join!(
        agent.submit("wide1.hcl", &wide1),
        agent.submit("wide2.hcl", &wide2)
    );
    for refused in [first, second] {
        assert!(refused.is_err(), "the wide template was accepted");
    }
    let peak = cage.peak();
    eprintln!(
        "memory charged to the agent: {} MiB after two replace() bombs, {} MiB after two wide templates",
        after_replace >> 20,
        peak >> 20
    );
    assert_eq!(cage.oom_kills(), 0);
    // Still there, and answering.
    let me: berth::api::AgentSelf = agent.client().get("/v1/agent/self").await.unwrap();
    assert!(!me.drivers.is_empty());
    // Two refused jobspecs at once: 64 MiB each at most.
    assert!(peak < 128 << 20, "{} MiB", peak >> 20);
}
