//! Files, directories and links made below a directory descriptor, never through a link
//! and never out of it: each path is walked one part at a time with `mkdirat` and
//! `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)` from the
//! directory before, and each name is created in the directory so opened. A link an
//! archive made is never followed by a later entry (it is a link on the way: refused).

use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Component, Path};

use rustix::fs::{AtFlags, Mode, OFlags, ResolveFlags};

use crate::unpack::UnpackError;
use crate::{Give, Limits};

const NO_LINKS: ResolveFlags = ResolveFlags::BENEATH
    .union(ResolveFlags::NO_SYMLINKS)
    .union(ResolveFlags::NO_MAGICLINKS);

/// Opens the directory `name` in `dir`, through no link.
pub fn open_dir(dir: BorrowedFd<'_>, name: &str) -> io::Result<OwnedFd> {
    Ok(rustix::fs::openat2(
        dir,
        name,
        OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::empty(),
        NO_LINKS,
    )?)
}

/// The directories [`make_dirs`] created, to be removed again if the fetch fails.
#[derive(Debug, Default)]
pub struct MadeDirs(Vec<Vec<String>>);

impl MadeDirs {
    /// Removes the directories made, deepest first, each only if still empty.
    pub fn remove(&self, root: BorrowedFd<'_>) {
        for path in self.0.iter().rev() {
            let Some((name, parents)) = path.split_last() else {
                continue;
            };
            let mut dir = match rustix::io::dup(root) {
                Ok(dir) => dir,
                Err(_) => return,
            };
            let mut reached = true;
            for part in parents {
                match open_dir(dir.as_fd(), part) {
                    Ok(next) => dir = next,
                    Err(_) => {
                        reached = false;
                        break;
                    }
                }
            }
            if reached {
                let _ = rustix::fs::unlinkat(&dir, name.as_str(), AtFlags::REMOVEDIR);
            }
        }
    }
}

/// Opens (making what is missing, 0755) the directory `parts` below `root`.
pub fn make_dirs(
    root: BorrowedFd<'_>,
    parts: &[&str],
    give: Option<&Give>,
    made: &mut MadeDirs,
) -> io::Result<OwnedFd> {
    let mut dir = rustix::io::dup(root)?;
    let mut walked = Vec::new();
    for part in parts {
        walked.push(part.to_string());
        match rustix::fs::mkdirat(&dir, *part, Mode::from_raw_mode(0o755)) {
            Ok(()) => made.0.push(walked.clone()),
            Err(rustix::io::Errno::EXIST) => {}
            Err(error) => return Err(refused(error)),
        }
        dir = open_dir(dir.as_fd(), part).map_err(|e| match e.raw_os_error() {
            Some(code) => refused(rustix::io::Errno::from_raw_os_error(code)),
            None => e,
        })?;
        if let Some(give) = give
            && made.0.last() == Some(&walked)
        {
            give(dir.as_fd())?;
        }
    }
    Ok(dir)
}

fn refused(error: rustix::io::Errno) -> io::Error {
    use rustix::io::Errno;
    if [Errno::XDEV, Errno::LOOP, Errno::NOTDIR].contains(&error) {
        io::Error::other(
            "a file or a symlink is where a directory should be, or the path leads out of \
             the task's directory; berth does not follow symlinks",
        )
    } else {
        error.into()
    }
}

/// A file in `dir` with no name yet (`O_TMPFILE`): on the same filesystem, counted
/// against it, and gone with its descriptor unless [`link_unnamed`] names it.
pub fn unnamed_file(dir: BorrowedFd<'_>) -> io::Result<std::fs::File> {
    let fd = rustix::fs::openat(dir, ".", crate::UNNAMED, Mode::from_raw_mode(0o600))?;
    Ok(fd.into())
}

/// Names the unnamed `file` `name` in `dir`: linked under a random name, then renamed
/// over `name` (a file or link there is replaced; a directory is not).
pub fn link_unnamed(dir: BorrowedFd<'_>, file: BorrowedFd<'_>, name: &str) -> io::Result<()> {
    let temporary = hidden_name("berth-artifact");
    let mut buffer = [0u8; 32];
    let proc_path = fd_path(&file, &mut buffer);
    rustix::fs::linkat(
        rustix::fs::CWD,
        proc_path,
        dir,
        temporary.as_str(),
        AtFlags::SYMLINK_FOLLOW,
    )?;
    if let Err(error) = rustix::fs::renameat(dir, temporary.as_str(), dir, name) {
        let _ = rustix::fs::unlinkat(dir, temporary.as_str(), AtFlags::empty());
        return Err(error.into());
    }
    Ok(())
}

