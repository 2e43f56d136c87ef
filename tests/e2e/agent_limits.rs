//! What hostile requests cost the agent: a small jobspec that asks for gigabytes, and
//! (below) connections held open by another local user. The agent refuses, stays within
//! its budget, and keeps answering its operator.

use std::path::PathBuf;

use berth_harness::AgentProcess;

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
        berth_sys::cgroup::layout::keyed_value(&text, "oom_kill").unwrap_or(0)
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
        let Err(berth_api::client::ClientError::Api(error, _)) = refused else {
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
    let me: berth_api::AgentSelf = agent.client().get("/v1/berth/agent/self").await.unwrap();
    assert!(!me.drivers.is_empty());
    // Two refused jobspecs at once: 64 MiB each at most.
    assert!(peak < 128 << 20, "{} MiB", peak >> 20);
}

/// Opens `count` connections to `port` as `nobody`, each with half a request sent, and
/// holds them; prints `held <n>` once they are open.
const HOLDER: &str = r#"
import resource, socket, sys, time
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
port, count = int(sys.argv[1]), int(sys.argv[2])
held = []
for i in range(count):
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.send(b"GET /v1/berth/agent/self HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        held.append(s)
    except OSError:
        pass
print("held", len(held), flush=True)
time.sleep(120)
"#;

/// `nobody`, with no token, opens 20,000 connections to the TCP listener and sends half a
/// request on each: the agent keeps at most its cap of them, its descriptors stay
/// bounded, and root is answered on the Unix socket meanwhile.
#[tokio::test(flavor = "multi_thread")]
async fn root_is_answered_on_the_socket_while_nobody_holds_twenty_thousand_connections() {
    use std::io::BufRead as _;
    use std::os::unix::process::CommandExt as _;
    let mut agent = AgentProcess::production(|port, dir| {
        format!(
            "http {{\n  address = \"127.0.0.1:{port}\"\n  token_file = \"{}/api-token\"\n  header_timeout = \"60s\"\n}}\n",
            dir.display()
        )
    });
    agent.start().await;
    let mut holder = std::process::Command::new("/usr/bin/python3")
        .args(["-c", HOLDER, &agent.port().to_string(), "20000"])
        .uid(65534)
        .gid(65534)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(holder.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let descriptors = std::fs::read_dir(format!("/proc/{}/fd", agent.pid()))
        .unwrap()
        .count();
    let started = std::time::Instant::now();
    let answered: Result<berth_api::AgentSelf, _> =
        tokio::time::timeout(std::time::Duration::from_secs(10), async {
            agent.client().get("/v1/berth/agent/self").await
        })
        .await
        .expect("root got no answer on the socket within 10 s");
    let took = started.elapsed();
    let _ = holder.kill();
    let _ = holder.wait();
    assert!(line.starts_with("held "), "{line}");
    assert!(answered.is_ok(), "{answered:?}");
    eprintln!(
        "{} by nobody; the agent held {descriptors} descriptors; root answered in {took:?}",
        line.trim()
    );
    let cap = berth_model::limits::ConnectionLimits::TCP.max_connections;
    assert!(descriptors < cap + 512, "{descriptors} descriptors");
}

/// A client that sends half a request is cut at `header_timeout`; one that keeps an
/// answered connection open is cut at `idle_timeout`.
#[tokio::test(flavor = "multi_thread")]
async fn slow_and_idle_connections_are_closed_at_their_timeouts() {
    use std::io::{Read as _, Write as _};
    let mut agent = AgentProcess::production(|port, dir| {
        format!(
            "http {{\n  address = \"127.0.0.1:{port}\"\n  token_file = \"{}/api-token\"\n  header_timeout = \"1s\"\n  idle_timeout = \"2s\"\n}}\n",
            dir.display()
        )
    });
    agent.start().await;
    let token = std::fs::read_to_string(agent.path().join("api-token")).unwrap();
    let connect = || {
        let stream = std::net::TcpStream::connect(("127.0.0.1", agent.port())).unwrap();
        stream
            .set_read_timeout(Some(std::time::Duration::from_secs(30)))
            .unwrap();
        stream
    };
    // Until the server closes: what it sent, and how long that took.
    let until_closed = |mut stream: std::net::TcpStream| {
        let started = std::time::Instant::now();
        let mut seen = Vec::new();
        let mut buffer = [0u8; 4096];
        loop {
            match stream.read(&mut buffer) {
                Ok(0) | Err(_) => break,
                Ok(n) => seen.extend_from_slice(&buffer[..n]),
            }
        }
        (
            String::from_utf8_lossy(&seen).into_owned(),
            started.elapsed(),
        )
    };
    let mut slow = connect();
    slow.write_all(b"GET /v1/berth/agent/self HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        .unwrap();
    let (_, waited) = tokio::task::spawn_blocking(move || until_closed(slow))
        .await
        .unwrap();
    assert!(waited < std::time::Duration::from_secs(15), "{waited:?}");
    let mut idle = connect();
    write!(
        idle,
        "GET /v1/berth/agent/self HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nX-Berth-Token: {}\r\n\r\n",
        agent.port(),
        token.trim()
    )
    .unwrap();
    let (answer, waited) = tokio::task::spawn_blocking(move || until_closed(idle))
        .await
        .unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(
        waited >= std::time::Duration::from_secs(1) && waited < std::time::Duration::from_secs(15),
        "{waited:?}"
    );
    // Whole headers and a body that never comes: the body has its own deadline (the idle
    // timeout), as the request being answered keeps the connection from counting as idle.
    let mut stalled = connect();
    write!(
        stalled,
        "POST /v1/berth/jobs HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nX-Berth-Token: {}\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{{",
        agent.port(),
        token.trim()
    )
    .unwrap();
    let (answer, waited) = tokio::task::spawn_blocking(move || until_closed(stalled))
        .await
        .unwrap();
    // The body's deadline is 2 s. The bound leaves a loaded CI machine room (one run
    // took over 8 s there, never here) and is still far below a connection held for
    // good, which the read timeout above would end at 30 s.
    assert!(
        answer.starts_with("HTTP/1.1 400"),
        "the stalled body was not refused within {waited:?}: {answer:?}\n{}",
        agent.output()
    );
    assert!(
        waited < std::time::Duration::from_secs(20),
        "{waited:?}\n{}",
        agent.output()
    );
}

/// One client may hold `max_connections_per_client` connections (Nomad's
/// `http_max_conns_per_client`), and all of loopback is one client: past its share, a
/// connection from another loopback address lands in the reserve kept for token holders,
/// where a request without a token is answered 401 and the connection closed, and one
/// with a token is answered.
#[tokio::test(flavor = "multi_thread")]
async fn one_client_cannot_take_every_connection() {
    use std::io::{Read, Write};
    let mut agent = AgentProcess::production(|port, dir| {
        format!(
            "http {{\n  address = \"0.0.0.0:{port}\"\n  token_file = \"{}/api-token\"\n  max_connections_per_client = 3\n}}\n",
            dir.display()
        )
    });
    agent.start().await;
    let port = agent.port();
    let token = std::fs::read_to_string(agent.path().join("api-token")).unwrap();
    let from = |local: &str| {
        let socket = socket2_free_connect(local, port);
        socket
            .set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        socket
    };
    let _held: Vec<std::net::TcpStream> = (0..3)
        .map(|_| {
            let mut s = from("127.0.0.1");
            s.write_all(b"GET /v1/jobs HTTP/1.1\r\n").unwrap();
            s
        })
        .collect();
    // Let the agent accept the three before the next comes.
    std::thread::sleep(std::time::Duration::from_millis(300));
    let answer = |mut s: std::net::TcpStream, token: Option<&str>| {
        let token = token.map_or(String::new(), |t| {
            format!("X-Berth-Token: {}\r\n", t.trim())
        });
        let request =
            format!("GET /v1/agent/health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{token}\r\n");
        let _ = s.write_all(request.as_bytes());
        // Read to the end: the connection must be closed by the agent, or this times out.
        let mut answer = String::new();
        let _ = s.read_to_string(&mut answer);
        answer.to_ascii_lowercase()
    };
    let refused = answer(from("127.0.0.2"), None);
    assert!(refused.starts_with("http/1.1 401"), "{refused}");
    assert!(refused.contains("connection: close"), "{refused}");
    assert!(refused.contains("only a request with a token"), "{refused}");
    let wrong = answer(from("127.0.0.3"), Some("not-the-token-0123456789"));
    assert!(wrong.starts_with("http/1.1 403"), "{wrong}");
    let mut s = from("127.0.0.4");
    s.write_all(
        format!(
            "GET /v1/agent/health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nX-Berth-Token: {}\r\nConnection: close\r\n\r\n",
            token.trim()
        )
        .as_bytes(),
    )
    .unwrap();
    let mut answered = String::new();
    let _ = s.read_to_string(&mut answered);
    assert!(answered.starts_with("HTTP/1.1 200"), "{answered}");
}

/// A task may bind any of 127.0.0.0/8 as its source address. Connections from 12 of them,
/// 100 each (the per-client share of each address, were each its own client), all held
/// open with half a request sent, would hold every one of the listener's 1,024
/// connections; all of loopback is one client, and 64 connections are kept for token
/// holders, so each of 20 requests with a token is answered.
#[tokio::test(flavor = "multi_thread")]
async fn connections_from_many_loopback_addresses_do_not_starve_a_token_holder() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut agent = AgentProcess::production(|port, dir| {
        format!(
            "http {{\n  address = \"127.0.0.1:{port}\"\n  token_file = \"{}/api-token\"\n  header_timeout = \"60s\"\n}}\n",
            dir.display()
        )
    });
    agent.open_files_limit(8192);
    agent.start().await;
    let port = agent.port();
    let token = std::fs::read_to_string(agent.path().join("api-token")).unwrap();
    let connect = |local: String| async move {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind(format!("{local}:0").parse().unwrap()).unwrap();
        socket
            .connect(format!("127.0.0.1:{port}").parse().unwrap())
            .await
            .unwrap()
    };
    let mut held = Vec::new();
    for address in 2..14 {
        for _ in 0..100 {
            let mut stream = connect(format!("127.0.0.{address}")).await;
            // Half a request: the agent waits for the rest (header_timeout is 60 s).
            let _ = stream.write_all(b"GET /v1/jobs HTTP/1.1\r\n").await;
            held.push(stream);
        }
    }
    // Let the agent accept them all before the token holder comes.
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    let mut answered = 0;
    let mut failures = Vec::new();
    for n in 0..20 {
        let mut stream = connect(format!("127.0.0.{}", 100 + n)).await;
        let request = format!(
            "GET /v1/agent/health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nX-Berth-Token: {}\r\nConnection: close\r\n\r\n",
            token.trim()
        );
        let _ = stream.write_all(request.as_bytes()).await;
        let mut answer = Vec::new();
        let read = tokio::time::timeout(
            std::time::Duration::from_secs(10),
            stream.read_to_end(&mut answer),
        )
        .await;
        let answer = String::from_utf8_lossy(&answer).to_string();
        if answer.starts_with("HTTP/1.1 200") {
            answered += 1;
        } else {
            failures.push(format!("{read:?}: {answer:?}"));
        }
    }
    assert_eq!(
        answered,
        20,
        "token holders answered while 1,200 loopback connections were held: {failures:?}\n{}",
        agent.output()
    );
    drop(held);
}

/// A TCP connection to the agent from the local address `local` (a loopback address).
fn socket2_free_connect(local: &str, port: u16) -> std::net::TcpStream {
    // std has no bind-then-connect; a tokio socket does it (on a thread of its own, out
    // of the test's runtime), then hands the stream over.
    let local = local.to_string();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let socket = tokio::net::TcpSocket::new_v4().unwrap();
            socket.bind(format!("{local}:0").parse().unwrap()).unwrap();
            let stream = socket
                .connect(format!("127.0.0.1:{port}").parse().unwrap())
                .await
                .unwrap();
            let stream = stream.into_std().unwrap();
            stream.set_nonblocking(false).unwrap();
            stream
        })
    })
    .join()
    .unwrap()
}

