//! The SDK as an author outside this repository meets it: packaged with `cargo package`
//! and unpacked into a directory of its own (so nothing can reach back into the checkout,
//! `../wit` included), `examples/echo-driver` copied beside it, and the README's "Write a
//! hook" blocks written out as a crate. Both are built for wasm32-wasip2 and run by the
//! agent, as the example's own files say to.

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn cargo() -> Command {
    let mut command = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    // The test's own build settings are not the author's.
    for name in [
        "CARGO_ENCODED_RUSTFLAGS",
        "RUSTFLAGS",
        "CARGO_TARGET_DIR",
        "CARGO_MANIFEST_DIR",
    ] {
        command.env_remove(name);
    }
    command.env("CARGO_BUILD_JOBS", "2");
    command
}

/// Runs `command`, failing the test with everything it said when it fails.
fn run(command: &mut Command, what: &str) -> (String, String) {
    let output = command
        .output()
        .unwrap_or_else(|error| panic!("{what}: {error}"));
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(
        output.status.success(),
        "{what} failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
    (stdout, stderr)
}

/// The fenced block of `language` that follows `heading` in the README.
fn readme_block(readme: &str, heading: &str, language: &str) -> String {
    let section = &readme[readme.find(heading).expect(heading)..];
    let fence = format!("```{language}\n");
    let start = section.find(&fence).expect(&fence) + fence.len();
    let length = section[start..].find("```").unwrap();
    section[start..start + length].to_string()
}

/// `cargo package` of the SDK, unpacked into `into`: the directory of the packaged crate.
fn packaged_sdk(into: &Path) -> PathBuf {
    let package_target = into.join("package-target");
    run(
        cargo()
            .current_dir(repo())
            .args([
                "package",
                "-p",
                "berth-plugin-sdk",
                "--allow-dirty",
                "--no-verify",
            ])
            .arg("--target-dir")
            .arg(&package_target),
        "cargo package -p berth-plugin-sdk",
    );
    let crate_file = std::fs::read_dir(package_target.join("package"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .find(|path| path.extension().is_some_and(|e| e == "crate"))
        .expect("cargo package wrote no .crate");
    run(
        Command::new("tar")
            .arg("-xzf")
            .arg(&crate_file)
            .arg("-C")
            .arg(into),
        "unpack the SDK",
    );
    let unpacked = into.join(crate_file.file_stem().unwrap());
    for world in ["host", "driver", "hook"] {
        assert!(
            unpacked.join("wit").join(world).is_dir(),
            "the packaged SDK lacks wit/{world}"
        );
    }
    unpacked
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name();
        if name == "target" {
            continue;
        }
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &to.join(&name));
        } else {
            std::fs::copy(entry.path(), to.join(&name)).unwrap();
        }
    }
}

/// Builds the crate in `dir` for wasm32-wasip2 in release, into the shared `target`.
fn build_component(dir: &Path, target: &Path, file: &str) -> PathBuf {
    run(
        cargo()
            .current_dir(dir)
            .args(["build", "--release", "--target", "wasm32-wasip2"])
            .env("CARGO_TARGET_DIR", target),
        &format!("cargo build of {}", dir.display()),
    );
    target.join("wasm32-wasip2/release").join(file)
}