fn fd_path<'a>(fd: &impl AsFd, buffer: &'a mut [u8; 32]) -> &'a str {
    use std::os::fd::AsRawFd;
    let mut cursor = io::Cursor::new(&mut buffer[..]);
    let _ = write!(cursor, "/proc/self/fd/{}", fd.as_fd().as_raw_fd());
    let len = cursor.position() as usize;
    std::str::from_utf8(&buffer[..len]).unwrap_or("/proc/self/fd/-1")
}

/// `.<prefix>-<16 hex digits>`: a name no archive entry is expected to have.
pub fn hidden_name(prefix: &str) -> String {
    let mut bytes = [0u8; 8];
    let _ = rustix::rand::getrandom(&mut bytes, rustix::rand::GetRandomFlags::empty());
    format!(".{prefix}-{:016x}", u64::from_ne_bytes(bytes))
}

/// The staging directory just opened is the one made: root's, 0700, empty (no one swapped
/// another in between its `mkdirat` and its open).
pub fn check_staging(dir: BorrowedFd<'_>) -> io::Result<()> {
    let stat = rustix::fs::fstat(dir)?;
    let ours = stat.st_uid == rustix::process::geteuid().as_raw()
        && stat.st_mode & 0o7777 == 0o700
        && stat.st_nlink == 2
        && list(dir)?.is_empty();
    if !ours {
        return Err(io::Error::other(
            "the staging directory was replaced while it was made; berth does not unpack \
             into it",
        ));
    }
    Ok(())
}

/// An archive's entries written below one directory, counted against the limits.
pub struct Tree<'a> {
    root: BorrowedFd<'a>,
    give: Option<&'a Give>,
    limits: &'a Limits,
    pub entries: u64,
    pub bytes: u64,
    /// The symbolic links made, checked once all are there ([`Tree::links_stay_inside`]).
    links: Vec<(String, String)>,
}

/// The deepest an entry's path may go: beyond, [`merge`] and [`remove_tree`], one call
/// per level, would risk the agent's stack.
const MAX_DEPTH: usize = 128;

/// An entry's path as parts: `./a/b` is `["a", "b"]`; `..`, an absolute path or an
/// empty one is refused.
pub fn parts_of(path: &Path) -> Result<Vec<String>, UnpackError> {
    let shown = || path.display().to_string();
    let mut parts = Vec::new();
    for component in path.components() {
        match component {
            Component::Normal(part) => match part.to_str() {
                Some(part) if !part.contains('\0') => parts.push(part.to_string()),
                _ => return Err(UnpackError::Name { entry: shown() }),
            },
            Component::CurDir => {}
            Component::ParentDir => return Err(UnpackError::Escapes { entry: shown() }),
            Component::RootDir | Component::Prefix(_) => {
                return Err(UnpackError::Absolute { entry: shown() });
            }
        }
    }
    if parts.len() > MAX_DEPTH {
        return Err(UnpackError::TooDeep {
            entry: shown(),
            limit: MAX_DEPTH,
        });
    }
    Ok(parts)
}

impl<'a> Tree<'a> {
    pub fn new(root: BorrowedFd<'a>, limits: &'a Limits, give: Option<&'a Give>) -> Tree<'a> {
        Tree {
            root,
            give,
            limits,
            entries: 0,
            bytes: 0,
            links: Vec::new(),
        }
    }

    /// Every link made, resolved now that the whole tree is there (`openat2` with
    /// `RESOLVE_BENEATH`, following links): one whose chain of links leads out (`s -> .`,
    /// `t -> s/..`) is refused, though each link's own text stays inside.
    pub fn links_stay_inside(&self) -> Result<(), UnpackError> {
        for (path, target) in &self.links {
            let resolved = rustix::fs::openat2(
                self.root,
                path.as_str(),
                OFlags::PATH | OFlags::CLOEXEC,
                Mode::empty(),
                ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS,
            );
            match resolved {
                // A link to what the archive does not hold leads nowhere yet.
                Ok(_) | Err(rustix::io::Errno::NOENT) => {}
                Err(_) => {
                    return Err(UnpackError::LinkOut {
                        entry: path.clone(),
                        target: target.clone(),
                    });
                }
            }
        }
        Ok(())
    }

    fn count(&mut self) -> Result<(), UnpackError> {
        self.entries += 1;
        if self.entries > self.limits.max_files {
            return Err(UnpackError::TooManyEntries {
                limit: self.limits.max_files,
            });
        }
        Ok(())
    }

    /// The directory holding `parts`' last part (made as needed), and that part.
    fn parent<'p>(
        &mut self,
        entry: &str,
        parts: &'p [String],
    ) -> Result<(OwnedFd, &'p str), UnpackError> {
        let io = |error: io::Error| UnpackError::Io {
            entry: entry.to_string(),
            error,
        };
        let (name, dirs) = parts.split_last().ok_or_else(|| UnpackError::Name {
            entry: entry.to_string(),
        })?;
        let mut dir = rustix::io::dup(self.root).map_err(|e| io(e.into()))?;
        for part in dirs {
            match rustix::fs::mkdirat(&dir, part.as_str(), Mode::from_raw_mode(0o755)) {
                Ok(()) => {
                    self.count()?;
                    dir = open_dir(dir.as_fd(), part).map_err(io)?;
                    if let Some(give) = self.give {
                        give(dir.as_fd()).map_err(io)?;
                    }
                }
                Err(rustix::io::Errno::EXIST) => {
                    dir = open_dir(dir.as_fd(), part).map_err(|e| self.link_on_way(entry, e))?;
                }
                Err(error) => return Err(io(error.into())),
            }
        }
        Ok((dir, name.as_str()))
    }

