//! The `berth` binary, as a person runs it.

use std::process::Command;

use crate::support;

#[test]
fn driver_list_shows_every_driver_with_its_capabilities_and_skips_bad_files() {
    let plugins = tempfile::tempdir().unwrap();
    std::fs::copy(
        berth::builtin::test_components::LEGACY_V01,
        plugins.path().join("legacy.wasm"),
    )
    .unwrap();
    std::fs::copy(support::python_driver(), plugins.path().join("pyexec.wasm")).unwrap();
    std::fs::write(plugins.path().join("broken.wasm"), "nope").unwrap();
    let (stdout, stderr, success, _) = driver_list(plugins.path());
    assert!(success, "{stderr}");
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
        ["exec", "0.1.0", "0.2.0", "all", "chroot"]
    );
    assert_eq!(
        row("raw_exec")[..5],
        ["raw_exec", "0.1.0", "0.2.0", "none", "none"]
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
            berth::builtin::test_components::LEGACY_V01,
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
            berth::builtin::test_components::SLOW_INFO,
            plugins.path().join(name),
        )
        .unwrap();
    }
    std::fs::copy(
        berth::builtin::test_components::LEGACY_V01,
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
    let deadline = berth::runtime::driver::LOAD_CALL_WALL;
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
