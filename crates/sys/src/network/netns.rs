//! A group's network namespace, named as `ip netns` names them (`/run/netns/<name>`), so
//! the operator's tools see it, CNI plugins are handed its path, and it survives an
//! agent restart: restore finds it by name.

use std::io;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

use crate::mount::netns as ns_mount;

/// Where named network namespaces live, as `ip netns` has them.
pub const NETNS_DIR: &str = "/run/netns";

/// The longest name berth gives a namespace (an alloc id is 36).
const MAX_NAME: usize = 64;

/// `NSFS_MAGIC`: the filesystem of a namespace file (`statfs(2)`).
const NSFS_MAGIC: i64 = 0x6e73_6673;

#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    #[error(
        "{name:?} cannot name a network namespace: only letters, digits, '.', '-' and '_', at most {MAX_NAME}"
    )]
    BadName { name: String },
    #[error("network namespace {name:?} exists already")]
    Exists { name: String },
    #[error("cannot {doing} network namespace {name:?}: {source}")]
    Io {
        doing: &'static str,
        name: String,
        #[source]
        source: io::Error,
    },
}

/// A named network namespace: the file its mount keeps alive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetNs {
    name: String,
    path: PathBuf,
}

impl NetNs {
    /// Creates the namespace `name` in [`NETNS_DIR`]: new, empty but for a loopback
    /// device that is down (the CNI `loopback` plugin brings it up).
    pub fn create(name: &str) -> Result<NetNs, NetnsError> {
        Self::create_in(Path::new(NETNS_DIR), name)
    }

    /// [`NetNs::create`] in `dir` (tests keep theirs apart).
    pub fn create_in(dir: &Path, name: &str) -> Result<NetNs, NetnsError> {
        check_name(name)?;
        let io = |doing: &'static str| {
            let name = name.to_string();
            move |source| NetnsError::Io {
                doing,
                name,
                source,
            }
        };
        std::fs::create_dir_all(dir).map_err(io("make the directory of"))?;
        ns_mount::share_dir(dir).map_err(io("share the directory of"))?;
        let path = dir.join(name);
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o444)
            .open(&path)
            .map_err(|source| match source.kind() {
                io::ErrorKind::AlreadyExists => NetnsError::Exists {
                    name: name.to_string(),
                },
                _ => io("create the file of")(source),
            })?;
        // A thread of its own unshares (the agent's other threads stay in the host's
        // namespace), binds its namespace at the file and ends; the mount keeps it.
        let target = path.clone();
        let made = std::thread::Builder::new()
            .name("berth-netns".into())
            .spawn(move || -> io::Result<()> {
                // SAFETY: only the network namespace is unshared, and only by this
                // thread, which shares no descriptor table change with anyone (FILES is
                // not among the flags).
                unsafe { rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWNET)? };
                // Every port of the group's namespace is the group's, as Docker makes a
                // container's: root in an image, whose capabilities its user namespace
                // does not carry over to this namespace, binds port 80. (The sysctl is
                // this thread's namespace's.)
                std::fs::write("/proc/sys/net/ipv4/ip_unprivileged_port_start", "0")?;
                ns_mount::bind_namespace(Path::new("/proc/thread-self/ns/net"), &target)
            })
            .map_err(io("start the thread that makes"))?
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("the thread making it panicked")));
        if let Err(source) = made {
            let _ = std::fs::remove_file(&path);
            return Err(io("make")(source));
        }
        Ok(NetNs {
            name: name.to_string(),
            path,
        })
    }

    /// The namespace `name` if it exists in [`NETNS_DIR`] (a restore finds its alloc's).
    pub fn existing(name: &str) -> Option<NetNs> {
        Self::existing_in(Path::new(NETNS_DIR), name)
    }

    /// [`NetNs::existing`] in `dir`.
    pub fn existing_in(dir: &Path, name: &str) -> Option<NetNs> {
        check_name(name).ok()?;
        let path = dir.join(name);
        is_namespace(&path).then(|| NetNs {
            name: name.to_string(),
            path,
        })
    }

    /// The namespace `name` in [`NETNS_DIR`] whether or not it is there: what a removal
    /// is given when an agent died between making its file and mounting it (a plain file
    /// that would refuse the next `create`).
    pub fn named(name: &str) -> Result<NetNs, NetnsError> {
        check_name(name)?;
        Ok(NetNs {
            name: name.to_string(),
            path: Path::new(NETNS_DIR).join(name),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The namespace's file: what CNI plugins are given (`CNI_NETNS`) and tasks join.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Removes the namespace's name: its mount and its file. What is still inside it
    /// (a process not yet reaped) keeps the namespace itself until it goes. Removing a
    /// namespace that is gone is not an error.
    pub fn remove(&self) -> Result<(), NetnsError> {
        let io = |doing: &'static str| {
            let name = self.name.clone();
            move |source| NetnsError::Io {
                doing,
                name,
                source,
            }
        };
        if is_namespace(&self.path) {
            ns_mount::unbind_namespace(&self.path).map_err(io("unmount"))?;
        }
        match std::fs::remove_file(&self.path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(io("remove the file of")(e)),
            _ => Ok(()),
        }
    }
}

fn check_name(name: &str) -> Result<(), NetnsError> {
    let fine = !name.is_empty()
        && name.len() <= MAX_NAME
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'));
    if fine {
        Ok(())
    } else {
        Err(NetnsError::BadName {
            name: name.chars().take(MAX_NAME + 8).collect(),
        })
    }
}

/// Whether a namespace is mounted at `path` (its file is on `nsfs`, not the plain file
/// left when the mount is gone).
fn is_namespace(path: &Path) -> bool {
    rustix::fs::statfs(path).is_ok_and(|fs| fs.f_type == NSFS_MAGIC)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_plain() {
        for good in ["0b5a7c1e-8f5e-4d38-9a51-1b6c0d0e2f3a", "web.1", "a_b"] {
            assert!(check_name(good).is_ok(), "{good}");
        }
        for bad in ["", ".", "..", "../x", "a/b", "a b", "é", &"x".repeat(65)] {
            assert!(
                matches!(check_name(bad), Err(NetnsError::BadName { .. })),
                "{bad:?}"
            );
        }
    }
}