    fn link_on_way(&self, entry: &str, error: io::Error) -> UnpackError {
        let code = error.raw_os_error();
        let refusals = [
            rustix::io::Errno::LOOP,
            rustix::io::Errno::XDEV,
            rustix::io::Errno::NOTDIR,
        ];
        if refusals.iter().any(|e| code == Some(e.raw_os_error())) {
            UnpackError::ThroughLink {
                entry: entry.to_string(),
            }
        } else {
            UnpackError::Io {
                entry: entry.to_string(),
                error,
            }
        }
    }

    pub fn dir(&mut self, entry: &Path, mode: u32) -> Result<(), UnpackError> {
        let shown = entry.display().to_string();
        let parts = parts_of(entry)?;
        if parts.is_empty() {
            return Ok(());
        }
        let (parent, name) = self.parent(&shown, &parts)?;
        // Every entry counts, one already there too.
        self.count()?;
        match rustix::fs::mkdirat(&parent, name, Mode::from_raw_mode(0o755)) {
            Ok(()) | Err(rustix::io::Errno::EXIST) => {}
            Err(error) => {
                return Err(UnpackError::Io {
                    entry: shown,
                    error: error.into(),
                });
            }
        }
        let dir = open_dir(parent.as_fd(), name).map_err(|e| self.link_on_way(&shown, e))?;
        let io = |error: rustix::io::Errno| UnpackError::Io {
            entry: shown.clone(),
            error: error.into(),
        };
        // Never setuid, setgid or sticky; always enterable by its owner.
        rustix::fs::fchmod(&dir, Mode::from_raw_mode((mode & 0o777) | 0o700)).map_err(io)?;
        if let Some(give) = self.give {
            give(dir.as_fd()).map_err(|error| UnpackError::Io {
                entry: shown.clone(),
                error,
            })?;
        }
        Ok(())
    }

    /// Writes a regular file from `content`, charging its bytes to the unpack limit.
    pub fn file(
        &mut self,
        entry: &Path,
        mode: u32,
        content: &mut dyn Read,
    ) -> Result<(), UnpackError> {
        let shown = entry.display().to_string();
        let parts = parts_of(entry)?;
        let (parent, name) = self.parent(&shown, &parts)?;
        self.count()?;
        // A new inode always (O_EXCL): an archive that names a file twice has the first
        // unlinked, never written through (a hard link to it would carry the write).
        let create = || {
            rustix::fs::openat2(
                &parent,
                name,
                OFlags::WRONLY
                    | OFlags::CREATE
                    | OFlags::EXCL
                    | OFlags::CLOEXEC
                    | OFlags::NOFOLLOW
                    | OFlags::NONBLOCK,
                Mode::from_raw_mode(0o600),
                NO_LINKS,
            )
        };
        let file = match create() {
            Err(rustix::io::Errno::EXIST) => {
                rustix::fs::unlinkat(&parent, name, AtFlags::empty()).map_err(|_| {
                    UnpackError::NotAFile {
                        entry: shown.clone(),
                    }
                })?;
                create()
            }
            other => other,
        }
        .map_err(|e| self.link_on_way(&shown, e.into()))?;
        let mut file = std::fs::File::from(file);
        let remaining = self.limits.max_unpacked.saturating_sub(self.bytes);
        // One byte past the limit tells a file that reaches it from one that passes it.
        let copied = io::copy(&mut content.take(remaining.saturating_add(1)), &mut file).map_err(
            |error| UnpackError::Io {
                entry: shown.clone(),
                error,
            },
        )?;
        if copied > remaining {
            return Err(UnpackError::TooLarge {
                limit: self.limits.max_unpacked,
            });
        }
        self.bytes += copied;
        let io = |error: io::Error| UnpackError::Io {
            entry: shown.clone(),
            error,
        };
        // Never setuid or setgid: the bits a file keeps are its permissions.
        rustix::fs::fchmod(&file, Mode::from_raw_mode(mode & 0o777)).map_err(|e| io(e.into()))?;
        if let Some(give) = self.give {
            give(file.as_fd()).map_err(io)?;
        }
        Ok(())
    }

