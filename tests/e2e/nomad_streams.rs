//! Nomad's long answers and alloc files on a berth agent, as Nomad's tools ask for them:
//! a task's log followed while it writes (raw HTTP, python-nomad 2.1.0 and `curl`), the
//! event stream (`curl -N`, as Nomad's documentation shows it), and an alloc's files
//! (`ls`, `stat`, `cat`, `readat`) with a task that plants a link to `/etc`, a FIFO and
//! asks for `..`: each refused, nothing outside read, no request left hanging.

use std::io::{Read, Write};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use berth_harness::AgentProcess;

/// A dev agent (TCP without a token, as Nomad's `-dev`) whose connections count as idle
/// after one second.
async fn dev_agent() -> AgentProcess {
    let mut agent = AgentProcess::with_config("http {\n  idle_timeout = \"1s\"\n}\n");
    agent.start().await;
    agent
}

/// One request, the whole answer: status and body (chunks joined).
fn get(port: u16, path: &str) -> (u16, String) {
    let started = Instant::now();
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = Vec::new();
    stream
        .read_to_end(&mut answer)
        .unwrap_or_else(|e| panic!("{path} did not answer in time: {e}"));
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{path} was slow"
    );
    let (status, body, _) = split_answer(&answer);
    (status, body)
}

/// Status, body (de-chunked) and whether the chunked body has ended.
fn split_answer(raw: &[u8]) -> (u16, String, bool) {
    let text = String::from_utf8_lossy(raw).into_owned();
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        return (0, String::new(), false);
    };
    let status = head
        .lines()
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    if !head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        return (status, body.to_string(), true);
    }
    let (mut out, mut rest, mut ended) = (String::new(), body, false);
    while let Some((size, after)) = rest.split_once("\r\n") {
        let Ok(size) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if size == 0 {
            ended = true;
            break;
        }
        if after.len() < size {
            break;
        }
        out.push_str(&after[..size]);
        rest = after[size..].strip_prefix("\r\n").unwrap_or("");
    }
    (status, out, ended)
}

/// A streamed answer read as it comes, on a thread of its own.
struct Streamed {
    raw: Arc<Mutex<Vec<u8>>>,
    closed: Arc<Mutex<Option<Instant>>>,
}

impl Streamed {
    fn open(port: u16, path: &str) -> Streamed {
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        write!(
            stream,
            "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let raw = Arc::new(Mutex::new(Vec::new()));
        let closed = Arc::new(Mutex::new(None));
        let (into, done) = (raw.clone(), closed.clone());
        std::thread::spawn(move || {
            let mut buffer = [0u8; 65536];
            loop {
                match stream.read(&mut buffer) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => into.lock().unwrap().extend_from_slice(&buffer[..n]),
                }
            }
            *done.lock().unwrap() = Some(Instant::now());
        });
        Streamed { raw, closed }
    }

    /// Status, the body so far, and whether it has ended.
    fn now(&self) -> (u16, String, bool) {
        split_answer(&self.raw.lock().unwrap())
    }

    fn closed_at(&self) -> Option<Instant> {
        *self.closed.lock().unwrap()
    }

