//! `alloc exec` end to end on a production agent: a command run through `berth alloc
//! exec` sees what its task sees (its user, pid and mount namespaces, root, cgroup, and
//! confinement), not the agent's; a terminal session driven through Nomad's websocket
//! frames by a test client gets its size, its resizes, its input and its exit code; the
//! `alloc-exec` scope and job ownership guard it; and a client that goes away takes its
//! command with it.

use std::time::{Duration, Instant};

use berth_api::SubmitRequest;
use berth_api::client::{Client, WebSocket, WebSocketMessage};
use berth_client::agent::Submitted;
use berth_harness::AgentProcess;
use berth_model::status::ClientStatus;
use berth_nomad_api::exec::{
    ExecStreamingInput, ExecStreamingIoOperation, ExecStreamingOutput, TerminalSize,
};
use futures_util::{SinkExt as _, StreamExt as _};

const OWNER: &str = "owner-secret-0123456789";
const OTHER: &str = "other-secret-0123456789";
const SUBMITTER: &str = "submitter-secret-0123456789";
const VIEWER: &str = "viewer-secret-0123456789";

/// What a process sees of where it runs, on one line: its user, namespaces, root,
/// cgroup and confinement.
const SEEN: &str = "echo \"seen uid=$(id -u) pid=$(readlink /proc/self/ns/pid) \
                    mnt=$(readlink /proc/self/ns/mnt) net=$(readlink /proc/self/ns/net) \
                    root=$(stat -c %d:%i /) cgroup=$(cat /proc/self/cgroup | tr '\\n' ' ') \
                    $(grep -E '^(NoNewPrivs|Seccomp|CapEff|CapBnd):' /proc/self/status | tr -d ' \\t' | tr '\\n' ' ')\"";

fn job(name: &str) -> String {
    format!(
        r#"job "{name}" {{
  group "g" {{
    task "t" {{
      driver = "exec"
      config {{
        command = "/bin/sh"
        args    = ["-c", "{seen}; exec sleep 600"]
      }}
      resources {{
        memory = 64
      }}
    }}
    task "side" {{
      driver = "exec"
      config {{
        command = "/bin/sleep"
        args    = ["600"]
      }}
      resources {{
        memory = 32
      }}
    }}
  }}
}}
"#,
        seen = SEEN.replace('\\', "\\\\").replace('"', "\\\"")
    )
}

fn token_config(port: u16) -> String {
    let token = |name: &str, secret: &str, scope: &str| {
        format!(
            "  token \"{name}\" {{\n    secret = \"{secret}\"\n    scope  = \"{scope}\"\n  }}\n"
        )
    };
    format!(
        "http {{\n  address = \"127.0.0.1:{port}\"\n{}{}{}{}}}\n",
        token("owner", OWNER, "alloc-exec"),
        token("other", OTHER, "alloc-exec"),
        token("submitter", SUBMITTER, "submit"),
        token("viewer", VIEWER, "read"),
    )
}

fn client(agent: &AgentProcess, secret: &str) -> Client {
    Client::new(&agent.address())
        .unwrap()
        .with_token(Some(secret.to_string()))
}

/// The exec path for `argv` in task `task`.
fn exec_path(alloc: &str, task: &str, argv: &[&str], tty: bool) -> String {
    let command = serde_json::to_string(argv).unwrap();
    let escaped: String = command
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'.' | b'_' | b'-' => (b as char).to_string(),
            other => format!("%{other:02X}"),
        })
        .collect();
    format!("/v1/client/allocation/{alloc}/exec?task={task}&command={escaped}&tty={tty}")
}

async fn send(socket: &mut WebSocket, frame: ExecStreamingInput) {
    let text = serde_json::to_string(&frame).unwrap();
    socket
        .send(WebSocketMessage::Text(text.into()))
        .await
        .unwrap();
}

fn stdin(bytes: &[u8]) -> ExecStreamingInput {
    ExecStreamingInput {
        stdin: Some(ExecStreamingIoOperation {
            data: bytes.to_vec(),
            close: false,
        }),
        tty_size: None,
    }
}

