//! Nomad's `docker` jobs, as written, on the `docker` driver (a WebAssembly component)
//! and the agent's image store: images built in the test with `umoci` from
//! `busybox-static`, pushed with `skopeo` to a real registry (Debian's
//! `docker-registry`) on loopback, pulled and run with no daemon.

use std::time::{Duration, Instant};

use berth_client::alloc_runner::AllocStatus;
use berth_harness::AgentProcess;
use berth_model::status::ClientStatus;
use berth_testkit::registry::{ImageSpec, OciLayout, Registry};

fn batch(name: &str, tasks: &str) -> String {
    format!(
        "job \"{name}\" {{\n  type = \"batch\"\n  group \"g\" {{\n    restart {{\n      attempts = 0\n    }}\n{tasks}  }}\n}}\n"
    )
}

fn docker_task(name: &str, config: &str) -> String {
    format!(
        "    task \"{name}\" {{\n      driver = \"docker\"\n      config {{\n{config}      }}\n    }}\n"
    )
}

fn stdout(status: &AllocStatus, task: &str) -> String {
    std::fs::read_to_string(status.alloc_dir.join(format!("alloc/logs/{task}.stdout.0")))
        .unwrap_or_default()
}

fn events(status: &AllocStatus, task: &str) -> String {
    status.tasks.get(task).map_or_else(String::new, |t| {
        t.events
            .iter()
            .map(|e| e.message.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    })
}

/// The image the tests share: busybox, `/bin/sh -c` as its entrypoint, a Cmd that
/// says what it sees, `FOO=from-image` and `/data` as its working dir.
fn base_image(layout: &OciLayout) {
    layout.busybox(
        "base",
        &[],
        &ImageSpec {
            entrypoint: &["/bin/sh", "-c"],
            cmd: &["echo \"default FOO=$FOO\"; pwd; cat from-image; id -u; \
                    ls -d /local /secrets /alloc; echo \"alloc $NOMAD_ALLOC_ID\""],
            env: &["FOO=from-image", "PATH=/bin"],
            working_dir: Some("/data"),
            user: None,
        },
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_docker_job_runs_an_image_from_a_registry_with_its_defaults_and_with_overrides() {
    let registry = Registry::start();
    let layout = OciLayout::new();
    base_image(&layout);
    let digest = registry.push(&layout, "base", "tools/busybox:1");
    let image = format!("{}/tools/busybox:1", registry.address);

    let mut agent = AgentProcess::new();
    agent.start().await;

    // The image's own Entrypoint, Cmd, Env and WorkingDir.
    let defaults = batch(
        "defaults",
        &docker_task("t", &format!("        image = \"{image}\"\n")),
    );
    let submitted = agent.submit("defaults.hcl", &defaults).await.unwrap();
    let status = agent.finished(&submitted.alloc_ids[0]).await;
    let out = stdout(&status, "t");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines.len(),
        8,
        "{out}\n{}\n{}",
        events(&status, "t"),
        agent.output()
    );
    assert_eq!(lines[0], "default FOO=from-image");
    assert_eq!(lines[1], "/data", "the image's WorkingDir");
    assert_eq!(lines[2], "hello from the image");
    assert_eq!(
        lines[3], "0",
        "root in the image (in its own user namespace)"
    );
    assert_eq!(&lines[4..7], ["/alloc", "/local", "/secrets"]);
    assert_eq!(lines[7], format!("alloc {}", status.id));
    assert_eq!(status.client_status, ClientStatus::Complete);
    // The pull, as the task's "Driver" events, as Nomad's docker driver shows it.
    let driver_events: Vec<&str> = status.tasks["t"]
        .events
        .iter()
        .filter(|e| e.kind == berth_model::events::EventKind::Driver)
        .map(|e| e.message.as_str())
        .collect();
    assert_eq!(driver_events.len(), 2, "{driver_events:?}");
    assert!(
        driver_events[0].starts_with(&format!("Downloading image {image}: 1 of its 1 layers (")),
        "{driver_events:?}"
    );
    assert!(
        driver_events[1].starts_with("Downloaded layer 1 of 1 (")
            && driver_events[1].ends_with(" MB)"),
        "{driver_events:?}"
    );

    // Nomad's overrides: entrypoint, command with args, work_dir, the task's env over
    // the image's; and the same image by its digest.
    let overrides = batch(
        "overrides",
        &format!(
            "    task \"t\" {{\n      driver = \"docker\"\n      env {{\n        FOO = \"from-task\"\n      }}\n      config {{\n        image = \"{}/tools/busybox@{digest}\"\n        entrypoint = [\"/bin/sh\"]\n        command = \"-c\"\n        args = [\"echo \\\"override FOO=$FOO\\\"; pwd; echo written > /tmp/w && cat /tmp/w\"]\n        work_dir = \"/tmp\"\n        image_pull_timeout = \"1m30.5s\"\n      }}\n    }}\n",
            registry.address
        ),
    );
    let submitted = agent.submit("overrides.hcl", &overrides).await.unwrap();
    let status = agent.finished(&submitted.alloc_ids[0]).await;
    assert_eq!(
        stdout(&status, "t"),
        "override FOO=from-task\n/tmp\nwritten\n",
        "{}\n{}",
        events(&status, "t"),
        std::fs::read_to_string(status.alloc_dir.join("alloc/logs/t.stderr.0")).unwrap_or_default()
    );
    assert_eq!(status.client_status, ClientStatus::Complete);

    // One layer in the store, pulled once for both (by tag, then by digest).
    let layers = std::fs::read_dir(agent.path().join("data/images/layers"))
        .unwrap()
        .count();
    assert_eq!(layers, 1);
}

/// Runs `argv` in task `t` of `alloc` (`alloc exec`) once the task runs: its stdout,
/// stderr and exit code.
async fn exec_when_running(
    agent: &AgentProcess,
    alloc: &str,
    argv: &[&str],
) -> (String, String, Option<i32>) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let status = agent.alloc(alloc).await;
        let running = status
            .tasks
            .get("t")
            .is_some_and(|t| t.state == berth_model::events::TaskStateKind::Running);
        if running {
            return crate::alloc_exec::exec_once(&agent.client(), alloc, "t", argv).await;
        }
        assert!(Instant::now() < deadline, "{}", events(&status, "t"));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The host's owner (uid, gid) of `path`.
fn owner(path: &std::path::Path) -> (u32, u32) {
    use std::os::unix::fs::MetadataExt as _;
    let meta =
        std::fs::symlink_metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    (meta.uid(), meta.gid())
}

#[tokio::test(flavor = "multi_thread")]
async fn root_in_an_image_is_the_tasks_own_uid_and_the_images_users_are_its_subordinate_ids() {
    let registry = Registry::start();
    let layout = OciLayout::new();
    layout.busybox(
        "app",
        &[
            (
                "etc/passwd",
                "root:x:0:0:root:/root:/bin/sh\napp:x:1000:1001::/home/app:/bin/sh\n",
                0o644,
            ),
            ("etc/group", "root:x:0:\napp:x:1001:\n", 0o644),
        ],
        &ImageSpec {
            entrypoint: &["/bin/sh", "-c"],
            cmd: &["id -u; id -g; id -G; touch /local/mine /secrets/mine /home/app/mine && echo own-dirs"],
            env: &["PATH=/bin"],
            user: Some("app"),
            ..ImageSpec::default()
        },
    );
    // The app's home, owned by it in the image.
    layout.layer("app", "app", |rootfs| {
        let home = rootfs.join("home/app");
        std::fs::create_dir_all(&home).unwrap();
        std::os::unix::fs::chown(&home, Some(1000), Some(1001)).unwrap();
    });
    registry.push(&layout, "app", "tools/app:1");
    let image = format!("{}/tools/app:1", registry.address);
    let volume = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        volume.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    std::fs::write(volume.path().join("owned-by-root"), "root's\n").unwrap();
    let mut agent = AgentProcess::with_config(&format!(
        "host_volume \"guarded\" {{\n  path = \"{}\"\n}}\n",
        volume.path().display()
    ));
    agent.start().await;

    // The image's User, from the image's own /etc/passwd: uid 1000, gid 1001, and the
    // alloc's group (65536 inside) for /alloc.
    let job = batch(
        "as-app",
        &docker_task("t", &format!("        image = \"{image}\"\n")),
    );
    let submitted = agent.submit("as-app.hcl", &job).await.unwrap();
    let status = agent.finished(&submitted.alloc_ids[0]).await;
    assert_eq!(
        stdout(&status, "t"),
        "1000\n1001\n1001 65536\nown-dirs\n",
        "{}",
        events(&status, "t")
    );

    // The job's `user` is a user of the image: root here, which is not the host's.
    let job = format!(
        r#"job "as-root" {{
  type = "batch"
  group "g" {{
    restart {{
      attempts = 0
    }}
    volume "guarded" {{
      type   = "host"
      source = "guarded"
    }}
    task "t" {{
      driver = "docker"
      user   = "root"
      volume_mount {{
        volume      = "guarded"
        destination = "/guarded"
      }}
      config {{
        image = "{image}"
        args  = ["id -u; echo mine >> /guarded/owned-by-root || echo refused; touch /etc/made && chown 1000:1001 /etc/made && echo chowned; touch /home/app/by-root && echo in-home; touch /made-at-the-root && echo at-the-root"]
      }}
    }}
  }}
}}
"#
    );
    let submitted = agent.submit("as-root.hcl", &job).await.unwrap();
    let status = agent.finished(&submitted.alloc_ids[0]).await;
    assert_eq!(
        stdout(&status, "t"),
        "0\nrefused\nchowned\nin-home\nat-the-root\n",
        "root inside owns the image's files and may chown to the image's users, and \
         is nobody to the host's\n{}",
        events(&status, "t")
    );
    assert_eq!(
        std::fs::read_to_string(volume.path().join("owned-by-root")).unwrap(),
        "root's\n"
    );
    // On the host: root's files are the task's dynamic uid (and its gid block's first),
    // the image's user 1000 one of its subordinate ids, far from every host user.
    let upper = status.alloc_dir.join("tasks/t/image/upper");
    let (root_uid, root_gid) = owner(&upper.join("made-at-the-root"));
    assert!((80_000..=89_999).contains(&root_uid), "{root_uid}");
    let block = u64::from(root_uid - 80_000) * 65_536 + 1_000_000_000;
    assert_eq!(u64::from(root_gid), block, "gid 0 is the block's first id");
    let (app_uid, app_gid) = owner(&upper.join("etc/made"));
    assert_eq!(
        (u64::from(app_uid), u64::from(app_gid)),
        (block + 1000, block + 1001)
    );
    assert_eq!(
        owner(&upper.join("home/app/by-root")),
        (root_uid, root_gid),
        "written in a dir of the image's user, copied up under its ids"
    );
    assert_eq!(owner(&upper.join("home/app")), (app_uid, app_gid));
    // `alloc exec` runs as the task runs: its user, in its namespace.
    let job = format!(
        r#"job "entered" {{
  group "g" {{
    task "t" {{
      driver = "docker"
      config {{
        image = "{image}"
        args  = ["sleep 300"]
      }}
    }}
  }}
}}
"#
    );
    let submitted = agent.submit("entered.hcl", &job).await.unwrap();
    let alloc = submitted.alloc_ids[0].clone();
    let (out, err, exit) = exec_when_running(
        &agent,
        &alloc,
        &["/bin/sh", "-c", "id -u; id -G; touch /home/app/by-exec && echo wrote; echo x > /etc/by-exec || echo not-root"],
    )
    .await;
    assert_eq!(
        (out.as_str(), exit),
        ("1000\n1001 65536\nwrote\nnot-root\n", Some(0)),
        "{err}"
    );
    let status = agent.alloc(&alloc).await;
    let made = status
        .alloc_dir
        .join("tasks/t/image/upper/home/app/by-exec");
    assert_eq!(
        owner(&made).0,
        owner(&status.alloc_dir.join("tasks/t/local")).0,
        "the task's user is its dynamic uid on the host, in the task or entering it"
    );
    let (code, _, stopped) = agent.cli(&["job", "stop", "entered"]);
    assert_eq!(code, 0, "{stopped}");

    // In a group's own network every port is the group's: root in the image binds 80
    // there, though its capabilities do not reach the namespace (the host's).
    let job = format!(
        r#"job "low-port" {{
  type = "batch"
  group "g" {{
    network {{
      mode = "bridge"
    }}
    restart {{
      attempts = 0
    }}
    task "t" {{
      driver = "docker"
      user   = "root"
      config {{
        image = "{image}"
        args  = ["httpd -p 80 -h /etc && echo bound"]
      }}
    }}
  }}
}}
"#
    );
    let submitted = agent.submit("low-port.hcl", &job).await.unwrap();
    let status = agent.finished(&submitted.alloc_ids[0]).await;
    assert_eq!(
        stdout(&status, "t"),
        "bound\n",
        "{}\n{}",
        events(&status, "t"),
        std::fs::read_to_string(status.alloc_dir.join("alloc/logs/t.stderr.0")).unwrap_or_default()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_wrong_digest_or_an_unknown_image_fails_the_task_with_an_event_that_says_so() {
    let registry = Registry::start();
    let layout = OciLayout::new();
    base_image(&layout);
    registry.push(&layout, "base", "tools/busybox:1");
    let mut agent = AgentProcess::new();
    agent.start().await;

    let wrong = format!("sha256:{}", "ab".repeat(32));
    for (name, image, expect) in [
        (
            "wrong-digest",
            format!("{}/tools/busybox@{wrong}", registry.address),
            "404",
        ),
        (
            "unknown",
            format!("{}/tools/nothing:1", registry.address),
            "404",
        ),
        ("odd", "Busy..Box".to_string(), "reference"),
    ] {
        let job = batch(
            name,
            &docker_task("t", &format!("        image = \"{image}\"\n")),
        );
        let submitted = agent.submit(&format!("{name}.hcl"), &job).await.unwrap();
        let status = agent.finished(&submitted.alloc_ids[0]).await;
        assert_eq!(status.client_status, ClientStatus::Failed, "{name}");
        let said = events(&status, "t");
        assert!(said.contains(expect), "{name}: {said}");
    }
    let store = agent.path().join("data/images");
    assert_eq!(std::fs::read_dir(store.join("layers")).unwrap().count(), 0);
    assert_eq!(staged(&store), 0);
}

/// What is staged in the store's `tmp/`: each open store's own directory's entries
/// (the agent's is there, empty, while it runs).
fn staged(store: &std::path::Path) -> usize {
    std::fs::read_dir(store.join("tmp"))
        .unwrap()
        .map(|entry| {
            let path = entry.unwrap().path();
            std::fs::read_dir(&path).map_or(1, |inside| inside.count())
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread")]
async fn two_images_that_share_a_layer_unpack_it_once_and_a_port_and_a_volume_reach_the_task() {
    let registry = Registry::start();
    let layout = OciLayout::new();
    base_image(&layout);
    layout.on_top(
        "base",
        "web",
        &[("www/index.html", "served from the image\n", 0o644)],
        &ImageSpec::default(),
    );
    registry.push(&layout, "base", "tools/busybox:1");
    registry.push(&layout, "web", "tools/web:1");

    let volume = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        volume.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    std::fs::write(volume.path().join("owned-by-root"), "root's\n").unwrap();
    std::fs::write(volume.path().join("shared"), "from the host\n").unwrap();
    let mut agent = AgentProcess::with_config(&format!(
        "host_volume \"shared\" {{\n  path = \"{}\"\n}}\n",
        volume.path().display()
    ));
    agent.start().await;
    let port = berth_testkit::etcd::free_port();
    let job = format!(
        r#"job "web" {{
  group "g" {{
    network {{
      port "http" {{
        static = {port}
      }}
    }}
    volume "shared" {{
      type   = "host"
      source = "shared"
    }}
    task "web" {{
      driver = "docker"
      config {{
        image   = "{registry}/tools/web:1"
        entrypoint = ["/bin/httpd"]
        args       = ["-f", "-p", "${{NOMAD_PORT_http}}", "-h", "/www"]
        ports   = ["http"]
      }}
    }}
    task "tools" {{
      driver = "docker"
      volume_mount {{
        volume      = "shared"
        destination = "/shared"
      }}
      config {{
        image = "{registry}/tools/busybox:1"
        args  = ["cat /shared/shared; echo mine > /shared/owned-by-root || echo refused; sleep 300"]
      }}
    }}
  }}
}}
"#,
        registry = registry.address
    );
    let submitted = agent.submit("web.hcl", &job).await.unwrap();
    let alloc = submitted.alloc_ids[0].clone();
    // The web task's own network (Docker's default) forwards the port from the host's
    // addresses, not its loopback.
    let host = crate::bridge_network::host_address();
    let deadline = Instant::now() + Duration::from_secs(60);
    let page = loop {
        let page = std::process::Command::new("curl")
            .args(["-sf", &format!("http://{host}:{port}/index.html")])
            .output()
            .unwrap();
        if page.status.success() {
            break String::from_utf8(page.stdout).unwrap();
        }
        let status = agent.alloc(&alloc).await;
        assert!(
            Instant::now() < deadline && !status.client_status.is_terminal(),
            "{status:#?}\n{}\n{}",
            std::fs::read_to_string(status.alloc_dir.join("alloc/logs/web.stderr.0"))
                .unwrap_or_default(),
            agent.output()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(page, "served from the image\n");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = agent.task_stdout(&alloc, "tools");
        if out.contains("refused") || out.contains("mine") {
            assert_eq!(out, "from the host\nrefused\n");
            break;
        }
        assert!(Instant::now() < deadline, "{out}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        std::fs::read_to_string(volume.path().join("owned-by-root")).unwrap(),
        "root's\n",
        "a host file the task may not write is unchanged"
    );
    // The base layer once, the web image's own layer once.
    let layers = std::fs::read_dir(agent.path().join("data/images/layers"))
        .unwrap()
        .count();
    assert_eq!(layers, 2);
}

/// An OCI layout's blob by digest.
fn blob(layout: &std::path::Path, digest: &str) -> Vec<u8> {
    std::fs::read(layout.join("blobs/sha256").join(&digest["sha256:".len()..])).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn images_load_from_an_oci_archive_and_a_docker_save_archive_and_run_with_no_registry() {
    let layout = OciLayout::new();
    base_image(&layout);
    let work = tempfile::tempdir().unwrap();
    // An OCI layout archive, as `skopeo copy … oci-archive:` writes one.
    let oci_archive = work.path().join("oci.tar");
    let tar = std::process::Command::new("tar")
        .arg("-cf")
        .arg(&oci_archive)
        .arg("-C")
        .arg(layout.path())
        .arg(".")
        .status()
        .unwrap();
    assert!(tar.success());
    // The same image as `docker save` writes it: manifest.json, the config, and each
    // layer as a plain tar in a directory of its own.
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(layout.path().join("index.json")).unwrap()).unwrap();
    let manifest_digest = index["manifests"][0]["digest"].as_str().unwrap();
    let manifest: serde_json::Value =
        serde_json::from_slice(&blob(&layout.path(), manifest_digest)).unwrap();
    let saved = work.path().join("saved");
    std::fs::create_dir_all(saved.join("l0")).unwrap();
    std::fs::write(
        saved.join("config.json"),
        blob(
            &layout.path(),
            manifest["config"]["digest"].as_str().unwrap(),
        ),
    )
    .unwrap();
    let gzipped = layout
        .path()
        .join("blobs/sha256")
        .join(&manifest["layers"][0]["digest"].as_str().unwrap()["sha256:".len()..]);
    let plain = std::process::Command::new("gzip")
        .arg("-dc")
        .arg(gzipped)
        .output()
        .unwrap();
    assert!(plain.status.success());
    std::fs::write(saved.join("l0/layer.tar"), plain.stdout).unwrap();
    std::fs::write(
        saved.join("manifest.json"),
        r#"[{"Config":"config.json","RepoTags":["saved/busybox:2"],"Layers":["l0/layer.tar"]}]"#,
    )
    .unwrap();
    let docker_archive = work.path().join("docker.tar");
    let tar = std::process::Command::new("tar")
        .arg("-cf")
        .arg(&docker_archive)
        .arg("-C")
        .arg(&saved)
        .arg(".")
        .status()
        .unwrap();
    assert!(tar.success());

    let mut agent = AgentProcess::new();
    // The OCI layout names its image `base` only: a tag with no repository, so the
    // reference is given.
    let (code, _, stderr) = agent.cli(&["image", "load", oci_archive.to_str().unwrap()]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("tags no image"), "{stderr}");
    let (code, out, stderr) = agent.cli(&[
        "image",
        "load",
        oci_archive.to_str().unwrap(),
        "local/busybox:1",
    ]);
    assert_eq!(code, 0, "{stderr}");
    assert!(out.contains("loaded docker.io/local/busybox:1"), "{out}");
    let (code, out, stderr) = agent.cli(&["image", "load", docker_archive.to_str().unwrap()]);
    assert_eq!(code, 0, "{stderr}");
    assert!(out.contains("loaded docker.io/saved/busybox:2"), "{out}");
    let (_, listed, _) = agent.cli(&["image", "list"]);
    assert!(
        listed.contains("docker.io/local/busybox:1")
            && listed.contains("docker.io/saved/busybox:2"),
        "{listed}"
    );
    // A layer that is not what the archive says is refused.
    let lying = work.path().join("lying");
    std::fs::create_dir_all(&lying).unwrap();
    let copy = std::process::Command::new("cp")
        .arg("-a")
        .arg(format!("{}/.", layout.path().display()))
        .arg(&lying)
        .status()
        .unwrap();
    assert!(copy.success());
    let layer_digest = manifest["layers"][0]["digest"].as_str().unwrap();
    std::fs::write(
        lying
            .join("blobs/sha256")
            .join(&layer_digest["sha256:".len()..]),
        b"not the layer",
    )
    .unwrap();
    let lying_archive = work.path().join("lying.tar");
    let tar = std::process::Command::new("tar")
        .arg("-cf")
        .arg(&lying_archive)
        .arg("-C")
        .arg(&lying)
        .arg(".")
        .status()
        .unwrap();
    assert!(tar.success());
    let (code, _, stderr) = agent.cli(&[
        "image",
        "load",
        lying_archive.to_str().unwrap(),
        "local/lying:1",
    ]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("does not match its digest"), "{stderr}");

    // No registry anywhere: both run from the store.
    agent.start().await;
    for image in ["local/busybox:1", "saved/busybox:2"] {
        let job = batch(
            "loaded",
            &docker_task("t", &format!("        image = \"{image}\"\n")),
        );
        let submitted = agent.submit("loaded.hcl", &job).await.unwrap();
        let status = agent.finished(&submitted.alloc_ids[0]).await;
        assert!(
            stdout(&status, "t").starts_with("default FOO=from-image\n/data\n"),
            "{image}: {}",
            events(&status, "t")
        );
    }
    // Two layers: `docker save` writes the layer as a plain tar, which is its own blob
    // (its digest is the image's diff id), not the gzipped one the layout holds.
    let layers = std::fs::read_dir(agent.path().join("data/images/layers"))
        .unwrap()
        .count();
    assert_eq!(layers, 2);

    // `image rm`: refused while a task's dir stands on the image (the second job's: the
    // first's alloc went when the job changed); an unused tag goes, and a layer a task
    // uses stays.
    let (code, _, stderr) = agent.cli(&["image", "rm", "saved/busybox:2"]);
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("is used by a task on this node"),
        "{stderr}"
    );
    let (code, _, stderr) = agent.cli(&[
        "image",
        "load",
        oci_archive.to_str().unwrap(),
        "unused/busybox:3",
    ]);
    assert_eq!(code, 0, "{stderr}");
    // The same image as local/busybox:1: only the tag goes.
    let (code, out, stderr) = agent.cli(&["image", "rm", "unused/busybox:3"]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        out.trim(),
        "untagged docker.io/unused/busybox:3 (the image has other tags)"
    );
    // Then the image, and its layer, which no task stands on now.
    let (code, out, stderr) = agent.cli(&["image", "rm", "local/busybox:1"]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        out.trim(),
        "removed docker.io/local/busybox:1 (1 layers only it had)"
    );
    let (_, list, _) = agent.cli(&["image", "list"]);
    assert!(
        !list.contains("busybox:1") && !list.contains("busybox:3"),
        "{list}"
    );
    assert!(list.contains("saved/busybox:2"), "{list}");
    let layers = std::fs::read_dir(agent.path().join("data/images/layers"))
        .unwrap()
        .count();
    assert_eq!(layers, 1, "the saved image's layer stays");
}

/// A loopback TCP proxy to `target` whose answers trickle at about `bytes_per_second`
/// while `slow` is set: a registry on a slow link.
fn slow_proxy(
    target: String,
    bytes_per_second: usize,
    slow: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> String {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for client in listener.incoming().flatten() {
            let Ok(server) = std::net::TcpStream::connect(&target) else {
                continue;
            };
            let (mut to_server, mut from_client) = (server.try_clone().unwrap(), client);
            let mut to_client = from_client.try_clone().unwrap();
            let mut from_server = server;
            std::thread::spawn(move || std::io::copy(&mut from_client, &mut to_server));
            let slow = slow.clone();
            std::thread::spawn(move || {
                let mut buffer = vec![0u8; bytes_per_second / 10];
                while let Ok(read) = from_server.read(&mut buffer) {
                    if read == 0 || to_client.write_all(&buffer[..read]).is_err() {
                        break;
                    }
                    if slow.load(std::sync::atomic::Ordering::Relaxed) {
                        std::thread::sleep(Duration::from_millis(100));
                    }
                }
                let _ = to_client.shutdown(std::net::Shutdown::Both);
            });
        }
    });
    address
}

#[tokio::test(flavor = "multi_thread")]
async fn an_agent_killed_during_a_pull_leaves_no_partial_layer_and_the_task_starts_after_restart() {
    let registry = Registry::start();
    let layout = OciLayout::new();
    base_image(&layout);
    // 4 MiB that do not compress: some seconds at the proxy's pace.
    layout.layer("base", "big", |root| {
        let mut noise = vec![0u8; 4 << 20];
        rustix::rand::getrandom(&mut noise, rustix::rand::GetRandomFlags::empty()).unwrap();
        std::fs::write(root.join("data/noise"), noise).unwrap();
    });
    registry.push(&layout, "big", "tools/big:1");
    let slow = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let proxy = slow_proxy(registry.address.clone(), 256 << 10, slow.clone());

    let mut agent = AgentProcess::new();
    agent.start().await;
    let job = batch(
        "big",
        &docker_task("t", &format!("        image = \"{proxy}/tools/big:1\"\n")),
    );
    let submitted = agent.submit("big.hcl", &job).await.unwrap();
    let alloc = submitted.alloc_ids[0].clone();
    let store = agent.path().join("data/images");
    // Killed while a layer is downloading (something in tmp/, the record not written).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let downloading = store.join("tmp").is_dir() && staged(&store) > 0;
        let layers = std::fs::read_dir(store.join("layers"))
            .map(|d| d.count())
            .unwrap_or(0);
        if downloading || layers > 0 {
            break;
        }
        assert!(Instant::now() < deadline, "{}", agent.output());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    agent.kill9();
    assert_eq!(
        std::fs::read_dir(store.join("manifests")).unwrap().count(),
        0,
        "no image is recorded before all its layers are in the store"
    );

    // The link is fast again; the restarted agent empties tmp/ and pulls what is missing.
    slow.store(false, std::sync::atomic::Ordering::Relaxed);
    agent.start().await;
    let status = agent.finished(&alloc).await;
    assert_eq!(
        status.client_status,
        ClientStatus::Complete,
        "{}\n{}",
        events(&status, "t"),
        agent.output()
    );
    assert!(stdout(&status, "t").starts_with("default FOO=from-image\n"));
    assert_eq!(staged(&store), 0, "what the killed agent staged is gone");
    assert_eq!(std::fs::read_dir(store.join("layers")).unwrap().count(), 2);
}

/// The `CapEff` line of a task's `/proc/self/status`, as bits.
fn effective_capabilities(status: &str) -> Option<u64> {
    let hex = status
        .lines()
        .find_map(|line| line.strip_prefix("CapEff:"))?;
    u64::from_str_radix(hex.trim(), 16).ok()
}

#[tokio::test(flavor = "multi_thread")]
async fn cap_drop_and_cap_add_change_a_tasks_capabilities_within_what_the_operator_allows() {
    use berth_sys::process::confine::TASK_CAPABILITIES;
    use rustix::thread::CapabilitySet;
    let registry = Registry::start();
    let layout = OciLayout::new();
    base_image(&layout);
    registry.push(&layout, "base", "tools/busybox:1");
    let image = format!("{}/tools/busybox:1", registry.address);
    let mut agent =
        AgentProcess::with_config("image {\n  allow_caps = [\"chown\", \"CAP_FSETID\"]\n}\n");
    agent.start().await;
    let run = |name: &'static str, caps: &'static str| {
        let job = batch(
            name,
            &docker_task(
                "t",
                &format!(
                    "        image = \"{image}\"\n        args  = [\"cat /proc/self/status\"]\n{caps}"
                ),
            ),
        );
        let agent = &agent;
        async move {
            let submitted = agent.submit(&format!("{name}.hcl"), &job).await.unwrap();
            agent.finished(&submitted.alloc_ids[0]).await
        }
    };
    let status = run("default", "").await;
    assert_eq!(
        effective_capabilities(&stdout(&status, "t")),
        Some(TASK_CAPABILITIES.bits()),
        "root in the image: Nomad's exec set, in its own namespace\n{}",
        events(&status, "t")
    );
    let status = run("none", "        cap_drop = [\"all\"]\n").await;
    assert_eq!(effective_capabilities(&stdout(&status, "t")), Some(0));
    let status = run(
        "swapped",
        "        cap_drop = [\"chown\"]\n        cap_add  = [\"fsetid\"]\n",
    )
    .await;
    let mut expected = TASK_CAPABILITIES;
    expected.remove(CapabilitySet::CHOWN);
    expected.insert(CapabilitySet::FSETID);
    assert_eq!(
        effective_capabilities(&stdout(&status, "t")),
        Some(expected.bits()),
        "{}",
        events(&status, "t")
    );
    // Docker's default set, but not the operator's allow_caps: refused at the start.
    let status = run("not-allowed", "        cap_add = [\"mknod\"]\n").await;
    assert_eq!(status.client_status, ClientStatus::Failed);
    assert!(
        events(&status, "t").contains(
            "CAP_MKNOD (cap_add) is not among the capabilities the operator lets jobs add"
        ),
        "{}",
        events(&status, "t")
    );
    assert_eq!(stdout(&status, "t"), "");
    // A command run inside the task (alloc exec, a check) has no more than the task.
    let job = format!(
        "job \"kept\" {{\n  group \"g\" {{\n    task \"t\" {{\n      driver = \"docker\"\n      config {{\n        image = \"{image}\"\n        args  = [\"sleep 300\"]\n        cap_drop = [\"chown\"]\n      }}\n    }}\n  }}\n}}\n"
    );
    let submitted = agent.submit("kept.hcl", &job).await.unwrap();
    let alloc = submitted.alloc_ids[0].clone();
    let (out, err, _) = exec_when_running(&agent, &alloc, &["/bin/cat", "/proc/self/status"]).await;
    let mut without_chown = TASK_CAPABILITIES;
    without_chown.remove(CapabilitySet::CHOWN);
    assert_eq!(
        effective_capabilities(&out),
        Some(without_chown.bits()),
        "{err}"
    );
    let (code, _, stopped) = agent.cli(&["job", "stop", "kept"]);
    assert_eq!(code, 0, "{stopped}");

    // What no task in its own user namespace could use: refused at submit.
    let job = batch(
        "net-admin",
        &docker_task(
            "t",
            &format!("        image = \"{image}\"\n        cap_add = [\"NET_ADMIN\"]\n"),
        ),
    );
    let refused = format!(
        "{:?}",
        agent.submit("net-admin.hcl", &job).await.unwrap_err()
    );
    assert!(
        refused.contains("cap_add \\\"NET_ADMIN\\\" is not one berth gives"),
        "{refused}"
    );
}

/// A proxy to `target` whose first `failures` connections get a 503 (and are closed).
fn failing_proxy(target: String, failures: usize) -> String {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for (n, mut client) in listener.incoming().flatten().enumerate() {
            if n < failures {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && client.read(&mut byte).is_ok_and(|r| r == 1) {
                    head.push(byte[0]);
                }
                let _ = client.write_all(
                    b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                );
                continue;
            }
            let Ok(server) = std::net::TcpStream::connect(&target) else {
                continue;
            };
            let (mut to_server, mut from_client) = (server.try_clone().unwrap(), client);
            let (mut to_client, mut from_server) = (from_client.try_clone().unwrap(), server);
            std::thread::spawn(move || std::io::copy(&mut from_client, &mut to_server));
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut from_server, &mut to_client);
                let _ = to_client.shutdown(std::net::Shutdown::Both);
            });
        }
    });
    address
}

