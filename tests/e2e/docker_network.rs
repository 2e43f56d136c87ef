//! Docker's default network for a docker task in a host-mode group, as Nomad's docker
//! driver gives it: a namespace of the task's own on the node's bridge, the group ports
//! its `ports` names forwarded from their host port to their `to`, its own `hosts` and
//! `resolv.conf`; `network_mode = "host"` keeps a task on the host's network. Kept
//! across an agent's kill -9, gone with the alloc.

use std::path::Path;
use std::time::{Duration, Instant};

use berth_harness::AgentProcess;
use berth_model::status::ClientStatus;
use berth_testkit::registry::{ImageSpec, OciLayout, Registry};

use crate::bridge_network::{cni_chains, host_address, leftovers};

/// What a task prints of its network, then (for the web task) serves `/www`.
const SAYS: &str = "echo \"port=$NOMAD_PORT_http host=$NOMAD_HOST_PORT_http\"; \
    echo \"netns=$(readlink /proc/self/ns/net)\"; \
    links=; while read -r line; do case $line in *:*) links=\"$links${line%%:*},\";; esac; done < /proc/net/dev; \
    echo \"links=$links\"; \
    if grep -q \"${NOMAD_ALLOC_ID%%-*}\" /etc/hosts; then echo hosts=own; else echo hosts=other; fi";

/// A registry on loopback holding `tools/<tag>:1`: busybox with `files`, `/bin/sh -c` as
/// its entrypoint and `cmd` as its Cmd.
fn shell_image(tag: &str, files: &[(&str, &str, u32)], cmd: &[&str]) -> Registry {
    let registry = Registry::start();
    let layout = OciLayout::new();
    layout.busybox(
        tag,
        files,
        &ImageSpec {
            entrypoint: &["/bin/sh", "-c"],
            cmd,
            env: &["PATH=/bin"],
            working_dir: None,
            user: None,
        },
    );
    registry.push(&layout, tag, &format!("tools/{tag}:1"));
    registry
}

fn line(stdout: &str, key: &str) -> Option<String> {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .map(str::to_string)
}

