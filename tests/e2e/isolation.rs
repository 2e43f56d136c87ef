//! Mount propagation, checked from the task's own `/proc/self/mountinfo` and by mount
//! events actually crossing (or not crossing) between host and task.

use std::path::Path;

use berth_model::mount::Propagation;
use berth_sys::mount::mountinfo::{self, MountEntry};
use serde_json::json;

use crate::support::{self, HostMounts, TaskDir, mount};

fn entry<'a>(entries: &'a [MountEntry], mount_point: &str) -> &'a MountEntry {
    entries
        .iter()
        .rev()
        .find(|e| e.mount_point == Path::new(mount_point))
        .unwrap_or_else(|| panic!("no mount at {mount_point} in the task's mountinfo"))
}

fn host_group(path: &Path) -> u32 {
    let mounts = mountinfo::read_self().unwrap();
    mounts
        .iter()
        .rev()
        .find(|m| m.mount_point == path)
        .and_then(|m| m.shared_group())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn private_and_host_to_task_propagation_as_the_task_sees_it() {
    let runtime = support::runtime();
    let exec = support::builtin(&runtime, "exec").await;
    let sources = tempfile::Builder::new()
        .prefix("berth-e2e-src")
        .tempdir_in("/tmp")
        .unwrap();
    let private = sources.path().join("private");
    let shared = sources.path().join("shared");
    std::fs::create_dir_all(&private).unwrap();
    std::fs::create_dir_all(shared.join("sub")).unwrap();
    let mut host = HostMounts::default();
    host.make_shared(&shared);

    let task = TaskDir::new();
    let script = "for i in $(seq 200); do [ -e /local/h2t/sub/marker ] && break; sleep 0.05; done; \
                  [ -e /local/h2t/sub/marker ] && echo saw-host-mount; \
                  cat /proc/self/mountinfo > /local/priv/mountinfo";
    let request = task.request(
        "h2t",
        json!({"command": "/bin/sh", "args": ["-c", script]}),
        vec![
            mount(&private, "/local/priv", false, Propagation::Private),
            mount(&shared, "/local/h2t", true, Propagation::HostToTask),
        ],
    );
    let handle = exec.start_task(&request).await.unwrap();
    // A mount made on the host after the task started must reach it.
    host.tmpfs(&shared.join("sub"));
    std::fs::write(shared.join("sub/marker"), "").unwrap();
    let exit = exec.wait_task(&handle).await.unwrap();
    assert!(exit.successful(), "{exit:?}: {}", task.read_stderr());
    assert_eq!(task.read_stdout(), "saw-host-mount\n");

    let seen = mountinfo::parse(&std::fs::read_to_string(private.join("mountinfo")).unwrap());
    let priv_entry = entry(&seen, "/local/priv");
    assert_eq!(
        (priv_entry.shared_group(), priv_entry.master_group()),
        (None, None)
    );
    assert!(!priv_entry.is_read_only());
    let h2t = entry(&seen, "/local/h2t");
    assert_eq!(h2t.master_group(), Some(host_group(&shared)), "{h2t:?}");
    assert_eq!(h2t.shared_group(), None);
    assert!(h2t.is_read_only());
    assert_eq!(entry(&seen, "/local/h2t/sub").fs_type, "tmpfs");
}

#[tokio::test(flavor = "multi_thread")]
async fn bidirectional_propagation_sends_task_mounts_to_the_host() {
    let runtime = support::runtime();
    let exec = support::builtin(&runtime, "exec").await;
    let sources = tempfile::Builder::new()
        .prefix("berth-e2e-src")
        .tempdir_in("/tmp")
        .unwrap();
    let out = sources.path().join("out");
    let shared = sources.path().join("shared");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::create_dir_all(shared.join("sub")).unwrap();
    let mut host = HostMounts::default();
    host.make_shared(&shared);
    // Registered before the task runs: if the assertion below fails, it is still removed.
    host.adopt(&shared.join("sub"));

    let task = TaskDir::new();
    // A bind mount: what a CSI node plugin makes, and all a task granted mounting may.
    let script = "mount --bind /local/out /local/bidi/sub && echo mounted; \
                  cat /proc/self/mountinfo > /local/out/mountinfo";
    let mut request = task.request(
        "bidi",
        json!({"command": "/bin/sh", "args": ["-c", script]}),
        vec![
            mount(&out, "/local/out", false, Propagation::Private),
            mount(&shared, "/local/bidi", false, Propagation::Bidirectional),
        ],
    );
    // Only a privileged task (an operator-approved CSI plugin) may mount at all.
    request.privileged = true;
    let handle = exec.start_task(&request).await.unwrap();
    let exit = exec.wait_task(&handle).await.unwrap();
    assert!(exit.successful(), "{exit:?}: {}", task.read_stderr());
    assert_eq!(task.read_stdout(), "mounted\n");

    let seen = mountinfo::parse(&std::fs::read_to_string(out.join("mountinfo")).unwrap());
    let bidi = entry(&seen, "/local/bidi");
    assert_eq!(bidi.shared_group(), Some(host_group(&shared)), "{bidi:?}");
    let on_host = support::host_mounts_under(&shared.join("sub"));
    assert!(
        on_host
            .iter()
            .any(|m| m.mount_point == shared.join("sub") && m.root.ends_with("out")),
        "the task's mount did not reach the host: {on_host:?}"
    );
    // System dirs stay one-way even in this mode.
    let usr = entry(&seen, "/usr");
    assert!(
        usr.shared_group().is_none() && usr.is_read_only(),
        "{usr:?}"
    );
}
