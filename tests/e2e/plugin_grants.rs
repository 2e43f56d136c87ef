//! Who may run a CSI plugin, and what a plugin the operator granted mounting may do.
//!
//! A job author writes the plugin id, so a grant by id alone made any job author root on
//! the node: a job with `csi_plugin { id = "hostpath" }` got every capability. Now a
//! plugin job needs the operator (the Unix socket) or a token of scope `plugin`, the
//! grant names the jobs as well as the id, and a granted plugin keeps only
//! `CAP_SYS_ADMIN` beyond a task's set, narrowed by seccomp and its mount warden to bind mounts below its dirs, with no kernel
//! settings in its `/proc`, under `pivot_root`.

use berth_api::SubmitRequest;
use berth_api::client::{Client, ClientError};
use berth_harness::AgentProcess;
use berth_sys::process::confine::{MOUNTING_PLUGIN_CAPABILITIES, TASK_CAPABILITIES};

/// Mount probes, by the system call (as a CSI plugin mounts), one line each.
const MOUNT_PROBES: &str = r#"import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
MS_BIND, MS_REMOUNT = 4096, 32
def mount(source, target, fs, flags):
    return libc.mount(source, target, fs, ctypes.c_ulong(flags), None) == 0
os.makedirs("/tmp/m", exist_ok=True)
print("ESCAPED new-proc" if mount(b"proc", b"/tmp/m", b"proc", 0) else "new-proc denied")
wrote = False
if mount(None, b"/usr", None, MS_REMOUNT | MS_BIND):
    try:
        open("/usr/berth-plugin-wrote", "w").close()
        wrote = True
    except OSError:
        pass
print("ESCAPED usr-rw" if wrote else "usr-rw denied")
if mount(b"/local", b"/tmp/m", None, MS_BIND):
    print("ESCAPED bind-outside-its-dirs")
    libc.umount2(b"/tmp/m", 0)
else:
    print("bind-outside denied")
"#;

/// What a granted plugin does with mount(8) as real plugins call it (Kubernetes'
/// mount-utils: bind, then `bind,remount[,ro]`), and what it asks beyond its dirs, one
/// line each. Its stage and publish dir is `/local/csi`.
const MOUNT8_PROBES: &str = r#"mkdir -p /local/src /local/csi/staging/v /local/csi/per-alloc/a/v/rw /local/csi/per-alloc/a/v/ro /local/csi/per-alloc/a/v/usr
echo data > /local/src/file
nosuid() { grep -E " $1 [^ ]*nosuid" /proc/self/mountinfo >/dev/null; }
ro() { grep -E " $1 ro[, ]" /proc/self/mountinfo >/dev/null; }
if mount -o bind /local/src /local/csi/staging/v && mount -o bind,remount,rw /local/src /local/csi/staging/v; then echo "stage ok"; else echo "stage FAILED"; fi
published=""
if mount -o bind /local/csi/staging/v /local/csi/per-alloc/a/v/rw && mount -o bind,remount,rw /local/csi/staging/v /local/csi/per-alloc/a/v/rw && echo w > /local/csi/per-alloc/a/v/rw/written; then echo "publish-rw ok"; published=1; else echo "publish-rw FAILED"; fi
if mount -o bind /local/csi/staging/v /local/csi/per-alloc/a/v/ro && mount -o bind,remount,ro /local/csi/staging/v /local/csi/per-alloc/a/v/ro && ro /local/csi/per-alloc/a/v/ro && ! touch /local/csi/per-alloc/a/v/ro/x 2>/dev/null; then echo "publish-ro ok"; else echo "publish-ro FAILED"; fi
if [ -n "$published" ]; then
  if nosuid /local/csi/per-alloc/a/v/rw && nosuid /local/csi/per-alloc/a/v/ro; then echo "publish nosuid"; else echo "ESCAPED publish-suid"; fi
  mount -o remount,bind,suid /local/csi/per-alloc/a/v/rw 2>/dev/null
  if nosuid /local/csi/per-alloc/a/v/rw; then echo "suid-remount denied"; else echo "ESCAPED suid-remount"; fi
