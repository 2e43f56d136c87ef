//! An `exec` task tries, from inside, the ways a root process reaches the host: another
//! process's root through /proc, a device node for the host's disk, a mount, the kernel's
//! core_pattern, and the host's /dev. Each is refused, and the task keeps only the
//! capabilities it is given. It sees only its own processes (a pid namespace), lives in
//! a cgroup that OOM-kills it past `resources.memory` and stops a fork bomb at
//! `pids_max`, and a seccomp filter refuses what its other limits would not (the host
//! root's keyring).

use berth_harness::AgentProcess;
use berth_model::events::EventKind;
use berth_model::status::ClientStatus;

/// Runs `script` in an exec task (with `task_extra` in its task block) until it ends, with
/// no restart; its alloc's status and the task's stdout.
async fn run_script(
    agent: &AgentProcess,
    job: &str,
    task_extra: &str,
    script: &str,
) -> (berth_client::alloc_runner::AllocStatus, String) {
    let source = format!(
        "job \"{job}\" {{\n  type = \"batch\"\n  group \"g\" {{\n    restart {{\n      attempts = 0\n    }}\n    task \"t\" {{\n      driver = \"exec\"\n{task_extra}      config {{\n        command = \"/bin/sh\"\n        args = [\"-c\", {}]\n      }}\n    }}\n  }}\n}}\n",
        serde_json::to_string(script).unwrap()
    );
    let status = run_to_the_end(agent, job, &source).await;
    let stdout = std::fs::read_to_string(status.alloc_dir.join("alloc/logs/t.stdout.0")).unwrap();
    (status, stdout)
}

/// Each probe prints one line: `<what> denied` when contained, `ESCAPED <what>` when not.
/// `$HOST_MARKER` names a file the test made in the host's `/tmp`.
const PROBES: &str = r#"
grep -E '^(CapEff|CapBnd|NoNewPrivs):' /proc/self/status
echo "dev: $(ls /dev | tr '\n' ' ')"
# In its pid namespace, pid 1 is berth's init (the task's parent), rooted with it: a
# /proc/<pid>/root that is not the task's own root would be a way out, and the init, a
# copy of the agent, must not give the agent's memory or environment away.
for pid in 1 $PPID; do
  if [ -e /proc/$pid/root/ ] && [ "$(stat -L -c %d:%i /proc/$pid/root/)" != "$(stat -c %d:%i /)" ]; then echo "ESCAPED proc-root"; else echo "proc-root denied"; fi
done
for file in mem environ; do
  if (exec 3< /proc/1/$file) 2>/dev/null; then echo "ESCAPED init-$file"; else echo "init-$file denied"; fi
done
if mknod /tmp/disk b 8 0 2>/dev/null; then echo "ESCAPED mknod"; else echo "mknod denied"; fi
# A file's flags and project (chattr +d, -p): what would take a file out of its alloc's
# project quota.
touch /tmp/attr
if chattr +d /tmp/attr 2>/dev/null; then echo "ESCAPED file-flags"; else echo "file-flags denied"; fi
if chattr -p 7 /tmp/attr 2>/dev/null; then echo "ESCAPED file-project"; else echo "file-project denied"; fi
# A setuid or setgid file (by chmod, or made so by open): such a bit works only outside
# the task, where a file left in a volume would give a local user the task's ids.
touch /tmp/suid
if chmod 4755 /tmp/suid 2>/dev/null || chmod 2755 /tmp/suid 2>/dev/null; then echo "ESCAPED setuid-file"; else echo "setuid-file denied"; fi
if perl -e 'use Fcntl; umask 0; sysopen(F, "/tmp/suid-made", O_CREAT|O_WRONLY, 06755) or exit 1; exit(((stat "/tmp/suid-made")[2] & 06000) ? 0 : 1)'; then echo "ESCAPED setuid-create"; else echo "setuid-create denied"; fi
# File capabilities (setcap's xattr, cap_setuid+ep): as good as setuid root outside.
if python3 -c 'import os, struct; open("/tmp/fcap", "w").close(); os.setxattr("/tmp/fcap", "security.capability", struct.pack("<5I", 0x02000001, 1 << 7, 0, 0, 0))' 2>/dev/null; then echo "ESCAPED file-caps"; else echo "file-caps denied"; fi
if mount -t tmpfs none /tmp 2>/dev/null; then echo "ESCAPED mount"; else echo "mount denied"; fi
# Writes the value already there, so a failing defence changes nothing on the host.
if cat /proc/sys/kernel/core_pattern > /tmp/pattern && cat /tmp/pattern > /proc/sys/kernel/core_pattern 2>/dev/null; then echo "ESCAPED core_pattern"; else echo "core_pattern denied"; fi
# /sys holds every task's cgroup limits on the host: the same value written back.
if cat /sys/fs/cgroup/pids/berth/pids.max > /tmp/sys 2>/dev/null && cat /tmp/sys > /sys/fs/cgroup/pids/berth/pids.max 2>/dev/null; then echo "ESCAPED sys"; else echo "sys denied"; fi
disk=denied
for dev in /dev/sda /dev/vda /dev/xvda /dev/nvme0n1; do
  if [ "$(head -c 512 $dev 2>/dev/null | wc -c)" = 512 ]; then disk=ESCAPED; fi
