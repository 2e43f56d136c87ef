//! A group's network namespace as its tasks see it: a task spawned into the namespace
//! (the keeper joins it before it confines the task) is in it, and sees only its
//! interfaces; a task spawned without one stays in the host's.

use std::os::unix::fs::MetadataExt as _;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use berth_model::mount::Propagation;
use berth_sys::network::netns::NetNs;
use berth_sys::process::isolation::{ChrootSpec, VolumeMount};
use berth_sys::process::{Isolation, SpawnSpec};

use crate::support;

/// The namespace, removed on drop even when the test fails.
struct Namespace(NetNs);

impl Drop for Namespace {
    fn drop(&mut self) {
        let _ = self.0.remove();
    }
}

/// What a confined task (as exec runs one: chrooted, its own pid namespace) printed:
/// its network namespace's link, then `/proc/net/dev`.
async fn confined_view(dir: &Path, network_namespace: Option<&Path>) -> String {
    let root = dir.join("task");
    std::fs::create_dir_all(&root).unwrap();
    let scratch = dir.join("scratch");
    std::fs::create_dir_all(&scratch).unwrap();
    let spec = SpawnSpec {
        argv: vec![
            "/bin/sh".into(),
            "-c".into(),
            "readlink /proc/self/ns/net; cat /proc/net/dev".into(),
        ],
        env: vec![("PATH".into(), "/usr/bin:/bin".into())],
        isolation: Isolation::Chroot(ChrootSpec {
            root: root.clone(),
            cwd: "/".into(),
            mounts: vec![VolumeMount {
                host_path: scratch,
                task_path: "/scratch".into(),
                read_only: false,
                propagation: Propagation::Private,
                source_below: None,
                allow_setuid: false,
            }],
            privileged: false,
            mount_refusals: None,
            etc_files: Vec::new(),
            image: None,
        }),
        stdout: dir.join("t.stdout.0"),
        stderr: dir.join("t.stderr.0"),
        logs: Default::default(),
        user: None,
        user_namespace: None,
        capabilities: None,
        cgroup_procs: Vec::new(),
        collector_cgroup_procs: Vec::new(),
        network_namespace: network_namespace.map(Path::to_path_buf),
    };
    let processes = support::processes();
    let owner: Arc<str> = "group-network-test".into();
    let process = processes.spawn(&owner, &spec).unwrap();
    let status = processes
        .wait(&owner, process, Some(Duration::from_secs(30)))
        .await
        .unwrap()
        .expect("the task exits");
    assert_eq!(
        status.code,
        Some(0),
        "{}",
        std::fs::read_to_string(dir.join("t.stderr.0")).unwrap_or_default()
    );
    // The log collector writes the file as the task's output arrives.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(dir.join("t.stdout.0")).unwrap_or_default();
        if text.contains("lo:") || std::time::Instant::now() > deadline {
            return text;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn interfaces(view: &str) -> Vec<String> {
    view.lines()
        .filter_map(|line| line.split_once(':'))
        .map(|(name, _)| name.trim().to_string())
        .filter(|name| !name.starts_with("net") && !name.contains('|'))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_task_spawned_into_a_group_namespace_is_in_it_and_sees_only_its_interfaces() {
    let dir = support::TaskDir::new();
    let name = format!("berth-e2e-net-{}", std::process::id());
    let namespace = Namespace(NetNs::create(&name).unwrap());
    let inode = std::fs::metadata(namespace.0.path()).unwrap().ino();

    let inside = confined_view(&dir.path().join("inside"), Some(namespace.0.path())).await;
    assert_eq!(
        inside.lines().next(),
        Some(format!("net:[{inode}]").as_str()),
        "{inside}"
    );
    assert_eq!(interfaces(&inside), ["lo"], "{inside}");

    // Without one, the host's namespace and its interfaces.
    let outside = confined_view(&dir.path().join("outside"), None).await;
    let host = std::fs::read_link("/proc/self/ns/net").unwrap();
    assert_eq!(outside.lines().next(), host.to_str(), "{outside}");
    assert!(interfaces(&outside).len() > 1, "{outside}");
}
