//! An `exec` task tries, from inside, the ways a root process reaches the host: another
//! process's root through /proc, a device node for the host's disk, a mount, the kernel's
//! core_pattern, and the host's /dev. Each is refused, and the task keeps only the
//! capabilities it is given.

use berth::model::status::ClientStatus;

use crate::agent_process::AgentProcess;

/// Runs `script` in an exec task (with `task_extra` in its task block) until it ends; its
/// alloc's status and the task's stdout.
async fn run_script(
    agent: &AgentProcess,
    job: &str,
    task_extra: &str,
    script: &str,
) -> (berth::alloc_runner::AllocStatus, String) {
    let source = format!(
        "job \"{job}\" {{\n  type = \"batch\"\n  group \"g\" {{\n    task \"t\" {{\n      driver = \"exec\"\n{task_extra}      config {{\n        command = \"/bin/sh\"\n        args = [\"-c\", {}]\n      }}\n    }}\n  }}\n}}\n",
        serde_json::to_string(script).unwrap()
    );
    let submitted = agent.submit(&format!("{job}.hcl"), &source).await.unwrap();
    let id = &submitted.alloc_ids[0];
    agent
        .wait_alloc(id, "finished", |s| {
            matches!(
                s.client_status,
                ClientStatus::Complete | ClientStatus::Failed
            )
        })
        .await;
    let status = agent.alloc(id).await;
    let stdout = std::fs::read_to_string(status.alloc_dir.join("alloc/logs/t.stdout.0")).unwrap();
    (status, stdout)
}

/// Each probe prints one line: `<what> denied` when contained, `ESCAPED <what>` when not.
const PROBES: &str = r#"
grep -E '^(CapEff|CapBnd|NoNewPrivs):' /proc/self/status
echo "dev: $(ls /dev | tr '\n' ' ')"
for pid in 1 $PPID; do
  if ls /proc/$pid/root/ >/dev/null 2>&1; then echo "ESCAPED proc-root"; else echo "proc-root denied"; fi
done
if mknod /tmp/disk b 8 0 2>/dev/null; then echo "ESCAPED mknod"; else echo "mknod denied"; fi
if mount -t tmpfs none /tmp 2>/dev/null; then echo "ESCAPED mount"; else echo "mount denied"; fi
# Writes the value already there, so a failing defence changes nothing on the host.
if cat /proc/sys/kernel/core_pattern > /tmp/pattern && cat /tmp/pattern > /proc/sys/kernel/core_pattern 2>/dev/null; then echo "ESCAPED core_pattern"; else echo "core_pattern denied"; fi
disk=denied
for dev in /dev/sda /dev/vda /dev/xvda /dev/nvme0n1; do
  if [ "$(head -c 512 $dev 2>/dev/null | wc -c)" = 512 ]; then disk=ESCAPED; fi
done
if [ $disk = ESCAPED ]; then echo "ESCAPED disk"; else echo "disk denied"; fi
"#;

#[tokio::test(flavor = "multi_thread")]
async fn an_exec_task_cannot_reach_the_host_through_proc_devices_mounts_or_sysctl() {
    let mut agent = AgentProcess::new();
    agent.start().await;
    let (_, stdout) = run_script(&agent, "prober", "", PROBES).await;
    let kept = format!("{:016x}", berth::process::confine::TASK_CAPABILITIES.bits());
    assert!(stdout.contains(&format!("CapEff:\t{kept}")), "{stdout}");
    assert!(stdout.contains(&format!("CapBnd:\t{kept}")), "{stdout}");
    assert!(stdout.contains("NoNewPrivs:\t1"), "{stdout}");
    assert!(
        stdout.contains(
            "dev: fd full null ptmx pts random shm stderr stdin stdout tty urandom zero "
        ),
        "{stdout}"
    );
    // The listing above is what proves the host's disks are out of reach: on machines whose
    // own sandbox denies block devices even to the agent, the disk probe cannot fail.
    for contained in ["mknod", "mount", "core_pattern", "disk"] {
        assert!(
            stdout.contains(&format!("{contained} denied")),
            "{contained}: {stdout}"
        );
    }
    assert_eq!(stdout.matches("proc-root denied").count(), 2, "{stdout}");
    assert!(!stdout.contains("ESCAPED"), "{stdout}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_exec_task_runs_as_its_user_with_no_capabilities_and_an_unknown_user_is_refused() {
    let mut agent = AgentProcess::new();
    agent.start().await;
    let script = "id -u; id -g; grep '^CapEff:' /proc/self/status; \
                  echo ok > /local/mine && echo local writable; \
                  echo no > /etc/berth-test 2>/dev/null || echo etc read-only";
    let user = "      user = \"nobody\"\n";
    let (status, stdout) = run_script(&agent, "nobody", user, script).await;
    assert_eq!(
        stdout, "65534\n65534\nCapEff:\t0000000000000000\nlocal writable\netc read-only\n",
        "{status:#?}"
    );
    assert_eq!(status.client_status, ClientStatus::Complete);

    let ghost = "job \"ghost\" {\n  group \"g\" {\n    task \"t\" {\n      driver = \"exec\"\n      user = \"no-such-user-here\"\n      config {\n        command = \"/bin/true\"\n      }\n    }\n  }\n}\n";
    let Err(berth::api::client::ClientError::Api(error, _)) =
        agent.submit("ghost.hcl", ghost).await
    else {
        panic!("a job with an unknown user was accepted");
    };
    assert!(
        error
            .problems
            .iter()
            .any(|p| p
                .contains("task \"t\": user \"no-such-user-here\" does not exist on this node")),
        "{error:?}"
    );
}
