//! One image layer (a tar, gzip-compressed or not) unpacked into a directory that
//! overlayfs can stack: ownership and modes as the layer says (setuid files are kept:
//! every image root is mounted `nosuid`), a whiteout (`.wh.name`) as overlayfs's
//! character device 0:0, an opaque directory (`.wh..wh..opq`) as its
//! `trusted.overlay.opaque` attribute.
//!
//! **Nothing is written outside the directory, and no link is followed.** Each entry's
//! parent is walked one part at a time with `openat2(RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS)`; an entry with `..` ends the unpack. A symbolic link is made as
//! the layer says, absolute or not: it is read only inside the task's root, after its
//! `pivot_root`, where `/` is the image's. A hard link must name a file the layer
//! already holds. Device nodes are skipped (a task gets its own `/dev`) and counted.
//! The operator's limits bound the bytes and entries unpacked, and the size of the
//! tar's own headers of headers (long names, PAX records).

use std::io::{self, Read};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Component, Path};

use berth_artifact::tree::open_dir;

use rustix::fs::{AtFlags, Mode, OFlags, ResolveFlags};

const NO_LINKS: ResolveFlags = ResolveFlags::BENEATH
    .union(ResolveFlags::NO_SYMLINKS)
    .union(ResolveFlags::NO_MAGICLINKS);

/// A header of headers larger than this ends the unpack: the tar crate reads one whole
/// into memory.
const MAX_TAR_METADATA: u64 = 1 << 20;
/// The deepest path accepted.
const MAX_DEPTH: usize = 256;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerLimits {
    /// Bytes of files one layer may unpack to.
    pub max_unpacked: u64,
    /// Entries one layer may hold.
    pub max_entries: u64,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Unpacked {
    pub entries: u64,
    pub bytes: u64,
    /// Device nodes skipped.
    pub devices_skipped: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum LayerError {
    #[error("entry {entry:?} climbs out of the layer ('..')")]
    Escapes { entry: String },
    #[error("entry {entry:?} is deeper than {MAX_DEPTH} directories")]
    TooDeep { entry: String },
    #[error("entry {entry:?} is not a valid name")]
    Name { entry: String },
    #[error(
        "entry {entry:?} lies through a link or a file where a directory should be; berth follows no link"
    )]
    ThroughLink { entry: String },
    #[error("entry {entry:?} is a hard link to {target:?}, which is not a file of this layer")]
    HardLinkOut { entry: String, target: String },
    #[error("the layer unpacks to more than {limit} bytes (the agent's image max_unpacked_bytes)")]
    TooLarge { limit: u64 },
    #[error("the layer holds more than {limit} entries (the agent's image max_layer_entries)")]
    TooManyEntries { limit: u64 },
    #[error("the layer is compressed with zstd, which berth does not unpack yet")]
    Zstd,
    #[error("reading the layer: {0}")]
    Format(String),
    #[error("entry {entry:?}: {error}")]
    Io {
        entry: String,
        #[source]
        error: io::Error,
    },
}

/// What a layer blob is compressed with, from its first bytes.
fn decompressed(mut blob: std::fs::File) -> Result<Box<dyn Read>, LayerError> {
    use std::io::Seek;
    let format = |e: io::Error| LayerError::Format(e.to_string());
    // The clones of one file share its offset: each pass starts from the beginning.
    blob.rewind().map_err(format)?;
    let mut magic = [0u8; 4];
    let read = blob.read(&mut magic).map_err(format)?;
    blob.rewind().map_err(format)?;
    let reader = io::BufReader::with_capacity(1 << 16, blob);
    match &magic[..read] {
        [0x1f, 0x8b, ..] => Ok(Box::new(flate2::read::MultiGzDecoder::new(reader))),
        [0x28, 0xb5, 0x2f, 0xfd] => Err(LayerError::Zstd),
        _ => Ok(Box::new(reader)),
    }
}

