//! The `berth` binary, as a person runs it.

use std::process::Command;

use crate::support;

#[test]
fn driver_list_shows_every_driver_with_its_capabilities_and_skips_bad_files() {
    let plugins = tempfile::tempdir().unwrap();
    std::fs::copy(
        berth_builtin::test_components::LEGACY_V01,
        plugins.path().join("legacy.wasm"),
    )
    .unwrap();
    std::fs::copy(support::python_driver(), plugins.path().join("pyexec.wasm")).unwrap();
    std::fs::write(plugins.path().join("broken.wasm"), "nope").unwrap();
    // A driver built against a world this agent does not have, and a hook dropped where
    // drivers go: each named for what it is, before anything is compiled.
    let newer = wat::parse_str(
        "(component (instance $i) (export \"berth:driver/driver@0.3.0\" (instance $i)))",
    )
    .unwrap();
    std::fs::write(plugins.path().join("newer.wasm"), newer).unwrap();
    std::fs::copy(
        berth_builtin::test_components::INJECT_ENV_HOOK,
        plugins.path().join("inject.wasm"),
    )
    .unwrap();
    let (stdout, stderr, success, _) = driver_list(plugins.path());
    // The drivers that load are listed; the refusals fail the listing.
    assert!(!success, "{stderr}");
    for (file, why) in [
        (
            "newer.wasm",
            "exports berth:driver/driver@0.3.0; this agent runs berth:driver/driver@0.2.1, @0.2.0 and @0.1.0",
        ),
        (
            "inject.wasm",
            "is a hook, not a task driver (it exports berth:hook/lifecycle@0.1.0): declare it in a `hook` block of the agent config",
        ),
    ] {
        let said = format!(
            "Warning: skipped a driver: {}: {why}\n",
            plugins.path().join(file).display()
        );
        assert_eq!(stderr.matches(&said).count(), 1, "{said}\n{stderr}");
    }
    let rows: Vec<Vec<&str>> = stdout
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    let row = |name: &str| {
        rows.iter()
            .find(|r| r.first() == Some(&name))
            .unwrap_or_else(|| panic!("{name} missing:\n{stdout}"))
    };
    assert_eq!(
        row("exec")[..5],
        ["exec", "0.1.0", "0.2.1", "all", "chroot"]
    );
    assert_eq!(
        row("raw_exec")[..5],
        ["raw_exec", "0.1.0", "0.2.1", "none", "none"]
    );
    assert_eq!(row("mock")[3], "all");
    assert_eq!(
        row("legacy_exec")[..5],
        ["legacy_exec", "0.1.0", "0.1.0", "all", "(default)"]
    );
    assert_eq!(row("pyexec")[..4], ["pyexec", "0.1.0", "0.2.0", "none"]);
    for name in ["exec", "raw_exec", "mock", "legacy_exec", "pyexec"] {
        assert!(row(name).contains(&"healthy"), "{name}: {stdout}");
    }
    assert!(
        stdout.contains(
            "legacy_exec is built against berth:driver@0.1.0, which predates capabilities"
        )
    );
    let broken = plugins.path().join("broken.wasm");
    assert!(
        stderr.contains(&format!(
            "Warning: skipped a driver: {}: not a valid WebAssembly component",
            broken.display()
        )),
        "{stderr}"
    );
}

/// `berth driver list` over `plugins`, with the shared component cache: its stdout, its
/// stderr, whether it succeeded, and how long it took.
fn driver_list(plugins: &std::path::Path) -> (String, String, bool, std::time::Duration) {
    let data = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(support::cache_dir(), data.path().join("component-cache")).unwrap();
    let started = std::time::Instant::now();
    let output = Command::new(env!("CARGO_BIN_EXE_berth"))
        .args(["driver", "list", "--plugin-dir"])
        .arg(plugins)
        .arg("--data-dir")
        .arg(data.path())
        .output()
        .unwrap();
    (
        String::from_utf8(output.stdout).unwrap(),
        String::from_utf8(output.stderr).unwrap(),
        output.status.success(),
        started.elapsed(),
    )
}

/// Two files reporting one driver name: neither is loaded (load order must not decide
/// which file an operator's grant to that name goes to).
#[test]
fn two_files_reporting_one_driver_name_are_both_refused() {
    let plugins = tempfile::tempdir().unwrap();
    for name in ["a.wasm", "b.wasm"] {
        std::fs::copy(
            berth_builtin::test_components::LEGACY_V01,
            plugins.path().join(name),
        )
        .unwrap();
    }
    let (stdout, stderr, _, _) = driver_list(plugins.path());
    assert!(
        !stdout.lines().any(|l| l.starts_with("legacy_exec")),
        "{stdout}"
    );
    for file in ["a.wasm", "b.wasm"] {
        let expected = format!(
            "{}: the driver reported an unusable name \"legacy_exec\", which {}, {} all report: \
             none of them is loaded",
            plugins.path().join(file).display(),
            plugins.path().join("a.wasm").display(),
            plugins.path().join("b.wasm").display(),
        );
        assert!(stderr.contains(&expected), "{expected}\n{stderr}");
    }
}