done
if [ $disk = ESCAPED ]; then echo "ESCAPED disk"; else echo "disk denied"; fi
# The classic way out of a chroot, for a process that may still chroot: a jail below the
# working directory, then ".." until the real root. Under pivot_root the task's root is
# the namespace's: the climb ends there, and the file lands in the task's own /tmp.
perl -e 'mkdir "/tmp/x"; chroot("/tmp/x") or exit 1; for (1..64) { chdir("..") } chroot(".") or exit 1; chdir("/"); open(F, ">/tmp/PWNED-$ENV{NOMAD_ALLOC_ID}") or exit 1; print F "x"; exit(-e "/tmp/$ENV{HOST_MARKER}" ? 0 : 2)'
case $? in 0) echo "ESCAPED breakout";; 1) echo "breakout denied (no chroot)";; *) echo "breakout denied (climbed to the task's own root)";; esac
# A setuid copy of a shell, planted where the task can write: never runs with privilege.
if cp /bin/dash /alloc/data/suid-sh 2>/dev/null && chmod 4755 /alloc/data/suid-sh 2>/dev/null; then echo "planted setuid"; fi
# Writable mounts are nosuid,nodev (/dev keeps its devices, and /proc's masks are the null
# device; the mount's own options are the sixth field of mountinfo).
awk '$6 ~ /(^|,)rw(,|$)/ && $5 != "/dev" && $5 != "/dev/pts" && $5 !~ /^\/proc\// && ($6 !~ /nosuid/ || $6 !~ /nodev/) { print "ESCAPED suid-mount " $5 " " $6 }' /proc/self/mountinfo
awk '$5 == "/" || $5 == "/alloc" { print "mount " $5 " " $6 }' /proc/self/mountinfo
"#;

/// What every confined task must show, root or not: the probes above all denied.
fn assert_contained(stdout: &str) {
    assert!(
        stdout.contains(
            "dev: fd full null ptmx pts random shm stderr stdin stdout tty urandom zero "
        ),
        "{stdout}"
    );
    // The listing above is what proves the host's disks are out of reach: on machines whose
    // own sandbox denies block devices even to the agent, the disk probe cannot fail.
    for contained in [
        "mknod",
        "mount",
        "core_pattern",
        "sys",
        "disk",
        "init-mem",
        "init-environ",
        "breakout",
        "file-flags",
        "file-project",
        "setuid-file",
        "setuid-create",
        "file-caps",
    ] {
        assert!(
            stdout.contains(&format!("{contained} denied")),
            "{contained}: {stdout}"
        );
    }
    assert_eq!(stdout.matches("proc-root denied").count(), 2, "{stdout}");
    assert!(!stdout.contains("ESCAPED"), "{stdout}");
}

/// Runs the probes as `user` (or the default user) on `agent`; checks the host saw none
/// of the breakout, and that a setuid file planted in `/alloc/data` runs without
/// privilege for any user of the host. Returns the task's stdout.
async fn probe_as(agent: &AgentProcess, job: &str, user: Option<&str>) -> String {
    let marker = format!("berth-host-marker-{}-{job}", std::process::id());
    let host_marker = std::path::Path::new("/tmp").join(&marker);
    std::fs::write(&host_marker, "host").unwrap();
    let extra = format!(
        "{}      env {{\n        HOST_MARKER = \"{marker}\"\n      }}\n",
        user.map(|u| format!("      user = \"{u}\"\n"))
            .unwrap_or_default()
    );
    let (status, stdout) = run_script(agent, job, &extra, PROBES).await;
    let _ = std::fs::remove_file(&host_marker);
    let pwned = std::path::Path::new("/tmp").join(format!("PWNED-{}", status.id));
    let escaped = pwned.exists();
    let _ = std::fs::remove_file(&pwned);
    assert!(
        !escaped,
        "the breakout wrote {} on the host: {stdout}",
        pwned.display()
    );
    let planted = status.alloc_dir.join("alloc/data/suid-sh");
    if planted.exists() {
        // As nobody on the host: the data dir (0700) keeps every other user out.
        use std::os::unix::process::CommandExt as _;
        let outside = std::process::Command::new(&planted)
            .args(["-p", "-c", "id -u"])
            .uid(65534)
            .gid(65534)
            .output();
        if let Ok(outside) = outside {
            let said = String::from_utf8_lossy(&outside.stdout);
            assert_ne!(
                said.trim(),
                "0",
                "a planted setuid file ran as root on the host"
            );
        }
    }
    stdout
}