fi
if mount -o remount,bind,rw /usr 2>/dev/null || ! ro /usr; then echo "ESCAPED usr-remount-rw"; else echo "usr-remount-rw denied"; fi
if mount --bind /etc /tmp 2>/dev/null; then echo "ESCAPED etc-over-tmp"; else echo "etc-over-tmp denied"; fi
mount -o bind /usr /local/csi/per-alloc/a/v/usr 2>/dev/null
if mount -o bind,remount,rw /usr /local/csi/per-alloc/a/v/usr 2>/dev/null && touch /local/csi/per-alloc/a/v/usr/berth-plugin-wrote 2>/dev/null; then echo "ESCAPED usr-copy-rw"; else echo "usr-copy-rw denied"; fi
if mount -o bind /local/src /local/csi/per-alloc/a 2>/dev/null && umount /local/csi/per-alloc/a; then echo "nested ok"; fi
for m in usr ro rw; do umount /local/csi/per-alloc/a/v/$m 2>/dev/null; done
umount /local/csi/staging/v
if grep -q " /local/csi/" /proc/self/mountinfo; then echo "mounts LEFT"; else echo "unmounted all"; fi
"#;

/// A plugin job whose task (`user` if given) probes what it may do, prints one line per
/// probe, and waits to be stopped. `marker` names a file in the host's `/tmp` that a
/// breakout would see.
fn plugin_job(job: &str, user: Option<&str>, marker: &str) -> String {
    plugin_job_of("hostpath", "node", job, user, marker)
}

/// [`plugin_job`] providing plugin `id` as `kind` (`node` or `controller`).
fn plugin_job_of(id: &str, kind: &str, job: &str, user: Option<&str>, marker: &str) -> String {
    let script = format!(
        r#"grep -E '^CapEff:' /proc/self/status
if [ -e /proc/sys ]; then echo "proc-sys present"; else echo "proc-sys absent"; fi
if cat /proc/sys/kernel/core_pattern > /tmp/cp 2>/dev/null && cat /tmp/cp > /proc/sys/kernel/core_pattern 2>/dev/null; then echo "ESCAPED core_pattern"; else echo "core_pattern denied"; fi
/usr/bin/python3 -c '{MOUNT_PROBES}'
{MOUNT8_PROBES}
perl -e 'mkdir "/tmp/x"; chroot("/tmp/x") or exit 1; for (1..64) {{ chdir("..") }} chroot(".") or exit 1; exit(-e "/tmp/{marker}" ? 0 : 2)'
case $? in 0) echo "ESCAPED breakout";; *) echo "breakout contained";; esac
echo done
sleep 600
"#
    );
    let user = user
        .map(|u| format!("      user = \"{u}\"\n"))
        .unwrap_or_default();
    format!(
        "job \"{job}\" {{\n  group \"g\" {{\n    task \"t\" {{\n      driver = \"exec\"\n{user}      config {{\n        command = \"/bin/sh\"\n        args = [\"-c\", {}]\n      }}\n      csi_plugin {{\n        id             = \"{id}\"\n        type           = \"{kind}\"\n        health_timeout = \"5m\"\n      }}\n    }}\n  }}\n}}\n",
        serde_json::to_string(&script).unwrap()
    )
}

/// Where [`probes`]' answer turns from the task's stdout to its stderr.
const STDERR_FOLLOWS: &str = "\n== stderr ==\n";
/// Where it turns from the task's stderr to its events' messages.
const EVENTS_FOLLOW: &str = "\n== events ==\n";

