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
//! The filter is compiled once in the agent, handed to each task's keeper in its spawn
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

impl TaskFilter {
    /// Compiles the filter for this machine's architecture.
    pub fn compile() -> Result<TaskFilter, FilterError> {
        let arch: TargetArch = std::env::consts::ARCH.try_into()?;
        let mut denied: BTreeMap<i64, Vec<SeccompRule>> = DENIED
            .iter()
            .chain(crate::mount::SYSCALLS)
            .map(|&call| (call, Vec::new()))
            .collect();
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

    #[test]
    fn compiles_for_this_machine() {
        let filter = TaskFilter::compile().unwrap();
        assert_eq!(filter.programs.len(), 2);
        assert!(filter.programs.iter().all(|p| !p.is_empty()));
    }

    #[test]
    fn reaches_the_keeper_instruction_for_instruction() {
        let filter = TaskFilter::compile().unwrap();
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
