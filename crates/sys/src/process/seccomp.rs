//! The seccomp filter of confined tasks: the system calls a task has no business making,
//! refused with `EPERM` even where its other limits (no `CAP_SYS_ADMIN`, a chroot, a
//! pid namespace) would not stop them. The list follows Docker's default profile in
//! spirit, kept short enough to read:
//!
//! - mounting and namespaces: `mount`, `umount2`, `pivot_root`, the new mount API,
//!   `unshare`, `setns`, and `clone` with any `CLONE_NEW*` flag (`clone3`, whose flags the
//!   filter cannot see, fails with `ENOSYS` so libc falls back to `clone`);
//! - the kernel itself: `kexec_*`, module loading, `reboot`, `swapon`/`swapoff`, `acct`,
//!   `bpf`, `perf_event_open`, `userfaultfd`, `syslog`, the clock setters, `iopl`/`ioperm`;
//! - the kernel keyrings (`keyctl`, `add_key`, `request_key`): they are not namespaced,
//!   so a task running as uid 0 would otherwise share the host root's keys;
//! - file handles (`open_by_handle_at`, which escaped chroots in Docker's past,
//!   `name_to_handle_at`);
//! - `ptrace` except `PTRACE_TRACEME`: a process can be traced only by the parent it
//!   asked (a debugger that starts its program), never attached to;
//! - changing a file's project (`ioctl` `FS_IOC_FSSETXATTR`, `FS_IOC_SETFLAGS`,
//!   `file_setattr`): an alloc's disk may be a project quota, which its files must not
//!   leave (`chattr -p`, `chattr -P` answer "Operation not permitted");
//! - making a file setuid or setgid (`chmod`, `open` with `O_CREAT`, `mknod`… whose mode
//!   carries `S_ISUID` or `S_ISGID`), as systemd's `RestrictSUIDSGID=`: under
//!   `no_new_privs` such a bit never works inside a task, only outside it, where a file
//!   left in a host or CSI volume would hand a local user the task's uid or its alloc's
//!   gid (a dynamic user, [`super::dynamic_users`], is soon another task's);
//! - `io_uring`, whose queued operations (an `openat` among them) seccomp never sees, as
//!   Docker's default profile refuses it;
//! - on x86-64, every x32 call (a number with bit 30 set): the x32 ABI shares the x86-64
//!   audit architecture, so a filter that lists x86-64 numbers would let
//!   `0x40000000 | nr` past each refusal on a kernel built with x32.
//!
//! A CSI plugin the operator granted mounting keeps `CAP_SYS_ADMIN`, and its filter lets
//! it `umount2`, change propagation, and `mount` with `MS_BIND`: never a new filesystem
//! (a fresh `proc` or `sysfs` would give it the host's kernel settings), a superblock
//! remount (which changes the host's filesystem for everyone), or a move. Its calls with
//! `MS_BIND` (binds and bind remounts) are not the kernel's to make, though: a last
//! program hands each to the plugin's **mount warden** as a seccomp user notification
//! ([`super::mount_warden`]), which checks where the mount goes (a filter sees flags,
//! never paths) and makes it for the plugin, or refuses. The new mount API
//! (`open_tree`, `move_mount`, `mount_setattr`, `fsopen`…) answers it `ENOSYS`, as a
//! kernel older than 5.2 would, so util-linux's mount(8) falls back to `mount(2)`.
//! Everything else above is refused to it as to any task.
//!
//! The filters are compiled once in the agent, handed to each task's keeper in its spawn
//! plan, and installed by the task's init before it forks the task, after
//! `no_new_privs`.

use std::collections::BTreeMap;
use std::io;
use std::os::fd::{FromRawFd as _, OwnedFd, RawFd};

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

