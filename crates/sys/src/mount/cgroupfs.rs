//! Mounting and reconfiguring cgroup filesystems, for the node-wide tuning an operator
//! asks for in `cgroups { favor_dynmods = true }` (see [`crate::cgroup::favor`]).

use std::path::Path;

use rustix::mount::{self, FsPickFlags, MountFlags};

/// Reconfigures the cgroup2 superblock mounted at `target` with `options` (its current
/// super options, each `key` or `key=value`; `rw`/`ro` are the mount's and are left
/// alone) plus the flag `add`. A reconfiguration clears every option it does not name,
/// hence the current ones are passed again. Per-mount flags (`nosuid`, …) are untouched.
pub fn reconfigure_cgroup2(target: &Path, options: &[&str], add: &str) -> std::io::Result<()> {
    let context = mount::fspick(rustix::fs::CWD, target, FsPickFlags::FSPICK_CLOEXEC)?;
    for option in options.iter().filter(|o| !matches!(**o, "rw" | "ro" | "")) {
        match option.split_once('=') {
            Some((key, value)) => mount::fsconfig_set_string(&context, key, value)?,
            None => mount::fsconfig_set_flag(&context, *option)?,
        }
    }
    mount::fsconfig_set_flag(&context, add)?;
    mount::fsconfig_reconfigure(&context)?;
    Ok(())
}

/// Mounts a cgroup v1 hierarchy with no controller (`none,name=<name>`) and `options`
/// at `target`, which must exist.
pub fn mount_named_cgroup1(target: &Path, name: &str, options: &str) -> std::io::Result<()> {
    let data = crate::mount::c_path(format!("none,name={name},{options}"))?;
    mount::mount(
        c"cgroup",
        target,
        c"cgroup",
        MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
        Some(data.as_c_str()),
    )?;
    Ok(())
}

/// Unmounts `target` (lazily: nothing of the agent's holds it open).
pub fn unmount(target: &Path) -> std::io::Result<()> {
    mount::unmount(target, mount::UnmountFlags::DETACH)?;
    Ok(())
}
