//! The alloc directory, in Nomad's layout but for where task directories live:
//!
//! ```text
//! <data_dir>/allocs/<alloc_id>/
//!   alloc/{data,logs,tmp}             shared by the alloc's tasks (`/alloc` inside them)
//!   tasks/<task>/{local,secrets,tmp}  each task's own directory
//!   tasks/.<task>.mount-refusals      a granted CSI plugin's refused mounts (its
//!                                     warden writes, the agent reports them)
//!   .layout-tasks                     berth's marker of this layout
//!   etc/{resolv.conf,hosts}           the group's own, over the host's in its tasks'
//!                                     `/etc` (written by berth alone)
//!   si-token-accessors                berth's record of the alloc's Consul tokens
//! ```
//!
//! Nomad keeps a task's directory beside `alloc/` (`<alloc_id>/<task>`), so a task named
//! `alloc` gets the shared directory as its own and builds its root inside what every
//! other task sees at `/alloc`. Here task directories live in a namespace of their own,
//! `tasks/`, where no task name can meet anything berth keeps. An alloc made by a build
//! with the old layout keeps it until it ends (its root has no layout marker): nothing is
//! moved under a running task, and a task that restarts finds its `local/` where it was.

use std::io;
use std::path::{Path, PathBuf};

/// Written in the alloc root by [`AllocDir::build`] when the alloc uses the `tasks/`
/// layout. The root is the agent's (no task writes it), so the marker is berth's word.
const LAYOUT_MARKER: &str = ".layout-tasks";

/// The files a group may have of its own in its tasks' `/etc`, by name.
pub const GROUP_ETC_FILES: [&str; 2] = ["resolv.conf", "hosts"];

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllocDir {
    root: PathBuf,
    /// Where task directories live: `<root>/tasks`, or `<root>` for an alloc of the old
    /// layout.
    tasks: PathBuf,
}

impl AllocDir {
    /// The directory of a new alloc.
    pub fn new(data_dir: &Path, alloc_id: &str) -> Self {
        let root = data_dir.join("allocs").join(alloc_id);
        AllocDir {
            tasks: root.join("tasks"),
            root,
        }
    }

    /// The directory of an alloc recorded before an agent restart: the old layout when
    /// its root exists without the layout marker (made by a build before `tasks/`).
    pub fn existing(data_dir: &Path, alloc_id: &str) -> Self {
        let mut dir = AllocDir::new(data_dir, alloc_id);
        let marked =
            std::fs::symlink_metadata(dir.root.join(LAYOUT_MARKER)).is_ok_and(|m| m.is_file());
        let made = std::fs::symlink_metadata(&dir.root).is_ok_and(|m| m.is_dir());
        if made && !marked {
            dir.tasks = dir.root.clone();
        }
        dir
    }