/// A driver whose plugin-info takes two minutes holds nothing up: it is refused at its
/// load-time deadline, and three of them load beside the others in about one deadline,
/// not three.
#[test]
fn slow_drivers_are_refused_at_their_load_deadline_and_delay_nothing_else() {
    let plugins = tempfile::tempdir().unwrap();
    for name in ["slow1.wasm", "slow2.wasm", "slow3.wasm"] {
        std::fs::copy(
            berth_builtin::test_components::SLOW_INFO,
            plugins.path().join(name),
        )
        .unwrap();
    }
    std::fs::copy(
        berth_builtin::test_components::LEGACY_V01,
        plugins.path().join("legacy.wasm"),
    )
    .unwrap();
    let (stdout, stderr, _, elapsed) = driver_list(plugins.path());
    assert!(
        stdout.lines().any(|l| l.starts_with("legacy_exec")),
        "{stdout}\n{stderr}"
    );
    assert_eq!(
        stderr
            .matches("did not finish plugin-info within 5s")
            .count(),
        3,
        "{stderr}"
    );
    // One at a time, three slow files would take three deadlines (15 s).
    let deadline = berth_runtime::driver::LOAD_CALL_WALL;
    assert!(
        elapsed < deadline * 3 - std::time::Duration::from_secs(1),
        "loading took {elapsed:?}"
    );
}

/// A reader that goes away (`berth driver list | head -0`) ends the command quietly, by
/// SIGPIPE as Unix tools end, never with a panic on the broken pipe.
#[test]
fn a_command_whose_reader_goes_away_ends_quietly() {
    use std::os::unix::process::ExitStatusExt;
    let plugins = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(support::cache_dir(), data.path().join("component-cache")).unwrap();
    let (reader, writer) = rustix::pipe::pipe().unwrap();
    drop(reader);
    let output = Command::new(env!("CARGO_BIN_EXE_berth"))
        .args(["driver", "list", "--plugin-dir"])
        .arg(plugins.path())
        .arg("--data-dir")
        .arg(data.path())
        .stdout(std::process::Stdio::from(writer))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(
        output.status.signal(),
        Some(libc::SIGPIPE),
        "{:?}: {stderr}",
        output.status
    );
}

/// The CLI with none of berth's environment variables, so only its flags choose.
fn berth_without_env() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_berth"));
    for name in [
        "BERTH_ADDR",
        "BERTH_DATA_DIR",
        "BERTH_CONFIG",
        "BERTH_TOKEN",
        "BERTH_PLUGIN_DIR",
    ] {
        command.env_remove(name);
    }
    command
}