/// The probes as a root task (on an agent whose deny-list allows it) and as a task with
/// no `user` (nobody, the default): the root task keeps its capability set and may still
/// chroot, and nothing leads out of its root; the default task keeps no capability.
#[tokio::test(flavor = "multi_thread")]
async fn an_exec_task_root_or_not_cannot_reach_the_host_through_chroot_proc_devices_mounts_or_sysfs()
 {
    let mut agent = AgentProcess::with_config("user {\n  denylist = []\n}\n");
    agent.start().await;
    let stdout = probe_as(&agent, "prober-root", Some("root")).await;
    let kept = format!(
        "{:016x}",
        berth_sys::process::confine::TASK_CAPABILITIES.bits()
    );
    assert!(stdout.contains(&format!("CapEff:\t{kept}")), "{stdout}");
    assert!(stdout.contains(&format!("CapBnd:\t{kept}")), "{stdout}");
    assert!(stdout.contains("NoNewPrivs:\t1"), "{stdout}");
    // Root may chroot (CAP_SYS_CHROOT is Nomad's default), and climbs only to its own root.
    assert!(
        stdout.contains("breakout denied (climbed to the task's own root)"),
        "{stdout}"
    );
    // Even root cannot make a file setuid (seccomp); what else stops a planted one is
    // checked with a file the host made setuid, below.
    assert!(!stdout.contains("planted setuid"), "{stdout}");
    for mount in ["/", "/alloc"] {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(&format!("mount {mount} ")))
            .unwrap_or_else(|| panic!("{mount} is not a mount of the task: {stdout}"));
        assert!(line.contains("nosuid") && line.contains("nodev"), "{line}");
    }
    assert_contained(&stdout);

    let stdout = probe_as(&agent, "prober-default", None).await;
    assert!(stdout.contains("CapEff:\t0000000000000000"), "{stdout}");
    assert!(stdout.contains("NoNewPrivs:\t1"), "{stdout}");
    assert!(stdout.contains("breakout denied (no chroot)"), "{stdout}");
    assert_contained(&stdout);
}

/// A root prestart task cannot make the shell it copies into `/alloc/data` setuid
/// (seccomp refuses the mode), nor keep the bit of a setuid file it rewrites (it has no
/// `CAP_FSETID`); and one the host made setuid there (as a setuid file left in a volume
/// would be) gives the main task (its own dynamic uid) nothing: the mount is nosuid and
/// the task has no_new_privs.
#[tokio::test(flavor = "multi_thread")]
async fn a_setuid_file_a_root_task_plants_runs_without_privilege_for_the_next_task() {
    let mut agent = AgentProcess::with_config("user {\n  denylist = []\n}\n");
    agent.start().await;
    let source = r#"job "plant" {
  type = "batch"
  group "g" {
    restart {
      attempts = 0
    }
    task "planter" {
      driver = "exec"
      user   = "root"
      lifecycle {
        hook = "prestart"
      }
      config {
        command = "/bin/sh"
        args    = ["-c", "cp /bin/dash /alloc/data/suid-sh && (chmod 4755 /alloc/data/suid-sh 2>/dev/null && echo planted || echo refused); while [ ! -e /alloc/data/go ]; do sleep 0.1; done; echo rewritten > /alloc/data/suid-kept"]
      }
    }
    task "main" {
      driver = "exec"
      config {
        command = "/bin/sh"
        args    = ["-c", "id -u; /alloc/data/suid-sh -p -c 'id -u; id -ru'"]
      }
    }
  }
}
"#;
    let submitted = agent.submit("plant.hcl", source).await.unwrap();
    let alloc_dir = agent.alloc(&submitted.alloc_ids[0]).await.alloc_dir;
    let logs = alloc_dir.join("alloc/logs");
    let planted = alloc_dir.join("alloc/data/suid-sh");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while std::fs::read_to_string(logs.join("planter.stdout.0"))
        .unwrap_or_default()
        .is_empty()
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the planter never copied its shell"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let planter = std::fs::read_to_string(logs.join("planter.stdout.0")).unwrap();
    assert_eq!(planter, "refused\n", "the task made a file setuid");
    // What a setuid file left in a volume would be: the host makes it so.
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&planted, std::fs::Permissions::from_mode(0o4755)).unwrap();
    // And one the root task rewrites: without CAP_FSETID the kernel clears its bit.
    let kept = alloc_dir.join("alloc/data/suid-kept");
    std::fs::write(&kept, "host").unwrap();
    std::fs::set_permissions(&kept, std::fs::Permissions::from_mode(0o4755)).unwrap();
    std::fs::write(alloc_dir.join("alloc/data/go"), "").unwrap();
    let status = agent.finished(&submitted.alloc_ids[0]).await;
    let mode = std::fs::metadata(&planted)
        .map(|m| m.permissions().mode())
        .unwrap();
    assert_eq!(mode & 0o4000, 0o4000, "the plant is setuid on disk");
    let rewritten = std::fs::metadata(&kept).unwrap();
    assert_eq!(std::fs::read_to_string(&kept).unwrap(), "rewritten\n");
    assert_eq!(
        rewritten.permissions().mode() & 0o6000,
        0,
        "a root task's write kept a setuid bit (CAP_FSETID)"
    );
    let main = std::fs::read_to_string(logs.join("main.stdout.0")).unwrap();
    // The task's own dynamic uid, three times: the setuid plant gains nothing.
    let uids: Vec<&str> = main.lines().collect();
    assert!(
        uids.len() == 3
            && uids.iter().all(|u| *u == uids[0])
            && uids[0]
                .parse::<u32>()
                .is_ok_and(|u| (80_000..=89_999).contains(&u)),
        "{status:#?}"
    );
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
    let Err(berth_api::client::ClientError::Api(error, _)) = agent.submit("ghost.hcl", ghost).await
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

