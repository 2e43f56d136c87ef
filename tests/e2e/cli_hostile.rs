//! Every CLI command, run on a terminal (a real pseudo-terminal) against an agent that
//! holds text a job author or a token holder wrote (an OSC 52 clipboard write, BEL, a
//! forged line, a bidi override, C1's CSI), and given such text as its arguments:
//! nothing any of them prints reaches the terminal as a control character but our own
//! line breaks and tabs, with `--json` and without.
//!
//! The list of commands is checked against the CLI's own `--help`, so a command added
//! later without a row here fails this test.

use std::collections::BTreeSet;
use std::io::Read as _;
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use berth_client::alloc_runner::AllocStatus;
use berth_harness::AgentProcess;
use berth_model::events::TaskStateKind;
use berth_model::status::ClientStatus;

use crate::csi::CsiSteps as _;
use crate::support;

/// What a hostile author writes: a clipboard write ended by BEL, a forged line, a
/// right-to-left override, and C1's CSI clearing the screen.
const HOSTILE: &str = "X\u{1b}]52;c;aGk=\u{7}\r\nforged line\u{202e}txt\u{9b}2J";

/// `berth agent` is the test's agent itself: its output (the events it prints and its
/// log, written to a file here) is checked as a command's is.
const CHECKED_THROUGH_THE_AGENTS_OUTPUT: &str = "agent";

/// `text` as an HCL string literal (JSON's escapes are HCL's).
fn hcl(text: &str) -> String {
    serde_json::to_string(text).unwrap()
}

/// A job whose every author-written field the CLI shows holds [`HOSTILE`]: a failed
/// start's message, meta, a service's tags, and a task's output.
fn hostile_job() -> String {
    let h = hcl(HOSTILE);
    format!(
        r#"job "hostile" {{
  type = "batch"
  meta {{
    note = {h}
  }}
  group "fails" {{
    restart {{
      attempts = 0
      mode     = "fail"
    }}
    reschedule {{
      attempts  = 0
      unlimited = false
    }}
    task "t" {{
      driver = "mock"
      config {{
        start_error = {h}
      }}
    }}
  }}
  group "serves" {{
    task "t" {{
      driver = "mock"
      config {{
        run_for = "1h"
      }}
      meta {{
        note = {h}
      }}
      service {{
        name     = "web"
        provider = "nomad"
        tags     = [{h}]
      }}
    }}
  }}
  group "prints" {{
    task "t" {{
      driver = "exec"
      config {{
        command = "/bin/sh"
        args    = ["-c", "printf '%s\\n' \"$NOTE\"; printf '%s\\n' \"$NOTE\" >&2; : > \"$NOMAD_TASK_DIR/$NOTE\""]
      }}
      env {{
        NOTE = {h}
      }}
    }}
  }}
}}
"#
    )
}

/// A parameterized job that takes `note` as dispatch meta.
fn parameterized_job() -> String {
    r#"job "param" {
  type = "batch"
  parameterized {
    meta_optional = ["note"]
  }
  group "g" {
    task "t" {
      driver = "mock"
      config {
        run_for = "1h"
      }
    }
  }
}
"#
    .to_string()
}

/// A jobspec refused for what it names: its driver and a volume's source are hostile.
fn refused_job() -> String {
    let h = hcl(HOSTILE);
    format!(
        r#"job "refused" {{
  meta {{
    note = {h}
  }}
  group "g" {{
    task "t" {{
      driver = {h}
      config {{
        command = {h}
      }}
    }}
  }}
}}
"#
    )
}

