//! Archives unpacked into a staging directory ([`tree_into`]) and single compressed files
//! decompressed ([`decompress_into`]), as go-getter's decompressors do, within the
//! operator's limits. Entries a task could use to write elsewhere are refused, and so is
//! what only privileged code should make (device nodes, FIFOs).

use std::fs::File;
use std::io::{self, BufReader, Read, Seek};
use std::os::fd::{AsFd, BorrowedFd};
use std::path::Path;

use berth_jobspec::artifact::ArchiveKind;

use crate::tree::{self, Tree};
use crate::{Fetched, Give, Limits};

#[derive(Debug, thiserror::Error)]
pub enum UnpackError {
    #[error("entry {entry:?} climbs out of the destination with \"..\"")]
    Escapes { entry: String },
    #[error("entry {entry:?} is an absolute path")]
    Absolute { entry: String },
    #[error("entry {entry:?} has a name berth cannot write")]
    Name { entry: String },
    #[error("entry {entry:?} is a link to {target:?}, which leads out of the destination")]
    LinkOut { entry: String, target: String },
    #[error("entry {entry:?} would be written through a link; berth does not follow it")]
    ThroughLink { entry: String },
    #[error("entry {entry:?} is a {kind}; berth unpacks files, directories and links only")]
    Special { entry: String, kind: &'static str },
    #[error("entry {entry:?} is already there as something other than a file")]
    NotAFile { entry: String },
    #[error("entry {entry:?} is already there")]
    Exists { entry: String },
    #[error(
        "the archive holds more than {limit} entries (the agent's decompression_file_count_limit)"
    )]
    TooManyEntries { limit: u64 },
    #[error(
        "the archive unpacks to more than {limit} bytes (the agent's decompression_size_limit)"
    )]
    TooLarge { limit: u64 },
    #[error("entry {entry:?}: {error}")]
    Io {
        entry: String,
        #[source]
        error: io::Error,
    },
    #[error("{0}")]
    Format(String),
}

pub fn kind_name(kind: ArchiveKind) -> &'static str {
    match kind {
        ArchiveKind::Tar => "tar",
        ArchiveKind::TarGz => "tar.gz",
        ArchiveKind::TarXz => "tar.xz",
        ArchiveKind::TarBz2 => "tar.bz2",
        ArchiveKind::Zip => "zip",
        ArchiveKind::Gz => "gz",
        ArchiveKind::Xz => "xz",
        ArchiveKind::Bz2 => "bz2",
    }
}

const BUFFER: usize = 256 << 10;

/// The decompressed stream of `file` (from its start).
fn decompressed(kind: ArchiveKind, mut file: File) -> io::Result<Box<dyn Read>> {
    file.rewind()?;
    let file = BufReader::with_capacity(BUFFER, file);
    Ok(match kind {
        ArchiveKind::Tar => Box::new(file),
        ArchiveKind::TarGz | ArchiveKind::Gz => {
            Box::new(flate2::bufread::MultiGzDecoder::new(file))
        }
        ArchiveKind::TarXz | ArchiveKind::Xz => {
            Box::new(liblzma::bufread::XzDecoder::new_multi_decoder(file))
        }
        ArchiveKind::TarBz2 | ArchiveKind::Bz2 => {
            Box::new(bzip2::bufread::MultiBzDecoder::new(file))
        }
        ArchiveKind::Zip => Box::new(file),
    })
}

/// Decompresses `download` into the unnamed file `out`, at most `max_unpacked` bytes.
pub fn decompress_into(
    kind: ArchiveKind,
    download: File,
    out: &File,
    limits: &Limits,
) -> Result<u64, UnpackError> {
    let io = |error: io::Error| UnpackError::Format(error.to_string());
    let reader = decompressed(kind, download).map_err(io)?;
    let mut out = out;
    let copied = io::copy(
        &mut reader.take(limits.max_unpacked.saturating_add(1)),
        &mut out,
    )
    .map_err(io)?;
    if copied > limits.max_unpacked {
        return Err(UnpackError::TooLarge {
            limit: limits.max_unpacked,
        });
    }
    Ok(copied)
}

