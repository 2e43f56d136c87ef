//! Paths below a directory that untrusted parties write into (a task's root, the alloc's
//! shared dir, a CSI plugin's staging tree), resolved and created **without following a
//! link and without leaving the directory**: `openat2(RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)`, and `mkdirat` in the directory opened
//! before. A mount aimed at such a path goes to `/proc/self/fd/<n>` of the descriptor so
//! opened (as runc does), so a link a task or plugin swapped in never redirects the mount
//! onto the host.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path};

use rustix::fs::{Mode, OFlags, ResolveFlags};

const NO_LINKS: ResolveFlags = ResolveFlags::BENEATH
    .union(ResolveFlags::NO_SYMLINKS)
    .union(ResolveFlags::NO_MAGICLINKS);

/// Opens `relative` (a path inside `root`, no `..`) as an `O_PATH` descriptor, refusing
/// any link on the way (`ELOOP`) and any way out (`EXDEV`). Async-signal-safe.
pub fn open(root: impl AsFd, relative: &CStr) -> io::Result<OwnedFd> {
    Ok(rustix::fs::openat2(
        root,
        relative,
        OFlags::PATH | OFlags::CLOEXEC,
        Mode::empty(),
        NO_LINKS,
    )?)
}

/// As [`open`], but a link as the last component is opened itself (`O_NOFOLLOW`), not
/// refused: for a mount that covers whatever is there, a link included. Async-signal-safe.
pub fn open_unfollowed(root: impl AsFd, relative: &CStr) -> io::Result<OwnedFd> {
    Ok(rustix::fs::openat2(
        root,
        relative,
        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
        NO_LINKS,
    )?)
}

/// Why [`open_file_for_writing`] refused.
#[derive(Debug, thiserror::Error)]
pub enum WriteOpenError {
    /// Something other than a regular file is there (a FIFO, a device, a socket).
    #[error("not a regular file (a FIFO, a device or a socket)")]
    NotAFile,
    #[error("{0}")]
    Open(rustix::io::Errno),
}

/// Opens (creating and truncating) the regular file `name` in `dir` for writing, through
/// no link and never out of `dir`, and **without blocking**: a FIFO a task left there
/// would otherwise hold the open, and the thread, until someone reads it. Anything but a
/// regular file is refused.
pub fn open_file_for_writing(
    dir: impl AsFd,
    name: impl rustix::path::Arg,
    mode: u32,
) -> Result<OwnedFd, WriteOpenError> {
    let file = rustix::fs::openat2(
        dir,
        name,
        OFlags::WRONLY
            | OFlags::CREATE
            | OFlags::TRUNC
            | OFlags::CLOEXEC
            | OFlags::NOFOLLOW
            | OFlags::NONBLOCK,
        Mode::from_raw_mode(mode),
        NO_LINKS,
    )
    .map_err(|e| match e {
        // A FIFO nobody reads, opened without blocking.
        rustix::io::Errno::NXIO => WriteOpenError::NotAFile,
        other => WriteOpenError::Open(other),
    })?;
    let kind = rustix::fs::fstat(&file)
        .map_err(WriteOpenError::Open)?
        .st_mode;
    if rustix::fs::FileType::from_raw_mode(kind) != rustix::fs::FileType::RegularFile {
        return Err(WriteOpenError::NotAFile);
    }
    Ok(file)
}

/// Whether something is at `relative` inside `root` (a link included, or a link on the
/// way, which is never followed). Not async-signal-safe.
pub fn something_at(root: &Path, relative: &Path) -> bool {
    let (Ok(root), Ok(relative)) = (
        std::ffi::CString::new(root.as_os_str().as_encoded_bytes()),
        std::ffi::CString::new(relative.as_os_str().as_encoded_bytes()),
    ) else {
        return false;
    };
    let Ok(root) = open_root(&root) else {
        return false;
    };
    match open_unfollowed(&root, &relative) {
        Ok(_) => true,
        Err(e) => e.raw_os_error() == Some(libc::ELOOP) || e.raw_os_error() == Some(libc::EXDEV),
    }
}