    /// Waits until the body so far satisfies `done`; the body.
    fn wait_for(&self, what: &str, within: Duration, done: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + within;
        loop {
            let (_, body, _) = self.now();
            if done(&body) {
                return body;
            }
            assert!(Instant::now() < deadline, "no {what} in: {body}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn put_job(port: u16, job: serde_json::Value) {
    let body = job.to_string();
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        stream,
        "PUT /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).unwrap();
    let (status, body, _) = split_answer(&answer);
    assert_eq!(status, 200, "{body}");
}

/// The job's one alloc, once `ready` holds for its stub.
fn alloc_of(port: u16, job: &str, ready: impl Fn(&serde_json::Value) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, body) = get(port, &format!("/v1/job/{job}/allocations"));
        let allocs: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        if let Some(alloc) = allocs.as_array().and_then(|a| a.first())
            && ready(alloc)
        {
            return alloc["ID"].as_str().unwrap().to_string();
        }
        assert!(
            Instant::now() < deadline,
            "job {job} never got ready: {body}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn exec_job(id: &str, script: &str) -> serde_json::Value {
    serde_json::json!({"Job": {"ID": id, "Type": "batch", "TaskGroups": [{"Name": "g",
        "Tasks": [{"Name": "t", "Driver": "exec",
            "Config": {"command": "/bin/sh", "args": ["-c", script]}}]}]}})
}

fn frames(body: &str) -> Vec<serde_json::Value> {
    body.lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{line:?}: {e}")))
        .collect()
}

fn frame_data(frames: &[serde_json::Value]) -> String {
    use base64::Engine as _;
    frames
        .iter()
        .filter_map(|f| f["Data"].as_str())
        .map(|data| {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(data)
                .unwrap();
            String::from_utf8(bytes).unwrap()
        })
        .collect()
}

/// A followed log brings each line as the task writes it, stays up through a quiet
/// spell three times the idle timeout (heartbeat frames `{}` meanwhile), and ends once
/// the task is dead and its log is sent; python-nomad's follow reads the same.
#[tokio::test(flavor = "multi_thread")]
async fn a_followed_log_arrives_as_written_and_stays_up_while_quiet() {
    let agent = dev_agent().await;
    let port = agent.port();
    put_job(
        port,
        exec_job("talk", "echo first; sleep 4; echo second; sleep 1"),
    );
    let alloc = alloc_of(port, "talk", |a| a["ClientStatus"] == "running");
    let follow = Streamed::open(
        port,
        &format!("/v1/client/fs/logs/{alloc}?task=t&type=stdout&follow=true"),
    );
    let body = follow.wait_for("first line", Duration::from_secs(10), |b| {
        frame_data(&frames(b)).contains("first")
    });
    assert!(!body.contains("second"), "{body}");
    let first_at = Instant::now();
    let body = follow.wait_for("second line", Duration::from_secs(30), |b| {
        frame_data(&frames(b)).contains("second")
    });
    assert!(
        first_at.elapsed() >= Duration::from_secs(2),
        "the quiet spell was too short to prove anything"
    );
    let all = frames(&body);
    assert!(
        all.iter().any(|f| f == &serde_json::json!({})),
        "no heartbeat while quiet: {body}"
    );
    let data = all.iter().find(|f| f["Data"].is_string()).unwrap();
    assert_eq!(data["File"], "alloc/logs/t.stdout.0", "{data}");
    assert!(data["Offset"].as_u64().unwrap() > 0, "{data}");
    assert_eq!(frame_data(&all), "first\nsecond\n");
    // The task ends: so does the stream, with its last chunk.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !follow.now().2 {
        assert!(Instant::now() < deadline, "the follow never ended");
        std::thread::sleep(Duration::from_millis(100));
    }

    // python-nomad's follow of the dead task: the whole log, then the end.
    let script = r#"
import json, sys
import nomad
n = nomad.Nomad(host="127.0.0.1", port=int(sys.argv[1]), timeout=30)
logs = n.client.stream_logs
print(json.dumps([
    logs.stream(sys.argv[2], "t", "stdout", follow=True, plain=True),
    logs.stream(sys.argv[2], "t", "stdout", follow=True, plain=True, offset=7, origin="end"),
]))
"#;
    let output = python(script, &[&port.to_string(), &alloc]).await;
    assert_eq!(
        output,
        serde_json::json!(["first\nsecond\n", "second\n"]),
        "{}",
        agent.output()
    );
}

/// A follow goes on from file to file as the collector rotates them: every byte a
/// task writes through three files arrives once.
#[tokio::test(flavor = "multi_thread")]
async fn a_followed_log_goes_on_across_rotated_files() {
    let agent = dev_agent().await;
    let port = agent.port();
    let mut job = exec_job(
        "chatty",
        "sleep 1; i=0; while [ $i -lt 2500 ]; do printf '%0999d\\n' $i; i=$((i+1)); done",
    );
    job["Job"]["TaskGroups"][0]["Tasks"][0]["LogConfig"] =
        serde_json::json!({"MaxFiles": 10, "MaxFileSizeMB": 1});
    put_job(port, job);
    let alloc = alloc_of(port, "chatty", |a| a["ClientStatus"] != "pending");
    let follow = Streamed::open(
        port,
        &format!("/v1/client/fs/logs/{alloc}?task=t&type=stdout&follow=true"),
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while !follow.now().2 {
        assert!(Instant::now() < deadline, "the follow never ended");
        std::thread::sleep(Duration::from_millis(100));
    }
    let (_, body, _) = follow.now();
    let all = frames(&body);
    let files: std::collections::BTreeSet<&str> =
        all.iter().filter_map(|f| f["File"].as_str()).collect();
    assert!(files.len() >= 3, "{files:?}");
    let text = frame_data(&all);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2500);
    assert!(
        lines
            .iter()
            .enumerate()
            .all(|(i, line)| line.parse::<usize>() == Ok(i))
    );
}

async fn python(script: &str, args: &[&str]) -> serde_json::Value {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("drive.py");
    std::fs::write(&path, script).unwrap();
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new("python3")
            .arg(&path)
            .args(&args)
            .output()
    })
    .await
    .unwrap()
    .expect("python3 runs (with python-nomad==2.1.0, which .ci/test installs)");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_str(stdout.trim()).unwrap()
}

