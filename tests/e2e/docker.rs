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
    let uid: u32 = lines[3].parse().unwrap();
    assert!(
        (80_000..=89_999).contains(&uid),
        "root in no image is root on the host: runs as its own uid, {uid}"
    );
    assert_eq!(&lines[4..7], ["/alloc", "/local", "/secrets"]);
    assert_eq!(lines[7], format!("alloc {}", status.id));
    assert_eq!(status.client_status, ClientStatus::Complete);

    // Nomad's overrides: entrypoint, command with args, work_dir, the task's env over
    // the image's; and the same image by its digest.
    let overrides = batch(
        "overrides",
        &format!(
            "    task \"t\" {{\n      driver = \"docker\"\n      env {{\n        FOO = \"from-task\"\n      }}\n      config {{\n        image = \"{}/tools/busybox@{digest}\"\n        entrypoint = [\"/bin/sh\"]\n        command = \"-c\"\n        args = [\"echo \\\"override FOO=$FOO\\\"; pwd; echo written > /tmp/w && cat /tmp/w\"]\n        work_dir = \"/tmp\"\n      }}\n    }}\n",
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
    assert_eq!(std::fs::read_dir(store.join("tmp")).unwrap().count(), 0);
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
    let deadline = Instant::now() + Duration::from_secs(60);
    let page = loop {
        let page = std::process::Command::new("curl")
            .args(["-sf", &format!("http://127.0.0.1:{port}/index.html")])
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
