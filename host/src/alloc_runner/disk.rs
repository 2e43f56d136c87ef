//! The alloc's `ephemeral_disk { size }`, enforced by measuring: every
//! [`CHECK_INTERVAL`] the alloc directory is walked (allocated blocks, links not
//! followed, no other filesystem entered) and, past the size, every task is told why and
//! stopped, the alloc fails, and what its tasks wrote (their directories, `alloc/data`,
//! `alloc/tmp`) is removed once they are gone; the logs stay for `berth alloc logs`.
//!
//! Measured, not a filesystem quota: project quotas need a data dir on XFS or on ext4
//! made with the `project` feature and mounted with `prjquota`, which the data dirs of
//! these nodes (and most) are not; a loop-mounted image per alloc would cost a `mkfs`
//! per alloc start. The price of measuring: a task can overshoot by what it writes
//! within one interval before it is stopped.

use std::io;
use std::os::unix::fs::MetadataExt as _;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::AllocRunner;
use crate::model::events::{EventKind, TaskEvent};
use crate::model::limits::MIB;

/// How often an alloc's directory is measured.
pub const CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// Bytes allocated on disk under `root`: files, directories and links (not what sparse
/// files pretend to hold), without following links or entering another filesystem.
pub fn usage(root: &Path) -> io::Result<u64> {
    let device = std::fs::symlink_metadata(root)?.dev();
    let mut total = 0u64;
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            // Removed while walking (a task's temporary files): nothing to count.
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        for entry in entries {
            let Ok(entry) = entry else { continue };
            let Ok(meta) = entry.metadata() else { continue };
            if meta.dev() != device {
                continue;
            }
            total = total.saturating_add(meta.blocks().saturating_mul(512));
            if meta.is_dir() {
                pending.push(entry.path());
            }
        }
    }
    Ok(total)
}

impl AllocRunner {
    /// The most bytes the alloc's directory may hold.
    pub fn disk_limit(&self) -> u64 {
        self.group.ephemeral_disk_mb.saturating_mul(MIB)
    }

    /// Measures the alloc's directory until it holds more than its `ephemeral_disk`
    /// size; returns the usage then. Never returns while the alloc stays within it.
    pub(super) async fn watch_disk(&self) -> u64 {
        loop {
            tokio::time::sleep(CHECK_INTERVAL).await;
            let root = self.alloc_dir.root().to_path_buf();
            let measured = tokio::task::spawn_blocking(move || usage(&root)).await;
            let Ok(Ok(used)) = measured else {
                continue;
            };
            self.disk_used.store(used, Ordering::Relaxed);
            if used > self.disk_limit() {
                return used;
            }
        }
    }

    /// Measures once more (what the alloc's status shows once it is over).
    pub(super) fn measure_disk(&self) {
        if let Ok(used) = crate::blocking::run(|| usage(self.alloc_dir.root())) {
            self.disk_used.store(used, Ordering::Relaxed);
        }
    }

    /// Tells every task why, and stops them all.
    pub(super) fn disk_exceeded(&self, used: u64) {
        let message = format!(
            "the alloc's directory holds {} MB, more than its ephemeral_disk size of {} MB \
             (logs included): its tasks are stopped and what they wrote is removed",
            used.div_ceil(MIB),
            self.group.ephemeral_disk_mb
        );
        tracing::warn!(alloc = %self.id, used, limit = self.disk_limit(), "{message}");
        for task in &self.group.tasks {
            self.task_event(
                &task.name,
                TaskEvent::new(EventKind::DiskExceeded, &message),
            );
        }
        let _ = self.stop.send(true);
    }

    /// Removes what the tasks wrote, once they are gone: their directories, and the
    /// shared `data/` and `tmp/` (the logs stay). Nothing is removed while anything is
    /// mounted below the alloc's directory.
    pub(super) fn remove_written_files(&self) {
        let root = self.alloc_dir.root().to_path_buf();
        let mut doomed: Vec<_> = self
            .group
            .tasks
            .iter()
            .map(|t| self.alloc_dir.task_dir(&t.name))
            .collect();
        doomed.push(self.alloc_dir.shared().join("data"));
        doomed.push(self.alloc_dir.shared().join("tmp"));
        let removed = crate::blocking::run(|| {
            let root = root.canonicalize()?;
            let mounts = crate::mount::mountinfo::read_self()?;
            if let Some(mount) = mounts.iter().find(|m| m.mount_point.starts_with(&root)) {
                return Err(io::Error::other(format!(
                    "{} is still mounted",
                    mount.mount_point.display()
                )));
            }
            for dir in &doomed {
                // std's remove_dir_all does not follow links a task planted.
                match std::fs::remove_dir_all(dir) {
                    Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                    _ => {}
                }
            }
            Ok(())
        });
        if let Err(error) = removed {
            tracing::error!(alloc = %self.id, %error,
                "removing what an alloc over its ephemeral_disk wrote");
        }
        self.measure_disk();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_counts_allocated_blocks_and_follows_no_link() {
        let dir = tempfile::tempdir().unwrap();
        let empty = usage(dir.path()).unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub/data"), vec![1u8; 1 << 20]).unwrap();
        // A sparse file claims a gigabyte and holds nothing.
        let sparse = std::fs::File::create(dir.path().join("sparse")).unwrap();
        sparse.set_len(1 << 30).unwrap();
        // A link to a big tree outside counts as the link alone.
        std::os::unix::fs::symlink("/usr", dir.path().join("usr")).unwrap();
        let used = usage(dir.path()).unwrap() - empty;
        assert!((1 << 20..(1 << 20) + (64 << 10)).contains(&used), "{used}");
    }
}