/// A job's `kill_timeout` is capped by the agent's `max_kill_timeout` (Nomad's client
/// setting): a task that ignores SIGTERM under `kill_timeout = "1h"` is killed after the
/// cap, not an hour later, and the Killing event says the wait it got.
#[tokio::test(flavor = "multi_thread")]
async fn a_tasks_kill_timeout_is_capped_by_the_agents_max_kill_timeout() {
    let mut agent = AgentProcess::with_config("max_kill_timeout = \"2s\"\n");
    agent.start().await;
    let job = r#"job "stubborn" {
  group "g" {
    task "t" {
      driver       = "exec"
      kill_timeout = "1h"
      config {
        command = "/bin/sh"
        args    = ["-c", "trap '' TERM; while true; do sleep 0.2; done"]
      }
    }
  }
}
"#;
    let id = agent.submit("stubborn.hcl", job).await.unwrap().alloc_ids[0].clone();
    agent
        .wait_alloc(&id, "running", |s| {
            s.client_status == berth_model::status::ClientStatus::Running
        })
        .await;
    let asked = std::time::Instant::now();
    let (code, out, err) = agent.cli(&["job", "stop", "stubborn"]);
    assert_eq!(code, 0, "{out}{err}");
    agent
        .wait_alloc(&id, "stopped", |s| {
            matches!(
                s.client_status,
                berth_model::status::ClientStatus::Complete
                    | berth_model::status::ClientStatus::Failed
            )
        })
        .await;
    let took = asked.elapsed();
    assert!(
        took < std::time::Duration::from_secs(15),
        "the stop took {took:?}"
    );
    let status = agent.alloc(&id).await;
    let killing = status.tasks["t"]
        .events
        .iter()
        .find(|e| e.kind == berth_model::events::EventKind::Killing)
        .unwrap();
    assert_eq!(
        killing.message,
        "Sent interrupt. Waiting 2s before force killing"
    );
}
