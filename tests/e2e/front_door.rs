//! The front door, tried as a hostile job author or a careless operator would: names and
//! paths that would leave the data dir, raw_exec without the operator's consent, text
//! that would repaint the operator's terminal, arguments that are not UTF-8, and the
//! modes of the files that hold secrets.

use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::Command;

use berth_harness::AgentProcess;
use berth_model::status::ClientStatus;

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

/// Every directory below `dir`, as paths relative to it.
fn tree(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(next) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&next) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() && !path.is_symlink() {
                found.push(path.strip_prefix(dir).unwrap().display().to_string());
                stack.push(path);
            }
        }
    }
    found.sort();
    found
}

#[tokio::test(flavor = "multi_thread")]
async fn names_and_paths_that_would_leave_the_task_dir_are_refused_before_any_disk_work() {
    let mut agent = AgentProcess::new();
    agent.start().await;
    let escape = agent.path().join("escaped");
    let before = tree(agent.path());
    let cases = [
        (
            "dotdot-task.hcl",
            "job \"j\" {\n  group \"g\" {\n    task \"../x\" {\n      driver = \"mock\"\n    }\n  }\n}\n",
            "dotdot-task.hcl:3:5: job.j.group.g.task.../x: task name \"../x\" is not allowed",
        ),
        (
            "absolute-job.hcl",
            "job \"/etc\" {\n  group \"g\" {\n    task \"t\" {\n      driver = \"mock\"\n    }\n  }\n}\n",
            "absolute-job.hcl:1:1: job./etc: job name \"/etc\" is not allowed",
        ),
        (
            "dotdot-destination.hcl",
            &format!(
                "job \"j\" {{\n  group \"g\" {{\n    volume \"v\" {{\n      type = \"host\"\n      source = \"scratch\"\n    }}\n    task \"t\" {{\n      driver = \"exec\"\n      config {{\n        command = \"/bin/true\"\n      }}\n      volume_mount {{\n        volume = \"v\"\n        destination = \"/data/../../../../../..{}\"\n      }}\n    }}\n  }}\n}}\n",
                escape.display()
            ),
            "dotdot-destination.hcl:14:23: job.j.group.g.task.t.volume_mount.destination: destination \"/data/../../",
        ),
    ];
    for (name, source, expected) in cases {
        let path = agent.path().join(name);
        std::fs::write(&path, source).unwrap();
        let (code, _, stderr) = agent.cli(&["job", "run", path.to_str().unwrap()]);
        assert_eq!(code, 2, "{name}: {stderr}");
        assert!(
            stderr.contains(expected),
            "{name}: expected {expected:?} in:\n{stderr}"
        );
    }
    assert!(
        !escape.exists(),
        "a refused destination created {}",
        escape.display()
    );
    assert_eq!(
        tree(agent.path()),
        before,
        "a refused job created directories"
    );
    let jobs: serde_json::Value = agent.client().get("/v1/berth/jobs").await.unwrap();
    assert_eq!(jobs, serde_json::json!([]));
}

