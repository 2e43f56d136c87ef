//! The binaries cargo built for the running test or bench, and the directories of its
//! target dir the runs share.
//!
//! Cargo gives an integration test or bench the path of its package's binaries only at
//! compile time (`env!("CARGO_BIN_EXE_<name>")`), which a library cannot read. They sit
//! in the profile's directory, the parent of the `deps/` the test or bench runs from
//! (`target/debug/deps/e2e-<hash>` runs beside `target/debug/berth`), as crates such as
//! `assert_cmd` find them too.

use std::path::PathBuf;

/// The profile's output directory of this test or bench: `target/<profile>`.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test knows its own executable");
    let deps = exe.parent().expect("a test runs from a directory");
    // `cargo test` runs tests from `deps/`; anything else run from the profile dir.
    if deps.ends_with("deps") {
        deps.parent().expect("deps/ has a parent").to_path_buf()
    } else {
        deps.to_path_buf()
    }
}

fn built(name: &str) -> PathBuf {
    let path = profile_dir().join(name);
    assert!(
        path.is_file(),
        "{} is not built: run the tests and benches through cargo (`cargo test`, `cargo bench`), which builds the package's binaries first",
        path.display()
    );
    path
}

/// The `berth` binary.
pub fn berth() -> PathBuf {
    built("berth")
}

/// The `berth-keeper` binary, which starts every task.
pub fn berth_keeper() -> PathBuf {
    built("berth-keeper")
}

/// The target dir's scratch directory (`target/tmp`, what cargo names
/// `CARGO_TARGET_TMPDIR` for integration tests).
pub fn target_tmp() -> PathBuf {
    let dir = profile_dir()
        .parent()
        .expect("a profile dir is inside the target dir")
        .join("tmp");
    std::fs::create_dir_all(&dir).expect("the target dir is writable");
    dir
}

/// The component cache the tests and benches share. It exists when this returns, so a
/// symlink to it (agents in their own data dirs) never dangles.
pub fn component_cache() -> PathBuf {
    let dir = target_tmp().join("component-cache");
    std::fs::create_dir_all(&dir).expect("the target dir is writable");
    dir
}