/// An alloc's files in Nomad's view (`alloc/`, `<task>/`), with `curl` as Nomad's
/// documentation calls `fs/ls`; a task's planted link to `/etc`, its FIFO, `..` and its
/// secrets are refused at once, and nothing of `/etc` comes back.
#[tokio::test(flavor = "multi_thread")]
async fn alloc_files_are_served_in_nomads_view_and_plants_are_refused() {
    let agent = dev_agent().await;
    let port = agent.port();
    put_job(
        port,
        exec_job(
            "files",
            "echo hello > local/out.txt && ln -s /etc local/evil && mkfifo local/fifo && \
             echo ready && sleep 600",
        ),
    );
    let alloc = alloc_of(port, "files", |a| a["ClientStatus"] == "running");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !get(
        port,
        &format!("/v1/client/fs/logs/{alloc}?task=t&plain=true"),
    )
    .1
    .contains("ready")
    {
        assert!(
            Instant::now() < deadline,
            "the task never planted its files"
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    // `curl` as in Nomad's documentation (`fs/ls/:alloc_id`), over TCP.
    let url = format!("http://127.0.0.1:{port}/v1/client/fs/ls/{alloc}?path=/t/local");
    let curl = tokio::task::spawn_blocking(move || {
        std::process::Command::new("curl")
            .arg("-s")
            .arg(url)
            .output()
    });
    let output = curl.await.unwrap().expect("curl runs");
    let listed: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let entry = |name: &str| {
        listed
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["Name"] == name)
            .unwrap_or_else(|| panic!("no {name} in {listed}"))
            .clone()
    };
    let out = entry("out.txt");
    assert_eq!(
        (&out["IsDir"], &out["Size"], &out["FileMode"]),
        (
            &serde_json::json!(false),
            &serde_json::json!(6),
            &serde_json::json!("-rw-r--r--")
        ),
        "{out}"
    );
    assert_eq!(out["ContentType"], "text/plain; charset=utf-8");
    assert!(out["ModTime"].as_str().unwrap().ends_with('Z'), "{out}");
    assert!(entry("evil")["FileMode"].as_str().unwrap().starts_with('L'));
    assert!(entry("fifo")["FileMode"].as_str().unwrap().starts_with('p'));

    let ls = |path: &str| get(port, &format!("/v1/client/fs/ls/{alloc}?path={path}"));
    let names = |body: &str| -> Vec<String> {
        serde_json::from_str::<Vec<serde_json::Value>>(body)
            .unwrap()
            .iter()
            .map(|e| e["Name"].as_str().unwrap().to_string())
            .collect()
    };
    let (status, body) = ls("/");
    assert_eq!(
        (status, names(&body)),
        (200, vec!["alloc".into(), "t".into()])
    );
    let (status, body) = ls("alloc/logs");
    assert_eq!(status, 200, "{body}");
    assert!(names(&body).contains(&"t.stdout.0".to_string()), "{body}");

    let file =
        |kind: &str, path: &str| get(port, &format!("/v1/client/fs/{kind}/{alloc}?path={path}"));
    assert_eq!(file("cat", "t/local/out.txt"), (200, "hello\n".into()));
    assert_eq!(
        get(
            port,
            &format!("/v1/client/fs/readat/{alloc}?path=t/local/out.txt&offset=1&limit=3")
        ),
        (200, "ell".into())
    );
    let (status, body) = file("stat", "t/local/out.txt");
    let stat: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (status, &stat["Name"], &stat["Size"]),
        (200, &serde_json::json!("out.txt"), &serde_json::json!(6))
    );
    // The link itself is described, never what it points to.
    let (status, body) = file("stat", "t/local/evil");
    assert_eq!(status, 200, "{body}");
    let stat: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(stat["IsDir"], false, "{body}");

    // Refused, each at once, with a sentence; nothing of /etc in any answer.
    let refusals = [
        ("ls", "t/local/evil", 400, "symbolic link"),
        ("cat", "t/local/evil/passwd", 400, "symbolic link"),
        ("stat", "t/local/evil/passwd", 400, "symbolic link"),
        ("cat", "t/local/evil", 400, "symbolic link"),
        ("cat", "t/local/fifo", 400, "FIFO"),
        ("readat", "t/local/fifo", 400, "FIFO"),
        ("ls", "../../..", 400, "leaves the alloc dir"),
        (
            "cat",
            "t/../../../../etc/passwd",
            400,
            "leaves the alloc dir",
        ),
        (
            "cat",
            "alloc/../../../etc/passwd",
            400,
            "leaves the alloc dir",
        ),
        ("cat", "t/secrets/x", 403, "secrets"),
        ("cat", "etc/passwd", 404, "not found"),
        ("cat", "t/local", 400, "directory"),
    ];
    for (kind, path, code, words) in refusals {
        let started = Instant::now();
        let (status, body) = file(kind, path);
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{kind} {path} was slow"
        );
        assert_eq!(status, code, "{kind} {path}: {body}");
        assert!(body.contains(words), "{kind} {path}: {body}");
        assert!(!body.contains("root:"), "{kind} {path} read /etc: {body}");
    }
}

