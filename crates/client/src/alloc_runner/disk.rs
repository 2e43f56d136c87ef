//! The alloc's `ephemeral_disk { size }`. The kernel holds an alloc to it (`disk`: the
//! alloc's directory is a filesystem image of its size, or a project with a quota): the
//! runner limits the directory before anything is made in it, reads what it holds once
//! per [`CHECK_INTERVAL`] (one call), and stops the alloc once it is full ("Disk
//! Resources Exceeded"): every task is told why and stopped, the alloc fails, and what
//! its tasks wrote (their directories, `alloc/data`, `alloc/tmp`) is removed once they
//! are gone; the logs stay for `berth alloc logs`.
//!
//! An alloc an older build made (its directory holds files, with no image or project)
//! is measured as before: the directory is walked (allocated blocks, links not
//! followed, no other filesystem entered, each directory read through a descriptor
//! opened in its parent) and the files its tasks hold open after unlinking them are
//! added. A tree nested deeper than [`MAX_DEPTH`] cannot be measured and stops it.

use std::io;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::AllocRunner;
use berth_model::events::{EventKind, TaskEvent};
use berth_model::limits::MIB;
use berth_sys::disk::AllocDiskLimit;

/// How often an alloc's directory is measured.
pub const CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// How deep the measurement descends.
pub const MAX_DEPTH: usize = 256;

/// Why an alloc's directory could not be measured.
#[derive(Debug, thiserror::Error)]
pub enum Unmeasurable {
    #[error("it nests directories deeper than {MAX_DEPTH}")]
    TooDeep,
    #[error("{0}")]
    Io(#[from] io::Error),
}

/// How an alloc's disk is limited, for its status.
#[derive(Debug, Clone, Default)]
pub struct DiskReport {
    pub limited_by: Option<String>,
    pub inodes: Option<(u64, u64)>,
}

/// Why an alloc is stopped for its disk.
#[derive(Debug)]
pub enum DiskVerdict {
    /// The kernel says its disk is full (or it holds more than its size).
    Full(berth_sys::disk::DiskUsage),
    /// It holds this many bytes, more than its size.
    Over(u64),
    /// It cannot be measured.
    Unmeasurable(Unmeasurable),
}

/// Bytes allocated on disk under `root`: files, directories and links (not what sparse
/// files pretend to hold), without following links or entering another filesystem.
pub fn usage(root: &Path) -> Result<u64, Unmeasurable> {
    use rustix::fs::{Mode, OFlags};
    let dir = rustix::fs::open(
        root,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(io::Error::from)?;
    let device = rustix::fs::fstat(&dir).map_err(io::Error::from)?.st_dev;
    let mut total = 0u64;
    walk(&dir, device, 0, &mut total)?;
    Ok(total)
}

fn walk(dir: &OwnedFd, device: u64, depth: usize, total: &mut u64) -> Result<(), Unmeasurable> {
    use rustix::fs::{AtFlags, FileType, Mode, OFlags};
    let entries = rustix::fs::Dir::read_from(dir).map_err(io::Error::from)?;
    for entry in entries {
        let Ok(entry) = entry else { continue };
        let name = entry.file_name();
        if name == c"." || name == c".." {
            continue;
        }
        // Removed meanwhile (a task's temporary file): nothing to count.
        let Ok(stat) = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) else {
            continue;
        };
        if stat.st_dev != device {
            continue;
        }
        *total = total.saturating_add((stat.st_blocks as u64).saturating_mul(512));
        if FileType::from_raw_mode(stat.st_mode) == FileType::Directory {
            if depth + 1 > MAX_DEPTH {
                return Err(Unmeasurable::TooDeep);
            }
            let Ok(child) = rustix::fs::openat(
                dir,
                name,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            ) else {
                continue;
            };
            walk(&child, device, depth + 1, total)?;
        }
    }
    Ok(())
}

/// Bytes of regular files on `device` that `pids` hold open after unlinking them: gone
/// from the directory, still on the disk while the task runs.
pub fn held_unlinked(pids: &[u32], device: u64) -> u64 {
    use std::os::unix::fs::MetadataExt as _;
    let mut seen = std::collections::BTreeSet::new();
    let mut total = 0u64;
    for pid in pids {
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            let Ok(meta) = std::fs::metadata(fd.path()) else {
                continue;
            };
            if meta.is_file()
                && meta.nlink() == 0
                && meta.dev() == device
                && seen.insert(meta.ino())
            {
                total = total.saturating_add(meta.blocks().saturating_mul(512));
            }
        }
    }
    total
}

