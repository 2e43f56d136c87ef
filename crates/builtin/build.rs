//! Builds the guest components in `drivers/` for `wasm32-wasip2` with a nested cargo, in
//! a target dir of its own under `OUT_DIR` (so it never waits on the outer cargo's lock),
//! and writes `guests.rs`: the first-party drivers as embedded bytes, the test components
//! as paths.

use std::env;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Guest crates (lib names) the `berth` binary embeds.
const EMBEDDED: &[(&str, &str)] = &[
    ("EXEC", "berth_driver_exec"),
    ("RAW_EXEC", "berth_driver_raw_exec"),
    ("DOCKER", "berth_driver_docker"),
    ("MOCK", "berth_driver_mock"),
];

/// Guest crates only tests use; exposed as paths.
const TEST_ONLY: &[(&str, &str)] = &[
    ("LEGACY_V01", "berth_test_legacy_v01"),
    ("UNDECLARED_SPAWN", "berth_test_undeclared_spawn"),
    ("MISBEHAVE", "berth_test_misbehave"),
    ("IMAGE_MISBEHAVE", "berth_test_image_misbehave"),
    ("SLOW_INFO", "berth_test_slow_info"),
    ("HOSTILE_HOOK", "berth_hook_hostile_hook"),
    ("INJECT_ENV_HOOK", "berth_hook_inject_env"),
    ("RENDER_TEMPLATE_HOOK", "berth_hook_render_template"),
    ("DENY_POLICY_HOOK", "berth_hook_deny_policy"),
];

fn main() {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    // This crate is `crates/builtin/`: the repository is two folders up.
    let repo = manifest_dir.parent().and_then(Path::parent).unwrap();
    let out_dir = PathBuf::from(env::var("OUT_DIR").unwrap());
    let guest_target = out_dir.join("guests");

    for dir in ["drivers", "plugins-sdk", "wit"] {
        watch(&repo.join(dir));
    }

    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut build = Command::new(cargo);
    build
        .arg("build")
        .arg("--release")
        .arg("--target=wasm32-wasip2")
        .arg("--manifest-path")
        .arg(repo.join("drivers/Cargo.toml"))
        .arg("--target-dir")
        .arg(&guest_target)
        // Flags meant for the host build must not leak into the guest build.
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("CARGO_BUILD_TARGET")
        .env_remove("RUSTC_WORKSPACE_WRAPPER");
    let status = build
        .status()
        .expect("failed to run cargo for the guest components");
    if !status.success() {
        panic!(
            "building the guest components failed; is the target installed? \
             (`rustup target add wasm32-wasip2`)"
        );
    }

    let artifacts = guest_target.join("wasm32-wasip2/release");
    let mut generated = String::new();
    for (name, lib) in EMBEDDED {
        let path = artifacts.join(format!("{lib}.wasm"));
        writeln!(
            generated,
            "pub const {name}: &[u8] = include_bytes!({path:?});"
        )
        .unwrap();
    }
    generated.push_str("pub mod test_components {\n");
    for (name, lib) in TEST_ONLY {
        let path = artifacts.join(format!("{lib}.wasm"));
        writeln!(
            generated,
            "    pub const {name}: &str = {:?};",
            path.to_str().unwrap()
        )
        .unwrap();
    }
    generated.push_str("}\n");
    std::fs::write(out_dir.join("guests.rs"), generated).unwrap();
}

/// Asks cargo to rerun this script when a source file below `dir` changes, skipping
/// build output.
fn watch(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    println!("cargo:rerun-if-changed={}", dir.display());
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        if name == "target" || name.to_string_lossy().starts_with('.') {
            continue;
        }
        if path.is_dir() {
            watch(&path);
        } else {
            println!("cargo:rerun-if-changed={}", path.display());
        }
    }
}