/// Unpacks the archive `download` into `dir`: into a staging directory first, moved into
/// `dir` only when every entry was written; removed otherwise.
pub fn tree_into(
    kind: ArchiveKind,
    download: File,
    dir: BorrowedFd<'_>,
    limits: &Limits,
    give: Option<&Give>,
) -> Result<Fetched, UnpackError> {
    let staging = tree::hidden_name("berth-unpack");
    let setup = |error: io::Error| UnpackError::Io {
        entry: ".".into(),
        error,
    };
    rustix::fs::mkdirat(
        dir,
        staging.as_str(),
        rustix::fs::Mode::from_raw_mode(0o700),
    )
    .map_err(|e| setup(e.into()))?;
    let result = (|| {
        let root = rustix::fs::openat(
            dir,
            staging.as_str(),
            rustix::fs::OFlags::DIRECTORY
                | rustix::fs::OFlags::RDONLY
                | rustix::fs::OFlags::CLOEXEC
                | rustix::fs::OFlags::NOFOLLOW,
            rustix::fs::Mode::empty(),
        )
        .map_err(|e| setup(e.into()))?;
        let mut tree = Tree::new(root.as_fd(), limits, give);
        match kind {
            ArchiveKind::Zip => unzip(download, &mut tree)?,
            _ => untar(decompressed(kind, download).map_err(setup)?, &mut tree)?,
        }
        tree::merge(root.as_fd(), dir).map_err(setup)?;
        Ok(Fetched {
            downloaded: 0,
            entries: tree.entries,
            unpacked_bytes: tree.bytes,
        })
    })();
    if let Err(error) = tree::remove_tree(dir, &staging) {
        tracing::warn!(%error, "removing an artifact's staging directory");
    }
    result
}

fn untar(stream: Box<dyn Read>, tree: &mut Tree<'_>) -> Result<(), UnpackError> {
    let format = |error: io::Error| UnpackError::Format(format!("reading the tar stream: {error}"));
    let mut archive = tar::Archive::new(stream);
    for entry in archive.entries().map_err(format)? {
        let mut entry = entry.map_err(format)?;
        let path = entry.path().map_err(format)?.into_owned();
        let header = entry.header();
        let mode = header.mode().unwrap_or(0o644);
        let kind = header.entry_type();
        let shown = || path.display().to_string();
        match kind {
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                tree.file(&path, mode, &mut entry)?
            }
            tar::EntryType::Directory => tree.dir(&path, mode)?,
            tar::EntryType::Symlink => {
                let target = entry
                    .link_name()
                    .map_err(format)?
                    .ok_or_else(|| UnpackError::Name { entry: shown() })?
                    .into_owned();
                tree.symlink(&path, &target)?
            }
            tar::EntryType::Link => {
                let target = entry
                    .link_name()
                    .map_err(format)?
                    .ok_or_else(|| UnpackError::Name { entry: shown() })?
                    .into_owned();
                tree.hard_link(&path, &target)?
            }
            tar::EntryType::Char | tar::EntryType::Block => {
                return Err(UnpackError::Special {
                    entry: shown(),
                    kind: "device node",
                });
            }
            tar::EntryType::Fifo => {
                return Err(UnpackError::Special {
                    entry: shown(),
                    kind: "FIFO",
                });
            }
            // Headers of headers (PAX, GNU long names) are read by the tar crate; what is
            // left carries no file.
            _ => {}
        }
    }
    Ok(())
}

fn unzip(download: File, tree: &mut Tree<'_>) -> Result<(), UnpackError> {
    let format =
        |error: zip::result::ZipError| UnpackError::Format(format!("reading the zip: {error}"));
    let mut archive =
        zip::ZipArchive::new(BufReader::with_capacity(BUFFER, download)).map_err(format)?;
    for index in 0..archive.len() {
        let mut entry = archive.by_index(index).map_err(format)?;
        let name = entry.name().to_string();
        let path = Path::new(&name).to_path_buf();
        let mode = entry.unix_mode();
        if entry.is_symlink() {
            let mut target = String::new();
            (&mut entry)
                .take(4096)
                .read_to_string(&mut target)
                .map_err(|error| UnpackError::Io {
                    entry: name.clone(),
                    error,
                })?;
            tree.symlink(&path, Path::new(&target))?;
        } else if entry.is_dir() {
            tree.dir(&path, mode.unwrap_or(0o755))?;
        } else {
            tree.file(&path, mode.unwrap_or(0o644), &mut entry)?;
        }
    }
    Ok(())
}