#[tokio::test(flavor = "multi_thread")]
async fn raw_exec_is_refused_unless_the_operator_enables_it() {
    let dir = tempfile::Builder::new()
        .prefix("berth-e2e-rawexec")
        .tempdir_in("/tmp")
        .unwrap();
    let job = dir.path().join("shell.hcl");
    std::fs::write(
        &job,
        "job \"shell\" {\n  type = \"batch\"\n  group \"g\" {\n    task \"sh\" {\n      driver = \"raw_exec\"\n      config {\n        command = \"/bin/echo\"\n        args = [\"ran as\", \"the agent\"]\n      }\n    }\n  }\n}\n",
    )
    .unwrap();
    let run = |config: &str| {
        let config_path = dir.path().join("agent.hcl");
        std::fs::write(&config_path, config).unwrap();
        let output = Command::new(env!("CARGO_BIN_EXE_berth"))
            .arg("--config")
            .arg(&config_path)
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .arg("run")
            .arg(&job)
            .output()
            .unwrap();
        (
            output.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    let (code, stdout, stderr) = run("");
    assert_eq!(code, 2, "{stdout}{stderr}");
    assert!(
        stderr.contains(
            "shell.hcl:5:16: job.shell.group.g.task.sh.driver: task \"sh\": driver \"raw_exec\" is \
             disabled on this agent: it runs tasks unconfined, as the agent's user; an operator \
             enables it with plugin \"raw_exec\" { config { enabled = true } } in the agent config"
        ),
        "{stderr}"
    );
    assert!(!stdout.contains("ran as the agent"), "{stdout}");
    let (code, stdout, stderr) =
        run("plugin \"raw_exec\" {\n  config {\n    enabled = true\n  }\n}\n");
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(stdout.contains("ran as the agent"), "{stdout}");
}

#[tokio::test(flavor = "multi_thread")]
async fn escape_sequences_from_a_driver_are_shown_escaped() {
    let mut agent = AgentProcess::new();
    agent.start().await;
    // The driver's error text is the job author's: clear the screen, then paint.
    let job = "job \"paint\" {\n  type = \"batch\"\n  group \"g\" {\n    restart {\n      attempts = 0\n      mode = \"fail\"\n    }\n    task \"t\" {\n      driver = \"mock\"\n      config {\n        start_error = \"\\u001b[2J\\u001b[31mall is well\\nForged line\"\n      }\n    }\n  }\n}\n";
    let submitted = agent.submit("paint.hcl", job).await.unwrap();
    let id = &submitted.alloc_ids[0];
    agent
        .wait_alloc(id, "failed", |s| s.client_status == ClientStatus::Failed)
        .await;
    let status = agent.alloc(id).await;
    let raw = &status.tasks["t"].events;
    assert!(
        raw.iter().any(|e| e.message.contains("\u{1b}[2J")),
        "the test needs the raw escape in the recorded event: {raw:?}"
    );
    let (code, stdout, stderr) = agent.cli(&["alloc", "status", id]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        !stdout.contains('\u{1b}'),
        "a raw ESC reached the terminal:\n{stdout:?}"
    );
    assert!(
        stdout.contains("\\u{1b}[2J\\u{1b}[31mall is well\\u{a}Forged line"),
        "{stdout}"
    );
    assert!(
        !stdout.lines().any(|line| line.starts_with("Forged line")),
        "{stdout}"
    );
}

#[test]
fn arguments_that_are_not_utf8_are_errors_not_panics() {
    let berth = |args: &[&[u8]]| {
        let output = Command::new(env!("CARGO_BIN_EXE_berth"))
            .args(args.iter().map(|a| std::ffi::OsStr::from_bytes(a)))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        assert!(!stderr.contains("panicked"), "{stderr}");
        (output.status.code(), stderr)
    };
    // A text option: clap says so.
    let (code, stderr) = berth(&[b"--address", b"http://\xff", b"job", b"status"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("invalid UTF-8"), "{stderr}");
    // A file name: any bytes are a path; this one does not exist.
    let (code, stderr) = berth(&[b"job", b"validate", b"/nonexistent/job-\xff.hcl"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("cannot read the file"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_data_dir_and_state_file_are_private_also_on_an_old_install() {
    let mut agent = AgentProcess::new();
    let data = agent.path().join("data");
    // An install from before: a data dir anyone may enter.
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).unwrap();
    agent.start().await;
    assert_eq!(mode(&data), 0o700);
    assert_eq!(mode(&data.join("state.db")), 0o600);
    let job = "job \"s\" {\n  type = \"batch\"\n  group \"g\" {\n    task \"t\" {\n      driver = \"mock\"\n      config { run_for = \"0s\" }\n    }\n  }\n}\n";
    let submitted = agent.submit("s.hcl", job).await.unwrap();
    let id = &submitted.alloc_ids[0];
    agent
        .wait_alloc(id, "complete", |s| {
            s.client_status == ClientStatus::Complete
        })
        .await;
    let status = agent.alloc(id).await;
    assert_eq!(mode(&status.alloc_dir.join("tasks/t/secrets")), 0o700);
    // A state file left readable by an older agent is fixed at the next start.
    agent.kill9();
    std::fs::set_permissions(
        data.join("state.db"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    agent.start().await;
    assert_eq!(mode(&data.join("state.db")), 0o600);
}

/// `berth` run as `uid`/`gid` (no supplementary groups).
fn berth_as(uid: u32, gid: u32, args: &[&str]) -> (i32, String, String) {
    use std::os::unix::process::CommandExt;
    let output = Command::new(env!("CARGO_BIN_EXE_berth"))
        .args(args)
        .env("HOME", "/nonexistent")
        .uid(uid)
        .gid(gid)
        .output()
        .unwrap();
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

const NOBODY: u32 = 65534;
const NOGROUP: u32 = 65534;

#[tokio::test(flavor = "multi_thread")]
async fn the_api_socket_admits_its_owner_and_its_group_only() {
    // Without socket_group: root only.
    let mut private = AgentProcess::production(|_, _| String::new());
    private.start().await;
    std::fs::set_permissions(private.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    assert_eq!(mode(&private.socket()), 0o600);
    let address = format!("unix://{}", private.socket().display());
    let (code, _, stderr) = berth_as(NOBODY, NOGROUP, &["--address", &address, "job", "status"]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("Permission denied"), "{stderr}");
    let (code, stdout, stderr) = private.cli(&["job", "status"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("No jobs"), "{stdout}");

    // With socket_group: that group's members, and nobody else.
    let mut shared =
        AgentProcess::production(|_, _| "http {\n  socket_group = \"nogroup\"\n}\n".into());
    shared.start().await;
    std::fs::set_permissions(shared.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    assert_eq!(mode(&shared.socket()), 0o660);
    assert_eq!(mode(&shared.path().join("data")), 0o710);
    let address = format!("unix://{}", shared.socket().display());
    let (code, stdout, stderr) =
        berth_as(NOBODY, NOGROUP, &["--address", &address, "job", "status"]);
    assert_eq!(
        code, 0,
        "a member of the socket group was refused: {stderr}"
    );
    assert!(stdout.contains("No jobs"), "{stdout}");
    let (code, _, stderr) = berth_as(NOBODY, 65533, &["--address", &address, "job", "status"]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("Permission denied"), "{stderr}");
}

/// One raw HTTP/1.1 request, so the test controls every header; the status code.
fn status_of(port: u16, method: &str, headers: &[(&str, &str)], body: &str) -> u16 {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    let mut request = format!("{method} /v1/berth/jobs HTTP/1.1\r\nConnection: close\r\n");
    if !headers
        .iter()
        .any(|(name, _)| name.eq_ignore_ascii_case("host"))
    {
        request.push_str(&format!("Host: 127.0.0.1:{port}\r\n"));
    }
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str(&format!(
        "Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    ));
    stream.write_all(request.as_bytes()).unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    answer
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status in {answer:?}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn tcp_needs_a_valid_token_of_the_right_scope_and_its_own_host() {
    let mut agent = AgentProcess::production(|port, dir| {
        format!(
            "http {{\n  address = \"127.0.0.1:{port}\"\n  token_file = \"{}/api-token\"\n  token \"viewer\" {{\n    secret = \"viewer-secret-0123456789\"\n    scope  = \"read\"\n  }}\n}}\n",
            dir.display()
        )
    });
    agent.start().await;
    let port = agent.port();
    let token_file = agent.path().join("api-token");
    assert_eq!(mode(&token_file), 0o600);
    let submit = std::fs::read_to_string(&token_file)
        .unwrap()
        .trim()
        .to_string();
    let output = agent.output();
    assert!(
        output.contains(&token_file.display().to_string()),
        "{output}"
    );
    assert!(
        !output.contains(&submit),
        "the agent logged the token itself:\n{output}"
    );

    let job = serde_json::json!({
        "source_name": "t.hcl",
        "source": "job \"t\" {\n  type = \"batch\"\n  group \"g\" {\n    task \"t\" {\n      driver = \"mock\"\n    }\n  }\n}\n",
    })
    .to_string();
    let bearer = format!("Bearer {submit}");
    assert_eq!(status_of(port, "GET", &[], ""), 401);
    assert_eq!(
        status_of(
            port,
            "GET",
            &[("X-Berth-Token", "not-the-token-0123456789")],
            ""
        ),
        403
    );
    assert_eq!(
        status_of(
            port,
            "GET",
            &[("X-Berth-Token", "viewer-secret-0123456789")],
            ""
        ),
        200
    );
    assert_eq!(
        status_of(
            port,
            "POST",
            &[("X-Berth-Token", "viewer-secret-0123456789")],
            &job
        ),
        403
    );
    // DNS rebinding and other sites: refused even with the right token.
    assert_eq!(
        status_of(
            port,
            "GET",
            &[
                ("Host", &format!("rebound.example:{port}")),
                ("Authorization", &bearer)
            ],
            ""
        ),
        403
    );
    assert_eq!(
        status_of(
            port,
            "POST",
            &[
                ("Origin", "http://evil.example"),
                ("Authorization", &bearer)
            ],
            &job
        ),
        403
    );
    let jobs: serde_json::Value = agent.client().get("/v1/berth/jobs").await.unwrap();
    assert_eq!(
        jobs,
        serde_json::json!([]),
        "a refused request submitted a job"
    );
    assert_eq!(
        status_of(port, "POST", &[("Authorization", &bearer)], &job),
        200
    );

    // The CLI over TCP with BERTH_TOKEN.
    let output = Command::new(env!("CARGO_BIN_EXE_berth"))
        .args([
            "--address",
            &format!("http://127.0.0.1:{port}"),
            "job",
            "status",
        ])
        .env("BERTH_TOKEN", &submit)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains('t'), "{stdout}");
}

/// Runs `berth agent` on `dir` with `config` and returns its exit code and output; it is
/// expected to refuse to start.
fn refused_start(dir: &Path, config: &str) -> (Option<i32>, String) {
    refused_start_with(dir, config, &dir.join("data"), &[])
}

/// [`refused_start`] with its data dir and `agent`'s arguments.
fn refused_start_with(
    dir: &Path,
    config: &str,
    data_dir: &Path,
    agent_args: &[&str],
) -> (Option<i32>, String) {
    std::fs::write(dir.join("agent.hcl"), config).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_berth"))
        .arg("--config")
        .arg(dir.join("agent.hcl"))
        .arg("--data-dir")
        .arg(data_dir)
        .arg("agent")
        .args(agent_args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("the agent started although it should have refused");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let output = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.code(), text)
}

#[test]
fn a_misconfigured_front_door_keeps_the_agent_from_starting() {
    let dir = tempfile::Builder::new()
        .prefix("berth-e2e-doors")
        .tempdir_in("/tmp")
        .unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let (code, output) = refused_start(
        dir.path(),
        &format!("http {{\n  address = \"127.0.0.1:{port}\"\n}}\n"),
    );
    assert_eq!(code, Some(1), "{output}");
    assert!(
        output.contains(&format!(
            "http.address 127.0.0.1:{port} opens a TCP listener, which needs a token"
        )),
        "{output}"
    );

    let token_file = dir.path().join("loose-token");
    std::fs::write(&token_file, "loose-token-0123456789\n").unwrap();
    std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let (code, output) = refused_start(
        dir.path(),
        &format!(
            "http {{\n  address = \"127.0.0.1:{port}\"\n  token_file = \"{}\"\n}}\n",
            token_file.display()
        ),
    );
    assert_eq!(code, Some(1), "{output}");
    assert!(
        output.contains(&format!(
            "is open to others (mode 644): run `chmod 600 {}`",
            token_file.display()
        )),
        "{output}"
    );

    std::fs::create_dir_all(dir.path().join("data/api.sock")).unwrap();
    let (code, output) = refused_start(dir.path(), "");
    assert_eq!(code, Some(1), "{output}");
    assert!(
        output.contains("api.sock exists and is not a socket: move it away"),
        "{output}"
    );
    assert!(
        dir.path().join("data/api.sock").is_dir(),
        "the agent removed what it did not own"
    );

    // Dev mode answers without a token on loopback only.
    let anywhere = format!("0.0.0.0:{port}");
    let (code, output) = refused_start_with(
        dir.path(),
        "",
        &dir.path().join("dev-data"),
        &["-dev", "--http-addr", &anywhere],
    );
    assert_eq!(code, Some(1), "{output}");
    assert!(
        output.contains(&format!(
            "dev mode answers without a token only on loopback, and {anywhere} is reachable \
             from other machines"
        )),
        "{output}"
    );

    // A data dir another user made first (the dev default's case: /tmp/berth-dev).
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    let squatted = dir.path().join("squatted");
    let made = Command::new("/bin/sh")
        .args(["-c", &format!("mkdir {}", squatted.display())])
        .uid(65534)
        .gid(65534)
        .status()
        .unwrap();
    assert!(made.success());
    let (code, output) = refused_start_with(dir.path(), "", &squatted, &[]);
    assert_eq!(code, Some(1), "{output}");
    assert!(
        output.contains(&format!(
            "{} is owned by uid 65534, not by the agent's user (uid 0) or root",
            squatted.display()
        )),
        "{output}"
    );
    assert!(!squatted.join("api.sock").exists(), "the agent used it");
}

/// `berth` with a config and a plugin dir, not talking to any agent.
fn berth_offline(dir: &Path, config: &str, args: &[&str]) -> (i32, String, String) {
    std::fs::write(dir.join("agent.hcl"), config).unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_berth"))
        .arg("--config")
        .arg(dir.join("agent.hcl"))
        .arg("--data-dir")
        .arg(dir.join("data"))
        .arg("--plugin-dir")
        .arg(dir.join("plugins"))
        .args(args)
        .output()
        .unwrap();
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn components_are_held_to_the_operators_pins() {
    use berth_builtin::test_components::{INJECT_ENV_HOOK, LEGACY_V01};
    use berth_model::pins::sha256_hex;
    let dir = tempfile::Builder::new()
        .prefix("berth-e2e-pins")
        .tempdir_in("/tmp")
        .unwrap();
    std::fs::create_dir_all(dir.path().join("plugins")).unwrap();
    std::fs::create_dir_all(dir.path().join("data")).unwrap();
    std::os::unix::fs::symlink(
        crate::support::cache_dir(),
        dir.path().join("data/component-cache"),
    )
    .unwrap();
    let driver_file = dir.path().join("plugins/legacy.wasm");
    std::fs::copy(LEGACY_V01, &driver_file).unwrap();
    let driver_digest = sha256_hex(&std::fs::read(LEGACY_V01).unwrap());
    let hook_digest = sha256_hex(&std::fs::read(INJECT_ENV_HOOK).unwrap());
    let wrong = "0".repeat(64);
    let listed = |stdout: &str| stdout.lines().any(|l| l.starts_with("legacy_exec "));

    // Pinned to another digest: refused, with both digests.
    let (code, stdout, stderr) = berth_offline(
        dir.path(),
        &format!("plugin \"legacy_exec\" {{\n  sha256 = \"{wrong}\"\n}}\n"),
        &["driver", "list"],
    );
    // A refusal fails the listing.
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains(&format!(
            "{}: driver \"legacy_exec\" is pinned to sha256 {wrong}, but this file is sha256 {driver_digest}: refused",
            driver_file.display()
        )),
        "{stderr}"
    );
    assert!(!listed(&stdout), "{stdout}");

    // Pinned to its digest: loaded, and the digest is shown.
    let (code, stdout, stderr) = berth_offline(
        dir.path(),
        &format!(
            "require_pinned = true\nplugin \"legacy_exec\" {{\n  sha256 = \"sha256:{}\"\n}}\n",
            driver_digest.to_uppercase()
        ),
        &["driver", "list"],
    );
    assert_eq!(code, 0, "{stderr}");
    assert!(listed(&stdout), "{stdout}{stderr}");
    assert!(
        stdout.contains(&format!("legacy_exec  {driver_digest}")),
        "{stdout}"
    );

    // require_pinned and no pin: refused before it runs.
    let (_, stdout, stderr) =
        berth_offline(dir.path(), "require_pinned = true\n", &["driver", "list"]);
    assert!(
        stderr.contains(&format!(
            "sha256 {driver_digest} is not pinned by any plugin block"
        )),
        "{stderr}"
    );
    assert!(!listed(&stdout), "{stdout}");
    // Built-in drivers are pinned by the build: still there.
    assert!(stdout.lines().any(|l| l.starts_with("exec ")), "{stdout}");

    // Hooks: a wrong pin, and require_pinned without one.
    let hook = |extra: &str| {
        format!(
            "{extra}hook \"env\" {{\n  path = \"{INJECT_ENV_HOOK}\"\n  all_tasks = true\n}}\nhook \"pinned\" {{\n  path = \"{INJECT_ENV_HOOK}\"\n  sha256 = \"{wrong}\"\n}}\n"
        )
    };
    let (_, stdout, _) = berth_offline(dir.path(), &hook(""), &["hook", "list"]);
    assert!(
        stdout.contains(&format!("env              {hook_digest}")),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!(
            "hook \"pinned\": {INJECT_ENV_HOOK} is sha256 {hook_digest}, but the agent config pins sha256 {wrong}: refused"
        )),
        "{stdout}"
    );
    let (_, stdout, _) = berth_offline(
        dir.path(),
        &hook("require_pinned = true\n"),
        &["hook", "list"],
    );
    assert!(
        stdout.contains(&format!(
            "hook \"env\": {INJECT_ENV_HOOK} (sha256 {hook_digest}) has no sha256 pin, and require_pinned = true refuses unpinned components"
        )),
        "{stdout}"
    );
}
