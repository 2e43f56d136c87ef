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
//!   asked (a debugger that starts its program), never attached to.
//!
//! A CSI plugin the operator granted mounting keeps `CAP_SYS_ADMIN`, and its filter lets
//! it `umount2` and `mount` with only the flags of a bind mount, a propagation change, or
//! a remount of a bind **read-only, nosuid and nodev**: never a new filesystem (a fresh `proc` or `sysfs`
//! would give it the host's kernel settings), a superblock remount (which changes the
//! host's filesystem for everyone), a bind remounted writable (its read-only `/usr` is the
//! host's), or a move. Everything else above is refused to it as to any task.
//!
//! The filters are compiled once in the agent, handed to each task's keeper in its spawn
//! plan, and installed by the task's init before it forks the task, after
//! `no_new_privs`.

use std::collections::BTreeMap;
use std::io;

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
    #[cfg(target_arch = "x86_64")]
    libc::SYS_iopl,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_ioperm,
];

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
#[error("building the task's seccomp filter: {0}")]
pub struct FilterError(#[from] seccompiler::BackendError);

/// The `mount(2)` calls a mounting plugin may not make, each a rule on the flags (the
/// kernel's order: a remount with `MS_BIND` reconfigures a bind, a remount without it the
/// superblock, `MS_BIND` binds, a propagation flag changes propagation, the rest moves or
/// mounts a new filesystem).
fn plugin_mount_refusals() -> Result<Vec<SeccompRule>, seccompiler::BackendError> {
    // `mount(2)`'s flags are an unsigned long, as libc spells them here.
    let (bind, remount, read_only, nosuid, nodev): (u64, u64, u64, u64, u64) = (
        libc::MS_BIND,
        libc::MS_REMOUNT,
        libc::MS_RDONLY,
        libc::MS_NOSUID,
        libc::MS_NODEV,
    );
    let propagation: u64 =
        libc::MS_SHARED | libc::MS_PRIVATE | libc::MS_SLAVE | libc::MS_UNBINDABLE;
    let flags = |mask: u64, value: u64| {
        SeccompCondition::new(
            3,
            SeccompCmpArgLen::Qword,
            SeccompCmpOp::MaskedEq(mask),
            value,
        )
    };
    Ok(vec![
        // Neither a remount, a bind nor a propagation change: a new mount or a move.
        SeccompRule::new(vec![flags(remount | bind | propagation, 0)?])?,
        // A superblock remount.
        SeccompRule::new(vec![flags(remount | bind, remount)?])?,
        // A bind remounted without MS_RDONLY, MS_NOSUID or MS_NODEV: read-only, and it
        // keeps the setuid and device bits inert (a remount replaces a mount's flags).
        SeccompRule::new(vec![flags(remount | bind | read_only, remount | bind)?])?,
        SeccompRule::new(vec![flags(remount | bind | nosuid, remount | bind)?])?,
        SeccompRule::new(vec![flags(remount | bind | nodev, remount | bind)?])?,
    ])
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
            .filter(|&&call| !(mounting && call == crate::mount::UNMOUNT_SYSCALL))
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
        let refuse = SeccompFilter::new(
            denied,
            SeccompAction::Allow,
            SeccompAction::Errno(libc::EPERM as u32),
            arch,
        )?;
        let no_clone3 = SeccompFilter::new(
            BTreeMap::from([(libc::SYS_clone3, Vec::new())]),
            SeccompAction::Allow,
            SeccompAction::Errno(libc::ENOSYS as u32),
            arch,
        )?;
        Ok(TaskFilter {
            programs: vec![refuse.try_into()?, no_clone3.try_into()?],
        })
    }

    /// Installs the filters on the calling thread. Async-signal-safe (one `prctl` and one
    /// `seccomp` call per program, no allocation).
    pub fn install(&self) -> io::Result<()> {
        for program in &self.programs {
            seccompiler::apply_filter(program).map_err(|_| io::Error::last_os_error())?;
        }
        Ok(())
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
            assert_eq!(filter.programs.len(), 2);
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
        let filter = TaskFilter::compile(confinement).unwrap();
        let target = c"/nonexistent/berth-seccomp-test";
        let (read, write) = rustix::pipe::pipe().unwrap();
        // SAFETY: the child makes raw system calls only, then _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            if filter.install().is_err() {
                unsafe { libc::_exit(99) };
            }
            for &(flags, umount) in calls {
                let errno = crate::mount::raw_answer(target, flags, umount);
                let _ = rustix::io::write(&write, &errno.to_le_bytes());
            }
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
    fn a_mounting_plugin_may_bind_and_change_propagation_and_nothing_else() {
        use libc::{
            EPERM, MS_BIND, MS_MOVE, MS_NODEV, MS_NOSUID, MS_PRIVATE, MS_RDONLY, MS_REC,
            MS_REMOUNT, MS_SHARED,
        };
        let refused = EPERM;
        let passed = libc::ENOENT;
        let calls: Vec<(u64, bool, i32)> = [
            (0, false, refused),                                // a new proc
            (MS_REC, false, refused),                           // still a new mount
            (MS_REMOUNT, false, refused),                       // the superblock
            (MS_REMOUNT | MS_BIND, false, refused),             // a bind made writable
            (MS_MOVE, false, refused),                          // a move
            (MS_BIND, false, passed),                           // a bind
            (MS_BIND | MS_REC, false, passed),                  // a recursive bind
            (MS_REMOUNT | MS_BIND | MS_RDONLY, false, refused), // dropping nosuid, nodev
            (
                MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV,
                false,
                passed,
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
}