/// The system calls refused outright, besides [`crate::mount::SYSCALLS`].
const DENIED: &[i64] = &[
    libc::SYS_unshare,
    libc::SYS_setns,
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_reboot,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_acct,
    libc::SYS_bpf,
    libc::SYS_perf_event_open,
    libc::SYS_userfaultfd,
    libc::SYS_syslog,
    libc::SYS_settimeofday,
    libc::SYS_clock_settime,
    libc::SYS_clock_adjtime,
    libc::SYS_adjtimex,
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_open_by_handle_at,
    libc::SYS_name_to_handle_at,
    libc::SYS_quotactl,
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_iopl,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_ioperm,
];

/// `ioctl` requests that change a file's project or its inheritance of it
/// (`FS_IOC_SETFLAGS` clears `FS_PROJINHERIT_FL`, `FS_IOC_FSSETXATTR` sets `fsx_projid`):
/// with them a task that owns its files (or has `CAP_FOWNER`) would move what it writes
/// out of its alloc's project quota (`disk/quota.rs`). `FS_IOC_SETFLAGS` is 0x40086602
/// with a 64-bit `long`, 0x40046602 with a 32-bit one.
const FILE_ATTRIBUTE_SETTERS: &[u64] = &[0x4008_6602, 0x4004_6602, 0x401C_5820];

/// `file_setattr(2)` (Linux 6.17): the same as `FS_IOC_FSSETXATTR`, by path. Its number
/// is the same on every architecture of the unified table; libc does not name it yet.
pub const FILE_SETATTR: i64 = 469;

/// `fchmodat2(2)` (Linux 6.6), which libc does not name yet: the same number on every
/// architecture of the unified table.
const FCHMODAT2: i64 = 452;

/// The calls that give a file a mode, with the argument holding the mode and, for those
/// that make the mode only when they create (`open`'s family), the one holding the flags.
const MODE_SETTERS: &[(i64, u8, Option<u8>)] = &[
    #[cfg(target_arch = "x86_64")]
    (libc::SYS_chmod, 1, None),
    (libc::SYS_fchmod, 1, None),
    (libc::SYS_fchmodat, 2, None),
    (FCHMODAT2, 2, None),
    #[cfg(target_arch = "x86_64")]
    (libc::SYS_mknod, 1, None),
    (libc::SYS_mknodat, 2, None),
    #[cfg(target_arch = "x86_64")]
    (libc::SYS_mkdir, 1, None),
    (libc::SYS_mkdirat, 2, None),
    #[cfg(target_arch = "x86_64")]
    (libc::SYS_creat, 1, None),
    #[cfg(target_arch = "x86_64")]
    (libc::SYS_open, 2, Some(1)),
    (libc::SYS_openat, 3, Some(2)),
];

/// The rules refusing a call of [`MODE_SETTERS`] whose mode carries `S_ISUID` or
/// `S_ISGID` (for `open`'s family, only when it creates: with `O_CREAT` or `O_TMPFILE`;
/// otherwise its mode argument means nothing and may hold anything).
fn set_id_mode_refusals(
    mode: u8,
    flags: Option<u8>,
) -> Result<Vec<SeccompRule>, seccompiler::BackendError> {
    let has = |arg: u8, bits: u64| {
        SeccompCondition::new(
            arg,
            SeccompCmpArgLen::Dword,
            SeccompCmpOp::MaskedEq(bits),
            bits,
        )
    };
    let creating: Vec<Option<u64>> = match flags {
        None => vec![None],
        Some(_) => vec![Some(libc::O_CREAT as u64), Some(libc::O_TMPFILE as u64)],
    };
    let mut rules = Vec::new();
    for bit in [libc::S_ISUID as u64, libc::S_ISGID as u64] {
        for create in &creating {
            let mut conditions = vec![has(mode, bit)?];
            if let (Some(flags), Some(create)) = (flags, create) {
                conditions.push(has(flags, *create)?);
            }
            rules.push(SeccompRule::new(conditions)?);
        }
    }
    Ok(rules)
}