/// Unpacks the layer `blob` into `dir` (empty, the store's own).
pub fn unpack(
    blob: &std::fs::File,
    dir: BorrowedFd<'_>,
    limits: LayerLimits,
) -> Result<Unpacked, LayerError> {
    let again = || {
        blob.try_clone()
            .map_err(|e| LayerError::Format(e.to_string()))
    };
    scan(decompressed(again()?)?, limits)?;
    let mut archive = tar::Archive::new(decompressed(again()?)?);
    let format = |e: io::Error| LayerError::Format(e.to_string());
    let mut done = Unpacked::default();
    let mut opaque: Vec<Vec<String>> = Vec::new();
    for entry in archive.entries().map_err(format)? {
        let mut entry = entry.map_err(format)?;
        let path = entry.path().map_err(format)?.into_owned();
        let shown = path.display().to_string();
        let parts = parts_of(&path)?;
        done.entries += 1;
        if done.entries > limits.max_entries {
            return Err(LayerError::TooManyEntries {
                limit: limits.max_entries,
            });
        }
        let Some((name, parents)) = parts.split_last() else {
            continue;
        };
        let header = entry.header();
        let mode = header.mode().map_err(format)? & 0o7777;
        let uid = header.uid().map_err(format)?;
        let gid = header.gid().map_err(format)?;
        let owner = (
            u32::try_from(uid).unwrap_or(u32::MAX - 1),
            u32::try_from(gid).unwrap_or(u32::MAX - 1),
        );
        let kind = header.entry_type();
        let link = entry.link_name().map_err(format)?.map(|l| l.into_owned());
        let parent = open_parent(dir, parents, &shown)?;
        let io = |error: io::Error| LayerError::Io {
            entry: shown.clone(),
            error,
        };
        if name == ".wh..wh..opq" {
            opaque.push(parents.to_vec());
            continue;
        }
        if let Some(hidden) = name.strip_prefix(".wh.") {
            remove_existing(&parent, hidden).map_err(io)?;
            rustix::fs::mknodat(
                &parent,
                hidden,
                rustix::fs::FileType::CharacterDevice,
                Mode::empty(),
                0,
            )
            .map_err(|e| io(e.into()))?;
            continue;
        }
        use tar::EntryType;
        match kind {
            EntryType::Directory => {
                match rustix::fs::mkdirat(&parent, name.as_str(), Mode::from_raw_mode(0o700)) {
                    Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                    Err(e) => return Err(io(e.into())),
                }
                let made = open_dir(parent.as_fd(), name).map_err(|_| LayerError::ThroughLink {
                    entry: shown.clone(),
                })?;
                own(&made, owner, mode).map_err(io)?;
            }
            EntryType::Regular | EntryType::Continuous => {
                remove_existing(&parent, name).map_err(io)?;
                let file = rustix::fs::openat2(
                    &parent,
                    name.as_str(),
                    OFlags::WRONLY
                        | OFlags::CREATE
                        | OFlags::EXCL
                        | OFlags::CLOEXEC
                        | OFlags::NOFOLLOW,
                    Mode::from_raw_mode(0o600),
                    NO_LINKS,
                )
                .map_err(|e| io(e.into()))?;
                let mut file = std::fs::File::from(file);
                let remaining = limits.max_unpacked.saturating_sub(done.bytes);
                let copied = io::copy(
                    &mut (&mut entry).take(remaining.saturating_add(1)),
                    &mut file,
                )
                .map_err(io)?;
                if copied > remaining {
                    return Err(LayerError::TooLarge {
                        limit: limits.max_unpacked,
                    });
                }
                done.bytes += copied;
                own(&file, owner, mode).map_err(io)?;
            }
            EntryType::Symlink => {
                let target = link.ok_or_else(|| LayerError::Name {
                    entry: shown.clone(),
                })?;
                remove_existing(&parent, name).map_err(io)?;
                rustix::fs::symlinkat(&target, &parent, name.as_str()).map_err(|e| io(e.into()))?;
                rustix::fs::chownat(
                    &parent,
                    name.as_str(),
                    Some(rustix::fs::Uid::from_raw(owner.0)),
                    Some(rustix::fs::Gid::from_raw(owner.1)),
                    AtFlags::SYMLINK_NOFOLLOW,
                )
                .map_err(|e| io(e.into()))?;
            }
            EntryType::Link => {
                let target = link.ok_or_else(|| LayerError::Name {
                    entry: shown.clone(),
                })?;
                let out = || LayerError::HardLinkOut {
                    entry: shown.clone(),
                    target: target.display().to_string(),
                };
                let target_parts = parts_of(&target)?;
                if target_parts.is_empty() {
                    return Err(out());
                }
                let existing = rustix::fs::openat2(
                    dir,
                    target_parts.join("/").as_str(),
                    OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                    NO_LINKS,
                )
                .map_err(|_| out())?;
                let stat = rustix::fs::fstat(&existing).map_err(|e| io(e.into()))?;
                if rustix::fs::FileType::from_raw_mode(stat.st_mode)
                    == rustix::fs::FileType::Directory
                {
                    return Err(out());
                }
                remove_existing(&parent, name).map_err(io)?;
                rustix::fs::linkat(&existing, "", &parent, name.as_str(), AtFlags::EMPTY_PATH)
                    .map_err(|e| io(e.into()))?;
            }
            EntryType::Fifo => {
                remove_existing(&parent, name).map_err(io)?;
                rustix::fs::mknodat(
                    &parent,
                    name.as_str(),
                    rustix::fs::FileType::Fifo,
                    Mode::from_raw_mode(mode & 0o777),
                    0,
                )
                .map_err(|e| io(e.into()))?;
            }
            EntryType::Char | EntryType::Block => {
                done.devices_skipped += 1;
            }
            // Headers of headers are read by the tar crate; anything else is not a file.
            _ => {}
        }
    }
    for parts in opaque {
        let entry = parts.join("/");
        let target = if parts.is_empty() {
            rustix::io::dup(dir).map_err(|e| LayerError::Io {
                entry: entry.clone(),
                error: e.into(),
            })?
        } else {
            let refs: Vec<&String> = parts.iter().collect();
            let (last, parents) = refs.split_last().ok_or(LayerError::Name {
                entry: entry.clone(),
            })?;
            let owned: Vec<String> = parents.iter().map(|s| s.to_string()).collect();
            let parent = open_parent(dir, &owned, &entry)?;
            open_dir(parent.as_fd(), last).map_err(|_| LayerError::ThroughLink {
                entry: entry.clone(),
            })?
        };
        rustix::fs::fsetxattr(
            &target,
            "trusted.overlay.opaque",
            b"y",
            rustix::fs::XattrFlags::empty(),
        )
        .map_err(|e| LayerError::Io {
            entry,
            error: e.into(),
        })?;
    }
    Ok(done)
}