    /// Whether task directories live in `tasks/` (false: an alloc of the old layout).
    pub fn has_task_namespace(&self) -> bool {
        self.tasks != self.root
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

    /// Where berth writes the group's own `/etc` files, read-only to its tasks; `None`
    /// for an alloc of the old layout, whose tasks' dirs share the root (a task named
    /// `etc` would meet it).
    pub fn group_etc(&self) -> Option<PathBuf> {
        self.has_task_namespace().then(|| self.root.join("etc"))
    }

    /// The group's own `/etc` files that are written (of [`GROUP_ETC_FILES`]): what a
    /// confined task sees over the host's.
    pub fn group_etc_files(&self) -> Vec<PathBuf> {
        let Some(dir) = self.group_etc() else {
            return Vec::new();
        };
        GROUP_ETC_FILES
            .iter()
            .map(|name| dir.join(name))
            .filter(|path| std::fs::symlink_metadata(path).is_ok_and(|m| m.is_file()))
            .collect()
    }

    pub fn task_dir(&self, task: &str) -> PathBuf {
        self.tasks.join(task)
    }

    pub fn stdout(&self, task: &str) -> PathBuf {
        self.shared().join("logs").join(format!("{task}.stdout.0"))
    }

    pub fn stderr(&self, task: &str) -> PathBuf {
        self.shared().join("logs").join(format!("{task}.stderr.0"))
    }

    /// Where the mount warden of task `task` (a CSI plugin granted mounting) writes the
    /// mounts it refused, for the task's events: [`mount_refusals_beside`] its dir.
    pub fn mount_refusals(&self, task: &str) -> Option<PathBuf> {
        mount_refusals_beside(&self.task_dir(task))
    }

    /// Creates the shared part (idempotent). `data/` and `tmp/` are writable by every
    /// task of the alloc, whatever its user (Nomad makes them world-writable, so a
    /// prestart task can hand files to the main task); sticky, as `/tmp` is, so one task
    /// user cannot remove another's files. `logs/` is written by berth alone.
    pub fn build(&self) -> io::Result<()> {
        use std::os::unix::fs::PermissionsExt as _;
        crate::blocking::run(|| {
            std::fs::create_dir_all(self.shared())?;
            if self.has_task_namespace() {
                // Before any task dir: from here on a restarted agent reads this layout.
                std::fs::write(self.root.join(LAYOUT_MARKER), "tasks/<task>\n")?;
            }
            std::fs::set_permissions(self.shared(), std::fs::Permissions::from_mode(0o755))?;
            for (dir, mode) in [("data", 0o1777), ("logs", 0o755), ("tmp", 0o1777)] {
                let path = self.shared().join(dir);
                create_dir_if_missing(&path)?;
                // Given to the alloc's dynamic gid (root's, setgid: only the agent makes
                // it so), it stays closed on every task's start.
                let dir = open_dir_nofollow(&path)?;
                let stat = rustix::fs::fstat(&dir)?;
                if mode != 0o755 && stat.st_mode & 0o2000 != 0 && stat.st_gid != 0 {
                    continue;
                }
                rustix::fs::fchmod(&dir, rustix::fs::Mode::from_raw_mode(mode))?;
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
            if self.has_task_namespace() {
                create_dir_if_missing(&self.tasks)?;
                set_dir_mode(&self.tasks, 0o755)?;
            }
            create_dir_if_missing(&task_dir)?;
            // Not a link a task planted: what follows is made inside it.
            set_dir_mode(&task_dir, 0o755)?;
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

/// The file beside task dir `task_dir` (outside the task's root, so the task can neither
/// read nor forge it) where its mount warden writes the mounts it refused, one line each.
pub fn mount_refusals_beside(task_dir: &Path) -> Option<PathBuf> {
    let name = task_dir.file_name()?.to_str()?;
    Some(task_dir.parent()?.join(format!(".{name}.mount-refusals")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A new alloc is marked and keeps its task dirs in `tasks/`; read back after a
    /// restart it is the same layout, even with a task named `tasks` or `local`.
    #[test]
    fn a_new_alloc_keeps_its_layout_across_a_restart() {
        let data = tempfile::tempdir().unwrap();
        let dir = AllocDir::new(data.path(), "a1");
        dir.build().unwrap();
        dir.build_task("local").unwrap();
        let again = AllocDir::existing(data.path(), "a1");
        assert_eq!(again, dir);
        assert_eq!(again.task_dir("tasks"), dir.root().join("tasks/tasks"));
        assert!(again.task_dir("local").join("secrets").is_dir());
        assert_eq!(
            AllocDir::existing(data.path(), "never-built"),
            AllocDir::new(data.path(), "never-built")
        );
    }

    /// An alloc made before `tasks/` keeps its task dirs where they are: nothing is
    /// moved, and a restarted task finds what it wrote.
    #[test]
    fn an_alloc_of_the_old_layout_keeps_it() {
        let data = tempfile::tempdir().unwrap();
        let root = data.path().join("allocs/a1");
        std::fs::create_dir_all(root.join("web/local")).unwrap();
        std::fs::write(root.join("web/local/state"), "kept").unwrap();
        let dir = AllocDir::existing(data.path(), "a1");
        assert!(!dir.has_task_namespace());
        dir.build().unwrap();
        assert!(!root.join(LAYOUT_MARKER).exists());
        let task_dir = dir.build_task("web").unwrap();
        assert_eq!(task_dir, root.join("web"));
        assert_eq!(
            std::fs::read_to_string(task_dir.join("local/state")).unwrap(),
            "kept"
        );
    }

    /// A task dir that is a link (a task replaced it) is refused, not built through.
    #[test]
    fn a_task_dir_that_is_a_link_is_refused() {
        let data = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let dir = AllocDir::new(data.path(), "a1");
        dir.build().unwrap();
        std::fs::create_dir_all(dir.task_dir("x").parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.task_dir("web")).unwrap();
        let error = dir.build_task("web").unwrap_err();
        assert!(
            error.to_string().contains("is not a directory berth made"),
            "{error}"
        );
        assert!(std::fs::read_dir(outside.path()).unwrap().next().is_none());
    }
}