/// Every `CLONE_NEW*` flag `clone` can carry.
const CLONE_NEW_FLAGS: &[u64] = &[
    libc::CLONE_NEWNS as u64,
    libc::CLONE_NEWCGROUP as u64,
    libc::CLONE_NEWUTS as u64,
    libc::CLONE_NEWIPC as u64,
    libc::CLONE_NEWUSER as u64,
    libc::CLONE_NEWPID as u64,
    libc::CLONE_NEWNET as u64,
];

/// The compiled filters, installed in order.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct TaskFilter {
    #[serde(with = "instructions")]
    programs: Vec<BpfProgram>,
    /// The program whose calls go to the mount warden (a mounting plugin's), installed
    /// last, with a listener.
    #[serde(with = "instructions")]
    warden: Vec<BpfProgram>,
}

/// BPF programs in a spawn plan: each instruction's four fields.
mod instructions {
    use seccompiler::{BpfProgram, sock_filter};
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    type Fields = (u16, u8, u8, u32);

    pub fn serialize<S: Serializer>(programs: &[BpfProgram], to: S) -> Result<S::Ok, S::Error> {
        let fields: Vec<Vec<Fields>> = programs
            .iter()
            .map(|program| program.iter().map(|i| (i.code, i.jt, i.jf, i.k)).collect())
            .collect();
        fields.serialize(to)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(from: D) -> Result<Vec<BpfProgram>, D::Error> {
        let fields = Vec::<Vec<Fields>>::deserialize(from)?;
        Ok(fields
            .into_iter()
            .map(|program| {
                program
                    .into_iter()
                    .map(|(code, jt, jf, k)| sock_filter { code, jt, jf, k })
                    .collect()
            })
            .collect())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum FilterError {
    #[error("building the task's seccomp filter: {0}")]
    Build(#[from] seccompiler::BackendError),
    #[error("building the task's seccomp filter: the mount warden's program hands nothing over")]
    NoHandOver,
}

/// The `mount(2)` calls a mounting plugin may not make, each a rule on the flags (the
/// kernel's order: a remount with `MS_BIND` reconfigures a bind, a remount without it the
/// superblock, `MS_BIND` binds, a propagation flag changes propagation, the rest moves or
/// mounts a new filesystem). Binds and bind remounts pass here and go to the warden.
fn plugin_mount_refusals() -> Result<Vec<SeccompRule>, seccompiler::BackendError> {
    let (bind, remount): (u64, u64) = (libc::MS_BIND, libc::MS_REMOUNT);
    let propagation: u64 =
        libc::MS_SHARED | libc::MS_PRIVATE | libc::MS_SLAVE | libc::MS_UNBINDABLE;
    Ok(vec![
        // Neither a remount, a bind nor a propagation change: a new mount or a move.
        SeccompRule::new(vec![mount_flags(remount | bind | propagation, 0)?])?,
        // A superblock remount.
        SeccompRule::new(vec![mount_flags(remount | bind, remount)?])?,
    ])
}

/// A condition on `mount(2)`'s flags (an unsigned long, as libc spells them here).
fn mount_flags(mask: u64, value: u64) -> Result<SeccompCondition, seccompiler::BackendError> {
    SeccompCondition::new(
        3,
        SeccompCmpArgLen::Qword,
        SeccompCmpOp::MaskedEq(mask),
        value,
    )
}

/// On x86-64: a program refusing (`EPERM`) every call whose number has the x32 bit
/// (`__X32_SYSCALL_BIT`, 0x40000000), which seccompiler's programs do not look at.
fn no_x32_program() -> Option<BpfProgram> {
    if !cfg!(target_arch = "x86_64") {
        return None;
    }
    use seccompiler::sock_filter;
    const LOAD_NR: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
    const JUMP_GE: u16 = (libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K) as u16;
    const RETURN: u16 = (libc::BPF_RET | libc::BPF_K) as u16;
    const X32_SYSCALL_BIT: u32 = 0x4000_0000;
    let instruction = |code, jt, jf, k| sock_filter { code, jt, jf, k };
    Some(vec![
        // seccomp_data.nr is at offset 0.
        instruction(LOAD_NR, 0, 0, 0),
        instruction(JUMP_GE, 0, 1, X32_SYSCALL_BIT),
        instruction(RETURN, 0, 0, libc::SECCOMP_RET_ERRNO | libc::EPERM as u32),
        instruction(RETURN, 0, 0, libc::SECCOMP_RET_ALLOW),
    ])
}

/// What the warden's program returns for a call it hands over. seccompiler has no user
/// notification action, so the program is compiled with this `SECCOMP_RET_TRACE` value
/// and its returns rewritten to `SECCOMP_RET_USER_NOTIF` ([`to_user_notification`]).
const HAND_TO_WARDEN: u32 = 0x0b17;

/// Rewrites every `return SECCOMP_RET_TRACE | HAND_TO_WARDEN` of `program` to `return
/// SECCOMP_RET_USER_NOTIF`; returns how many it rewrote.
fn to_user_notification(program: &mut BpfProgram) -> usize {
    const BPF_RET_K: u16 = (libc::BPF_RET | libc::BPF_K) as u16;
    let marked = libc::SECCOMP_RET_TRACE | HAND_TO_WARDEN;
    let mut rewritten = 0;
    for instruction in program.iter_mut() {
        if instruction.code == BPF_RET_K && instruction.k == marked {
            instruction.k = libc::SECCOMP_RET_USER_NOTIF;
            rewritten += 1;
        }
    }
    rewritten
}

impl TaskFilter {
    /// Compiles the filter of `confinement` for this machine's architecture.
    pub fn compile(
        confinement: crate::process::confine::Confinement,
    ) -> Result<TaskFilter, FilterError> {
        let arch: TargetArch = std::env::consts::ARCH.try_into()?;
        let mounting = confinement == crate::process::confine::Confinement::MountingPlugin;
        let mut denied: BTreeMap<i64, Vec<SeccompRule>> = DENIED
            .iter()
            .chain(crate::mount::SYSCALLS)
            .filter(|&&call| {
                !(mounting
                    && (call == crate::mount::UNMOUNT_SYSCALL
                        || crate::mount::NEW_API_SYSCALLS.contains(&call)))
            })
            .map(|&call| (call, Vec::new()))
            .collect();
        if mounting {
            denied.insert(crate::mount::MOUNT_SYSCALL, plugin_mount_refusals()?);
        }
        let traceme_only = SeccompCondition::new(
            0,
            SeccompCmpArgLen::Dword,
            SeccompCmpOp::Ne,
            libc::PTRACE_TRACEME as u64,
        )?;
        denied.insert(
            libc::SYS_ptrace,
            vec![SeccompRule::new(vec![traceme_only])?],
        );
        let namespace_clones = CLONE_NEW_FLAGS
            .iter()
            .map(|&flag| {
                let has_flag = SeccompCondition::new(
                    0,
                    SeccompCmpArgLen::Qword,
                    SeccompCmpOp::MaskedEq(flag),
                    flag,
                )?;
                SeccompRule::new(vec![has_flag])
            })
            .collect::<Result<Vec<_>, _>>()?;
        denied.insert(libc::SYS_clone, namespace_clones);
        let attribute_setters = FILE_ATTRIBUTE_SETTERS
            .iter()
            .map(|&request| {
                let is_request =
                    SeccompCondition::new(1, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, request)?;
                SeccompRule::new(vec![is_request])
            })
            .collect::<Result<Vec<_>, _>>()?;
        denied.insert(libc::SYS_ioctl, attribute_setters);
        denied.insert(FILE_SETATTR, Vec::new());
        for &(call, mode, flags) in MODE_SETTERS {
            denied.insert(call, set_id_mode_refusals(mode, flags)?);
        }
        let refuse = SeccompFilter::new(
            denied,
            SeccompAction::Allow,
            SeccompAction::Errno(libc::EPERM as u32),
            arch,
        )?;
        // `openat2`'s mode is in a structure the filter cannot read: absent, libc and
        // language runtimes fall back to `openat`.
        let mut absent = BTreeMap::from([
            (libc::SYS_clone3, Vec::new()),
            (libc::SYS_openat2, Vec::new()),
        ]);
        if mounting {
            absent.extend(
                crate::mount::NEW_API_SYSCALLS
                    .iter()
                    .map(|&call| (call, Vec::new())),
            );
        }
        let no_clone3 = SeccompFilter::new(
            absent,
            SeccompAction::Allow,
            SeccompAction::Errno(libc::ENOSYS as u32),
            arch,
        )?;
        let warden = if mounting {
            let binds = SeccompFilter::new(
                BTreeMap::from([(
                    crate::mount::MOUNT_SYSCALL,
                    vec![SeccompRule::new(vec![mount_flags(
                        libc::MS_BIND,
                        libc::MS_BIND,
                    )?])?],
                )]),
                SeccompAction::Allow,
                SeccompAction::Trace(HAND_TO_WARDEN),
                arch,
            )?;
            let mut program: BpfProgram = binds.try_into()?;
            if to_user_notification(&mut program) == 0 {
                return Err(FilterError::NoHandOver);
            }
            vec![program]
        } else {
            Vec::new()
        };
        let mut programs = vec![refuse.try_into()?, no_clone3.try_into()?];
        programs.extend(no_x32_program());
        Ok(TaskFilter { programs, warden })
    }

    /// Whether the task's binds go to a mount warden ([`TaskFilter::install`] then
    /// returns the descriptor the warden reads them from).
    pub fn has_warden(&self) -> bool {
        !self.warden.is_empty()
    }

    /// Installs the filters on the calling thread; returns the listener of the warden's
    /// program when there is one. Async-signal-safe (one `prctl` and one `seccomp` call
    /// per program, no allocation).
    pub fn install(&self) -> io::Result<Option<OwnedFd>> {
        for program in &self.programs {
            seccompiler::apply_filter(program).map_err(|_| io::Error::last_os_error())?;
        }
        let mut listener = None;
        for program in &self.warden {
            let fprog = libc::sock_fprog {
                len: program.len() as u16,
                filter: program.as_ptr() as *mut libc::sock_filter,
            };
            // SAFETY: seccomp(2) on a program that outlives the call; `no_new_privs` was
            // set by the programs installed above.
            let fd = unsafe {
                libc::syscall(
                    libc::SYS_seccomp,
                    libc::SECCOMP_SET_MODE_FILTER,
                    libc::SECCOMP_FILTER_FLAG_NEW_LISTENER,
                    &fprog as *const libc::sock_fprog,
                )
            };
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            // SAFETY: the kernel just returned this descriptor, owned by no one else.
            listener = Some(unsafe { OwnedFd::from_raw_fd(fd as RawFd) });
        }
        Ok(listener)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::process::confine::Confinement;

    #[test]
    fn compiles_for_this_machine() {
        for confinement in [Confinement::Task, Confinement::MountingPlugin] {
            let filter = TaskFilter::compile(confinement).unwrap();
            let x32 = usize::from(cfg!(target_arch = "x86_64"));
            assert_eq!(filter.programs.len(), 2 + x32);
            assert!(filter.programs.iter().all(|p| !p.is_empty()));
        }
    }

    #[test]
    fn reaches_the_keeper_instruction_for_instruction() {
        let filter = TaskFilter::compile(Confinement::Task).unwrap();
        let bytes = postcard::to_allocvec(&filter).unwrap();
        let read: TaskFilter = postcard::from_bytes(&bytes).unwrap();
        let fields = |f: &TaskFilter| -> Vec<Vec<(u16, u8, u8, u32)>> {
            f.programs
                .iter()
                .map(|p| p.iter().map(|i| (i.code, i.jt, i.jf, i.k)).collect())
                .collect()
        };
        assert_eq!(fields(&read), fields(&filter));
    }
}

#[cfg(test)]
mod plugin_filter_tests {
    use super::*;
    use crate::process::confine::Confinement;

    /// What `mount(2)` answers (0 or an errno) for each of `calls` in a child that installed
    /// `confinement`'s filter: the filter answers EPERM; the kernel, for a path that does
    /// not exist, ENOENT.
    fn answers(confinement: Confinement, calls: &[(u64, bool)]) -> Vec<i32> {
        let target = c"/nonexistent/berth-seccomp-test";
        answers_in_filtered_child(confinement, |report| {
            for &(flags, umount) in calls {
                report(crate::mount::raw_answer(target, flags, umount));
            }
        })
    }

    /// The error numbers `calls` reports in a forked child that installed
    /// `confinement`'s filter (its listener, if any, dropped: no warden answers). The
    /// child allocates nothing (the test process has other threads): `calls` makes raw
    /// system calls and reports each answer straight to the pipe.
    fn answers_in_filtered_child(
        confinement: Confinement,
        calls: impl FnOnce(&dyn Fn(i32)),
    ) -> Vec<i32> {
        let filter = TaskFilter::compile(confinement).unwrap();
        let (read, write) = rustix::pipe::pipe().unwrap();
        // SAFETY: the child makes raw system calls only, then _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            if filter.install().is_err() {
                unsafe { libc::_exit(99) };
            }
            calls(&|errno: i32| {
                let _ = rustix::io::write(&write, &errno.to_le_bytes());
            });
            unsafe { libc::_exit(0) };
        }
        drop(write);
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut std::fs::File::from(read), &mut bytes).unwrap();
        let mut status = 0;
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert_eq!(status, 0, "the child failed");
        bytes
            .chunks(4)
            .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    #[test]
    fn a_mounting_plugin_hands_binds_to_its_warden_and_may_change_propagation_and_nothing_else() {
        use libc::{
            ENOSYS, EPERM, MS_BIND, MS_MOVE, MS_NODEV, MS_NOSUID, MS_PRIVATE, MS_RDONLY, MS_REC,
            MS_REMOUNT, MS_SHARED,
        };
        let refused = EPERM;
        let passed = libc::ENOENT;
        // The test has no warden: the kernel answers a call handed to a listener that
        // is gone with ENOSYS.
        let to_warden = ENOSYS;
        let calls: Vec<(u64, bool, i32)> = [
            (0, false, refused),                      // a new proc
            (MS_REC, false, refused),                 // still a new mount
            (MS_REMOUNT, false, refused),             // the superblock
            (MS_MOVE, false, refused),                // a move
            (MS_REMOUNT | MS_BIND, false, to_warden), // a bind made writable
            (MS_BIND, false, to_warden),              // a bind
            (MS_BIND | MS_REC, false, to_warden),     // a recursive bind
            (MS_REMOUNT | MS_BIND | MS_RDONLY, false, to_warden),
            (
                MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV,
                false,
                to_warden,
            ),
            (MS_PRIVATE | MS_REC, false, passed), // propagation
            (MS_SHARED, false, passed),
            (0, true, passed), // umount2
        ]
        .to_vec();
        let asked: Vec<(u64, bool)> = calls.iter().map(|(f, u, _)| (*f, *u)).collect();
        let expected: Vec<i32> = calls.iter().map(|(_, _, e)| *e).collect();
        assert_eq!(answers(Confinement::MountingPlugin, &asked), expected);
        // Any other confined task may do none of it.
        let all_refused = vec![refused; asked.len()];
        assert_eq!(answers(Confinement::Task, &asked), all_refused);
    }

    #[test]
    fn the_new_mount_api_does_not_exist_for_a_mounting_plugin_and_is_refused_to_a_task() {
        // open_tree_attr (Linux 6.15) too: unlisted, it cloned the host's /usr writable.
        for call in [crate::mount::OPEN_TREE, crate::mount::OPEN_TREE_ATTR] {
            assert_eq!(
                open_tree_answer(Confinement::MountingPlugin, call),
                libc::ENOSYS
            );
            assert_eq!(open_tree_answer(Confinement::Task, call), libc::EPERM);
        }
    }

    #[test]
    fn a_task_cannot_give_a_file_a_setuid_or_setgid_mode_and_may_give_any_other() {
        use libc::{AT_FDCWD, EACCES, ENOENT, EPERM, O_CREAT, O_RDONLY, O_WRONLY};
        let path = c"/nonexistent/berth-seccomp-test".as_ptr();
        let mode_calls = |report: &dyn Fn(i32)| {
            let answer = |result: libc::c_long| {
                report(if result < 0 {
                    // SAFETY: this thread's errno, read right after the call.
                    unsafe { *libc::__errno_location() }
                } else {
                    0
                })
            };
            // SAFETY: raw system calls on a path that does not exist.
            unsafe {
                for mode in [0o4755, 0o2755, 0o755] {
                    answer(libc::syscall(libc::SYS_fchmodat, AT_FDCWD, path, mode));
                    answer(libc::syscall(FCHMODAT2, AT_FDCWD, path, mode, 0));
                    answer(libc::syscall(libc::SYS_fchmod, -1, mode));
                    answer(libc::syscall(libc::SYS_mkdirat, AT_FDCWD, path, mode));
                    answer(libc::syscall(
                        libc::SYS_openat,
                        AT_FDCWD,
                        path,
                        O_CREAT | O_WRONLY,
                        mode,
                    ));
                    // Without O_CREAT the mode argument means nothing: never refused.
                    answer(libc::syscall(
                        libc::SYS_openat,
                        AT_FDCWD,
                        path,
                        O_RDONLY,
                        mode,
                    ));
                }
                answer(libc::syscall(
                    libc::SYS_openat2,
                    AT_FDCWD,
                    path,
                    0usize,
                    0usize,
                ));
                answer(libc::syscall(libc::SYS_io_uring_setup, 1, 0usize));
                // The x32 number of fchmodat: refused whether or not the kernel has x32
                // (without the filter, this kernel answers ENOSYS).
                let x32_fchmodat = 0x4000_0000 | libc::SYS_fchmodat;
                answer(libc::syscall(x32_fchmodat, AT_FDCWD, path, 0o4755));
            }
        };
        for confinement in [Confinement::Task, Confinement::MountingPlugin] {
            let answers = answers_in_filtered_child(confinement, mode_calls);
            let (set_ids, plain) = answers[..18].split_at(12);
            let refused_or_not_made =
                |answers: &[i32]| answers.iter().map(|&a| a == EPERM).collect::<Vec<_>>();
            assert_eq!(
                refused_or_not_made(set_ids),
                [true, true, true, true, true, false].repeat(2),
                "{confinement:?} setuid/setgid: {set_ids:?}"
            );
            assert!(
                plain
                    .iter()
                    .all(|&a| a == ENOENT || a == libc::EBADF || a == EACCES),
                "{confinement:?} plain modes: {plain:?}"
            );
            assert_eq!(answers[18], libc::ENOSYS, "{confinement:?} openat2");
            assert_eq!(answers[19], EPERM, "{confinement:?} io_uring_setup");
            if cfg!(target_arch = "x86_64") {
                assert_eq!(answers[20], EPERM, "{confinement:?} an x32 call");
            }
        }
    }

    /// What `open_tree(2)` (or `open_tree_attr`, as `call`) answers in a child that
    /// installed `confinement`'s filter.
    fn open_tree_answer(confinement: Confinement, call: i64) -> i32 {
        let answers = answers_in_filtered_child(confinement, |report| {
            report(crate::mount::raw_open_tree_answer(
                call,
                c"/nonexistent/berth-seccomp-test",
            ))
        });
        answers[0]
    }

    #[test]
    fn only_the_mounting_plugins_filter_has_a_warden_program() {
        assert!(
            TaskFilter::compile(Confinement::MountingPlugin)
                .unwrap()
                .has_warden()
        );
        assert!(!TaskFilter::compile(Confinement::Task).unwrap().has_warden());
    }
}
