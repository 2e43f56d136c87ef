//! Fixture programs that are workspace members of their own (so the `berth` package
//! does not carry them), built on first use by the cargo that runs the tests or benches,
//! in the same profile. Shared by `tests/e2e` and `host/benches` (included by path).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The reference CSI plugin (`tests/csi-hostpath`, package `berth-csi-hostpath`).
pub fn csi_hostpath() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| build("berth-csi-hostpath", "csi-hostpath"))
}

/// Builds `bin` of `package` and returns the executable's path, from cargo's own JSON
/// messages (so the target dir and profile are cargo's, not a guess).
fn build(package: &str, bin: &str) -> PathBuf {
    let mut cargo = Command::new(env!("CARGO"));
    cargo
        .args(["build", "--quiet", "--message-format=json"])
        .args(["--package", package, "--bin", bin])
        .current_dir(env!("CARGO_MANIFEST_DIR"));
    if !cfg!(debug_assertions) {
        cargo.arg("--release");
    }
    let output = cargo.output().expect("running cargo to build a fixture");
    assert!(
        output.status.success(),
        "building {package} failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .find_map(|message| {
            let executable = message.get("executable")?.as_str()?;
            let name = message.get("target")?.get("name")?.as_str()?;
            (name == bin).then(|| PathBuf::from(executable))
        })
        .unwrap_or_else(|| panic!("cargo built {package} but named no executable {bin}"))
}