/// Tasks this test suite's processes would recognise by their command line.
fn processes_running(marker: &str) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|cmdline| String::from_utf8_lossy(&cmdline).contains(marker))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_nobody_task_with_64_mib_sees_only_itself_and_is_oom_killed_at_256_mib() {
    let mut agent = AgentProcess::new();
    agent.start().await;
    let script = "id -u; grep '^CapEff:' /proc/self/status; \
                  echo \"pids: $(ls /proc | grep -E '^[0-9]+$' | tr '\\n' ' ')\"; \
                  echo \"me: $$\"; \
                  for dev in /dev/sda /dev/vda /dev/nvme0n1; do \
                    if head -c 1 $dev >/dev/null 2>&1; then echo ESCAPED $dev; fi; done; \
                  exec /usr/bin/python3 -c 'b = b\"x\" * (256 << 20); print(\"survived\")'";
    let extra = "      user = \"nobody\"\n      resources {\n        memory = 64\n      }\n";
    let (status, stdout) = run_script(&agent, "oom", extra, script).await;
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines[0], "65534", "{stdout}");
    assert_eq!(lines[1], "CapEff:\t0000000000000000", "{stdout}");
    // Its own namespace: pid 1 is berth's init, the task's shell is pid 2, and only the
    // task's few processes (with the listing's subshell, `ls`, `grep` and `tr`) are there.
    let pids: Vec<u32> = lines[2]
        .trim_start_matches("pids: ")
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();
    assert!(
        pids.starts_with(&[1, 2]) && pids.len() <= 7 && pids.iter().all(|p| *p < 16),
        "host pids are visible: {stdout}"
    );
    assert!(!pids.contains(&std::process::id()), "{stdout}");
    assert_eq!(lines[3], "me: 2", "{stdout}");
    assert!(
        !stdout.contains("ESCAPED") && !stdout.contains("survived"),
        "{stdout}"
    );
    assert_eq!(status.client_status, ClientStatus::Failed, "{status:#?}");
    let events = &status.tasks["t"].events;
    let terminated = events
        .iter()
        .find(|e| e.kind == EventKind::Terminated)
        .unwrap_or_else(|| panic!("{events:#?}"));
    assert!(
        terminated.message.contains("Signal: 9") && terminated.message.contains("OOM Killed"),
        "{events:#?}"
    );
    assert_no_task_cgroup_left(&status.id, true);
}