#[tokio::test(flavor = "multi_thread")]
async fn a_registry_that_fails_for_a_while_is_tried_again_and_one_that_keeps_failing_is_given_up() {
    let registry = Registry::start();
    let layout = OciLayout::new();
    base_image(&layout);
    registry.push(&layout, "base", "tools/busybox:1");
    let mut agent = AgentProcess::new();
    agent.start().await;
    let retries = |status: &AllocStatus| -> Vec<String> {
        status.tasks["t"]
            .events
            .iter()
            .filter(|e| e.message.starts_with("Attempt "))
            .map(|e| e.message.clone())
            .collect()
    };

    // Two 503s, then the registry: the third attempt pulls, after 1s and 2s.
    let flaky = failing_proxy(registry.address.clone(), 2);
    let job = batch(
        "flaky",
        &docker_task(
            "t",
            &format!("        image = \"{flaky}/tools/busybox:1\"\n"),
        ),
    );
    let submitted = agent.submit("flaky.hcl", &job).await.unwrap();
    let status = agent.finished(&submitted.alloc_ids[0]).await;
    assert_eq!(
        status.client_status,
        ClientStatus::Complete,
        "{}",
        events(&status, "t")
    );
    let retried = retries(&status);
    assert_eq!(retried.len(), 2, "{retried:?}");
    assert!(
        retried[0].starts_with("Attempt 1 of 3 failed: pulling ")
            && retried[0].contains("503")
            && retried[0].ends_with("; trying again in 1s"),
        "{retried:?}"
    );
    assert!(retried[1].ends_with("; trying again in 2s"), "{retried:?}");

    // Always 503: three attempts, then a failure that says so.
    let down = failing_proxy(registry.address.clone(), usize::MAX);
    let job = batch(
        "down",
        &docker_task(
            "t",
            &format!("        image = \"{down}/tools/busybox:1\"\n"),
        ),
    );
    let submitted = agent.submit("down.hcl", &job).await.unwrap();
    let status = agent.finished(&submitted.alloc_ids[0]).await;
    assert_eq!(status.client_status, ClientStatus::Failed);
    assert_eq!(retries(&status).len(), 2);
    let all = events(&status, "t");
    assert!(
        all.contains("503") && all.contains("(gave up after 3 attempts)"),
        "{all}"
    );

    // A refusal is not tried again: an unknown image fails at once.
    let job = batch(
        "unknown",
        &docker_task(
            "t",
            &format!("        image = \"{}/tools/none:1\"\n", registry.address),
        ),
    );
    let submitted = agent.submit("unknown.hcl", &job).await.unwrap();
    let status = agent.finished(&submitted.alloc_ids[0]).await;
    assert_eq!(status.client_status, ClientStatus::Failed);
    assert!(retries(&status).is_empty(), "{}", events(&status, "t"));
}

