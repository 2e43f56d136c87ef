//! The agent's own long-lived descriptors that no process it forks may hold: its API
//! listeners and its state file.
//!
//! They are close-on-exec, so a task never keeps them past its `exec`. But a child holds
//! them from `fork` until then, and a task's child does a lot in between (its cgroup,
//! namespaces, mounts, its shim). An agent killed with `kill -9` in that moment would
//! leave its address taken and its state file locked (redb's lock belongs to the open
//! file, which the child shares), and the agent restarted right after could not start.
//! So a forked child closes these first, before anything else ([`close_in_child`]).

use std::os::fd::{AsRawFd as _, BorrowedFd, RawFd};
use std::sync::atomic::{AtomicI32, Ordering};

/// Slots for the registered descriptors (-1: free). Few: two listeners and a state file.
static PRIVATE: [AtomicI32; 8] = [const { AtomicI32::new(-1) }; 8];

/// A descriptor registered as the agent's alone for as long as this lives. Drop it
/// before the descriptor is closed, so that a child never closes a number reused since.
#[derive(Debug)]
pub struct PrivateFd {
    slot: Option<usize>,
}

impl PrivateFd {
    /// Registers `fd`. With every slot taken it is not registered: a child then holds it
    /// until its `exec` (it is close-on-exec), which is only later, not wrong.
    pub fn register(fd: BorrowedFd<'_>) -> PrivateFd {
        let raw: RawFd = fd.as_raw_fd();
        let slot = PRIVATE.iter().position(|slot| {
            slot.compare_exchange(-1, raw, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
        });
        PrivateFd { slot }
    }
}

impl Drop for PrivateFd {
    fn drop(&mut self) {
        if let Some(slot) = self.slot {
            PRIVATE[slot].store(-1, Ordering::SeqCst);
        }
    }
}

/// In a child between `fork` and `exec`: closes the agent's private descriptors (its own
/// copies; the agent's stay open). Async-signal-safe: atomic loads and `close(2)`.
pub fn close_in_child() {
    for slot in &PRIVATE {
        let fd = slot.load(Ordering::SeqCst);
        if fd >= 0 {
            // SAFETY: close(2) on a descriptor of this forked process's own table.
            unsafe { libc::close(fd) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_registration_ends_with_its_guard() {
        let file = std::fs::File::open("/dev/null").unwrap();
        let raw = file.as_raw_fd();
        let registered = |raw| PRIVATE.iter().any(|s| s.load(Ordering::SeqCst) == raw);
        let guard = PrivateFd::register(std::os::fd::AsFd::as_fd(&file));
        assert!(registered(raw));
        drop(guard);
        assert!(!registered(raw));
    }
}