#[test]
fn a_driver_and_a_hook_built_outside_the_repo_from_the_example_and_the_readme_run_tasks() {
    let outside = tempfile::Builder::new()
        .prefix("berth-sdk-author")
        .tempdir_in("/tmp")
        .unwrap();
    let sdk = packaged_sdk(outside.path());
    // Kept between runs: the dependencies (wit-bindgen, serde) build once.
    let target = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("sdk-out-of-tree");

    // The example, copied out and pointed at the packaged SDK.
    let echo = outside.path().join("echo-driver");
    copy_tree(&repo().join("examples/echo-driver"), &echo);
    let manifest = std::fs::read_to_string(echo.join("Cargo.toml")).unwrap();
    let pointed = manifest.replace(
        "path = \"../../plugins-sdk\"",
        &format!("path = \"{}\"", sdk.display()),
    );
    assert_ne!(
        pointed, manifest,
        "the example no longer names the SDK by path"
    );
    std::fs::write(echo.join("Cargo.toml"), pointed).unwrap();
    let driver = build_component(&echo, &target, "echo_driver.wasm");
    // The example's size profile: berth's own drivers are about 100 KB; a default
    // release build is 2.5 MB.
    let size = std::fs::metadata(&driver).unwrap().len();
    assert!(size < 512 * 1024, "echo_driver.wasm is {size} bytes");
    // Where the example's agent.hcl looks for it (`plugin_dir`), as a build in place puts it.
    let plugin_dir = echo.join("target/wasm32-wasip2/release");
    std::fs::create_dir_all(&plugin_dir).unwrap();
    std::fs::copy(&driver, plugin_dir.join("echo_driver.wasm")).unwrap();

    // The README's hook, its two blocks as written.
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let hook = outside.path().join("greeting-hook");
    std::fs::create_dir_all(hook.join("src")).unwrap();
    let hook_manifest = readme_block(&readme, "## Write a hook", "toml");
    let pointed = hook_manifest.replace("/path/to/berth/plugins-sdk", &sdk.display().to_string());
    assert_ne!(
        pointed, hook_manifest,
        "the README's hook no longer names the SDK by path"
    );
    std::fs::write(hook.join("Cargo.toml"), format!("{pointed}\n[workspace]\n")).unwrap();
    std::fs::write(
        hook.join("src/lib.rs"),
        readme_block(&readme, "## Write a hook", "rust"),
    )
    .unwrap();
    let hook_wasm = build_component(&hook, &target, "greeting_hook.wasm");

    // The example's job, with the example's agent config, run as its README says.
    let data = outside.path().join("data");
    let berth = |args: &[&str]| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_berth"));
        command
            .current_dir(&echo)
            .args(["--config", "agent.hcl", "--data-dir"])
            .arg(&data)
            .args(args);
        command
    };
    let (stdout, _) = run(
        &mut berth(&["run", "echo.nomad.hcl"]),
        "berth run echo.nomad.hcl",
    );
    assert_eq!(
        stdout.matches("hello from my first berth driver\n").count(),
        2,
        "{stdout}"
    );
    assert!(stdout.contains("Complete"), "{stdout}");

    // A typo in its config is refused at its own line, with the field it meant.
    let job = std::fs::read_to_string(echo.join("echo.nomad.hcl")).unwrap();
    let (line, text) = (job.lines().enumerate())
        .find(|(_, text)| text.trim_start().starts_with("message"))
        .unwrap();
    let column = text.len() - text.trim_start().len() + 1;
    std::fs::write(
        echo.join("typo.hcl"),
        job.replacen("message =", "mesage =", 1),
    )
    .unwrap();
    let output = berth(&["job", "validate", "typo.hcl"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    let at = format!("typo.hcl:{}:{column}: ", line + 1);
    assert!(stderr.contains(&at), "not placed at {at}: {stderr}");
    assert!(
        stderr.contains("unknown field `mesage` (did you mean `message`?)"),
        "{stderr}"
    );

    // The hook, declared as the README says, gives every task its env var.
    let config = std::fs::read_to_string(echo.join("agent.hcl")).unwrap();
    std::fs::write(
        echo.join("agent.hcl"),
        format!(
            "{config}\nhook \"greeting\" {{\n  path      = \"{}\"\n  all_tasks = true\n}}\n",
            hook_wasm.display()
        ),
    )
    .unwrap();
    std::fs::write(
        echo.join("greet.nomad.hcl"),
        "job \"greet\" {\n  type = \"batch\"\n  group \"g\" {\n    restart {\n      attempts = 0\n      mode = \"fail\"\n    }\n    task \"greeted\" {\n      driver = \"exec\"\n      config {\n        command = \"/bin/sh\"\n        args    = [\"-c\", \"echo \\\"the hook says: $GREETING\\\"\"]\n      }\n    }\n  }\n}\n",
    )
    .unwrap();
    let (stdout, _) = run(
        &mut berth(&["run", "greet.nomad.hcl"]),
        "berth run greet.nomad.hcl",
    );
    assert!(
        stdout.contains("the hook says: hello greeted\n"),
        "{stdout}"
    );
}