/// What the alloc's directory and its tasks' unlinked open files take.
fn measure(root: &Path, pids: &[u32]) -> Result<u64, Unmeasurable> {
    use std::os::unix::fs::MetadataExt as _;
    let used = usage(root)?;
    let device = std::fs::symlink_metadata(root)?.dev();
    Ok(used.saturating_add(held_unlinked(pids, device)))
}

impl AllocRunner {
    /// The most bytes the alloc's directory may hold.
    pub fn disk_limit(&self) -> u64 {
        self.group.ephemeral_disk_mb.saturating_mul(MIB)
    }

    /// Limits the alloc's directory (made here) to its size: before anything is made in
    /// it. Idempotent, for a restored alloc. The error is for the alloc's events.
    pub(super) fn limit_disk(&self) -> Result<(), berth_sys::disk::DiskError> {
        let root = self.alloc_dir.root();
        let limited = berth_sys::blocking::run(|| {
            self.node
                .sys
                .limit_alloc_disk(&self.id, root, self.group.ephemeral_disk_mb)
        })?;
        self.disk_limit.lock().unwrap().limited_by = Some(match limited {
            AllocDiskLimit::Kernel => self.node.sys.disk_mechanism().name().to_string(),
            AllocDiskLimit::Measured => "measured".to_string(),
        });
        Ok(())
    }

    /// Whether the kernel limits this alloc's disk.
    fn kernel_limited(&self) -> bool {
        let report = self.disk_limit.lock().unwrap();
        report
            .limited_by
            .as_deref()
            .is_some_and(|by| by != "measured")
    }

    /// Reads what the kernel counts; `None` when it does not limit the alloc's disk.
    fn read_kernel_usage(&self) -> Option<berth_sys::disk::DiskUsage> {
        if !self.kernel_limited() {
            return None;
        }
        let root = self.alloc_dir.root();
        let usage = berth_sys::blocking::run(|| self.node.sys.alloc_disk_usage(root))?;
        self.disk_used.store(usage.used_bytes, Ordering::Relaxed);
        self.disk_limit.lock().unwrap().inodes = Some((usage.used_inodes, usage.max_inodes));
        Some(usage)
    }

    /// Reads the alloc's disk until it is full (or holds more than its size), or cannot
    /// be measured. Never returns while the alloc stays within it.
    pub(super) async fn watch_disk(&self) -> DiskVerdict {
        loop {
            tokio::time::sleep(CHECK_INTERVAL).await;
            if self.kernel_limited() {
                if let Some(usage) = self.read_kernel_usage()
                    && (usage.full || usage.used_bytes > self.disk_limit())
                {
                    return DiskVerdict::Full(usage);
                }
                continue;
            }
            let root = self.alloc_dir.root().to_path_buf();
            let pids = self.task_pids();
            let measured = tokio::task::spawn_blocking(move || measure(&root, &pids)).await;
            match measured {
                Ok(Ok(used)) => {
                    self.disk_used.store(used, Ordering::Relaxed);
                    if used > self.disk_limit() {
                        return DiskVerdict::Over(used);
                    }
                }
                Ok(Err(Unmeasurable::TooDeep)) => {
                    return DiskVerdict::Unmeasurable(Unmeasurable::TooDeep);
                }
                // A passing failure (the directory being made or removed): measured again.
                Ok(Err(Unmeasurable::Io(error))) => {
                    tracing::debug!(alloc = %self.id, %error, "measuring the alloc's directory");
                }
                Err(_) => {}
            }
        }
    }

    /// Every process of the alloc's tasks, from their cgroups.
    fn task_pids(&self) -> Vec<u32> {
        let nothing = berth_model::limits::TaskLimits {
            memory_bytes: 0,
            memory_soft_bytes: None,
            cpu_shares: 0,
            pids_max: 0,
            restrict_devices: false,
        };
        self.group
            .tasks
            .iter()
            .flat_map(|task| {
                let name =
                    berth_sys::cgroup::Cgroups::task_name(&self.job.name, &self.id, &task.name);
                self.node.sys.existing_cgroup(&name, &nothing).pids()
            })
            .collect()
    }

