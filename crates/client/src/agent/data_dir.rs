//! The data dir holds the state file, the API socket, task dirs with their secrets and
//! plugin sockets: before the agent puts anything there, the dir and every directory
//! above it must be beyond the reach of other users. A data dir another user made (say
//! `nobody` made `/tmp/berth-dev` first) would let them swap `api.sock` for their own
//! listener and receive the operator's jobs, or plant `allocs -> /root/victim`.
//!
//! - Every existing directory on the way (after resolving links) is owned by root or by
//!   the agent's user, and no other user can write it, unless it is root's and sticky
//!   (`/tmp`): there, others can add names but not take or replace root's.
//! - A link on the way must be root's or the agent's user's (one the agent's side made).
//! - Missing directories are made one `mkdir` at a time (never through a link, since
//!   `mkdir` does not follow one) and checked again after, so a name another user slipped
//!   in first is found and refused.
//! - The data dir itself ends up the agent user's, mode 0700.

use std::io;
use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _, PermissionsExt as _};
use std::path::{Component, Path, PathBuf};

/// Why the agent will not use a data dir; each says how to fix it.
#[derive(Debug, thiserror::Error)]
pub enum DataDirError {
    #[error(
        "{} is owned by uid {owner}, not by the agent's user (uid {agent}) or root: that user \
         could replace what the agent keeps there (its API socket, its state). Remove it (or \
         chown it to uid {agent}), or choose another data dir",
        path.display()
    )]
    ForeignOwner {
        path: PathBuf,
        owner: u32,
        agent: u32,
    },
    #[error(
        "{} can be written by other users (mode {mode:04o}): they could replace the data dir \
         inside it. Run `chmod go-w {}`, or choose a data dir elsewhere",
        path.display(),
        path.display()
    )]
    OpenToOthers { path: PathBuf, mode: u32 },
    #[error(
        "{} is a link made by uid {owner}: the agent follows no link another user made on the \
         way to its data dir. Remove it, or choose another data dir",
        path.display()
    )]
    ForeignLink { path: PathBuf, owner: u32 },
    #[error("{} is not a directory", .0.display())]
    NotADirectory(PathBuf),
    #[error(
        "the data dir {} is in use by another berth (an agent, or `berth run`): two would \
         take each other's allocs, disks and user ids. Stop it, or give this one its own \
         --data-dir",
        .0.display()
    )]
    InUse(PathBuf),
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: io::Error },
}

/// Holds the data dir for this process alone, for as long as the returned file is open
/// (an exclusive `flock` on `<dir>/agent.lock`, closed on exec: the agent's tasks never
/// hold it): a second agent or `berth run` on the same dir is refused.
pub fn lock(dir: &Path) -> Result<std::fs::File, DataDirError> {
    let path = dir.join("agent.lock");
    let io = |source| DataDirError::Io {
        path: path.clone(),
        source,
    };
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(io)?;
    match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(file),
        Err(rustix::io::Errno::WOULDBLOCK) => Err(DataDirError::InUse(dir.to_path_buf())),
        Err(e) => Err(io(e.into())),
    }
}

/// How deep links on the way may nest before the path is refused as a loop.
const MAX_LINKS: usize = 16;

/// Makes `dir` ready as the data dir (see the module's documentation); returns it with
/// links resolved, the path the agent then builds every other on (so a link found in a
/// path it built was planted, not the operator's).
pub fn prepare(dir: &Path) -> Result<PathBuf, DataDirError> {
    let agent = rustix::process::geteuid().as_raw();
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| DataDirError::Io { path, source }
    };
    let absolute = if dir.is_absolute() {
        dir.to_path_buf()
    } else {
        std::env::current_dir().map_err(io(dir))?.join(dir)
    };
    let resolved = walk(&absolute, agent, 0)?;
    let meta = std::fs::symlink_metadata(&resolved).map_err(io(&resolved))?;
    if meta.uid() != agent {
        return Err(DataDirError::ForeignOwner {
            path: resolved,
            owner: meta.uid(),
            agent,
        });
    }
    // An http.socket_group's group-execute is added when the socket is bound.
    if meta.permissions().mode() & 0o7777 != 0o700 {
        std::fs::set_permissions(&resolved, std::fs::Permissions::from_mode(0o700))
            .map_err(io(&resolved))?;
    }
    Ok(resolved)
}