#[tokio::test(flavor = "multi_thread")]
async fn the_operators_docker_config_gives_credentials_to_jobs_without_auth() {
    use base64::Engine as _;
    let registry = Registry::with_credentials("deploy", "s3cret-pass");
    let layout = OciLayout::new();
    base_image(&layout);
    registry.push(&layout, "base", "team/private:1");
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.json");
    let auth = base64::engine::general_purpose::STANDARD.encode("deploy:s3cret-pass");
    std::fs::write(
        &config,
        format!(
            "{{\"auths\": {{\"http://{}\": {{\"auth\": \"{auth}\"}}}}}}",
            registry.address
        ),
    )
    .unwrap();
    let mut agent = AgentProcess::with_config(&format!(
        "image {{\n  auth_config = \"{}\"\n}}\n",
        config.display()
    ));
    agent.start().await;
    let image = format!("{}/team/private:1", registry.address);
    let job = batch(
        "no-auth",
        &docker_task("t", &format!("        image = \"{image}\"\n")),
    );
    let submitted = agent.submit("no-auth.hcl", &job).await.unwrap();
    let status = agent.finished(&submitted.alloc_ids[0]).await;
    assert_eq!(
        status.client_status,
        ClientStatus::Complete,
        "{}",
        events(&status, "t")
    );
    // The job's own auth wins over the operator's.
    let job = batch(
        "own-auth",
        &docker_task(
            "t",
            &format!(
                "        image = \"{image}\"\n        force_pull = true\n        auth {{\n          username = \"deploy\"\n          password = \"wrong\"\n        }}\n"
            ),
        ),
    );
    let submitted = agent.submit("own-auth.hcl", &job).await.unwrap();
    let status = agent.finished(&submitted.alloc_ids[0]).await;
    assert_eq!(status.client_status, ClientStatus::Failed);
    assert!(
        events(&status, "t").contains("401"),
        "{}",
        events(&status, "t")
    );
    // A config that is no config says so.
    std::fs::write(&config, "not json").unwrap();
    let job = batch(
        "broken",
        &docker_task(
            "t",
            &format!("        image = \"{image}\"\n        force_pull = true\n"),
        ),
    );
    let submitted = agent.submit("broken.hcl", &job).await.unwrap();
    let status = agent.finished(&submitted.alloc_ids[0]).await;
    let said = events(&status, "t");
    assert!(
        said.contains(&format!(
            "the agent's image {{ auth_config }} file {}: is not Docker's config.json",
            config.display()
        )),
        "{said}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_private_image_in_the_store_runs_only_for_jobs_the_registry_gives_it_to() {
    let registry = Registry::with_credentials("deploy", "s3cret-pass");
    let layout = OciLayout::new();
    base_image(&layout);
    registry.push(&layout, "base", "team/private:1");
    let mut agent = AgentProcess::new();
    agent.start().await;
    let image = format!("{}/team/private:1", registry.address);
    let with_auth = |password: &str| {
        format!(
            "        image = \"{image}\"\n        auth {{\n          username = \"deploy\"\n          password = \"{password}\"\n        }}\n"
        )
    };
    let cases = [
        ("owner", with_auth("s3cret-pass"), true),
        // The image is in the store now; these jobs still cannot have it.
        ("anonymous", format!("        image = \"{image}\"\n"), false),
        ("guessing", with_auth("wrong"), false),
        ("owner-again", with_auth("s3cret-pass"), true),
    ];
    for (name, config, runs) in cases {
        let job = batch(name, &docker_task("t", &config));
        let submitted = agent.submit(&format!("{name}.hcl"), &job).await.unwrap();
        let status = agent.finished(&submitted.alloc_ids[0]).await;
        let said = events(&status, "t");
        if runs {
            assert_eq!(
                status.client_status,
                ClientStatus::Complete,
                "{name}: {said}"
            );
        } else {
            assert_eq!(status.client_status, ClientStatus::Failed, "{name}: {said}");
            assert!(said.contains("401"), "{name}: {said}");
            assert_eq!(stdout(&status, "t"), "", "{name}");
        }
    }
}

/// The digest of the (only) layer of `tag` in `layout`.
fn only_layer(layout: &OciLayout, tag: &str) -> String {
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(layout.path().join("index.json")).unwrap()).unwrap();
    let manifest = index["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["annotations"]["org.opencontainers.image.ref.name"] == tag)
        .unwrap()["digest"]
        .as_str()
        .unwrap()
        .to_string();
    let manifest: serde_json::Value =
        serde_json::from_slice(&blob(&layout.path(), &manifest)).unwrap();
    manifest["layers"][0]["digest"]
        .as_str()
        .unwrap()
        .to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_private_layer_in_the_store_is_not_given_to_a_manifest_that_only_names_it() {
    let private = Registry::with_credentials("deploy", "s3cret-pass");
    let layout = OciLayout::new();
    base_image(&layout);
    private.push(&layout, "base", "team/private:1");
    // A registry whose manifest names the private layer without having its bytes.
    let lister = Registry::start();
    lister.push(&layout, "base", "thief/copy:1");
    lister.forget_blob(&only_layer(&layout, "base"));
    // And one that has them: an honest public copy of the same image.
    let public = Registry::start();
    public.push(&layout, "base", "mirror/busybox:1");

    let mut agent = AgentProcess::new();
    agent.start().await;
    let run = |name: &'static str, config: String| {
        let agent = &agent;
        async move {
            let job = batch(name, &docker_task("t", &config));
            let submitted = agent.submit(&format!("{name}.hcl"), &job).await.unwrap();
            agent.finished(&submitted.alloc_ids[0]).await
        }
    };
    let owner = run(
        "owner",
        format!(
            "        image = \"{}/team/private:1\"\n        auth {{\n          username = \"deploy\"\n          password = \"s3cret-pass\"\n        }}\n",
            private.address
        ),
    )
    .await;
    assert_eq!(
        owner.client_status,
        ClientStatus::Complete,
        "{}",
        events(&owner, "t")
    );
    let thief = run(
        "thief",
        format!("        image = \"{}/thief/copy:1\"\n", lister.address),
    )
    .await;
    assert_eq!(
        thief.client_status,
        ClientStatus::Failed,
        "{}",
        events(&thief, "t")
    );
    assert_eq!(stdout(&thief, "t"), "");
    // A registry that has the bytes shows it by serving them: its image runs.
    let mirror = run(
        "mirror",
        format!("        image = \"{}/mirror/busybox:1\"\n", public.address),
    )
    .await;
    assert_eq!(
        mirror.client_status,
        ClientStatus::Complete,
        "{}",
        events(&mirror, "t")
    );
}
