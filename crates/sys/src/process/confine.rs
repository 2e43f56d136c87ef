//! What a confined task keeps of root: the last thing its process does before `exec`,
//! after its mounts (which still need `CAP_SYS_ADMIN`) and its `pivot_root`.
//!
//! - The capability bounding set, permitted and effective sets are cut to
//!   [`TASK_CAPABILITIES`] (Nomad's default `exec` set less `CAP_MKNOD`: without a devices
//!   cgroup, a task that can make device nodes can open the host's disks; less
//!   `CAP_SETFCAP` and `CAP_FSETID`: a root task could give a file in a volume file
//!   capabilities, or keep a setuid bit through a write, which work outside the task
//!   for any local user), or, for a CSI
//!   plugin the operator granted mounting, to [`MOUNTING_PLUGIN_CAPABILITIES`] (the same
//!   plus `CAP_SYS_ADMIN`, which its seccomp filter narrows to bind mounts). Inheritable
//!   is empty.
//! - `no_new_privs`: no setuid binary, no file capability gives any of it back.
//!
//! With `CAP_SYS_PTRACE` gone and its capabilities a strict subset of the agent's, a task
//! also cannot read `/proc/<pid>/root`, `environ` or `mem` of the agent or any other
//! fully privileged process (the kernel's ptrace access check), even as root.

use std::io;

use rustix::thread::{CapabilitySet, CapabilitySets};

/// Nomad's default capabilities for `exec` tasks (drivers/shared/capabilities), without
/// `MKNOD`, `SETFCAP` and `FSETID`: under `no_new_privs` file capabilities and setuid
/// bits never work inside a task, only for whoever runs its files outside it (attack
/// review: a root task `setcap cap_setuid+ep` on a perl in a host volume, and `nobody`
/// on the host ran it to uid 0).
pub const TASK_CAPABILITIES: CapabilitySet = CapabilitySet::AUDIT_WRITE
    .union(CapabilitySet::CHOWN)
    .union(CapabilitySet::DAC_OVERRIDE)
    .union(CapabilitySet::FOWNER)
    .union(CapabilitySet::KILL)
    .union(CapabilitySet::NET_BIND_SERVICE)
    .union(CapabilitySet::SETGID)
    .union(CapabilitySet::SETPCAP)
    .union(CapabilitySet::SETUID)
    .union(CapabilitySet::SYS_CHROOT);

/// What a CSI node plugin needs to mount volumes, and no more: [`TASK_CAPABILITIES`] and
/// `CAP_SYS_ADMIN`. Never `CAP_DAC_READ_SEARCH` (`open_by_handle_at` opens any file of a
/// filesystem the task can see, the host's root among them), `CAP_MKNOD`,
/// `CAP_SYS_MODULE`, `CAP_SYS_RAWIO`, `CAP_SYS_PTRACE` or `CAP_NET_ADMIN`.
pub const MOUNTING_PLUGIN_CAPABILITIES: CapabilitySet =
    TASK_CAPABILITIES.union(CapabilitySet::SYS_ADMIN);

/// What a task on an image may be given with `cap_add`: Docker's default set, which
/// is [`TASK_CAPABILITIES`] and `MKNOD`, `SETFCAP` and `FSETID`. In the task's own user
/// namespace these reach only what that namespace maps: `MKNOD` makes no device node
/// (the filesystems are the host's namespace's), a file capability `SETFCAP` writes
/// holds only in that namespace, and `FSETID` keeps a setgid bit only on the task's
/// own ids' files. Capabilities over a namespace (`NET_ADMIN`, `SYS_ADMIN`) would do
/// nothing: the task's network, mount and other namespaces are the host's.
pub const IMAGE_TASK_CAPABILITIES: CapabilitySet = TASK_CAPABILITIES
    .union(CapabilitySet::MKNOD)
    .union(CapabilitySet::SETFCAP)
    .union(CapabilitySet::FSETID);

/// A capability by Docker's name (`net_raw`, `CAP_NET_RAW`, any case).
pub fn capability_by_name(name: &str) -> Option<CapabilitySet> {
    let upper = name.trim().to_ascii_uppercase();
    let bare = upper.strip_prefix("CAP_").unwrap_or(&upper);
    CapabilitySet::from_name(bare).filter(|_| !bare.is_empty())
}

/// How much of root a confined task keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Confinement {
    /// [`TASK_CAPABILITIES`].
    Task,
    /// [`MOUNTING_PLUGIN_CAPABILITIES`]: a CSI plugin the operator granted mounting.
    MountingPlugin,
}

impl Confinement {
    pub fn capabilities(self) -> CapabilitySet {
        match self {
            Confinement::Task => TASK_CAPABILITIES,
            Confinement::MountingPlugin => MOUNTING_PLUGIN_CAPABILITIES,
        }
    }
}

/// Drops every capability outside `confinement`'s for good and sets `no_new_privs`.
/// Async-signal-safe: raw syscalls, no allocation; runs between `fork` and `exec`.
pub fn drop_privileges(confinement: Confinement) -> io::Result<()> {
    drop_privileges_to(confinement.capabilities())
}

/// [`drop_privileges`] to `kept` (a task on an image whose job changed its set, within
/// [`IMAGE_TASK_CAPABILITIES`]).
pub fn drop_privileges_to(kept: CapabilitySet) -> io::Result<()> {
    for bit in 0..64 {
        let capability = CapabilitySet::from_bits_retain(1 << bit);
        if kept.contains(capability) {
            continue;
        }
        match rustix::thread::remove_capability_from_bounding_set(capability) {
            // A capability this kernel does not know: nothing to drop.
            Err(rustix::io::Errno::INVAL) => {}
            other => other?,
        }
    }
    rustix::thread::set_capabilities(
        None,
        CapabilitySets {
            effective: kept,
            permitted: kept,
            inheritable: CapabilitySet::empty(),
        },
    )?;
    rustix::thread::set_no_new_privs(true)?;
    Ok(())
}

/// Becomes `user` (its primary group only) for good. Async-signal-safe, as above. Leaving
/// uid 0 makes the kernel clear the permitted and effective capabilities.
pub fn become_user(user: berth_model::driver::TaskUser) -> io::Result<()> {
    let gid = rustix::process::Gid::from_raw(user.gid);
    rustix::thread::set_thread_groups(&[gid])?;
    rustix::thread::set_thread_res_gid(gid, gid, gid)?;
    let uid = rustix::process::Uid::from_raw(user.uid);
    rustix::thread::set_thread_res_uid(uid, uid, uid)?;
    Ok(())
}