/// A decoy on Nomad's address, where the CLI falls back when nothing names an agent:
/// it answers each connection with a 500 and counts them.
struct Decoy {
    connections: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Decoy {
    fn on_nomads_port() -> Decoy {
        use std::io::{Read as _, Write as _};
        let listener = std::net::TcpListener::bind("127.0.0.1:4646")
            .unwrap_or_else(|e| panic!("this test needs 127.0.0.1:4646 free: {e}"));
        let connections = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = connections.clone();
        // Lives as long as the test binary: nothing else listens on 4646.
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let _ = stream.set_read_timeout(Some(std::time::Duration::from_millis(200)));
                let _ = stream.read(&mut [0u8; 4096]);
                let _ = stream.write_all(
                    b"HTTP/1.1 500 Decoy\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                );
            }
        });
        Decoy { connections }
    }

    /// How many connections reached the decoy so far.
    fn connections(&self) -> usize {
        self.connections.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// `--data-dir` or `--config` names an agent whose socket is not there (not started
/// yet): the command fails naming that socket, and never goes to another agent (here a
/// decoy on 127.0.0.1:4646, which a command that names no agent does reach).
#[test]
fn an_agent_named_by_its_flags_is_that_agent_or_a_clear_error_never_another() {
    for default in ["/var/lib/berth/api.sock", "/tmp/berth-dev/api.sock"] {
        assert!(
            !std::path::Path::new(default).exists(),
            "{default} exists: this test needs the CLI's fallbacks to end at 4646"
        );
    }
    let decoy = Decoy::on_nomads_port();
    // The control: naming no agent, the CLI falls back to the decoy.
    let output = berth_without_env()
        .args(["job", "status"])
        .output()
        .unwrap();
    assert!(
        decoy.connections() >= 1,
        "the fallback did not reach the decoy: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let reached_by_the_control = decoy.connections();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let config = dir.path().join("agent.hcl");
    std::fs::write(
        &config,
        format!("data_dir = {:?}\n", data.display().to_string()),
    )
    .unwrap();
    let socket = data.join("api.sock");
    for flags in [
        vec!["--data-dir".to_string(), data.display().to_string()],
        vec!["--config".to_string(), config.display().to_string()],
        vec![
            "--address".to_string(),
            format!("unix://{}", socket.display()),
        ],
    ] {
        for command in [vec!["job", "status"], vec!["job", "stop", "web"]] {
            let output = berth_without_env()
                .args(&flags)
                .args(&command)
                .output()
                .unwrap();
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert!(!output.status.success(), "{flags:?} {command:?}: {stderr}");
            assert!(
                stderr.contains(&socket.display().to_string()),
                "{flags:?} {command:?} does not name the agent's socket: {stderr}"
            );
            assert_eq!(
                decoy.connections(),
                reached_by_the_control,
                "{flags:?} {command:?} went to another agent: {stderr}"
            );
        }
    }
}

/// An agent config with two problems: each on a line of its own, under the count, with
/// our line breaks kept (not shown as `\u{a}`).
#[test]
fn errors_with_several_problems_keep_their_line_breaks() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("agent.hcl");
    std::fs::write(
        &config,
        "client {\n  no_such_field = 1\n}\nhttp {\n  idle_timeout = \"soon\"\n}\n",
    )
    .unwrap();
    let output = berth_without_env()
        .arg("--config")
        .arg(&config)
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .args(["agent", "-dev", "--http-addr", "127.0.0.1:1"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(!stderr.contains("\\u{a}"), "{stderr}");
    let shown = config.display().to_string();
    let lines: Vec<&str> = stderr.lines().collect();
    let head = lines
        .iter()
        .position(|l| l.contains(&format!("{shown} has 2 problems:")))
        .unwrap_or_else(|| panic!("no count of the problems: {stderr}"));
    for line in &lines[head + 1..head + 3] {
        assert!(line.starts_with(&format!("  {shown}:")), "{stderr}");
    }
}

/// A task for a driver this agent does not have, run as a user the deny-list refuses
/// for that driver's name (`java` is a checked driver): the one problem is the unknown
/// driver, not its user.
#[tokio::test(flavor = "multi_thread")]
async fn a_driver_the_agent_lacks_is_the_problem_reported_not_its_user() {
    let mut agent = berth_harness::AgentProcess::new();
    agent.start().await;
    let job = agent.path().join("java.hcl");
    std::fs::write(
        &job,
        "job \"java\" {\n  group \"g\" {\n    task \"t\" {\n      driver = \"java\"\n      user   = \"root\"\n      config {\n        jar_path = \"/app.jar\"\n      }\n    }\n  }\n}\n",
    )
    .unwrap();
    let (code, out, err) = agent.cli(&["job", "validate", job.to_str().unwrap()]);
    assert_ne!(code, 0, "{out}{err}");
    assert!(err.contains("has 1 problem:"), "{err}");
    assert!(err.contains("unknown driver \"java\""), "{err}");
    assert!(!err.contains("root"), "{err}");
}

/// `berth hook list` lists a refused hook with its reason, once, and fails; with only
/// hooks that load it succeeds.
#[test]
fn hook_list_fails_when_a_hook_was_refused() {
    let dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(support::cache_dir(), dir.path().join("component-cache")).unwrap();
    let driver_as_hook = dir.path().join("driver.wasm");
    std::fs::copy(berth_builtin::test_components::MISBEHAVE, &driver_as_hook).unwrap();
    let list = |hooks: &str| {
        let config = dir.path().join("agent.hcl");
        std::fs::write(&config, hooks).unwrap();
        let output = Command::new(env!("CARGO_BIN_EXE_berth"))
            .arg("--config")
            .arg(&config)
            .arg("--data-dir")
            .arg(dir.path())
            .args(["hook", "list"])
            .output()
            .unwrap();
        (
            String::from_utf8(output.stdout).unwrap(),
            output.status.success(),
        )
    };
    let fine = format!(
        "hook \"fine\" {{\n  path = \"{}\"\n}}\n",
        berth_builtin::test_components::INJECT_ENV_HOOK
    );
    let (stdout, success) = list(&fine);
    assert!(success, "{stdout}");
    let (stdout, success) = list(&format!(
        "{fine}hook \"wrong\" {{\n  path = \"{}\"\n}}\n",
        driver_as_hook.display()
    ));
    assert!(!success, "{stdout}");
    assert_eq!(
        stdout
            .matches("is a task driver, not a hook (it exports berth:driver/driver@0.2.1)")
            .count(),
        1,
        "{stdout}"
    );
    // Past the operator's size limit: refused with its size, before it is read.
    let size = std::fs::metadata(berth_builtin::test_components::INJECT_ENV_HOOK)
        .unwrap()
        .len();
    let (stdout, success) = list(&format!("max_component_size = \"1KiB\"\n{fine}"));
    assert!(!success, "{stdout}");
    assert!(
        stdout.contains(&format!(
            "is {size} bytes; this agent compiles components of at most 1024 bytes (`max_component_size` in the agent config)"
        )),
        "{stdout}"
    );
}

/// `berth run` says each refusal once: a broken file in the plugin dir and a hook that
/// does not load, each one warning line, nothing repeated by the log.
#[test]
fn berth_run_says_each_refusal_once() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::os::unix::fs::symlink(support::cache_dir(), data.join("component-cache")).unwrap();
    let plugins = dir.path().join("plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    let broken = plugins.join("broken.wasm");
    std::fs::write(&broken, "nope").unwrap();
    let config = dir.path().join("agent.hcl");
    std::fs::write(
        &config,
        format!(
            "plugin \"mock\" {{\n  config {{\n    enabled = true\n  }}\n}}\nhook \"bad\" {{\n  path = \"{}\"\n}}\n",
            broken.display()
        ),
    )
    .unwrap();
    let job = dir.path().join("job.hcl");
    std::fs::write(
        &job,
        "job \"j\" {\n  type = \"batch\"\n  group \"g\" {\n    task \"t\" {\n      driver = \"mock\"\n      config {\n        run_for = \"0s\"\n      }\n    }\n  }\n}\n",
    )
    .unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_berth"))
        .arg("--config")
        .arg(&config)
        .arg("--plugin-dir")
        .arg(&plugins)
        .arg("--data-dir")
        .arg(&data)
        .arg("run")
        .arg(&job)
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let reason = "not a valid WebAssembly component (4 bytes)";
    assert_eq!(said.matches(reason).count(), 2, "{said}");
    assert_eq!(
        said.matches("Warning: skipped a driver: ").count(),
        1,
        "{said}"
    );
    assert_eq!(said.matches("refused a hook: ").count(), 1, "{said}");
    assert!(output.status.success(), "{said}");
}

/// A driver that says it spawns unconfined (`spawn-isolation` lists `none`) is refused at
/// `job validate`, at the task's driver line, unless the operator allows that driver to
/// run unconfined; with the operator's leave, the job validates.
#[test]
fn a_driver_that_spawns_unconfined_is_refused_at_validate_without_the_operators_leave() {
    let dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(support::cache_dir(), dir.path().join("component-cache")).unwrap();
    let plugins = dir.path().join("plugins");
    std::fs::create_dir(&plugins).unwrap();
    let component = plugins.join("undeclared.wasm");
    std::fs::copy(berth_builtin::test_components::UNDECLARED_SPAWN, &component).unwrap();
    let job = dir.path().join("job.hcl");
    std::fs::write(
        &job,
        "job \"u\" {\n  group \"g\" {\n    task \"t\" {\n      driver = \"undeclared_spawn\"\n    }\n  }\n}\n",
    )
    .unwrap();
    let config = dir.path().join("agent.hcl");
    let validate = |agent_config: &str| {
        std::fs::write(&config, agent_config).unwrap();
        let output = berth_without_env()
            .arg("--config")
            .arg(&config)
            .arg("--plugin-dir")
            .arg(&plugins)
            .arg("--data-dir")
            .arg(dir.path())
            .args(["job", "validate"])
            .arg(&job)
            .output()
            .unwrap();
        (
            output.status.code(),
            String::from_utf8(output.stderr).unwrap(),
        )
    };
    let (code, stderr) = validate("");
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("job.hcl:4:"),
        "placed at the driver line: {stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "task \"t\": driver \"undeclared_spawn\" runs its tasks unconfined (as the agent's \
             user, in the host's namespaces: its spawn-isolation lists \"none\"), which the \
             operator has not allowed for this driver: plugin \"undeclared_spawn\" {{ path = {:?}, \
             allow_unconfined = true }} in the agent config allows it",
            component.display().to_string()
        )),
        "{stderr}"
    );
    let (code, stderr) = validate(&format!(
        "plugin \"undeclared_spawn\" {{\n  path = {:?}\n  allow_unconfined = true\n}}\n",
        component.display().to_string()
    ));
    assert_eq!(code, Some(0), "{stderr}");
}