/// Runs the CLI on a pseudo-terminal in raw mode (bytes arrive as written, no `\n` to
/// `\r\n`), so each command takes its terminal path: what the operator would see.
/// Returns its exit code and everything it wrote to stdout and stderr.
fn on_a_terminal(args: &[String], global: &[String]) -> (Option<i32>, String) {
    let (mut master, mut slave) = (-1, -1);
    // SAFETY: openpty(3) writes two descriptors into the locals; no name, termios or
    // window size is passed.
    let opened = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    assert_eq!(opened, 0, "openpty: {}", std::io::Error::last_os_error());
    // SAFETY: both descriptors were just opened and are owned here alone.
    let (master, slave) = unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
    // SAFETY: tcgetattr(3), cfmakeraw(3) and tcsetattr(3) on a local termios and the
    // slave just opened.
    unsafe {
        let mut attributes: libc::termios = std::mem::zeroed();
        assert_eq!(libc::tcgetattr(slave.as_raw_fd(), &mut attributes), 0);
        libc::cfmakeraw(&mut attributes);
        assert_eq!(
            libc::tcsetattr(slave.as_raw_fd(), libc::TCSANOW, &attributes),
            0
        );
    }
    let mut child = {
        // The command (and with it the parent's copies of the slave) is dropped once
        // spawned, so the master reads end of file when the CLI exits.
        let mut command = Command::new(env!("CARGO_BIN_EXE_berth"));
        command
            .args(global)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::from(slave.try_clone().unwrap()))
            .stderr(Stdio::from(slave));
        command.spawn().unwrap()
    };
    let reader = std::thread::spawn(move || {
        let mut master = std::fs::File::from(master);
        let mut seen = Vec::new();
        let mut buffer = [0u8; 4096];
        loop {
            match master.read(&mut buffer) {
                Ok(0) => break,
                Ok(n) => seen.extend_from_slice(&buffer[..n]),
                Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
                // EIO: every slave is closed.
                Err(_) => break,
            }
        }
        seen
    });
    let deadline = Instant::now() + Duration::from_secs(90);
    let code = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status.code();
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("berth {args:?} did not end within 90 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let seen = reader.join().unwrap();
    (code, String::from_utf8_lossy(&seen).into_owned())
}

/// The characters of `text` that a terminal would act on: every control character but
/// line feed and tab, and the bidirectional controls.
fn terminal_controls(text: &str) -> Vec<char> {
    text.chars()
        .filter(|&c| {
            (c.is_control() && c != '\n' && c != '\t')
                || matches!(
                    c,
                    '\u{202a}'..='\u{202e}'
                        | '\u{2066}'..='\u{2069}'
                        | '\u{200e}'
                        | '\u{200f}'
                        | '\u{061c}'
                )
        })
        .collect()
}

/// Every command of the CLI, as `--help` lists them: "job run", "volume snapshot list".
fn every_command() -> BTreeSet<String> {
    fn below(path: &[&str], found: &mut BTreeSet<String>) {
        let output = Command::new(env!("CARGO_BIN_EXE_berth"))
            .args(path)
            .arg("--help")
            .output()
            .unwrap();
        let help = String::from_utf8(output.stdout).unwrap();
        let subcommands: Vec<String> = help
            .lines()
            .skip_while(|line| !line.starts_with("Commands:"))
            .skip(1)
            .take_while(|line| line.starts_with("  "))
            .filter_map(|line| line.split_whitespace().next())
            .filter(|name| *name != "help")
            .map(str::to_string)
            .collect();
        if subcommands.is_empty() {
            found.insert(path.join(" "));
        }
        for name in subcommands {
            let mut deeper = path.to_vec();
            deeper.push(&name);
            below(&deeper, found);
        }
    }
    let mut found = BTreeSet::new();
    below(&[], &mut found);
    found
}

/// Whether `command` ("alloc status") takes `--json`.
fn takes_json(command: &str) -> bool {
    let output = Command::new(env!("CARGO_BIN_EXE_berth"))
        .args(command.split(' '))
        .arg("--help")
        .output()
        .unwrap();
    String::from_utf8(output.stdout).unwrap().contains("--json")
}