/// The namespace file's inode, as `readlink /proc/<pid>/ns/net` names it.
fn namespace_of(path: &Path) -> String {
    use std::os::unix::fs::MetadataExt as _;
    format!("net:[{}]", std::fs::metadata(path).unwrap().ino())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_docker_task_in_a_host_mode_group_has_its_own_network_with_its_ports_forwarded_to_their_to()
 {
    assert!(
        Path::new("/usr/lib/cni/bridge").is_file(),
        "the CNI reference plugins are needed: apt-get install containernetworking-plugins iptables"
    );
    let registry = shell_image(
        "web",
        &[("www/index.html", "served from its own network\n", 0o644)],
        &[],
    );
    let mut agent = AgentProcess::new();
    agent.start().await;
    let job = format!(
        r#"job "web" {{
  group "g" {{
    network {{
      port "http" {{
        to = 8080
      }}
      port "admin" {{}}
    }}
    task "web" {{
      driver = "docker"
      config {{
        image = "{registry}/tools/web:1"
        args  = ["{SAYS}; exec httpd -f -p $NOMAD_PORT_http -h /www"]
        ports = ["http"]
      }}
      service {{
        name     = "web"
        port     = "http"
        provider = "nomad"
        check {{
          type     = "http"
          path     = "/index.html"
          interval = "1s"
          timeout  = "2s"
        }}
      }}
    }}
    task "beside" {{
      driver = "docker"
      config {{
        image        = "{registry}/tools/web:1"
        args         = ["{SAYS}; exec sleep 600"]
        network_mode = "host"
      }}
    }}
  }}
}}
"#,
        registry = registry.address,
        // An HCL string: quotes and backslashes escaped, `${` written `$${`.
        SAYS = SAYS
            .replace('\\', "\\\\")
            .replace('"', "\\\"")
            .replace("${", "$${"),
    );
    let submitted = agent.submit("web.hcl", &job).await.unwrap();
    let alloc = submitted.alloc_ids[0].clone();
    let deadline = Instant::now() + Duration::from_secs(60);
    let (web, beside) = loop {
        let web = agent.task_stdout(&alloc, "web");
        let beside = agent.task_stdout(&alloc, "beside");
        if web.contains("hosts=") && beside.contains("hosts=") {
            break (web, beside);
        }
        let status = agent.alloc(&alloc).await;
        assert!(
            Instant::now() < deadline && !status.client_status.is_terminal(),
            "{status:#?}\n{}",
            agent.output()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // The web task listens on its `to`, inside a namespace of its own: its loopback and
    // its eth0, the one /run/netns/<alloc>.0 keeps, and its own hosts file.
    let namespace = format!("{alloc}.0");
    let netns = Path::new("/run/netns").join(&namespace);
    let host_port: u16 = line(&web, "port=8080 host")
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("{web}"));
    assert_eq!(line(&web, "links").as_deref(), Some("lo,eth0,"), "{web}");
    assert_eq!(line(&web, "netns"), Some(namespace_of(&netns)), "{web}");
    assert_eq!(line(&web, "hosts").as_deref(), Some("own"), "{web}");
    // The task beside it asked for the host's network, and has it.
    let ours = std::fs::read_link("/proc/self/ns/net").unwrap();
    assert_eq!(line(&beside, "netns").as_deref(), ours.to_str(), "{beside}");
    assert_eq!(line(&beside, "hosts").as_deref(), Some("other"), "{beside}");
    // Reached from outside on the host port; only `ports` is forwarded.
    let host = host_address();
    let page =
        berth_testkit::net::http_get(&format!("{host}:{host_port}"), Duration::from_secs(20));
    assert!(
        page.contains("served from its own network"),
        "{page}\n{}",
        agent.output()
    );
    // The service's check, run by the agent on the host's address and port, reaches it.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let checks: serde_json::Value = agent
            .client()
            .get(&format!("/v1/client/allocation/{alloc}/checks"))
            .await
            .unwrap();
        if checks
            .as_object()
            .is_some_and(|c| c.len() == 1 && c.values().all(|r| r["Status"] == "success"))
        {
            break;
        }
        assert!(Instant::now() < deadline, "{checks:#}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let running = leftovers(std::slice::from_ref(&namespace), &[]);
    for chain in cni_chains(&namespace) {
        assert!(
            running.iter().any(|l| l.contains(&format!(":{chain} "))),
            "{chain} not in {running:#?}"
        );
    }

    // A kill -9 of the agent: the task keeps its namespace and its forward.
    agent.kill9();
    agent.start().await;
    let page =
        berth_testkit::net::http_get(&format!("{host}:{host_port}"), Duration::from_secs(20));
    assert!(page.contains("served from its own network"), "{page}");
    assert_eq!(namespace_of(&netns), line(&web, "netns").unwrap());

    // A restart of the task finds its namespace again.
    let (code, out, err) = agent.cli(&["alloc", "restart", &alloc, "web"]);
    assert_eq!(code, 0, "{out}{err}");
    let deadline = Instant::now() + Duration::from_secs(30);
    let web = loop {
        let web = agent.task_stdout(&alloc, "web");
        if web.matches("hosts=").count() >= 2 {
            break web;
        }
        assert!(Instant::now() < deadline, "{web}\n{}", agent.output());
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let seen: Vec<&str> = web.lines().filter(|l| l.starts_with("netns=")).collect();
    assert_eq!(seen.len(), 2, "{web}");
    assert!(seen.iter().all(|l| l[6..] == namespace_of(&netns)), "{web}");
    let page =
        berth_testkit::net::http_get(&format!("{host}:{host_port}"), Duration::from_secs(20));
    assert!(page.contains("served from its own network"), "{page}");

    // A port the group does not define is refused by name, and leaves nothing.
    let wrong = format!(
        r#"job "wrong" {{
  type = "batch"
  group "g" {{
    restart {{
      attempts = 0
    }}
    network {{
      port "http" {{}}
    }}
    task "t" {{
      driver = "docker"
      config {{
        image = "{registry}/tools/web:1"
        args  = ["true"]
        ports = ["htp"]
      }}
    }}
  }}
}}
"#,
        registry = registry.address
    );
    let wrong = agent.submit("wrong.hcl", &wrong).await.unwrap().alloc_ids[0].clone();
    let status = agent.finished(&wrong).await;
    assert_eq!(status.client_status, ClientStatus::Failed);
    let said: Vec<&str> = status.tasks["t"]
        .events
        .iter()
        .map(|e| e.message.as_str())
        .collect();
    assert!(
        said.iter().any(|m| m.contains(
            "the task's own network: ports names \"htp\", which the group's network does not define (its ports: http)"
        )),
        "{said:#?}"
    );
    assert!(
        !Path::new("/run/netns").join(format!("{wrong}.0")).exists(),
        "a refused network leaves no namespace"
    );

    // The alloc's end takes the namespace, its veth, chains and lease.
    let (code, _, stderr) = agent.cli(&["job", "stop", "web"]);
    assert_eq!(code, 0, "{stderr}");
    let status = agent.finished(&alloc).await;
    assert!(status.client_status.is_terminal());
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let left = leftovers(std::slice::from_ref(&namespace), &[]);
        if left.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "{left:#?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// On a node without the CNI plugins, a docker task on Docker's default network fails
/// saying what it needs and how to do without; with `network_mode = "host"` it runs.
#[tokio::test(flavor = "multi_thread")]
async fn without_the_cni_plugins_a_docker_task_is_told_what_its_network_needs() {
    let registry = shell_image("tool", &[], &["echo ran"]);
    let empty = tempfile::tempdir().unwrap();
    let mut agent =
        AgentProcess::with_config(&format!("cni_path = \"{}\"\n", empty.path().display()));
    agent.start().await;
    let job = |name: &str, extra: &str| {
        format!(
            "job \"{name}\" {{\n  type = \"batch\"\n  group \"g\" {{\n    restart {{\n      attempts = 0\n    }}\n    task \"t\" {{\n      driver = \"docker\"\n      config {{\n        image = \"{}/tools/tool:1\"\n{extra}      }}\n    }}\n  }}\n}}\n",
            registry.address
        )
    };
    let refused = agent
        .submit("default.hcl", &job("default", ""))
        .await
        .unwrap();
    let status = agent.finished(&refused.alloc_ids[0]).await;
    assert_eq!(status.client_status, ClientStatus::Failed);
    let said: Vec<&str> = status.tasks["t"]
        .events
        .iter()
        .map(|e| e.message.as_str())
        .collect();
    assert!(
        said.iter().any(|m| m.contains("is not in the CNI path")
            && m.contains("network_mode = \"host\" keeps the task on the host's network")),
        "{said:#?}"
    );
    let host = agent
        .submit(
            "host.hcl",
            &job("host", "        network_mode = \"host\"\n"),
        )
        .await
        .unwrap();
    let status = agent.finished(&host.alloc_ids[0]).await;
    assert_eq!(status.client_status, ClientStatus::Complete, "{status:#?}");
    assert_eq!(agent.task_stdout(&host.alloc_ids[0], "t"), "ran\n");
}

/// A static port is never shared: one another job's alloc holds on the node (a dynamic
/// one included, which the scheduler does not know) is refused at placement, saying so
/// (attack review: a docker task's forward took another alloc's traffic). One the
/// operator reserved is kept off the node by the scheduler (`scenarios`).
#[tokio::test(flavor = "multi_thread")]
async fn a_static_port_another_alloc_holds_is_refused_at_placement() {
    let mut agent = AgentProcess::new();
    agent.start().await;
    let job = |name: &str, port: &str| {
        format!(
            "job \"{name}\" {{\n  group \"g\" {{\n    network {{\n      port \"http\" {{{port}}}\n    }}\n    task \"t\" {{\n      driver = \"exec\"\n      config {{\n        command = \"/bin/sh\"\n        args    = [\"-c\", \"echo $NOMAD_HOST_PORT_http; exec sleep 600\"]\n      }}\n    }}\n  }}\n}}\n"
        )
    };
    let victim = agent.run_job("victim.hcl", &job("victim", "")).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let taken: u16 = loop {
        if let Ok(port) = agent.task_stdout(&victim, "t").trim().parse() {
            break port;
        }
        assert!(Instant::now() < deadline, "{}", agent.output());
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    for (name, port, why) in [("thief", taken, "is held by another alloc on this node")] {
        let spec = job(name, &format!("\n        static = {port}\n      "));
        agent.submit(&format!("{name}.hcl"), &spec).await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let listed: serde_json::Value = agent
                .client()
                .get(&format!("/v1/job/{name}/allocations"))
                .await
                .unwrap();
            let said = listed[0]["ClientDescription"].as_str().unwrap_or_default();
            if listed[0]["ClientStatus"] == "failed" {
                assert_eq!(
                    said,
                    format!("group \"g\": static port {port} {why}"),
                    "{listed:#}"
                );
                break;
            }
            assert!(Instant::now() < deadline, "{listed:#}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// A docker task over for good (a prestart task that ran to completion) gives its own
/// network back at once, not at the alloc's end: the main task may forward the same
/// port (attack review).
#[tokio::test(flavor = "multi_thread")]
async fn a_finished_prestart_docker_task_gives_its_network_and_ports_back_to_the_main_task() {
    let registry = shell_image("web", &[("www/index.html", "the main task\n", 0o644)], &[]);
    let mut agent = AgentProcess::new();
    agent.start().await;
    let job = format!(
        r#"job "staged" {{
  group "g" {{
    network {{
      port "http" {{
        to = 8080
      }}
    }}
    task "init" {{
      driver = "docker"
      lifecycle {{
        hook    = "prestart"
        sidecar = false
      }}
      config {{
        image = "{registry}/tools/web:1"
        args  = ["echo prepared"]
        ports = ["http"]
      }}
    }}
    task "web" {{
      driver = "docker"
      config {{
        image = "{registry}/tools/web:1"
        args  = ["echo $NOMAD_HOST_PORT_http; exec httpd -f -p 8080 -h /www"]
        ports = ["http"]
      }}
    }}
  }}
}}
"#,
        registry = registry.address
    );
    let alloc = agent.run_job("staged.hcl", &job).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    let port: u16 = loop {
        if let Ok(port) = agent.task_stdout(&alloc, "web").trim().parse() {
            break port;
        }
        let status = agent.alloc(&alloc).await;
        assert!(
            Instant::now() < deadline && !status.client_status.is_terminal(),
            "{status:#?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let page = berth_testkit::net::http_get(
        &format!("{}:{port}", host_address()),
        Duration::from_secs(20),
    );
    assert_eq!(page, "the main task\n");
    assert_eq!(agent.task_stdout(&alloc, "init"), "prepared\n");
    let init = format!("{alloc}.0");
    assert!(
        leftovers(std::slice::from_ref(&init), &[]).is_empty(),
        "the prestart task's network is gone while the alloc runs"
    );
    let (code, _, stderr) = agent.cli(&["job", "stop", "staged"]);
    assert_eq!(code, 0, "{stderr}");
    agent.finished(&alloc).await;
}

/// A driver is given one network per start of a task, with the ports its first spawn
/// named: one asking other ports on its next spawn is refused (not a namespace torn down
/// and made again at each spawn), and one asking past the host's bounds too; what the
/// refused start spawned and made goes (attack review).
#[tokio::test(flavor = "multi_thread")]
async fn a_driver_asking_its_tasks_network_again_with_other_ports_or_too_many_is_refused() {
    let registry = Registry::start();
    let layout = OciLayout::new();
    layout.busybox("tool", &[], &ImageSpec::default());
    registry.push(&layout, "tool", "tools/tool:1");
    let plugins = tempfile::tempdir().unwrap();
    std::fs::copy(
        berth_builtin::test_components::IMAGE_MISBEHAVE,
        plugins.path().join("image-misbehave.wasm"),
    )
    .unwrap();
    let mut agent =
        AgentProcess::with_config(&format!("plugin_dir = \"{}\"\n", plugins.path().display()));
    agent.start().await;
    for (behave, said) in [
        (
            "other-ports",
            "driver \"image-misbehave\" asked for its task's network again with other ports",
        ),
        (
            "many-ports",
            "driver \"image-misbehave\" asked for a network forwarding more than 64 ports",
        ),
    ] {
        let job = format!(
            "job \"{behave}\" {{\n  type = \"batch\"\n  group \"g\" {{\n    restart {{\n      attempts = 0\n    }}\n    network {{\n      port \"http\" {{}}\n      port \"admin\" {{}}\n    }}\n    task \"t\" {{\n      driver = \"image-misbehave\"\n      config {{\n        image  = \"{}/tools/tool:1\"\n        behave = \"{behave}\"\n      }}\n    }}\n  }}\n}}\n",
            registry.address
        );
        let alloc = agent
            .submit(&format!("{behave}.hcl"), &job)
            .await
            .unwrap()
            .alloc_ids[0]
            .clone();
        let status = agent.finished(&alloc).await;
        assert_eq!(status.client_status, ClientStatus::Failed, "{behave}");
        let events: Vec<&str> = status.tasks["t"]
            .events
            .iter()
            .map(|e| e.message.as_str())
            .collect();
        assert!(
            events.iter().any(|m| m.contains(said)),
            "{behave}: {events:#?}"
        );
        let namespace = format!("{alloc}.0");
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let left = leftovers(std::slice::from_ref(&namespace), &[]);
            if left.is_empty() {
                break;
            }
            assert!(Instant::now() < deadline, "{behave}: {left:#?}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}