/// The event stream as Nomad's documentation shows it (`curl -s -N`): the job
/// registered, its alloc running and then complete, the job deregistered; with
/// `?index=` the events the agent kept (this node registered). When the agent shuts
/// down, open streams end at once.
#[tokio::test(flavor = "multi_thread")]
async fn the_event_stream_reports_a_job_and_its_alloc_as_nomad_does() {
    let agent = dev_agent().await;
    let port = agent.port();
    let mut curl = std::process::Command::new("curl")
        .args(["-s", "-N"])
        .arg(format!("http://127.0.0.1:{port}/v1/event/stream"))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("curl runs");
    let jobs_and_allocs = Streamed::open(
        port,
        "/v1/event/stream?topic=Job:*&topic=Allocation:*&index=1",
    );
    let only_other_job = Streamed::open(port, "/v1/event/stream?topic=Job:other");
    std::thread::sleep(Duration::from_millis(300));
    put_job(
        port,
        serde_json::json!({"Job": {"ID": "ev", "Type": "service", "TaskGroups": [{"Name": "g",
            "Tasks": [{"Name": "t", "Driver": "mock", "Config": {"run_for": "1h"}}]}]}}),
    );
    alloc_of(port, "ev", |a| a["ClientStatus"] == "running");
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        stream,
        "DELETE /v1/job/ev HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).unwrap();

    let events = |body: &str| -> Vec<serde_json::Value> {
        frames(body)
            .into_iter()
            .flat_map(|line| line["Events"].as_array().cloned().unwrap_or_default())
            .collect()
    };
    let complete = |body: &str| {
        events(body).iter().any(|e| {
            e["Type"] == "AllocationUpdated"
                && e["Payload"]["Allocation"]["ClientStatus"] == "complete"
        })
    };
    let body = jobs_and_allocs.wait_for("a complete alloc", Duration::from_secs(30), complete);
    let seen = events(&body);
    let first = |kind: &str, what: &dyn Fn(&serde_json::Value) -> bool| {
        seen.iter()
            .position(|e| e["Type"] == kind && what(e))
            .unwrap_or_else(|| panic!("no {kind} in {body}"))
    };
    let registered = first("JobRegistered", &|e| {
        e["Key"] == "ev" && e["Payload"]["Job"]["ID"] == "ev" && e["Topic"] == "Job"
    });
    let running = first("AllocationUpdated", &|e| {
        e["Payload"]["Allocation"]["ClientStatus"] == "running"
            && e["Payload"]["Allocation"]["JobID"] == "ev"
    });
    let deregistered = first("JobDeregistered", &|e| e["Key"] == "ev");
    let done = first("AllocationUpdated", &|e| {
        e["Payload"]["Allocation"]["ClientStatus"] == "complete"
    });
    assert!(
        registered < running && running < deregistered && deregistered < done,
        "{body}"
    );
    assert!(
        seen.iter()
            .all(|e| e["Namespace"] == "default" && e["Index"].as_u64().unwrap() > 0)
    );
    assert!(
        !seen.iter().any(|e| e["Topic"] == "Node"),
        "a topic not asked for: {body}"
    );
    let (status, body, _) = only_other_job.now();
    assert_eq!(status, 200);
    assert!(!body.contains("Events"), "an event of another job: {body}");

    // Kept events from an index: this node registered at the start.
    let replay = Streamed::open(port, "/v1/event/stream?topic=Node&index=1");
    replay.wait_for("the node's registration", Duration::from_secs(10), |b| {
        b.contains("NodeRegistration") && b.contains("\"Node\":{")
    });

    // curl's stream (every topic) got them too.
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(curl.id() as i32).unwrap(),
        rustix::process::Signal::TERM,
    )
    .unwrap();
    let output = {
        let mut out = String::new();
        curl.stdout
            .take()
            .unwrap()
            .read_to_string(&mut out)
            .unwrap();
        let _ = curl.wait();
        out
    };
    assert!(
        output.contains("JobRegistered") && output.contains("\"Topic\":\"Allocation\""),
        "{output}"
    );

    // Shutting down: the open streams end promptly.
    let pid = rustix::process::Pid::from_raw(agent.pid() as i32).unwrap();
    let stopping = Instant::now();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    for stream in [&jobs_and_allocs, &only_other_job, &replay] {
        while stream.closed_at().is_none() {
            assert!(
                stopping.elapsed() < Duration::from_secs(5),
                "a stream outlived the agent's stop"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Clients that ask for a large file and never read it hold at most
/// `MAX_READS_IN_MEMORY` answers (8 MiB each) in the agent: the next is a 429 that says
/// why, and once those clients go the agent answers again.
#[tokio::test(flavor = "multi_thread")]
async fn readers_that_never_read_hold_a_bounded_number_of_file_answers() {
    use berth_api::nomad::alloc_fs::{MAX_READ, MAX_READS_IN_MEMORY};
    // The default idle timeout (60 s): the stalled readers stay for the whole test.
    let mut agent = AgentProcess::with_config("");
    agent.start().await;
    let port = agent.port();
    put_job(
        port,
        exec_job(
            "big",
            &format!("head -c {MAX_READ} /dev/zero > local/big && echo ready && sleep 600"),
        ),
    );
    let alloc = alloc_of(port, "big", |a| a["ClientStatus"] == "running");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !get(
        port,
        &format!("/v1/client/fs/logs/{alloc}?task=t&plain=true"),
    )
    .1
    .contains("ready")
    {
        assert!(Instant::now() < deadline, "the task never wrote its file");
        std::thread::sleep(Duration::from_millis(100));
    }
    let request = format!(
        "GET /v1/client/fs/readat/{alloc}?path=/t/local/big&offset=0&limit={MAX_READ} \
         HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n"
    );
    // Through the Unix socket: a Unix stream's kernel buffer is fixed (wmem_default,
    // some 200 KiB), where a TCP connection's grows, on some machines to more than an
    // 8 MiB answer, which the kernel would then take off the agent's hands at once.
    let stall = || {
        let mut stream = std::os::unix::net::UnixStream::connect(agent.socket()).unwrap();
        stream.write_all(request.as_bytes()).unwrap();
        stream
    };
    let mut stalled: Vec<_> = (0..MAX_READS_IN_MEMORY).map(|_| stall()).collect();
    // Each of them is being answered (and is not read); one more is refused. Should a
    // machine's kernel still take a whole answer off the agent (its slot then free), one
    // more stalled reader takes its place, up to twice the cap: without the cap none
    // is ever refused.
    let deadline = Instant::now() + Duration::from_secs(20);
    let refusal = loop {
        let (status, body) = get(
            port,
            &format!("/v1/client/fs/readat/{alloc}?path=/t/local/big&offset=0&limit=16"),
        );
        if status == 429 {
            break body;
        }
        assert!(
            Instant::now() < deadline && stalled.len() < 2 * MAX_READS_IN_MEMORY,
            "never refused: {status} {body} ({} stalled readers)",
            stalled.len()
        );
        stalled.push(stall());
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        refusal.contains(&format!("{MAX_READS_IN_MEMORY} file reads (cat, readat)")),
        "{refusal}"
    );
    // The stalled clients go; the agent answers again, whole.
    drop(stalled);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, body) = get(
            port,
            &format!("/v1/client/fs/readat/{alloc}?path=/t/local/big&offset=0&limit=16"),
        );
        if status == 200 {
            assert_eq!(body.len(), 16);
            break;
        }
        assert!(Instant::now() < deadline, "still refused: {status} {body}");
        std::thread::sleep(Duration::from_millis(100));
    }
}
