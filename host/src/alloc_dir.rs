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

    /// Creates the shared part (idempotent).
    pub fn build(&self) -> io::Result<()> {
        crate::blocking::run(|| {
            for dir in ["data", "logs", "tmp"] {
                std::fs::create_dir_all(self.shared().join(dir))?;
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
                rustix::fs::chown(self.task_dir(task).join(dir), owner, group)?;
            }
            Ok(())
        })
    }

    /// Creates a task's directory (idempotent).
    pub fn build_task(&self, task: &str) -> io::Result<PathBuf> {
        let task_dir = self.task_dir(task);
        crate::blocking::run(|| {
            for dir in ["local", "secrets", "tmp"] {
                std::fs::create_dir_all(task_dir.join(dir))?;
            }
            // Secrets are for the task alone (fixed on every start, also for old dirs).
            std::fs::set_permissions(
                task_dir.join("secrets"),
                std::os::unix::fs::PermissionsExt::from_mode(0o700),
            )?;
            Ok(task_dir)
        })
    }
}