/// The alloc's task cgroups are gone from every hierarchy once it has finished. Where to
/// look is where berth puts them on this node (its own layout detection and plan: v1,
/// one directory per controller; v2, one tree), for a task `confined` (exec: with the
/// devices controller) or not (raw_exec). Each of those parents is created at a task's
/// start and never removed, so one that is not there is a failure, not a pass: the
/// check would have looked nowhere.
fn assert_no_task_cgroup_left(alloc_id: &str, confined: bool) {
    use berth_sys::cgroup::layout::{self, Layout};
    let mounts = berth_sys::mount::mountinfo::read_self().unwrap();
    let layout = Layout::detect(&mounts, |root| {
        std::fs::read_to_string(root.join("cgroup.controllers")).ok()
    })
    .expect("this node mounts cgroups");
    let limits = berth_model::limits::TaskLimits {
        memory_bytes: 0,
        memory_soft_bytes: None,
        cpu_shares: 0,
        pids_max: 0,
        restrict_devices: confined,
    };
    let plan = layout::plan(&layout, "berth", "any-task", &limits);
    assert!(!plan.parents.is_empty(), "nowhere to look: {layout:?}");
    for parent in &plan.parents {
        let entries = std::fs::read_dir(parent).unwrap_or_else(|e| {
            panic!(
                "{}: {e}: the parent of the alloc's task cgroups is not there to look in",
                parent.display()
            )
        });
        let left: Vec<_> = entries
            .map(|e| e.unwrap())
            .filter(|e| e.file_name().to_string_lossy().starts_with(alloc_id))
            .map(|e| e.path())
            .collect();
        assert!(left.is_empty(), "cgroups left behind: {left:?}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_fork_bomb_stops_at_pids_max_dies_with_its_task_and_its_neighbour_runs() {
    let mut agent = AgentProcess::with_config("cgroups {\n  pids_max = 64\n}\n");
    agent.start().await;
    // Bounded, so that without the limit the test fails instead of exhausting the node.
    let bomb = "i=0; while [ $i -lt 2000 ]; do sleep 7777 & i=$((i+1)); done; echo forked $i";
    let (bombed, neighbour) = tokio::join!(
        run_script(&agent, "bomb", "", bomb),
        run_script(&agent, "neighbour", "", "echo fine")
    );
    let (status, stdout) = bombed;
    let stderr = std::fs::read_to_string(status.alloc_dir.join("alloc/logs/t.stderr.0")).unwrap();
    assert!(!stdout.contains("forked 2000"), "{stdout}");
    assert!(stderr.contains("Cannot fork"), "{stderr}");
    assert_eq!(status.client_status, ClientStatus::Failed);
    assert!(
        processes_running("sleep\u{0}7777").is_empty(),
        "the bomb's processes outlived its task"
    );
    assert_no_task_cgroup_left(&status.id, true);
    assert_eq!(neighbour.1, "fine\n");
    assert_eq!(neighbour.0.client_status, ClientStatus::Complete);
}

#[tokio::test(flavor = "multi_thread")]
async fn seccomp_refuses_the_host_roots_keyring_to_a_root_task() {
    let mut agent = AgentProcess::with_config("user {\n  denylist = []\n}\n");
    agent.start().await;
    // keyctl(KEYCTL_GET_KEYRING_ID, KEY_SPEC_USER_KEYRING): keyrings are per uid and not
    // namespaced, so without the filter a task running as uid 0 gets the host root's.
    let probe = r#"import ctypes, os
numbers = {"x86_64": 250, "aarch64": 219}
libc = ctypes.CDLL(None, use_errno=True)
ring = libc.syscall(numbers[os.uname().machine], 0, -4, 0)
print("keyctl", "ESCAPED" if ring >= 0 else "denied", os.strerror(ctypes.get_errno()))
"#;
    let script = format!(
        "/usr/bin/python3 -c {}; grep '^Seccomp:' /proc/self/status",
        shell_quote(probe)
    );
    let root = "      user = \"root\"\n";
    let (status, stdout) = run_script(&agent, "keys", root, &script).await;
    assert_eq!(
        stdout, "keyctl denied Operation not permitted\nSeccomp:\t2\n",
        "{status:#?}"
    );
}

fn shell_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', "'\\''"))
}

/// raw_exec has no pid namespace to take a task's children down with it: its cgroup does.
/// A task that leaves a process running in the background and exits takes it along.
#[tokio::test(flavor = "multi_thread")]
async fn what_an_unconfined_task_leaves_running_dies_with_it() {
    let mut agent = AgentProcess::with_config(
        "plugin \"raw_exec\" {\n  config {\n    enabled = true\n  }\n}\n",
    );
    agent.start().await;
    let job = "job \"leaver\" {\n  type = \"batch\"\n  group \"g\" {\n    task \"t\" {\n      driver = \"raw_exec\"\n      config {\n        command = \"/bin/sh\"\n        args = [\"-c\", \"setsid sleep 7778 > /dev/null 2>&1 & echo left it\"]\n      }\n    }\n  }\n}\n";
    let submitted = agent.submit("leaver.hcl", job).await.unwrap();
    let id = &submitted.alloc_ids[0];
    agent
        .wait_alloc(id, "finished", |s| {
            s.client_status == ClientStatus::Complete
        })
        .await;
    let status = agent.alloc(id).await;
    let stdout = std::fs::read_to_string(status.alloc_dir.join("alloc/logs/t.stdout.0")).unwrap();
    assert_eq!(stdout, "left it\n");
    let left = processes_running("sleep\u{0}7778");
    for pid in &left {
        let _ = rustix::process::kill_process(
            rustix::process::Pid::from_raw(*pid as i32).unwrap(),
            rustix::process::Signal::KILL,
        );
    }
    assert!(left.is_empty(), "the task's background process outlived it");
    assert_no_task_cgroup_left(id, false);
}

#[tokio::test(flavor = "multi_thread")]
async fn favor_dynmods_is_turned_on_once_and_a_task_still_gets_its_cgroup() {
    let mut agent = AgentProcess::with_config("cgroups {\n  favor_dynmods = true\n}\n");
    let warnings = |notices: Vec<String>| -> Vec<String> {
        notices
            .into_iter()
            .filter(|n| !n.starts_with("[Info]"))
            .collect()
    };
    let me = agent.start().await;
    assert_eq!(warnings(me.notices), Vec::<String>::new());
    // This node is cgroup v1 (see the issue): a controller-less hierarchy carries the
    // option, under the agent's data directory.
    let keeper = agent.path().join("data/cgroup-favordynmods");
    let carriers = || crate::support::host_mounts_under(&keeper);
    let mounted = carriers();
    assert_eq!(mounted.len(), 1, "{mounted:#?}");
    let options: Vec<&str> = mounted[0].super_options.split(',').collect();
    assert_eq!(mounted[0].fs_type, "cgroup");
    assert!(options.contains(&"favordynmods"), "{options:?}");
    assert!(options.contains(&"name=berth_favordynmods"), "{options:?}");
    let (status, stdout) = run_script(&agent, "favoured", "", "cat /proc/self/cgroup").await;
    assert_eq!(status.client_status, ClientStatus::Complete, "{stdout}");
    assert!(
        stdout.contains(&format!("memory:/berth/job-favoured/{}.t", status.id)),
        "{stdout}"
    );
    // A restarted agent finds it and mounts nothing more.
    agent.kill9();
    let me = agent.start().await;
    assert_eq!(warnings(me.notices), Vec::<String>::new());
    assert_eq!(carriers().len(), 1, "{:#?}", carriers());
}

/// The task's init (pid 1 of its namespace, with the task's credentials) is never
/// dumpable, not even for a moment after the task exists: a task that opens `/proc/1/mem`
/// from its first instruction never gets in.
#[tokio::test(flavor = "multi_thread")]
async fn a_task_racing_its_init_never_opens_the_inits_memory() {
    let mut agent = AgentProcess::new();
    agent.start().await;
    let script = "i=0; while [ $i -lt 300 ]; do if (exec 3< /proc/1/mem) 2>/dev/null; then echo ESCAPED; fi; i=$((i+1)); done; echo done";
    for round in 0..5 {
        let (status, stdout) = run_script(&agent, &format!("race{round}"), "", script).await;
        assert_eq!(status.client_status, ClientStatus::Complete, "{stdout}");
        assert_eq!(stdout, "done\n", "round {round}");
    }
}

/// A task starts with stdin, stdout and stderr, and nothing else of the agent's: not its
/// API listeners, not a descriptor the agent itself inherited without close-on-exec (a
/// careless parent's open file, a jobserver pipe). Checked for a confined and an
/// unconfined task of an agent that inherited an open file.
#[tokio::test(flavor = "multi_thread")]
async fn a_task_gets_no_descriptor_of_the_agent_beyond_its_stdio() {
    let mut agent = AgentProcess::with_config(
        "plugin \"raw_exec\" {\n  config {\n    enabled = true\n  }\n}\n",
    );
    let secret = agent.path().join("agent-secret");
    std::fs::write(&secret, "not for tasks").unwrap();
    agent.inherit(&secret);
    agent.start().await;
    // The shell's descriptors, listed by a child (`ls`) so that the listing's own do not
    // count.
    for (driver, listed) in both_drivers_say(&agent, "fds", "ls -l /proc/$$/fd").await {
        // "lrwx------ 1 root root 64 Nov 25 10:43 1 -> /path"
        let fds: Vec<(&str, &str)> = listed
            .lines()
            .filter_map(|line| line.split_once(" -> "))
            .filter_map(|(before, target)| Some((before.rsplit(' ').next()?, target)))
            .collect();
        let numbers: Vec<&str> = fds.iter().map(|(fd, _)| *fd).collect();
        assert_eq!(
            numbers,
            ["0", "1", "2"],
            "{driver} task's descriptors:\n{listed}"
        );
        assert_eq!(fds[0].1, "/dev/null", "{listed}");
        // stdout and stderr: the pipes to the task's log collector.
        assert!(fds[1].1.starts_with("pipe:"), "{listed}");
        assert!(fds[2].1.starts_with("pipe:"), "{listed}");
    }
}

/// The agent raises its own soft open-files limit to the hard one (a thousand tasks cost
/// it a few thousand descriptors), and gives its tasks the limit it started with back:
/// programs that use select(2) break above 1024.
#[tokio::test(flavor = "multi_thread")]
async fn the_agent_raises_its_open_files_limit_and_tasks_get_the_nodes_back() {
    let mut agent = AgentProcess::with_config(
        "plugin \"raw_exec\" {\n  config {\n    enabled = true\n  }\n}\n",
    );
    agent.open_files_limit(512);
    agent.start().await;
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", agent.pid())).unwrap();
    let open_files: Vec<&str> = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap()
        .split_whitespace()
        .skip(3)
        .take(2)
        .collect();
    assert_eq!(open_files[0], open_files[1], "{limits}");
    assert_ne!(open_files[0], "512", "{limits}");
    for (driver, said) in both_drivers_say(&agent, "limits", "ulimit -n").await {
        assert_eq!(said.trim(), "512", "{driver} task's open-files limit");
    }
}

/// Runs `script` with `/bin/sh -c` as an exec task and as a raw_exec task of one batch
/// job on `agent` (raw_exec enabled), and returns what each wrote to its stdout.
async fn both_drivers_say(
    agent: &AgentProcess,
    job: &str,
    script: &str,
) -> Vec<(&'static str, String)> {
    let script = serde_json::to_string(script).unwrap();
    let tasks: String = ["exec", "raw_exec"]
        .map(|driver| {
            format!(
                "    task \"{driver}\" {{\n      driver = \"{driver}\"\n      config {{\n        command = \"/bin/sh\"\n        args = [\"-c\", {script}]\n      }}\n    }}\n"
            )
        })
        .concat();
    let source =
        format!("job \"{job}\" {{\n  type = \"batch\"\n  group \"g\" {{\n{tasks}  }}\n}}\n");
    let status = run_to_the_end(agent, job, &source).await;
    ["exec", "raw_exec"]
        .into_iter()
        .map(|driver| {
            let log = status
                .alloc_dir
                .join(format!("alloc/logs/{driver}.stdout.0"));
            (driver, std::fs::read_to_string(log).unwrap())
        })
        .collect()
}

/// Submits `source` as `job` and waits until its (first) alloc has finished.
async fn run_to_the_end(
    agent: &AgentProcess,
    job: &str,
    source: &str,
) -> berth_client::alloc_runner::AllocStatus {
    let submitted = agent.submit(&format!("{job}.hcl"), source).await.unwrap();
    agent.finished(&submitted.alloc_ids[0]).await
}

fn read_number(path: impl AsRef<std::path::Path>) -> u64 {
    let path = path.as_ref();
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .trim()
        .parse()
        .unwrap()
}

/// Nine tasks, each allowed an eighth of the host's pids, start threads until they are
/// refused, at once: the node-wide ceiling on the parent cgroup stops them together
/// short of the host's `pid_max`, and the host can still start a process.
#[tokio::test(flavor = "multi_thread")]
async fn nine_fork_bombs_at_once_leave_the_host_able_to_start_a_process() {
    let pid_max = read_number("/proc/sys/kernel/pid_max");
    assert!(
        pid_max <= 131_072,
        "this test exhausts the host's pids without the ceiling: it needs a pid_max of at \
         most 131072 (this host has {pid_max})"
    );
    let per_task = pid_max / 8 + 64;
    let parent = format!("berth-bombs-{}", std::process::id());
    let mut agent = AgentProcess::with_config(&format!(
        "cgroups {{\n  parent = \"{parent}\"\n  pids_max = {per_task}\n}}\n"
    ));
    agent.start().await;
    let parent_dir = std::path::Path::new("/sys/fs/cgroup/pids").join(&parent);
    let ceiling = read_number(parent_dir.join("pids.max"));
    assert_eq!(
        ceiling,
        berth_sys::cgroup::layout::default_all_tasks_pids(pid_max)
    );
    // Threads count against pids.max as processes do, and cost little memory. Each
    // task stops at its own limit (bounded), says how far it got, and holds them.
    let bomb = format!(
        "import threading, time\nthreading.stack_size(64 * 1024)\nhold = threading.Event()\nn = 0\ntry:\n    while n < {per_task}:\n        threading.Thread(target=hold.wait, daemon=True).start()\n        n += 1\nexcept RuntimeError:\n    pass\nprint('peak', n, flush=True)\ntime.sleep(300)\n"
    );
    let source = format!(
        "job \"bombs\" {{\n  group \"g\" {{\n    count = 9\n    task \"t\" {{\n      driver = \"exec\"\n      config {{\n        command = \"/usr/bin/python3\"\n        args = [\"-c\", {}]\n      }}\n      resources {{\n        memory = 1024\n      }}\n    }}\n  }}\n}}\n",
        serde_json::to_string(&bomb).unwrap()
    );
    let submitted = agent.submit("bombs.hcl", &source).await.unwrap();
    assert_eq!(submitted.alloc_ids.len(), 9);
    let started = std::time::Instant::now();
    let mut peaks = Vec::new();
    loop {
        peaks.clear();
        for id in &submitted.alloc_ids {
            let status = agent.alloc(id).await;
            let out = std::fs::read_to_string(status.alloc_dir.join("alloc/logs/t.stdout.0"))
                .unwrap_or_default();
            if let Some(peak) = out.strip_prefix("peak ") {
                peaks.push(peak.trim().parse::<u64>().unwrap());
            }
        }
        if peaks.len() == 9 || started.elapsed() > std::time::Duration::from_secs(120) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let in_use = read_number(parent_dir.join("pids.current"));
    // While every bomb holds what it got, the host still starts processes.
    let host_can_start = (0..20).all(|_| {
        std::process::Command::new("/bin/true")
            .status()
            .is_ok_and(|s| s.success())
    });
    let _ = agent
        .client()
        .delete::<serde_json::Value>("/v1/berth/job/bombs")
        .await;
    eprintln!("threads each bomb got: {peaks:?}; pids in the parent: {in_use} of {ceiling}");
    assert_eq!(peaks.len(), 9, "not every bomb reported: {peaks:?}");
    assert!(host_can_start, "the host could not start a process");
    assert!(in_use <= ceiling, "{in_use} pids in use past {ceiling}");
    let total: u64 = peaks.iter().sum();
    assert!(
        total < ceiling && peaks.iter().any(|p| *p < per_task),
        "the bombs were not stopped by the ceiling: {peaks:?} of {ceiling}"
    );
    for id in &submitted.alloc_ids {
        agent.finished(id).await;
    }
    drop(agent);
    for controller in ["memory", "cpu", "pids", "devices"] {
        let _ = std::fs::remove_dir(
            std::path::Path::new("/sys/fs/cgroup")
                .join(controller)
                .join(&parent),
        );
    }
}

/// The host's mounts inside what a task gets read-only (a disk mounted in a host
/// volume, a container runtime's bind-mounted `/etc/hosts` in `/etc`) are read-only,
/// nosuid and nodev in the task too: a remount restricts only the top of a recursive
/// bind, and a world-writable tmpfs inside a read-only volume stayed writable.
#[tokio::test(flavor = "multi_thread")]
async fn a_mount_inside_a_read_only_volume_is_read_only_nosuid_nodev_in_the_task() {
    let dir = tempfile::tempdir_in(berth_harness::binaries::target_tmp()).unwrap();
    let volume = dir.path().join("shelf");
    let sub = volume.join("sub");
    std::fs::create_dir_all(&sub).unwrap();
    /// The tmpfs is unmounted even when the test fails.
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(&self.0).status();
        }
    }
    let status = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "mode=1777,size=1m", "berth-test"])
        .arg(&sub)
        .status()
        .unwrap();
    assert!(status.success());
    let _unmount = Unmount(sub.clone());
    let mut agent = AgentProcess::with_config(&format!(
        "host_volume \"shelf\" {{\n  path      = \"{}\"\n  read_only = true\n}}\n",
        volume.display()
    ));
    agent.start().await;
    let source = r#"job "shelf" {
  type = "batch"
  group "g" {
    restart {
      attempts = 0
    }
    volume "shelf" {
      type      = "host"
      source    = "shelf"
      read_only = true
    }
    task "t" {
      driver = "exec"
      volume_mount {
        volume      = "shelf"
        destination = "/shelf"
        read_only   = true
      }
      config {
        command = "/bin/sh"
        args    = ["-c", "if echo x > /shelf/sub/planted 2>/dev/null; then echo 'ESCAPED write'; else echo 'write denied'; fi; awk '$5 == \"/shelf/sub\" { print \"sub \" $6 }' /proc/self/mountinfo"]
      }
    }
  }
}
"#;
    let status = run_to_the_end(&agent, "shelf", source).await;
    let stdout = std::fs::read_to_string(status.alloc_dir.join("alloc/logs/t.stdout.0")).unwrap();
    assert!(stdout.contains("write denied"), "{stdout}");
    assert!(!sub.join("planted").exists(), "{stdout}");
    let options = stdout
        .lines()
        .find_map(|l| l.strip_prefix("sub "))
        .unwrap_or_else(|| panic!("the submount is not in the task: {stdout}"));
    let options: Vec<&str> = options.split(',').collect();
    for wanted in ["ro", "nosuid", "nodev"] {
        assert!(options.contains(&wanted), "{options:?}");
    }
}
