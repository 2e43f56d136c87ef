//! Links a task plants where the agent later mounts: the agent resolves every mount
//! point inside a task's root through no link, so a link a sibling task left in `/alloc`
//! (or the task itself on an earlier run) never turns a bidirectional volume into a mount
//! over the host's own.

use berth_harness::AgentProcess;
use berth_model::status::ClientStatus;

use crate::support::HostMounts;

#[tokio::test(flavor = "multi_thread")]
async fn a_link_planted_in_alloc_data_does_not_redirect_a_bidirectional_mount_onto_the_host() {
    let scratch = tempfile::Builder::new()
        .prefix("berth-e2e-links")
        .tempdir_in("/tmp")
        .unwrap();
    let volume = scratch.path().join("vol");
    let host_mount = scratch.path().join("hostmnt");
    std::fs::create_dir_all(&volume).unwrap();
    std::fs::write(volume.join("trusted.conf"), "the volume's\n").unwrap();
    let mut mounts = HostMounts::default();
    // A bidirectional volume's source is a shared mount; the host's own mounts are
    // shared too on systemd hosts: a tmpfs stands for one.
    mounts.make_shared(&volume);
    mounts.tmpfs(&host_mount);
    rustix::mount::mount_change(&host_mount, rustix::mount::MountPropagationFlags::SHARED).unwrap();
    std::fs::write(host_mount.join("trusted.conf"), "the host's\n").unwrap();
    let mut agent = AgentProcess::with_config(&format!(
        "host_volume \"shared\" {{\n  path = \"{}\"\n}}\n",
        volume.display()
    ));
    agent.start().await;
    let source = format!(
        r#"job "links" {{
  type = "batch"
  group "g" {{
    restart {{
      attempts = 0
    }}
    volume "v" {{
      type   = "host"
      source = "shared"
    }}
    task "planter" {{
      driver = "exec"
      lifecycle {{
        hook = "prestart"
      }}
      config {{
        command = "/bin/sh"
        args    = ["-c", "ln -s {} /alloc/data/pwn"]
      }}
    }}
    task "main" {{
      driver = "exec"
      config {{
        command = "/bin/sh"
        args    = ["-c", "echo written-by-the-task > /alloc/data/pwn/trusted.conf"]
      }}
      volume_mount {{
        volume           = "v"
        destination      = "/alloc/data/pwn"
        propagation_mode = "bidirectional"
      }}
    }}
  }}
}}
"#,
        host_mount.display()
    );
    let submitted = agent.submit("links.hcl", &source).await.unwrap();
    let status = agent.finished(&submitted.alloc_ids[0]).await;
    let on_host: Vec<_> = crate::support::host_mounts_under(&host_mount)
        .into_iter()
        .filter(|m| m.mount_point == host_mount)
        .collect();
    for mount in on_host.iter().skip(1) {
        mounts.adopt(&mount.mount_point);
    }
    assert_eq!(
        on_host.len(),
        1,
        "the host's mount was mounted over: {on_host:#?}"
    );
    assert_eq!(
        std::fs::read_to_string(host_mount.join("trusted.conf")).unwrap(),
        "the host's\n"
    );
    assert_eq!(
        std::fs::read_to_string(volume.join("trusted.conf")).unwrap(),
        "the volume's\n"
    );
    assert_eq!(status.client_status, ClientStatus::Failed, "{status:#?}");
    let events = format!("{:?}", status.tasks["main"].events);
    assert!(
        events.contains("symbolic links") || events.contains("passes through a link"),
        "{events}"
    );
}