fn stdin_closed() -> ExecStreamingInput {
    ExecStreamingInput {
        stdin: Some(ExecStreamingIoOperation {
            data: Vec::new(),
            close: true,
        }),
        tty_size: None,
    }
}

/// A session's output so far, and its exit code once it came.
#[derive(Default, Debug)]
struct Seen {
    stdout: String,
    stderr: String,
    exit: Option<i32>,
}

impl Seen {
    /// The end of what was seen, for a failure's message.
    fn tail(&self) -> String {
        let start = self.stdout.len().saturating_sub(600);
        let start = (start..=self.stdout.len())
            .find(|i| self.stdout.is_char_boundary(*i))
            .unwrap_or(0);
        format!(
            "stdout ...{:?} stderr {:?} exit {:?}",
            &self.stdout[start..],
            self.stderr,
            self.exit
        )
    }
}

/// Reads frames until `done` holds of what was seen (or the deadline).
async fn read_until(socket: &mut WebSocket, seen: &mut Seen, done: impl Fn(&Seen) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done(seen) {
        let left = deadline.saturating_duration_since(Instant::now());
        let message = tokio::time::timeout(left, socket.next())
            .await
            .unwrap_or_else(|_| panic!("nothing more came: {}", seen.tail()));
        let text = match message {
            Some(Ok(WebSocketMessage::Text(text))) => text,
            Some(Ok(WebSocketMessage::Close(_))) | None => {
                panic!("closed before it was done: {}", seen.tail())
            }
            Some(Ok(_)) => continue,
            Some(Err(error)) => panic!("{error}: {}", seen.tail()),
        };
        let frame: ExecStreamingOutput = serde_json::from_str(text.as_str()).unwrap();
        if let Some(out) = frame.stdout {
            seen.stdout.push_str(&String::from_utf8_lossy(&out.data));
        }
        if let Some(err) = frame.stderr {
            seen.stderr.push_str(&String::from_utf8_lossy(&err.data));
        }
        if frame.exited {
            seen.exit = Some(frame.result.unwrap().exit_code);
        }
    }
}