/// First pass over the headers alone: no header of headers past [`MAX_TAR_METADATA`],
/// no more entries nor declared bytes than the limits.
fn scan(stream: Box<dyn Read>, limits: LayerLimits) -> Result<(), LayerError> {
    let format = |e: io::Error| LayerError::Format(format!("reading the tar stream: {e}"));
    let mut archive = tar::Archive::new(stream);
    let (mut entries, mut declared) = (0u64, 0u64);
    for entry in archive.entries().map_err(format)?.raw(true) {
        let entry = entry.map_err(format)?;
        let header = entry.header();
        let size = header.entry_size().map_err(format)?;
        let kind = header.entry_type();
        if kind.is_gnu_longname()
            || kind.is_gnu_longlink()
            || kind.is_pax_local_extensions()
            || kind.is_pax_global_extensions()
        {
            if size > MAX_TAR_METADATA {
                return Err(LayerError::Format(format!(
                    "the tar holds a {size}-byte header of headers; berth reads those of up to {MAX_TAR_METADATA} bytes"
                )));
            }
            continue;
        }
        entries += 1;
        if entries > limits.max_entries {
            return Err(LayerError::TooManyEntries {
                limit: limits.max_entries,
            });
        }
        // Every entry's data is read (and decompressed) whatever its kind, so every
        // entry's size counts: a directory claiming gigabytes costs as much as a file.
        {
            declared = declared.saturating_add(size);
            if declared > limits.max_unpacked {
                return Err(LayerError::TooLarge {
                    limit: limits.max_unpacked,
                });
            }
        }
    }
    Ok(())
}

/// An entry's path as parts; a leading `/` or `./` is dropped (some tools write them),
/// `..` is refused.
fn parts_of(path: &Path) -> Result<Vec<String>, LayerError> {
    let shown = || path.display().to_string();
    let mut parts = Vec::new();
    for component in path.components() {
        match component {
            Component::Normal(part) => match part.to_str() {
                Some(part) if !part.contains('\0') => parts.push(part.to_string()),
                _ => return Err(LayerError::Name { entry: shown() }),
            },
            Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
            Component::ParentDir => return Err(LayerError::Escapes { entry: shown() }),
        }
    }
    if parts.len() > MAX_DEPTH {
        return Err(LayerError::TooDeep { entry: shown() });
    }
    Ok(parts)
}