    /// Measures once more (what the alloc's status shows once it is over).
    pub(super) fn measure_disk(&self) {
        if self.read_kernel_usage().is_some() {
            return;
        }
        let root = self.alloc_dir.root();
        if let Ok(used) = berth_sys::blocking::run(|| measure(root, &[]).map_err(io::Error::other))
        {
            self.disk_used.store(used, Ordering::Relaxed);
        }
    }

    /// Tells every task why, and stops them all.
    pub(super) fn disk_exceeded(&self, verdict: DiskVerdict) {
        let size = self.group.ephemeral_disk_mb;
        let message = match verdict {
            DiskVerdict::Full(usage) => format!(
                "the alloc's disk is full: it holds {} MB and {} of its {} inodes (files, \
                 directories, links) of its ephemeral_disk size of {size} MB (logs included): \
                 its tasks are stopped and what they wrote is removed",
                usage.used_bytes.div_ceil(MIB),
                usage.used_inodes,
                usage.max_inodes
            ),
            DiskVerdict::Over(used) => format!(
                "the alloc's directory holds {} MB, more than its ephemeral_disk size of \
                 {size} MB (logs included): its tasks are stopped and what they wrote is removed",
                used.div_ceil(MIB)
            ),
            DiskVerdict::Unmeasurable(why) => format!(
                "the alloc's directory cannot be measured against its ephemeral_disk size of \
                 {size} MB ({why}): its tasks are stopped and what they wrote is removed"
            ),
        };
        tracing::warn!(alloc = %self.id, limit = self.disk_limit(), "{message}");
        for task in &self.group.tasks {
            self.task_event(
                &task.name,
                TaskEvent::new(EventKind::DiskExceeded, &message),
            );
        }
        self.stop.send_replace(true);
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
        let removed = berth_sys::blocking::run(|| {
            let root = root.canonicalize()?;
            let mounts = berth_sys::mount::mountinfo::read_self()?;
            // The alloc's own filesystem is mounted at its root; nothing else may be.
            if let Some(mount) = mounts
                .iter()
                .find(|m| m.mount_point != root && m.mount_point.starts_with(&root))
            {
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

    #[test]
    fn long_paths_are_measured_and_a_tree_too_deep_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        // 18 names of 250 bytes: a path of 4,500 bytes, past PATH_MAX, made in the dir
        // opened before as a task would.
        let open = |at: &OwnedFd, name: &str| {
            rustix::fs::openat(
                at,
                name,
                rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY,
                rustix::fs::Mode::empty(),
            )
            .unwrap()
        };
        let mut at: OwnedFd = rustix::fs::open(
            dir.path(),
            rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY,
            rustix::fs::Mode::empty(),
        )
        .unwrap();
        let name = "a".repeat(250);
        for _ in 0..18 {
            rustix::fs::mkdirat(&at, name.as_str(), rustix::fs::Mode::from_raw_mode(0o755))
                .unwrap();
            at = open(&at, &name);
        }
        let file = rustix::fs::openat(
            &at,
            "deep-file",
            rustix::fs::OFlags::CREATE | rustix::fs::OFlags::WRONLY,
            rustix::fs::Mode::from_raw_mode(0o644),
        )
        .unwrap();
        rustix::io::write(&file, &vec![1u8; 1 << 20]).unwrap();
        let used = usage(dir.path()).unwrap();
        assert!(used >= 1 << 20, "{used}");
        let deep = tempfile::tempdir().unwrap();
        let fd = rustix::fs::open(
            deep.path(),
            rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY,
            rustix::fs::Mode::empty(),
        )
        .unwrap();
        let mut current = fd;
        for _ in 0..=MAX_DEPTH {
            rustix::fs::mkdirat(&current, c"d", rustix::fs::Mode::from_raw_mode(0o755)).unwrap();
            current = rustix::fs::openat(
                &current,
                c"d",
                rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY,
                rustix::fs::Mode::empty(),
            )
            .unwrap();
        }
        assert!(matches!(usage(deep.path()), Err(Unmeasurable::TooDeep)));
    }

    #[test]
    fn a_file_held_open_after_its_unlink_counts() {
        use std::os::unix::fs::MetadataExt as _;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hidden");
        std::fs::write(&path, vec![1u8; 1 << 20]).unwrap();
        let held = std::fs::File::open(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        let device = std::fs::metadata(dir.path()).unwrap().dev();
        let counted = held_unlinked(&[std::process::id()], device);
        assert!(counted >= 1 << 20, "{counted}");
        drop(held);
        assert_eq!(held_unlinked(&[std::process::id()], device), 0);
    }
}