/// The length of `command`'s path among `args` ("volume snapshot list" is three words).
fn command_of(args: &[String], commands: &BTreeSet<String>) -> String {
    (1..=args.len())
        .rev()
        .map(|n| args[..n].join(" "))
        .find(|path| commands.contains(path))
        .unwrap_or_else(|| panic!("{args:?} is no command of the CLI"))
}

fn alloc_of(allocs: &[AllocStatus], group: &str) -> String {
    allocs
        .iter()
        .find(|a| a.name.contains(&format!(".{group}[")))
        .unwrap_or_else(|| panic!("no alloc of group {group}: {allocs:#?}"))
        .id
        .clone()
}

#[tokio::test(flavor = "multi_thread")]
async fn every_command_shows_hostile_text_escaped_on_a_terminal() {
    let mut agent = crate::csi::agent();
    agent.start().await;
    let plugin_alloc = agent.run_plugin("plugin", "hostpath", &[]).await;

    // What token holders and job authors leave in the agent.
    let volume = crate::csi::volume_spec("hostile", "hostpath").replace(
        "name      = \"hostile\"",
        &format!("name      = {}", hcl(HOSTILE)),
    );
    let volume = agent.write_file("hostile-volume.hcl", &volume);
    let (code, out, err) = agent.cli(&["volume", "create", volume.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    let refused_volume = agent.write_file(
        "refused-volume.hcl",
        &crate::csi::volume_spec("refused", "hostpath").replace(
            "plugin_id = \"hostpath\"",
            &format!("plugin_id = {}", hcl(HOSTILE)),
        ),
    );
    let submitted = agent
        .submit("hostile", &hostile_job())
        .await
        .unwrap_or_else(|e| panic!("{e:?}\n{}", agent.output()));
    agent
        .submit("param", &parameterized_job())
        .await
        .unwrap_or_else(|e| panic!("{e:?}"));
    let job_file = agent.write_file("hostile.hcl", &hostile_job());
    let refused_file = agent.write_file("refused.hcl", &refused_job());
    let allocs = wait_for_the_hostile_job(&agent, &submitted.alloc_ids).await;
    let fails = alloc_of(&allocs, "fails");
    let serves = alloc_of(&allocs, "serves");
    let prints = alloc_of(&allocs, "prints");

    let hostile = HOSTILE.to_string();
    let s = |items: &[&str]| items.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let path = |p: &Path| p.to_str().unwrap().to_string();
    let rows: Vec<Vec<String>> = vec![
        s(&["job", "validate", &path(&refused_file)]),
        s(&["job", "validate", &path(&job_file)]),
        s(&["job", "plan", &path(&refused_file)]),
        s(&["job", "plan", &path(&job_file)]),
        s(&["job", "run", &path(&refused_file)]),
        s(&["job", "status"]),
        s(&["job", "status", "hostile"]),
        s(&["job", "status", &hostile]),
        s(&["job", "stop", &hostile]),
        s(&[
            "job",
            "dispatch",
            "param",
            "--meta",
            &format!("note={HOSTILE}"),
        ]),
        s(&[
            "job",
            "dispatch",
            "param",
            "--meta",
            &format!("{HOSTILE}=1"),
        ]),
        s(&["job", "dispatch", &hostile]),
        s(&["job", "periodic", "force", &hostile]),
        s(&["alloc", "status", &fails]),
        s(&["alloc", "status", &serves]),
        s(&["alloc", "status", &hostile]),
        s(&["alloc", "logs", &prints]),
        s(&["alloc", "logs", "--stderr", &prints]),
        s(&["alloc", "logs", &hostile]),
        s(&["alloc", "logs", &serves, &hostile]),
        s(&["alloc", "restart", &hostile]),
        s(&["alloc", "restart", &serves, &hostile]),
        s(&["alloc", "signal", "--signal", &hostile, &serves]),
        s(&["alloc", "signal", &hostile]),
        // A file the task named with the hostile text, listed and shown.
        s(&["alloc", "fs", &prints, "t/local"]),
        s(&[
            "alloc",
            "fs",
            "--stat",
            &prints,
            &format!("t/local/{HOSTILE}"),
        ]),
        s(&["alloc", "fs", &prints, &hostile]),
        s(&["alloc", "fs", &hostile]),
        s(&["alloc", "stop", &hostile]),
        // Refused before any session opens, each naming what it was given.
        s(&["alloc", "exec", &hostile, "id"]),
        s(&["alloc", "exec", "--task", &hostile, &serves, "id"]),
        s(&["alloc", "exec", &serves, &hostile]),
        s(&["volume", "register", &path(&refused_volume)]),
        s(&["volume", "create", &path(&refused_volume)]),
        s(&["volume", "status"]),
        s(&["volume", "status", "hostile"]),
        s(&["volume", "status", &hostile]),
        s(&["volume", "deregister", &hostile]),
        s(&["volume", "delete", &hostile]),
        s(&["volume", "detach", &hostile]),
        s(&["volume", "snapshot", "create", "hostile", &hostile]),
        s(&["volume", "snapshot", "create", &hostile]),
        s(&["volume", "snapshot", "list"]),
        s(&["volume", "snapshot", "delete", "hostpath", &hostile]),
        s(&["plugin", "status"]),
        s(&["plugin", "status", "hostpath"]),
        s(&["plugin", "status", &hostile]),
        s(&["system", "gc"]),
        s(&["service", "list"]),
        s(&["node", "status"]),
        s(&["node", "status", "--verbose"]),
        s(&["node", "status", &hostile]),
        s(&["node", "eligibility", "--enable", &hostile]),
        s(&["node", "drain", "--enable", &hostile]),
        s(&["driver", "list"]),
        s(&["driver", "inspect", "mock"]),
        s(&["driver", "inspect", &hostile]),
        s(&["hook", "list"]),
        // The node's image store: a hostile reference, archive path and tag.
        s(&["image", "list"]),
        s(&["image", "pull", &hostile]),
        s(&["image", "rm", &hostile]),
        s(&["image", "load", &hostile]),
        s(&["image", "load", &path(&job_file), &hostile]),
    ];
    let commands = every_command();
    let global = vec![
        "--address".to_string(),
        format!("unix://{}", agent.socket().display()),
        "--config".to_string(),
        path(&agent.path().join("agent.hcl")),
        "--data-dir".to_string(),
        path(&agent.path().join("data")),
    ];
    let mut runs: Vec<(Vec<String>, Option<i32>, String)> = Vec::new();
    let mut covered = BTreeSet::new();
    for row in rows {
        let command = command_of(&row, &commands);
        covered.insert(command.clone());
        let json = takes_json(&command);
        let (code, shown) = on_a_terminal(&row, &global);
        runs.push((row.clone(), code, shown));
        if json {
            let mut with_json = row.clone();
            with_json.insert(command.split(' ').count(), "--json".to_string());
            let (code, shown) = on_a_terminal(&with_json, &global);
            runs.push((with_json, code, shown));
        }
    }
    // `run`: an embedded agent of its own, streaming the events of a job that fails with
    // a hostile message.
    let run_dir = agent.path().join("run-data");
    std::fs::create_dir_all(&run_dir).unwrap();
    std::os::unix::fs::symlink(support::cache_dir(), run_dir.join("component-cache")).unwrap();
    let run_job = agent.write_file(
        "run.hcl",
        &format!(
            "job \"run\" {{\n  type = \"batch\"\n  group \"g\" {{\n    restart {{\n      attempts = 0\n      mode = \"fail\"\n    }}\n    reschedule {{\n      attempts = 0\n      unlimited = false\n    }}\n    task \"t\" {{\n      driver = \"mock\"\n      config {{\n        start_error = {}\n      }}\n    }}\n  }}\n}}\n",
            hcl(HOSTILE)
        ),
    );
    let run = s(&["run", &path(&run_job)]);
    covered.insert(command_of(&run, &commands));
    let run_global = vec![
        "--config".to_string(),
        path(&agent.path().join("agent.hcl")),
        "--data-dir".to_string(),
        path(&run_dir),
    ];
    let (code, shown) = on_a_terminal(&run, &run_global);
    runs.push((run, code, shown));
    covered.insert(CHECKED_THROUGH_THE_AGENTS_OUTPUT.to_string());

    let missing: Vec<&String> = commands.difference(&covered).collect();
    assert!(
        missing.is_empty(),
        "commands without a hostile run here: {missing:?}"
    );
    let mut failures = Vec::new();
    for (args, code, shown) in &runs {
        let controls = terminal_controls(shown);
        if !controls.is_empty() || code.is_none() || *code == Some(101) {
            failures.push(format!(
                "berth {args:?} (exit {code:?}) showed {controls:?}:\n{shown}"
            ));
        }
    }
    let agent_output = agent.output();
    let controls = terminal_controls(&agent_output);
    if !controls.is_empty() || !agent_output.contains("X\\u{1b}]52;c;aGk=\\u{7}") {
        failures.push(format!(
            "the agent's own output showed {controls:?}, or not the failed start's message \
             escaped"
        ));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));

    // Not vacuous: the hostile text reached these commands and was shown escaped.
    let shown_by = |args: &[&str]| {
        runs.iter()
            .find(|(row, _, _)| row.iter().map(String::as_str).eq(args.iter().copied()))
            .map(|(_, _, shown)| shown.clone())
            .unwrap_or_else(|| panic!("{args:?} was not run"))
    };
    for args in [
        vec!["alloc", "status", fails.as_str()],
        vec!["alloc", "logs", prints.as_str()],
        vec!["alloc", "logs", "--stderr", prints.as_str()],
        vec!["service", "list"],
        vec!["volume", "status", "hostile"],
        vec!["job", "validate", refused_file.to_str().unwrap()],
        vec!["run", run_job.to_str().unwrap()],
    ] {
        let shown = shown_by(&args);
        assert!(
            shown.contains("X\\u{1b}]52;c;aGk=\\u{7}"),
            "berth {args:?} did not show the hostile text escaped:\n{shown}"
        );
    }
    let json = shown_by(&["alloc", "status", "--json", fails.as_str()]);
    assert!(
        json.contains("X\\u001b]52;c;aGk=\\u0007\\r\\nforged line\\u202etxt\\u009b2J"),
        "{json}"
    );

    agent.cli(&["job", "stop", "hostile"]);
    agent.cli(&["job", "stop", "plugin"]);
    agent
        .wait_alloc(&plugin_alloc, "stopped", |a| {
            matches!(
                a.client_status,
                ClientStatus::Complete | ClientStatus::Failed
            )
        })
        .await;
}

/// The hostile job's allocs once its failing group has failed, its serving one runs and
/// its printing one has printed.
async fn wait_for_the_hostile_job(agent: &AgentProcess, ids: &[String]) -> Vec<AllocStatus> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut allocs = Vec::new();
        for id in ids {
            allocs.push(agent.alloc(id).await);
        }
        let state = |group: &str| {
            allocs
                .iter()
                .find(|a| a.name.contains(&format!(".{group}[")))
                .map(|a| (a.client_status, a.tasks.get("t").map(|t| t.state)))
        };
        let fails = state("fails");
        let serves = state("serves");
        let prints = state("prints");
        if matches!(fails, Some((ClientStatus::Failed, _)))
            && matches!(serves, Some((_, Some(TaskStateKind::Running))))
            && matches!(prints, Some((ClientStatus::Complete, _)))
        {
            return allocs;
        }
        assert!(
            Instant::now() < deadline,
            "the hostile job never settled: {fails:?} {serves:?} {prints:?}\n{}",
            agent.output()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
