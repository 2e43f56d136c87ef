//! A lifecycle hook as the operator declared it in the agent config.

use std::path::PathBuf;
use std::time::Duration;

/// What a failing hook does to its task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OnFailure {
    /// The task fails with the hook's message (the default).
    Fail,
    /// The task proceeds; an event says the hook failed and was ignored.
    Ignore,
}

/// A hook as the operator declared it in the agent config.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct HookSpec {
    pub name: String,
    pub path: PathBuf,
    pub config: Vec<(String, String)>,
    pub timeout: Duration,
    pub memory_max: usize,
    pub on_failure: OnFailure,
    /// Runs for every task, not only for tasks that name it in `hooks`.
    pub all_tasks: bool,
    /// The component's SHA-256 as the operator approved it; a file that differs is refused.
    pub sha256: Option<String>,
    /// What one call may write into the task's `local/`.
    pub quota: WriteQuota,
}

/// The most one hook call may write: bytes in all, and inodes (files plus the
/// directories their paths create). Files are the hook's only way to write: its WASI view
/// of `local/` is read-only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct WriteQuota {
    pub bytes: u64,
    pub inodes: u64,
}

impl Default for WriteQuota {
    fn default() -> Self {
        WriteQuota {
            bytes: 4 << 20,
            inodes: 64,
        }
    }
}

impl HookSpec {
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);
    pub const DEFAULT_MEMORY_MAX: usize = 32 << 20;
    /// What `memory_max` may be, in bytes.
    pub const MEMORY_MAX_RANGE: std::ops::RangeInclusive<u64> = 1 << 20..=4 << 30;
}