/// Opens the directory `root` itself (`O_PATH`), to resolve paths below it.
pub fn open_root(root: &CStr) -> io::Result<OwnedFd> {
    Ok(rustix::fs::open(
        root,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// `/proc/self/fd/<fd>` in `buffer`, as a C string, without allocating.
pub fn fd_path<'a>(fd: &impl AsFd, buffer: &'a mut [u8; 32]) -> &'a CStr {
    use std::os::fd::AsRawFd as _;
    let prefix = b"/proc/self/fd/";
    buffer[..prefix.len()].copy_from_slice(prefix);
    let mut digits = [0u8; 12];
    let mut n = fd.as_fd().as_raw_fd().max(0) as u32;
    let mut len = 0;
    loop {
        digits[len] = b'0' + (n % 10) as u8;
        len += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for i in 0..len {
        buffer[prefix.len() + i] = digits[len - 1 - i];
    }
    buffer[prefix.len() + len] = 0;
    // A NUL was written right after the digits.
    CStr::from_bytes_until_nul(&buffer[..]).unwrap_or(c"/proc/self/fd/")
}

/// Makes the directories of `relative` below `root` (each `mkdirat` in the one opened
/// before, `mode` for new ones), and, with `file`, an empty file as its last component:
/// a mount point that cannot have been redirected. An existing link anywhere is refused.
pub fn create(root: &Path, relative: &Path, file: bool, mode: u32) -> io::Result<()> {
    let mut dir: OwnedFd = rustix::fs::open(
        root,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::empty(),
    )?;
    let parts: Vec<&std::ffi::OsStr> = relative
        .components()
        .filter_map(|c| match c {
            Component::Normal(name) => Some(Ok(name)),
            Component::CurDir | Component::RootDir => None,
            _ => Some(Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} climbs out ('..')", relative.display()),
            ))),
        })
        .collect::<io::Result<_>>()?;
    for (index, name) in parts.iter().enumerate() {
        let last = index + 1 == parts.len();
        if last && file {
            // Never blocking: a FIFO the task left here (attack review) would hold the
            // open, and the thread, until something read it.
            let not_a_file = || {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "{} is not a regular file (a FIFO, a device or a socket)",
                        relative.display()
                    ),
                )
            };
            match rustix::fs::openat(
                &dir,
                *name,
                OFlags::CREATE
                    | OFlags::WRONLY
                    | OFlags::NOFOLLOW
                    | OFlags::NONBLOCK
                    | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o644),
            ) {
                Ok(fd) => {
                    let kind = rustix::fs::FileType::from_raw_mode(rustix::fs::fstat(&fd)?.st_mode);
                    if kind != rustix::fs::FileType::RegularFile {
                        return Err(not_a_file());
                    }
                }
                // An existing link is not a file berth made: refused.
                Err(rustix::io::Errno::LOOP) => return Err(link_refused(relative)),
                // A FIFO no one reads, or a socket.
                Err(rustix::io::Errno::NXIO) => return Err(not_a_file()),
                Err(e) => return Err(e.into()),
            }
            // What is there now must be a regular file, not a link.
            open(&dir, &c_name(name)?)?;
            return Ok(());
        }
        match rustix::fs::mkdirat(&dir, *name, Mode::from_raw_mode(mode)) {
            Ok(()) | Err(rustix::io::Errno::EXIST) => {}
            Err(e) => return Err(e.into()),
        }
        dir = rustix::fs::openat(
            &dir,
            *name,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| match e {
            rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR => link_refused(relative),
            other => other.into(),
        })?;
    }
    Ok(())
}

/// Removes the directory `path` below `root`, then each parent it leaves empty, up to
/// (not including) `root`; each removal `unlinkat` in its parent opened through no link
/// and never out of `root`, so a plugin that swapped a directory of its tree for a link
/// to the host's `/etc` gets nothing removed there. Stops at the first directory that is
/// not empty, is a mount, or cannot be reached; one already gone is passed over.
pub fn remove_empty_dirs(root: &Path, path: &Path) {
    let Ok(relative) = path.strip_prefix(root) else {
        return;
    };
    let Ok(root_dir) = super::c_path(root).and_then(|root| open_root(&root)) else {
        return;
    };
    let mut current = relative;
    while let (Some(parent), Some(name)) = (current.parent(), current.file_name()) {
        let removed = (|| -> io::Result<()> {
            let parent_dir = match parent.as_os_str().is_empty() {
                true => None,
                false => Some(open(&root_dir, &super::c_path(parent)?)?),
            };
            let at = parent_dir
                .as_ref()
                .map_or(root_dir.as_fd(), |dir| dir.as_fd());
            match rustix::fs::unlinkat(at, name, rustix::fs::AtFlags::REMOVEDIR) {
                Ok(()) | Err(rustix::io::Errno::NOENT) => Ok(()),
                Err(e) => Err(e.into()),
            }
        })();
        if removed.is_err() {
            return;
        }
        current = parent;
    }
}

