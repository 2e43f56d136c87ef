//! The agent's own open-files limit, raised at its start, and the one its tasks get back.

use std::io;
use std::sync::OnceLock;

/// The open-files limit the agent started with, when it raised its own.
static NODE_OPEN_FILES_LIMIT: OnceLock<libc::rlimit> = OnceLock::new();

/// Raises the agent's soft open-files limit to the hard one, as Go programs (Nomad's
/// client among them) do at start: every running task costs the agent a few descriptors
/// (pidfds, pipes), and the common soft limit of 1024 would cap a node below a thousand
/// tasks. Tasks get the limit the agent started with back (the spawn plan's last steps), since
/// programs that use `select(2)` break above 1024. Returns the limits before and after.
pub fn raise_open_files_limit() -> io::Result<(u64, u64)> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit on a valid local struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return Err(io::Error::last_os_error());
        }
        let before = limit.rlim_cur;
        if limit.rlim_cur >= limit.rlim_max {
            return Ok((before, before));
        }
        let _ = NODE_OPEN_FILES_LIMIT.set(limit);
        let raised = libc::rlimit {
            rlim_cur: limit.rlim_max,
            rlim_max: limit.rlim_max,
        };
        if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok((before, raised.rlim_cur))
    }
}

/// The limit (soft, hard) the agent started with, which its tasks get: `None` when the
/// agent did not raise its own.
pub(super) fn node_limit() -> Option<(u64, u64)> {
    NODE_OPEN_FILES_LIMIT
        .get()
        .map(|limit| (limit.rlim_cur, limit.rlim_max))
}