async fn start(agent: &mut AgentProcess, name: &str) -> String {
    agent.start().await;
    let request = SubmitRequest {
        source_name: format!("{name}.hcl"),
        source: job(name),
        variables: Default::default(),
    };
    let submitted: Submitted = client(agent, OWNER)
        .post("/v1/berth/jobs", &request)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", agent.output()));
    let alloc = submitted.alloc_ids[0].clone();
    agent
        .wait_alloc(&alloc, "running", |s| {
            s.client_status == ClientStatus::Running
        })
        .await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while !agent.task_stdout(&alloc, "t").contains("seen ") {
        assert!(
            Instant::now() < deadline,
            "the task never said what it sees"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    alloc
}

fn seen_line(text: &str) -> String {
    text.lines()
        .find_map(|l| l.strip_prefix("seen "))
        .unwrap_or_else(|| panic!("no seen line in {text:?}"))
        .to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn alloc_exec_runs_inside_the_task_and_a_terminal_session_works_over_the_websocket() {
    let mut agent = AgentProcess::production(|port, _| token_config(port));
    let alloc = start(&mut agent, "inside").await;
    let task_saw = seen_line(&agent.task_stdout(&alloc, "t"));

    // The CLI, as the operator (the socket): what the command sees is what the task
    // sees, and not the agent's.
    let (code, out, err) =
        agent.cli(&["alloc", "exec", "-task", "t", &alloc, "/bin/sh", "-c", SEEN]);
    assert_eq!(code, 0, "{out}{err}");
    let exec_saw = seen_line(&out);
    assert_eq!(exec_saw, task_saw);
    for confined in ["NoNewPrivs:1", "Seccomp:2", "CapEff:0000000000000000"] {
        assert!(exec_saw.contains(confined), "{confined} in {exec_saw}");
    }
    assert!(!exec_saw.contains("uid=0 "), "{exec_saw}");
    for ns in ["pid", "mnt"] {
        let agents = std::fs::read_link(format!("/proc/self/ns/{ns}")).unwrap();
        assert!(
            !exec_saw.contains(&format!("{ns}={}", agents.display())),
            "{exec_saw}"
        );
    }
    // Its exit status and its stderr are the command's; a task that does not run it,
    // and a command that is not there, are refused with their reason.
    let (code, out, err) = agent.cli(&[
        "alloc",
        "exec",
        "-task",
        "t",
        &alloc,
        "/bin/sh",
        "-c",
        "echo out; echo err >&2; exit 7",
    ]);
    assert_eq!((code, out.as_str(), err.as_str()), (7, "out\n", "err\n"));
    let (code, _, err) = agent.cli(&["alloc", "exec", &alloc, "id"]);
    assert_ne!(code, 0);
    assert!(
        err.contains("has 2 tasks (t, side): name one (task=, or -task"),
        "{err}"
    );
    let (code, _, err) = agent.cli(&["alloc", "exec", "-task", "t", &alloc, "/no/such"]);
    assert_ne!(code, 0);
    assert!(err.contains("/no/such"), "{err}");

    // A terminal session, through Nomad's frames, with the owner's token over TCP.
    let owner = client(&agent, OWNER);
    let mut socket = owner
        .websocket(&exec_path(&alloc, "t", &["/bin/sh"], true))
        .await
        .unwrap();
    let size = |height, width| ExecStreamingInput {
        stdin: None,
        tty_size: Some(TerminalSize { height, width }),
    };
    send(&mut socket, size(30, 100)).await;
    send(&mut socket, stdin(b"stty size; tty; echo $((6*7))x\n")).await;
    let mut seen = Seen::default();
    read_until(&mut socket, &mut seen, |s| s.stdout.contains("42x")).await;
    assert!(seen.stdout.contains("30 100"), "{seen:?}");
    assert!(seen.stdout.contains("/dev/pts/"), "{seen:?}");
    send(&mut socket, size(40, 120)).await;
    send(&mut socket, stdin(b"stty size\n")).await;
    read_until(&mut socket, &mut seen, |s| s.stdout.contains("40 120")).await;
    // ^C reaches the command's foreground job through its terminal, not the shell.
    send(&mut socket, stdin(b"sleep 300\n")).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    send(&mut socket, stdin(b"\x03")).await;
    send(&mut socket, stdin(b"echo after-$((1+1))\n")).await;
    read_until(&mut socket, &mut seen, |s| s.stdout.contains("after-2")).await;
    send(&mut socket, stdin(b"exit 3\n")).await;
    read_until(&mut socket, &mut seen, |s| s.exit.is_some()).await;
    assert_eq!(seen.exit, Some(3), "{seen:?}");

    // Without a terminal: stdin through to its close, stdout and stderr apart.
    let mut socket = owner
        .websocket(&exec_path(
            &alloc,
            "t",
            &["/bin/sh", "-c", "cat; echo gone >&2"],
            false,
        ))
        .await
        .unwrap();
    send(&mut socket, stdin(b"piped\n")).await;
    send(&mut socket, stdin_closed()).await;
    let mut seen = Seen::default();
    read_until(&mut socket, &mut seen, |s| s.exit.is_some()).await;
    assert_eq!(
        (seen.stdout.as_str(), seen.stderr.as_str(), seen.exit),
        ("piped\n", "gone\n", Some(0))
    );
    agent.terminate(Duration::from_secs(30));
}

/// A client that leaves a session mid-way (its command's stdin full of what it never
/// reads) takes the command, and what it started in its group, along.
async fn leaving_takes_its_command_along(owner: &Client, alloc: &str, sleep_seconds: &str) {
    let marker = format!("sleep {sleep_seconds}");
    let script = format!("{marker} & {marker}; wait");
    let mut socket = owner
        .websocket(&exec_path(alloc, "t", &["/bin/sh", "-c", &script], false))
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while processes_running(&marker).len() < 2 {
        assert!(Instant::now() < deadline, "the command never started");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Stdin it never reads fills its pipe first: the write that waits on it does not
    // keep the session alive.
    send(&mut socket, stdin(&vec![b'y'; 300_000])).await;
    socket.close(None).await.unwrap();
    drop(socket);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !processes_running(&marker).is_empty() {
        assert!(
            Instant::now() < deadline,
            "the command outlived its session: {:?}",
            processes_running(&marker)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Runs `argv` in task `task` of `alloc` through `client`'s websocket, without a
/// terminal and with its stdin closed: its stdout, stderr and exit code.
pub(crate) async fn exec_once(
    client: &Client,
    alloc: &str,
    task: &str,
    argv: &[&str],
) -> (String, String, Option<i32>) {
    let mut socket = client
        .websocket(&exec_path(alloc, task, argv, false))
        .await
        .unwrap_or_else(|e| panic!("exec in {alloc}: {e}"));
    // A command that reads no stdin may have ended, and the agent closed the session,
    // before this is sent (a busy node's upstream run: EPIPE): what it said is still
    // there to read.
    let closing = serde_json::to_string(&stdin_closed()).unwrap();
    let _ = socket.send(WebSocketMessage::Text(closing.into())).await;
    let mut seen = Seen::default();
    read_until(&mut socket, &mut seen, |s| s.exit.is_some()).await;
    (seen.stdout, seen.stderr, seen.exit)
}

/// Every process whose command line is `argv`.
fn processes_running(argv: &str) -> Vec<u32> {
    let wanted: Vec<u8> = argv
        .split(' ')
        .flat_map(|a| [a.as_bytes(), b"\0"].concat())
        .collect();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c == wanted))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn alloc_exec_needs_its_scope_and_the_job_and_a_closed_socket_kills_the_command() {
    let mut agent = AgentProcess::production(|port, _| token_config(port));
    let alloc = start(&mut agent, "guarded").await;
    let path = exec_path(&alloc, "t", &["id"], false);
    let refusal = |result: Result<WebSocket, berth_api::client::ClientError>| match result {
        Ok(_) => panic!("the session was opened"),
        Err(berth_api::client::ClientError::Api(error, status)) => (status.as_u16(), error.error),
        Err(other) => panic!("{other}"),
    };
    // A submit token and a read token lack the scope; another alloc-exec token does not
    // own the job.
    for (secret, has) in [(SUBMITTER, "submit"), (VIEWER, "read")] {
        let (status, error) = refusal(client(&agent, secret).websocket(&path).await);
        assert_eq!(status, 403, "{error}");
        assert!(
            error.contains(&format!("has scope \"{has}\"")) && error.contains("\"alloc-exec\""),
            "{error}"
        );
    }
    let (status, error) = refusal(client(&agent, OTHER).websocket(&path).await);
    assert_eq!(status, 403, "{error}");
    assert_eq!(
        error,
        "job \"guarded\" belongs to token \"owner\"; token \"other\" may not run commands \
         inside an alloc of it"
    );
    // Bad requests are refused before a session opens.
    let owner = client(&agent, OWNER);
    for (path, expected) in [
        (
            format!("/v1/client/allocation/{alloc}/exec?task=t&command=id"),
            "command must be a JSON array of strings",
        ),
        (
            format!("/v1/client/allocation/{alloc}/exec?task=t&command=%5B%5D"),
            "command is empty",
        ),
        (
            exec_path(&alloc, "nope", &["id"], false),
            "has no task \"nope\"",
        ),
        (
            format!("/v1/client/allocation/{alloc}/exec?task=t&command=%5B%22id%22%5D&tty=yes"),
            "tty is \"yes\"",
        ),
    ] {
        let (status, error) = refusal(owner.websocket(&path).await);
        assert!((400..500).contains(&status), "{status} {error}");
        assert!(error.contains(expected), "{error} for {path}");
    }

    // A client that goes away mid-session takes its command (and what it started) along.
    leaving_takes_its_command_along(&owner, &alloc, "4242").await;
    // The task itself runs on.
    assert_eq!(
        agent.alloc(&alloc).await.client_status,
        ClientStatus::Running
    );
    agent.terminate(Duration::from_secs(30));
}

/// `alloc exec` asked of a cluster member that does not run the alloc reaches the node
/// that does, through the store: the same command inside the same task, a terminal
/// session with its resizes and exit code, the owner checked where it was asked, the
/// node's refusals answered as HTTP, and a client that goes away still takes the
/// command with it.
#[tokio::test(flavor = "multi_thread")]
async fn alloc_exec_asked_of_another_member_runs_on_the_node_that_runs_the_alloc() {
    let etcd = berth_testkit::etcd::EtcdServer::start();
    let endpoint = etcd.endpoint();
    let member = |name: &str| {
        let (name, endpoint) = (name.to_string(), endpoint.clone());
        AgentProcess::production(move |port, _| {
            format!(
                "name = \"{name}\"\ncluster {{\n  store = \"etcd\"\n  endpoints = [\"{endpoint}\"]\n  \
                 prefix = \"/exec\"\n  heartbeat_ttl = \"5s\"\n}}\n{}",
                token_config(port)
            )
        })
    };
    let mut nodes = [member("exec-a"), member("exec-b")];
    for node in &mut nodes {
        node.start().await;
    }
    let request = SubmitRequest {
        source_name: "far.hcl".into(),
        source: job("far"),
        variables: Default::default(),
    };
    let _: Submitted = client(&nodes[0], OWNER)
        .post("/v1/berth/jobs", &request)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", nodes[0].output()));
    crate::cluster::wait_allocs(
        &nodes[0],
        "far",
        "a running alloc",
        Duration::from_secs(60),
        |allocs| allocs.iter().any(|a| a.3 == "running"),
    )
    .await;
    let allocs = crate::cluster::allocs(&nodes[0], "far").await;
    let (alloc, _, node, _) = allocs.iter().find(|a| a.3 == "running").unwrap().clone();
    let (runs, asked) = match node.as_str() {
        "exec-a" => (&nodes[0], &nodes[1]),
        "exec-b" => (&nodes[1], &nodes[0]),
        other => panic!("an alloc on {other}"),
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while !runs.task_stdout(&alloc, "t").contains("seen ") {
        assert!(
            Instant::now() < deadline,
            "the task never said what it sees"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let task_saw = seen_line(&runs.task_stdout(&alloc, "t"));

    // The CLI against the member that does not run it: the task's own view.
    let (code, out, err) =
        asked.cli(&["alloc", "exec", "-task", "t", &alloc, "/bin/sh", "-c", SEEN]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(seen_line(&out), task_saw);
    let (code, out, err) = asked.cli(&[
        "alloc",
        "exec",
        "-task",
        "t",
        &alloc,
        "/bin/sh",
        "-c",
        "echo out; echo err >&2; exit 7",
    ]);
    assert_eq!((code, out.as_str(), err.as_str()), (7, "out\n", "err\n"));

    // A terminal session through the other member, with the owner's token.
    let owner = client(asked, OWNER);
    let mut socket = owner
        .websocket(&exec_path(&alloc, "t", &["/bin/sh"], true))
        .await
        .unwrap();
    let size = |height, width| ExecStreamingInput {
        stdin: None,
        tty_size: Some(TerminalSize { height, width }),
    };
    send(&mut socket, size(33, 90)).await;
    send(&mut socket, stdin(b"stty size; tty; echo $((6*7))x\n")).await;
    let mut seen = Seen::default();
    read_until(&mut socket, &mut seen, |s| s.stdout.contains("42x")).await;
    assert!(seen.stdout.contains("33 90"), "{seen:?}");
    assert!(seen.stdout.contains("/dev/pts/"), "{seen:?}");
    send(&mut socket, stdin(b"exit 4\n")).await;
    read_until(&mut socket, &mut seen, |s| s.exit.is_some()).await;
    assert_eq!(seen.exit, Some(4));
    // Much more stdin than one relayed frame holds arrives whole, and in order.
    let mut socket = owner
        .websocket(&exec_path(&alloc, "t", &["/bin/sh", "-c", "md5sum"], false))
        .await
        .unwrap();
    let big: Vec<u8> = (0..300_000u32).map(|n| (n % 251) as u8).collect();
    send(&mut socket, stdin(&big)).await;
    send(&mut socket, stdin_closed()).await;
    let mut seen = Seen::default();
    read_until(&mut socket, &mut seen, |s| s.exit.is_some()).await;
    let expected = std::process::Command::new("md5sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write as _;
            child.stdin.take().unwrap().write_all(&big)?;
            child.wait_with_output()
        })
        .unwrap();
    assert_eq!(seen.stdout, String::from_utf8(expected.stdout).unwrap());
    // Carried by the member asked, started by the node that runs the alloc.
    assert!(
        asked
            .output()
            .contains("alloc exec session opened on another node"),
        "{}",
        asked.output()
    );
    assert!(runs.output().contains("alloc exec started"));

    // Ownership is checked where the session is asked; the node's refusal is the answer.
    let refusal = |result: Result<WebSocket, berth_api::client::ClientError>| match result {
        Ok(_) => panic!("the session was opened"),
        Err(berth_api::client::ClientError::Api(error, status)) => (status.as_u16(), error.error),
        Err(other) => panic!("{other}"),
    };
    let (status, error) = refusal(
        client(asked, OTHER)
            .websocket(&exec_path(&alloc, "t", &["id"], false))
            .await,
    );
    assert_eq!(status, 403, "{error}");
    assert!(error.contains("belongs to token \"owner\""), "{error}");
    let (status, error) = refusal(
        owner
            .websocket(&exec_path(&alloc, "nope", &["id"], false))
            .await,
    );
    assert_eq!(status, 404, "{error}");
    assert!(error.contains("has no task \"nope\""), "{error}");

    // The client goes away: the command on the other node goes too.
    leaving_takes_its_command_along(&owner, &alloc, "4343").await;
    let (code, out, err) = nodes[0].cli(&["job", "stop", "far"]);
    assert_eq!(code, 0, "{out}{err}");
}

/// A session keeps its connection's place in the listener's limits for as long as it
/// runs (an upgraded connection is handed off, not gone): sessions cannot pile up past
/// `max_connections`, and a place comes back when a session ends.
#[tokio::test(flavor = "multi_thread")]
async fn sessions_hold_their_connections_places_in_the_listeners_limits() {
    let mut agent = AgentProcess::production(|port, _| {
        token_config(port).replacen(
            "http {\n",
            "http {\n  max_connections = 4\n  max_connections_per_client = 2\n",
            1,
        )
    });
    let alloc = start(&mut agent, "limited").await;
    let owner = client(&agent, OWNER);
    let path = exec_path(&alloc, "t", &["/bin/sleep", "300"], false);
    // Two ordinary places and the two of the reserve kept for token holders.
    let mut sessions = Vec::new();
    for n in 0..4 {
        let socket = owner
            .websocket(&path)
            .await
            .unwrap_or_else(|e| panic!("session {n}: {e}"));
        sessions.push(socket);
    }
    let refused = owner.websocket(&path).await;
    assert!(
        matches!(
            refused,
            Err(berth_api::client::ClientError::Unreachable { .. })
        ),
        "a fifth connection was served: {:?}",
        refused.err()
    );
    // One ends: its place is free again.
    let mut ended = sessions.pop().unwrap();
    ended.close(None).await.unwrap();
    drop(ended);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match owner.websocket(&path).await {
            Ok(socket) => {
                sessions.push(socket);
                break;
            }
            Err(error) => assert!(Instant::now() < deadline, "{error}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(sessions);
    agent.terminate(Duration::from_secs(30));
}
