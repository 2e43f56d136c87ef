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

    pub fn task_dir(&self, task: &str) -> PathBuf {
        self.root.join(task)
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
                set_dir_mode(&path, mode, None)?;
            }
            Ok(())
        })
    }

    /// Hands a task's own directories (`local/`, `secrets/`, `tmp/`) to the user it runs
    /// as, so it can write where it should and nowhere else.
    pub fn give_task_dirs(
        &self,
        task: &str,
        user: crate::model::driver::TaskUser,
    ) -> io::Result<()> {
        let owner = Some(rustix::fs::Uid::from_raw(user.uid));
        let group = Some(rustix::fs::Gid::from_raw(user.gid));
        crate::blocking::run(|| {
            for dir in ["local", "secrets", "tmp"] {
                let path = self.task_dir(task).join(dir);
                let mode = if dir == "secrets" { 0o700 } else { 0o755 };
                set_dir_mode(&path, mode, Some((owner, group)))?;
            }
            Ok(())
        })
    }

    /// Creates a task's directory (idempotent).
    pub fn build_task(&self, task: &str) -> io::Result<PathBuf> {
        let task_dir = self.task_dir(task);
        crate::blocking::run(|| {
            std::fs::create_dir_all(&task_dir)?;
            for dir in ["local", "secrets", "tmp"] {
                create_dir_if_missing(&task_dir.join(dir))?;
            }
            // Secrets are for the task alone (fixed on every start, also for old dirs).
            set_dir_mode(&task_dir.join("secrets"), 0o700, None)?;
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

/// Sets the mode (and owner) of the directory at `path` without following a link: a
/// task can replace its own `local/` or the alloc's `data/` with a symlink (to `/etc`,
/// say), and the agent, root on the host, must not then change what it points to.
fn set_dir_mode(
    path: &Path,
    mode: u32,
    owner: Option<(Option<rustix::fs::Uid>, Option<rustix::fs::Gid>)>,
) -> io::Result<()> {
    use rustix::fs::{Mode, OFlags};
    let dir = rustix::fs::open(
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
    })?;
    if let Some((uid, gid)) = owner {
        rustix::fs::fchown(&dir, uid, gid)?;
    }
    rustix::fs::fchmod(&dir, Mode::from_raw_mode(mode))?;
    Ok(())
}