/// Checks and creates `path` component by component; returns it with links resolved.
fn walk(path: &Path, agent: u32, links: usize) -> Result<PathBuf, DataDirError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| DataDirError::Io { path, source }
    };
    let mut at = PathBuf::from("/");
    check_dir(&at, agent, true)?;
    let components: Vec<Component> = path.components().collect();
    for (index, component) in components.iter().enumerate() {
        let last = index + 1 == components.len();
        match component {
            Component::RootDir | Component::CurDir => continue,
            Component::ParentDir => {
                at.pop();
                continue;
            }
            Component::Prefix(_) => continue,
            Component::Normal(name) => at.push(name),
        }
        let meta = match std::fs::symlink_metadata(&at) {
            Ok(meta) => meta,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let mode = if last { 0o700 } else { 0o755 };
                match std::fs::DirBuilder::new().mode(mode).create(&at) {
                    Ok(()) => {}
                    // Someone made it first: checked below like any existing one.
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                    Err(e) => return Err(io(&at)(e)),
                }
                std::fs::symlink_metadata(&at).map_err(io(&at))?
            }
            Err(e) => return Err(io(&at)(e)),
        };
        if meta.file_type().is_symlink() {
            if meta.uid() != 0 && meta.uid() != agent {
                return Err(DataDirError::ForeignLink {
                    path: at,
                    owner: meta.uid(),
                });
            }
            if links >= MAX_LINKS {
                return Err(io(&at)(io::Error::from_raw_os_error(libc::ELOOP)));
            }
            let target = std::fs::read_link(&at).map_err(io(&at))?;
            let mut through = at.clone();
            through.pop();
            let joined = through.join(target);
            // The rest of the path continues from where the link leads.
            let rest: PathBuf = components[index + 1..].iter().collect();
            return walk(&joined.join(rest), agent, links + 1);
        }
        check_dir(&at, agent, last)?;
    }
    Ok(at)
}

/// An existing directory on the way: root's or the agent's, and closed to other users
/// unless it is root's and sticky. The data dir itself (`last`) is checked by its owner
/// alone: the agent fixes its mode.
fn check_dir(path: &Path, agent: u32, last: bool) -> Result<(), DataDirError> {
    let meta = std::fs::symlink_metadata(path).map_err(|source| DataDirError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    if !meta.is_dir() {
        return Err(DataDirError::NotADirectory(path.to_path_buf()));
    }
    let owner = meta.uid();
    if owner != 0 && owner != agent {
        return Err(DataDirError::ForeignOwner {
            path: path.to_path_buf(),
            owner,
            agent,
        });
    }
    let mode = meta.permissions().mode() & 0o7777;
    let sticky_roots = mode & 0o1000 != 0 && owner == 0;
    if !last && mode & 0o022 != 0 && !sticky_roots {
        return Err(DataDirError::OpenToOthers {
            path: path.to_path_buf(),
            mode,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `script` with `sh -c` as `nobody` (tests run as root).
    fn as_nobody(script: &str) {
        use std::os::unix::process::CommandExt as _;
        let status = std::process::Command::new("/bin/sh")
            .args(["-c", script])
            .uid(65534)
            .gid(65534)
            .status()
            .unwrap();
        assert!(status.success(), "{script}");
    }

    fn scratch() -> tempfile::TempDir {
        let dir = tempfile::Builder::new()
            .prefix("berth-data-dir-test")
            .tempdir_in("/tmp")
            .unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
        dir
    }

    #[test]
    fn a_data_dir_another_user_made_or_can_reach_is_refused() {
        let dir = scratch();
        // nobody makes the data dir before the agent does (the -dev default's case),
        // a parent directory, and a link.
        let taken = dir.path().join("taken");
        let parent = dir.path().join("parent");
        let link = dir.path().join("link");
        as_nobody(&format!(
            "mkdir {} {} && ln -s /root {}",
            taken.display(),
            parent.display(),
            link.display()
        ));
        let error = prepare(&taken).unwrap_err();
        assert!(
            error.to_string().contains("is owned by uid 65534"),
            "{error}"
        );
        let error = prepare(&parent.join("data")).unwrap_err();
        assert!(
            matches!(error, DataDirError::ForeignOwner { .. }),
            "{error}"
        );
        assert!(!parent.join("data").exists());
        let error = prepare(&link.join("victim")).unwrap_err();
        assert!(matches!(error, DataDirError::ForeignLink { .. }), "{error}");
        // A world-writable parent that is not sticky.
        let open = dir.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let error = prepare(&open.join("data")).unwrap_err();
        assert!(
            error
                .to_string()
                .contains("can be written by other users (mode 0777)"),
            "{error}"
        );
        // Root's own, through root's links, under a sticky /tmp-like dir: made 0700.
        let good = dir.path().join("good/data");
        prepare(&good).unwrap();
        let mode = std::fs::metadata(&good).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o700);
        std::os::unix::fs::symlink(dir.path().join("good"), dir.path().join("rootlink")).unwrap();
        prepare(&dir.path().join("rootlink/data")).unwrap();
    }
}