/// The directory `parents` below `root`, made (0755, root's) where missing, through no link.
fn open_parent(
    root: BorrowedFd<'_>,
    parents: &[String],
    entry: &str,
) -> Result<OwnedFd, LayerError> {
    let mut dir = rustix::io::dup(root).map_err(|e| LayerError::Io {
        entry: entry.to_string(),
        error: e.into(),
    })?;
    for part in parents {
        match rustix::fs::mkdirat(&dir, part.as_str(), Mode::from_raw_mode(0o755)) {
            Ok(()) | Err(rustix::io::Errno::EXIST) => {}
            Err(e) => {
                return Err(LayerError::Io {
                    entry: entry.to_string(),
                    error: e.into(),
                });
            }
        }
        dir = open_dir(dir.as_fd(), part).map_err(|_| LayerError::ThroughLink {
            entry: entry.to_string(),
        })?;
    }
    Ok(dir)
}

/// Removes what is at `name` in `dir` (a later entry replaces an earlier one); a
/// directory stays (a directory entry over it merges), unless an entry replaces it
/// with something else, which then fails.
fn remove_existing(dir: &OwnedFd, name: &str) -> io::Result<()> {
    match rustix::fs::unlinkat(dir, name, AtFlags::empty()) {
        Ok(()) | Err(rustix::io::Errno::NOENT) | Err(rustix::io::Errno::ISDIR) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Gives `file` its owner, then its mode (after: `chown` clears setuid bits).
fn own(file: &impl AsFd, (uid, gid): (u32, u32), mode: u32) -> io::Result<()> {
    rustix::fs::fchown(
        file,
        Some(rustix::fs::Uid::from_raw(uid)),
        Some(rustix::fs::Gid::from_raw(gid)),
    )?;
    rustix::fs::fchmod(file, Mode::from_raw_mode(mode))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: LayerLimits = LayerLimits {
        max_unpacked: 1 << 20,
        max_entries: 1000,
    };

    enum Entry<'a> {
        Dir(&'a str, u32),
        File(&'a str, u32, &'a [u8]),
        Symlink(&'a str, &'a str),
        HardLink(&'a str, &'a str),
        Device(&'a str),
        /// A directory entry that carries data anyway.
        FatDir(&'a str, &'a [u8]),
    }

    /// A tar, gzip-compressed, of `entries` (raw names: `..` included).
    fn layer(entries: &[Entry<'_>]) -> std::fs::File {
        let mut builder = tar::Builder::new(flate2::write::GzEncoder::new(
            Vec::new(),
            flate2::Compression::fast(),
        ));
        for entry in entries {
            let mut header = tar::Header::new_gnu();
            let (name, kind, mode, data, link): (&str, tar::EntryType, u32, &[u8], Option<&str>) =
                match entry {
                    Entry::Dir(n, m) => (n, tar::EntryType::Directory, *m, b"", None),
                    Entry::File(n, m, d) => (n, tar::EntryType::Regular, *m, d, None),
                    Entry::Symlink(n, t) => (n, tar::EntryType::Symlink, 0o777, b"", Some(t)),
                    Entry::HardLink(n, t) => (n, tar::EntryType::Link, 0o644, b"", Some(t)),
                    Entry::Device(n) => (n, tar::EntryType::Char, 0o666, b"", None),
                    Entry::FatDir(n, d) => (n, tar::EntryType::Directory, 0o755, d, None),
                };
            header.set_entry_type(kind);
            header.set_mode(mode);
            header.set_uid(1234);
            header.set_gid(2345);
            header.set_size(data.len() as u64);
            {
                let bytes = &mut header.as_old_mut().name;
                bytes[..name.len()].copy_from_slice(name.as_bytes());
            }
            if let Some(link) = link {
                let bytes = &mut header.as_old_mut().linkname;
                bytes[..link.len()].copy_from_slice(link.as_bytes());
            }
            header.set_cksum();
            builder.append(&header, data).unwrap();
        }
        let bytes = builder.into_inner().unwrap().finish().unwrap();
        let mut file = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut file, &bytes).unwrap();
        file
    }

    fn unpack_into(entries: &[Entry<'_>]) -> (tempfile::TempDir, Result<Unpacked, LayerError>) {
        let dir = tempfile::tempdir().unwrap();
        let fd = std::fs::File::open(dir.path()).unwrap();
        let result = unpack(&layer(entries), fd.as_fd(), LIMITS);
        (dir, result)
    }

    #[test]
    fn a_layer_keeps_owners_modes_setuid_links_and_marks_whiteouts_for_overlayfs() {
        use std::os::unix::fs::{FileTypeExt, MetadataExt};
        let (dir, result) = unpack_into(&[
            Entry::Dir("bin", 0o755),
            Entry::File("bin/tool", 0o4755, b"#!/bin/sh\n"),
            Entry::Symlink("bin/sh", "/bin/busybox"),
            Entry::HardLink("bin/tool2", "bin/tool"),
            Entry::File("etc/.wh.passwd", 0o644, b""),
            Entry::Dir("var/cache", 0o755),
            Entry::File("var/cache/.wh..wh..opq", 0o644, b""),
            Entry::Device("dev/sda"),
        ]);
        let done = result.unwrap();
        assert_eq!(done.devices_skipped, 1);
        let root = dir.path();
        let tool = std::fs::metadata(root.join("bin/tool")).unwrap();
        assert_eq!(
            (tool.uid(), tool.gid(), tool.mode() & 0o7777),
            (1234, 2345, 0o4755)
        );
        assert_eq!(tool.nlink(), 2, "bin/tool2 is a hard link to it");
        assert_eq!(
            std::fs::read_link(root.join("bin/sh")).unwrap(),
            Path::new("/bin/busybox"),
            "an absolute link is kept as written; only the task's root ever reads it"
        );
        let whiteout = std::fs::symlink_metadata(root.join("etc/passwd")).unwrap();
        assert!(whiteout.file_type().is_char_device() && whiteout.rdev() == 0);
        let opaque = rustix::fs::getxattr(
            root.join("var/cache"),
            "trusted.overlay.opaque",
            &mut [0u8; 4],
        )
        .unwrap();
        assert_eq!(opaque, 1);
        assert!(!root.join("var/cache/.wh..wh..opq").exists());
        assert!(!root.join("dev/sda").exists(), "device nodes are not made");
    }

    #[test]
    fn hostile_layers_write_nothing_outside_their_directory() {
        let outside = tempfile::tempdir().unwrap();
        let target = outside.path().display().to_string();
        for (entries, expected) in [
            (vec![Entry::File("../escape", 0o644, b"x")], "climbs out"),
            (
                vec![Entry::File("a/../../escape", 0o644, b"x")],
                "climbs out",
            ),
            (
                vec![
                    Entry::Symlink("out", &target),
                    Entry::File("out/escape", 0o644, b"x"),
                ],
                "through a link",
            ),
            (
                vec![Entry::Symlink("out", &target), Entry::Dir("out/sub", 0o755)],
                "through a link",
            ),
            (vec![Entry::HardLink("passwd", "/etc/passwd")], "hard link"),
            (vec![Entry::HardLink("x", "../../etc/passwd")], "climbs out"),
        ] {
            let (_dir, result) = unpack_into(&entries);
            let error = result.unwrap_err().to_string();
            assert!(error.contains(expected), "{error}");
            assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);
        }
    }

    #[test]
    fn a_layer_past_the_limits_is_refused_before_it_is_written() {
        let big = vec![0u8; (LIMITS.max_unpacked + 1) as usize];
        let (dir, result) = unpack_into(&[Entry::File("big", 0o644, &big)]);
        assert!(matches!(result, Err(LayerError::TooLarge { .. })));
        assert!(!dir.path().join("big").exists());
        let many: Vec<String> = (0..=LIMITS.max_entries).map(|i| format!("f{i}")).collect();
        let entries: Vec<Entry<'_>> = many.iter().map(|n| Entry::File(n, 0o644, b"")).collect();
        let (dir, result) = unpack_into(&entries);
        assert!(matches!(result, Err(LayerError::TooManyEntries { .. })));
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        // Data an entry of another kind carries is read (and decompressed) all the same,
        // so it counts too.
        let (dir, result) = unpack_into(&[Entry::FatDir("fat", &big)]);
        assert!(
            matches!(result, Err(LayerError::TooLarge { .. })),
            "{result:?}"
        );
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