/// Runs `source` until its task printed `done`; its stdout, then [`STDERR_FOLLOWS`] and
/// its stderr, then [`EVENTS_FOLLOW`] and its events' messages.
async fn probes(agent: &AgentProcess, job: &str, source: &str) -> String {
    let submitted = agent
        .submit(&format!("{job}.hcl"), source)
        .await
        .unwrap_or_else(|e| panic!("{e:?}"));
    let id = submitted.alloc_ids[0].clone();
    let started = std::time::Instant::now();
    loop {
        let status = agent.alloc(&id).await;
        let out = std::fs::read_to_string(status.alloc_dir.join("alloc/logs/t.stdout.0"))
            .unwrap_or_default();
        if out.contains("done\n") {
            let logs = status.alloc_dir.join("alloc/logs/t.stderr.0");
            let stderr = std::fs::read_to_string(logs).unwrap_or_default();
            // The refusals reach the task's events within half a second.
            tokio::time::sleep(std::time::Duration::from_millis(1200)).await;
            let events: Vec<String> = agent.alloc(&id).await.tasks["t"]
                .events
                .iter()
                .map(|e| e.message.clone())
                .collect();
            let out = format!(
                "{out}{STDERR_FOLLOWS}{stderr}{EVENTS_FOLLOW}{}",
                events.join("\n")
            );
            let _ = agent
                .client()
                .delete::<serde_json::Value>(&format!("/v1/berth/job/{job}"))
                .await;
            agent.finished(&id).await;
            return out;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(60),
            "the plugin task never finished its probes: {out}\n{status:#?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

fn caps(set: rustix::thread::CapabilitySet) -> String {
    format!("CapEff:\t{:016x}", set.bits())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_granted_plugin_mounts_binds_only_and_a_job_author_claiming_its_id_gets_nothing() {
    let mut agent = AgentProcess::production(|port, _| {
        format!(
            "csi {{\n  privileged_plugin \"hostpath\" {{\n    jobs = [\"csi-hostpath\"]\n  }}\n}}\n\
             http {{\n  address = \"127.0.0.1:{port}\"\n  token \"author\" {{\n    secret = \"author-secret-0123456789\"\n    scope  = \"submit\"\n  }}\n  token \"csi\" {{\n    secret = \"plugin-secret-0123456789\"\n    scope  = \"plugin\"\n  }}\n}}\n"
        )
    });
    agent.start().await;
    let marker = format!("berth-plugin-marker-{}", std::process::id());
    let marker_path = std::path::Path::new("/tmp").join(&marker);
    std::fs::write(&marker_path, "host").unwrap();

    // The granted job, from the operator: CAP_SYS_ADMIN on top of a task's set, and what
    // it can do with it is bind mounts.
    let granted = probes(
        &agent,
        "csi-hostpath",
        &plugin_job("csi-hostpath", None, &marker),
    )
    .await;
    assert!(
        granted.contains(&caps(MOUNTING_PLUGIN_CAPABILITIES)),
        "{granted}"
    );
    for line in [
        "proc-sys absent",
        "new-proc denied",
        "usr-rw denied",
        "bind-outside denied",
        "breakout contained",
        // mount(8), as real plugins publish: its warden binds and remounts below its
        // dirs, and refuses the rest.
        "stage ok",
        "publish-rw ok",
        "publish-ro ok",
        "publish nosuid",
        "suid-remount denied",
        "usr-remount-rw denied",
        "etc-over-tmp denied",
        "usr-copy-rw denied",
        "unmounted all",
    ] {
        assert!(granted.contains(line), "{line}: {granted}");
    }
    assert!(!granted.contains("ESCAPED"), "{granted}");
    assert!(
        !std::path::Path::new("/usr/berth-plugin-wrote").exists(),
        "the plugin wrote into the host's /usr"
    );
    // Each refusal is in the plugin's log, naming the path.
    let (_, after) = granted.split_once(STDERR_FOLLOWS).unwrap_or_default();
    let (stderr, events) = after.split_once(EVENTS_FOLLOW).unwrap_or_default();
    // And in the task's events.
    assert!(
        events.contains(
            "Mount refused to this CSI plugin: \"/usr\" is not below the plugin's staging \
             and publish dirs"
        ),
        "{events}"
    );
    for refusal in [
        "berth: mount refused to this CSI plugin: \"/usr\" is not below the plugin's staging \
         and publish dirs",
        "berth: mount refused to this CSI plugin: \"/tmp\" is not below",
        "berth: mount refused to this CSI plugin: \"/local/csi/per-alloc/a/v/usr\" is \
         read-only and was not bound here from a writable source",
    ] {
        assert!(stderr.contains(refusal), "{refusal}: {stderr}");
    }

    // A job author's job claiming the granted id under another name, node part or
    // controller, even submitted by the operator: refused, so it is never registered
    // under the id and sent its calls (volume secrets included).
    for kind in ["node", "controller"] {
        let squatter = plugin_job_of("hostpath", kind, "squatter", None, &marker);
        let refused = agent.submit("squatter.hcl", &squatter).await;
        let Err(ClientError::Api(error, _)) = refused else {
            panic!("a {kind} squatting a granted plugin id was accepted: {refused:?}");
        };
        assert!(
            error.problems.iter().any(|p| p.contains(
                "provides CSI plugin \"hostpath\", which this agent's operator reserved for \
                 job(s) \"csi-hostpath\""
            )),
            "{error:?}"
        );
    }
    // A plugin of an id nobody was granted: confined like any task (nobody, no
    // capabilities).
    let claimed = probes(
        &agent,
        "other",
        &plugin_job_of("other", "node", "other", None, &marker),
    )
    .await;
    assert!(
        claimed.contains(&caps(rustix::thread::CapabilitySet::empty())),
        "{claimed}"
    );
    assert!(claimed.contains("bind-outside denied"), "{claimed}");
    // Even as root, where the operator allowed root: a task's set, no mounting.
    let mut open = AgentProcess::with_config(
        "user {\n  denylist = []\n}\ncsi {\n  privileged_plugin \"hostpath\" {\n    jobs = [\"csi-hostpath\"]\n  }\n}\n",
    );
    open.start().await;
    let rooted = probes(
        &open,
        "other",
        &plugin_job_of("other", "node", "other", Some("root"), &marker),
    )
    .await;
    assert!(rooted.contains(&caps(TASK_CAPABILITIES)), "{rooted}");
    assert!(rooted.contains("bind-outside denied"), "{rooted}");
    assert!(rooted.contains("breakout contained"), "{rooted}");
    let _ = std::fs::remove_file(&marker_path);
    for out in [&granted, &claimed, &rooted] {
        assert!(!out.contains("ESCAPED"), "{out}");
    }
    assert!(!std::path::Path::new("/usr/berth-plugin-wrote").exists());

    // Through TCP, a submit token may not run a plugin job at all, whatever its name; a
    // plugin token may.
    let tcp = |token: &str| {
        Client::new(&format!("http://127.0.0.1:{}", agent.port()))
            .unwrap()
            .with_token(Some(token.to_string()))
    };
    let request = SubmitRequest {
        source_name: "csi-hostpath.hcl".into(),
        source: plugin_job("csi-hostpath", None, &marker),
        variables: Default::default(),
    };
    let refused = tcp("author-secret-0123456789")
        .post::<_, serde_json::Value>("/v1/berth/jobs", &request)
        .await;
    let Err(ClientError::Api(error, _)) = refused else {
        panic!("a submit token ran a plugin job: {refused:?}");
    };
    assert!(
        error.problems.iter().any(|p| p.contains(
            "task \"t\" runs a CSI plugin, which needs the operator's authorization: submit it \
             through the agent's Unix socket, or with a token of scope \"plugin\""
        )),
        "{error:?}"
    );
    // A plugin token may run a plugin job, but not the granted one: a token holder
    // chooses the job's name too, so a grant holds only for the operator's submission.
    let squatted = tcp("plugin-secret-0123456789")
        .post::<_, serde_json::Value>("/v1/berth/jobs", &request)
        .await;
    let Err(ClientError::Api(error, _)) = squatted else {
        panic!("a plugin token ran the granted job by its name: {squatted:?}");
    };
    assert!(
        error
            .problems
            .iter()
            .any(|p| p.contains("submitted by the operator")),
        "{error:?}"
    );
    // (Under another job name: the operator's job "other" is not the token's to replace.)
    let other = SubmitRequest {
        source_name: "other-by-token.hcl".into(),
        source: plugin_job_of("other", "node", "other-by-token", None, &marker),
        variables: Default::default(),
    };
    let accepted: serde_json::Value = tcp("plugin-secret-0123456789")
        .post("/v1/berth/jobs", &other)
        .await
        .unwrap();
    assert_eq!(accepted["alloc_ids"].as_array().map(Vec::len), Some(1));
    let _ = agent
        .client()
        .delete::<serde_json::Value>("/v1/berth/job/other-by-token")
        .await;
}

#[test]
fn a_grant_by_plugin_id_alone_is_refused_with_the_new_form() {
    let error = berth_client::config::AgentConfig::parse(
        "agent.hcl",
        "csi {\n  privileged_plugins = [\"hostpath\"]\n}\n",
    )
    .unwrap_err();
    assert!(
        error.problems.iter().any(|p| p.message.contains(
            "a grant by plugin id alone is refused: any job author can write a plugin id. Name \
             the jobs that may run it too: privileged_plugin \"hostpath\" { jobs = [\"<the \
             plugin's job>\"] }"
        )),
        "{error:?}"
    );
}