/// `driver inspect` shows one driver whole, with the limits the operator set; a name no
/// driver has is an error naming the drivers there are.
#[test]
fn driver_inspect_shows_one_driver_and_an_unknown_name_lists_the_loaded_ones() {
    let dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(support::cache_dir(), dir.path().join("component-cache")).unwrap();
    let config = dir.path().join("agent.hcl");
    std::fs::write(&config, "max_plugin_instances = 16\n").unwrap();
    let inspect = |args: &[&str]| {
        let output = berth_without_env()
            .arg("--config")
            .arg(&config)
            .arg("--data-dir")
            .arg(dir.path())
            .args(["driver", "inspect"])
            .args(args)
            .output()
            .unwrap();
        (
            output.status.code(),
            String::from_utf8(output.stdout).unwrap(),
            String::from_utf8(output.stderr).unwrap(),
        )
    };
    let (code, stdout, stderr) = inspect(&["exec"]);
    assert_eq!(code, Some(0), "{stderr}");
    for line in [
        "Name           exec",
        "World          berth:driver@0.2.1",
        "Origin         built-in",
        "Mount configs  all",
        "FS isolation   chroot",
        "Spawns         chroot\n",
        // Read from the driver's own config type (`ExecConfig`).
        "Config         command  string  (required)\n",
        "               args     list(string)\n",
        "Exec           yes",
        "Instances      16 at once, shared by every driver and hook (2 kept for checks)",
    ] {
        assert!(stdout.contains(line), "no {line:?} in:\n{stdout}");
    }
    assert!(
        stdout.contains("Compiled       loaded from the compile cache")
            || stdout.contains("Compiled       compiled in "),
        "{stdout}"
    );

    let (code, stdout, stderr) = inspect(&["exec", "--json"]);
    assert_eq!(code, Some(0), "{stderr}");
    let shown: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(shown["world"], "berth:driver@0.2.1", "{shown:#}");
    assert_eq!(shown["capabilities"]["fs_isolation"], "chroot", "{shown:#}");
    assert_eq!(
        shown["capabilities"]["spawn_isolation"],
        serde_json::json!(["chroot"]),
        "{shown:#}"
    );
    assert_eq!(
        shown["config_schema"][0],
        serde_json::json!({"name": "command", "hcl_type": "string", "required": true}),
        "{shown:#}"
    );

    // raw_exec spawns unconfined, which takes the operator's leave; mock spawns nothing.
    let (code, stdout, stderr) = inspect(&["raw_exec"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stdout.contains(
            "Spawns         none (unconfined: its tasks run only where the operator allows it)"
        ),
        "{stdout}"
    );
    let (code, stdout, stderr) = inspect(&["mock"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.contains("Spawns         nothing\n"), "{stdout}");
    assert_eq!(shown["limits"]["max_instances"], 16, "{shown:#}");
    assert_eq!(shown["sha256"].as_str().unwrap().len(), 64, "{shown:#}");

    let (code, _, stderr) = inspect(&["exce"]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains(
            "no driver \"exce\" is loaded (this agent has: exec, raw_exec, docker, mock)"
        ),
        "{stderr}"
    );
}

/// A large component (the 18 MB Python hook) compiles for seconds the first time: the
/// CLI says so, once, and where it keeps the result; the next load reads that and says
/// nothing.
#[test]
fn a_large_components_first_compile_says_so_and_a_cached_load_does_not() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("agent.hcl");
    std::fs::write(
        &config,
        format!(
            "hook \"deny-list\" {{\n  path = \"{}\"\n}}\n",
            support::python_hook().display()
        ),
    )
    .unwrap();
    let list = || {
        let output = berth_without_env()
            .arg("--config")
            .arg(&config)
            .arg("--data-dir")
            .arg(dir.path())
            .args(["hook", "list"])
            .output()
            .unwrap();
        let stderr = String::from_utf8(output.stderr).unwrap();
        assert!(output.status.success(), "{stderr}");
        stderr
    };
    let first = list();
    let said = format!(
        "for this machine; once: it is kept in {}",
        dir.path().join("component-cache").display()
    );
    assert_eq!(
        first.matches("==> Compiling hook \"deny-list\"").count(),
        1,
        "{first}"
    );
    assert_eq!(first.matches(&said).count(), 1, "{first}");
    let second = list();
    assert!(!second.contains("Compiling"), "{second}");
}
