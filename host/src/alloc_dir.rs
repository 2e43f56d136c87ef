//! The alloc directory, in Nomad's layout:
//!
//! ```text
//! <data_dir>/allocs/<alloc_id>/
//!   alloc/{data,logs,tmp}     shared by the alloc's tasks (`/alloc` inside them)
//!   <task>/{local,secrets,tmp}  each task's own directory
//! ```

use std::io;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllocDir {
    root: PathBuf,
}

impl AllocDir {
    pub fn new(data_dir: &Path, alloc_id: &str) -> Self {
        AllocDir {
            root: data_dir.join("allocs").join(alloc_id),
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The directory shared by every task of the alloc.
    pub fn shared(&self) -> PathBuf {
        self.root.join("alloc")
    }

    /// The accessors of the service identity tokens derived for the alloc's Connect
    /// sidecars, one per line, revoked when the alloc ends. Beside the tasks' dirs, not
    /// in one.
    pub fn si_token_accessors(&self) -> PathBuf {
        self.root.join("si-token-accessors")
    }

    /// The directory every task directory lives in.
    fn tasks(&self) -> PathBuf {
        self.root.join("tasks")
    }

    pub fn task_dir(&self, task: &str) -> PathBuf {
        self.tasks().join(task)
    }

    /// Moves task directories of the old layout (`<alloc_id>/<task>`) to
    /// `<alloc_id>/tasks/<task>`, so a restored alloc's tasks keep what they wrote in
    /// `local/` and `secrets/`. Idempotent; a task named `alloc` had the shared directory as
    /// its own and is left where it is, since moving it would take the others' `/alloc`.
    /// A running task is not disturbed: its root is a mount in its own namespace, which
    /// follows the directory.
    pub fn adopt_legacy_task_dirs<'a>(
        &self,
        tasks: impl IntoIterator<Item = &'a str>,
    ) -> io::Result<()> {
        let tasks: Vec<&str> = tasks.into_iter().collect();
        crate::blocking::run(|| {
            let legacy: Vec<&str> = tasks
                .iter()
                .copied()
                .filter(|task| *task != "alloc" && !self.tasks().join(task).join("local").is_dir())
                .filter(|task| self.root.join(task).join("local").is_dir())
                .collect();
            if legacy.is_empty() {
                return Ok(());
            }
            // A task once named `tasks` owns the directory the new layout needs: move it
            // aside first.
            let aside = self.root.join(".tasks-legacy");
            if legacy.contains(&"tasks") {
                std::fs::rename(self.tasks(), &aside)?;
            }
            create_dir_if_missing(&self.tasks())?;
            set_dir_mode(&self.tasks(), 0o755)?;
            for task in legacy {
                let from = if task == "tasks" {
                    aside.clone()
                } else {
                    self.root.join(task)
                };
                std::fs::rename(from, self.task_dir(task))?;
            }
            Ok(())
        })
    }

    pub fn stdout(&self, task: &str) -> PathBuf {
        self.shared().join("logs").join(format!("{task}.stdout.0"))
    }

    pub fn stderr(&self, task: &str) -> PathBuf {
        self.shared().join("logs").join(format!("{task}.stderr.0"))
    }

    /// Creates the shared part (idempotent). `data/` and `tmp/` are writable by every
    /// task of the alloc, whatever its user (Nomad makes them world-writable, so a
    /// prestart task can hand files to the main task); sticky, as `/tmp` is, so one task
    /// user cannot remove another's files. `logs/` is written by berth alone.
    pub fn build(&self) -> io::Result<()> {
        use std::os::unix::fs::PermissionsExt as _;
        crate::blocking::run(|| {
            std::fs::create_dir_all(self.shared())?;
            std::fs::set_permissions(self.shared(), std::fs::Permissions::from_mode(0o755))?;
            for (dir, mode) in [("data", 0o1777), ("logs", 0o755), ("tmp", 0o1777)] {
                let path = self.shared().join(dir);
                create_dir_if_missing(&path)?;
                set_dir_mode(&path, mode)?;
            }
            Ok(())
        })
    }

    /// A task's own directories (`local/`, `secrets/`, `tmp/`) with their modes: what is
    /// handed to the user it runs as (`sys::Sys::give_dirs`), so it can write where it
    /// should and nowhere else.
    pub fn task_owned_dirs(&self, task: &str) -> Vec<(PathBuf, u32)> {
        ["local", "secrets", "tmp"]
            .into_iter()
            .map(|dir| {
                let mode = if dir == "secrets" { 0o700 } else { 0o755 };
                (self.task_dir(task).join(dir), mode)
            })
            .collect()
    }

    /// Creates a task's directory (idempotent).
    pub fn build_task(&self, task: &str) -> io::Result<PathBuf> {
        let task_dir = self.task_dir(task);
        crate::blocking::run(|| {
            std::fs::create_dir_all(self.tasks())?;
            set_dir_mode(&self.tasks(), 0o755)?;
            create_dir_if_missing(&task_dir)?;
            for dir in ["local", "secrets", "tmp"] {
                create_dir_if_missing(&task_dir.join(dir))?;
            }
            // Secrets are for the task alone (fixed on every start, also for old dirs).
            set_dir_mode(&task_dir.join("secrets"), 0o700)?;
            Ok(task_dir)
        })
    }
}

/// `mkdir`, unless something is there already (which [`set_dir_mode`] then checks).
fn create_dir_if_missing(path: &Path) -> io::Result<()> {
    match std::fs::create_dir(path) {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        other => other,
    }
}

/// Sets the mode of the directory at `path` without following a link: a task can
/// replace its own `local/` or the alloc's `data/` with a symlink (to `/etc`, say), and
/// the agent, root on the host, must not then change what it points to.
fn set_dir_mode(path: &Path, mode: u32) -> io::Result<()> {
    let dir = open_dir_nofollow(path)?;
    rustix::fs::fchmod(&dir, rustix::fs::Mode::from_raw_mode(mode))?;
    Ok(())
}

/// Opens a directory without following a link, to change its mode or owner.
pub fn open_dir_nofollow(path: &Path) -> io::Result<std::os::fd::OwnedFd> {
    use rustix::fs::{Mode, OFlags};
    rustix::fs::open(
        path,
        OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| {
        let e = io::Error::from(e);
        io::Error::new(
            e.kind(),
            format!("{} is not a directory berth made ({e})", path.display()),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(path: &Path, text: &str) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    /// Task dirs of the old layout, including one of a task once named `tasks`, move
    /// under `tasks/` with what the tasks wrote; the shared dir stays; twice is once.
    #[test]
    fn legacy_task_dirs_are_adopted_with_their_files() {
        let data = tempfile::tempdir().unwrap();
        let dir = AllocDir::new(data.path(), "a1");
        write(&dir.root().join("web/local/state"), "web");
        write(&dir.root().join("tasks/local/state"), "tasks");
        write(&dir.root().join("alloc/data/shared"), "shared");
        for _ in 0..2 {
            dir.adopt_legacy_task_dirs(["web", "tasks", "alloc", "absent"])
                .unwrap();
        }
        let read =
            |task: &str| std::fs::read_to_string(dir.task_dir(task).join("local/state")).unwrap();
        assert_eq!(read("web"), "web");
        assert_eq!(read("tasks"), "tasks");
        assert!(!dir.root().join("web").exists());
        assert!(!dir.root().join(".tasks-legacy").exists());
        assert_eq!(
            std::fs::read_to_string(dir.shared().join("data/shared")).unwrap(),
            "shared"
        );
        assert!(!dir.task_dir("absent").exists());
    }

    /// A task dir of the current layout is never replaced by an old one.
    #[test]
    fn a_current_task_dir_wins_over_a_legacy_one() {
        let data = tempfile::tempdir().unwrap();
        let dir = AllocDir::new(data.path(), "a1");
        write(&dir.root().join("web/local/state"), "old");
        write(&dir.task_dir("web").join("local/state"), "new");
        dir.adopt_legacy_task_dirs(["web"]).unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.task_dir("web").join("local/state")).unwrap(),
            "new"
        );
    }
}