fn c_name(name: &std::ffi::OsStr) -> io::Result<std::ffi::CString> {
    super::c_path(name)
}

fn link_refused(relative: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::PermissionDenied,
        format!(
            "{} passes through a link or something that is not a directory: berth follows no \
             link below a directory others write",
            relative.display()
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fd_path_is_written_without_allocating() {
        let file = std::fs::File::open("/dev/null").unwrap();
        let mut buffer = [0u8; 32];
        let path = fd_path(&file, &mut buffer).to_str().unwrap().to_string();
        use std::os::fd::AsRawFd as _;
        assert_eq!(path, format!("/proc/self/fd/{}", file.as_raw_fd()));
    }

    #[test]
    fn empty_dirs_are_removed_up_to_the_root_and_never_through_a_link() {
        let root = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("a/b/c")).unwrap();
        std::fs::create_dir_all(root.path().join("keep/d")).unwrap();
        std::fs::write(root.path().join("keep/file"), "").unwrap();
        remove_empty_dirs(root.path(), &root.path().join("a/b/c"));
        assert!(!root.path().join("a").exists());
        remove_empty_dirs(root.path(), &root.path().join("keep/d"));
        assert!(!root.path().join("keep/d").exists());
        assert!(root.path().join("keep/file").exists(), "not empty: kept");
        // A plugin's link to a host directory holding an empty one.
        std::fs::create_dir_all(outside.path().join("victim")).unwrap();
        std::fs::create_dir(root.path().join("per-alloc")).unwrap();
        std::os::unix::fs::symlink(outside.path(), root.path().join("per-alloc/x")).unwrap();
        remove_empty_dirs(root.path(), &root.path().join("per-alloc/x/victim"));
        assert!(
            outside.path().join("victim").exists(),
            "removed through a link"
        );
        remove_empty_dirs(root.path(), &root.path().join("per-alloc/x"));
        assert!(outside.path().exists());
        assert!(
            root.path().join("per-alloc/x").symlink_metadata().is_ok(),
            "a link is no dir"
        );
    }

    #[test]
    fn nothing_is_created_or_opened_through_a_link() {
        let root = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(outside.path(), root.path().join("link")).unwrap();
        let error = create(root.path(), Path::new("link/made"), false, 0o755).unwrap_err();
        assert!(
            error.to_string().contains("passes through a link"),
            "{error}"
        );
        assert!(!outside.path().join("made").exists());
        let error = create(root.path(), Path::new("a/../b"), false, 0o755).unwrap_err();
        assert!(error.to_string().contains("climbs out"), "{error}");
        create(root.path(), Path::new("a/b/c"), false, 0o755).unwrap();
        create(root.path(), Path::new("a/b/f"), true, 0o755).unwrap();
        assert!(root.path().join("a/b/c").is_dir());
        assert!(root.path().join("a/b/f").is_file());
        std::os::unix::fs::symlink("/etc/passwd", root.path().join("a/target")).unwrap();
        assert!(create(root.path(), Path::new("a/target"), true, 0o755).is_err());
        let dir = open_root(&crate::mount::c_path(root.path()).unwrap()).unwrap();
        assert!(open(&dir, c"a/b/c").is_ok());
        assert!(open(&dir, c"link").is_err());
        assert!(open(&dir, c"link/x").is_err());
        assert!(open(&dir, c"../x").is_err());
    }

    /// A task that left a FIFO where a file mount point goes (its `/etc/hosts`) must not
    /// hold the agent's thread in the open (attack review).
    #[test]
    fn a_fifo_where_a_file_goes_is_refused_at_once() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("etc")).unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            root.path().join("etc/hosts"),
            rustix::fs::FileType::Fifo,
            Mode::from_raw_mode(0o644),
            0,
        )
        .unwrap();
        let (done, result) = std::sync::mpsc::channel();
        let path = root.path().to_path_buf();
        std::thread::spawn(move || {
            let _ = done.send(create(&path, Path::new("etc/hosts"), true, 0o755));
        });
        let error = result
            .recv_timeout(std::time::Duration::from_secs(5))
            .expect("the open blocked on the FIFO")
            .unwrap_err();
        assert!(error.to_string().contains("not a regular file"), "{error}");
    }
}