    /// A symbolic link, made only if its target, read from where it stands, stays in
    /// the tree: relative, and never climbing above the root.
    pub fn symlink(&mut self, entry: &Path, target: &Path) -> Result<(), UnpackError> {
        let shown = entry.display().to_string();
        let parts = parts_of(entry)?;
        let out = || UnpackError::LinkOut {
            entry: shown.clone(),
            target: target.display().to_string(),
        };
        let mut depth = parts.len().saturating_sub(1) as i64;
        for component in target.components() {
            match component {
                Component::Normal(_) => depth += 1,
                Component::CurDir => {}
                Component::ParentDir => {
                    depth -= 1;
                    if depth < 0 {
                        return Err(out());
                    }
                }
                Component::RootDir | Component::Prefix(_) => return Err(out()),
            }
        }
        if target.as_os_str().is_empty() {
            return Err(out());
        }
        let (parent, name) = self.parent(&shown, &parts)?;
        self.count()?;
        rustix::fs::symlinkat(target, &parent, name).map_err(|e| match e {
            rustix::io::Errno::EXIST => UnpackError::Exists {
                entry: shown.clone(),
            },
            other => UnpackError::Io {
                entry: shown.clone(),
                error: other.into(),
            },
        })?;
        self.links
            .push((parts.join("/"), target.display().to_string()));
        Ok(())
    }

    /// A hard link to an entry already unpacked (never to a link, never from outside).
    pub fn hard_link(&mut self, entry: &Path, target: &Path) -> Result<(), UnpackError> {
        let shown = entry.display().to_string();
        let parts = parts_of(entry)?;
        let target_parts = parts_of(target)?;
        if target_parts.is_empty() {
            return Err(UnpackError::Name { entry: shown });
        }
        let joined = target_parts.join("/");
        let existing = rustix::fs::openat2(
            self.root,
            joined.as_str(),
            OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
            NO_LINKS,
        )
        .map_err(|_| UnpackError::LinkOut {
            entry: shown.clone(),
            target: target.display().to_string(),
        })?;
        let stat = rustix::fs::fstat(&existing).map_err(|e| UnpackError::Io {
            entry: shown.clone(),
            error: e.into(),
        })?;
        if rustix::fs::FileType::from_raw_mode(stat.st_mode) != rustix::fs::FileType::RegularFile {
            return Err(UnpackError::LinkOut {
                entry: shown,
                target: target.display().to_string(),
            });
        }
        let (parent, name) = self.parent(&shown, &parts)?;
        self.count()?;
        let mut buffer = [0u8; 32];
        let proc_path = fd_path(&existing, &mut buffer);
        rustix::fs::linkat(
            rustix::fs::CWD,
            proc_path,
            &parent,
            name,
            AtFlags::SYMLINK_FOLLOW,
        )
        .map_err(|e| UnpackError::Io {
            entry: shown,
            error: e.into(),
        })
    }
}

/// Moves everything in `from` into `to`: a name not in `to`, or a file there, is
/// renamed over; a directory in both is merged. Neither side's links are followed.
pub fn merge(from: BorrowedFd<'_>, to: BorrowedFd<'_>) -> io::Result<()> {
    let names = list(from)?;
    for name in names {
        match rustix::fs::renameat(from, name.as_str(), to, name.as_str()) {
            Ok(()) => {}
            Err(
                rustix::io::Errno::NOTEMPTY | rustix::io::Errno::EXIST | rustix::io::Errno::ISDIR,
            ) => {
                let inner_from = open_dir(from, &name)?;
                let inner_to = open_dir(to, &name)?;
                merge(inner_from.as_fd(), inner_to.as_fd())?;
            }
            Err(error) => return Err(error.into()),
        }
    }
    Ok(())
}

fn list(dir: BorrowedFd<'_>) -> io::Result<Vec<String>> {
    let reading = rustix::fs::openat(
        dir,
        ".",
        OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let mut names = Vec::new();
    for entry in rustix::fs::Dir::read_from(&reading)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name != "." && name != ".." {
            names.push(name);
        }
    }
    Ok(names)
}

/// Removes the directory `name` in `dir` and all in it, never following a link.
pub fn remove_tree(dir: BorrowedFd<'_>, name: &str) -> io::Result<()> {
    let inner = open_dir(dir, name)?;
    for child in list(inner.as_fd())? {
        match rustix::fs::unlinkat(&inner, child.as_str(), AtFlags::empty()) {
            Ok(()) => {}
            Err(rustix::io::Errno::ISDIR) => remove_tree(inner.as_fd(), &child)?,
            Err(error) => return Err(error.into()),
        }
    }
    rustix::fs::unlinkat(dir, name, AtFlags::REMOVEDIR)?;
    Ok(())
}
