//! Archives unpacked into a staging directory ([`tree_into`]) and single compressed files
//! decompressed ([`decompress_into`]), as go-getter's decompressors do, within the
//! operator's limits. Entries a task could use to write elsewhere are refused, and so is
//! what only privileged code should make (device nodes, FIFOs).

use std::fs::File;
use std::io::{self, BufReader, Read, Seek, SeekFrom};
use std::os::fd::{AsFd, BorrowedFd};
use std::path::Path;
use std::time::{Duration, Instant};

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
    #[error("entry {entry:?} is more than {limit} directories deep")]
    TooDeep { entry: String, limit: usize },
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

/// The most memory xz's decoder may take (its dictionary): what `xz -9` needs is 65 MiB.
const XZ_MEMORY: u64 = 256 << 20;

/// The largest header of headers (a GNU long name or link, a PAX record set) a tar may
/// hold: the tar crate reads them whole into memory.
const MAX_TAR_METADATA: u64 = 64 << 10;

/// Reads at most `limit` bytes from `inner`, and nothing after its time: what bounds the
/// work an archive makes the agent do, whatever the archive says of itself.
pub struct Bounded<R> {
    inner: R,
    left: u64,
    limit: u64,
    deadline: Instant,
    budget: Duration,
}

impl<R: Read> Bounded<R> {
    pub fn new(inner: R, limit: u64, budget: Duration) -> Bounded<R> {
        Bounded {
            inner,
            left: limit,
            limit,
            deadline: Instant::now() + budget,
            budget,
        }
    }
}

fn too_slow(budget: Duration) -> io::Error {
    io::Error::other(format!(
        "the unpack took more than {budget:?} (the agent's artifact http_read_timeout)"
    ))
}

impl<R: Read> Read for Bounded<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if Instant::now() > self.deadline {
            return Err(too_slow(self.budget));
        }
        let n = self.inner.read(buf)?;
        if n as u64 > self.left {
            return Err(io::Error::other(format!(
                "the archive unpacks to more than {} bytes (the agent's \
                 decompression_size_limit)",
                self.limit
            )));
        }
        self.left -= n as u64;
        Ok(n)
    }
}

/// The decompressed stream of `file` (from its start), bounded by the limits.
fn decompressed(kind: ArchiveKind, mut file: File, limits: &Limits) -> io::Result<Box<dyn Read>> {
    file.rewind()?;
    let file = BufReader::with_capacity(BUFFER, file);
    let stream: Box<dyn Read> = match kind {
        ArchiveKind::Tar | ArchiveKind::Zip => Box::new(file),
        ArchiveKind::TarGz | ArchiveKind::Gz => {
            Box::new(flate2::bufread::MultiGzDecoder::new(file))
        }
        ArchiveKind::TarXz | ArchiveKind::Xz => {
            // .xz only (not .lzma), with a cap on the decoder's memory.
            let stream = liblzma::stream::Stream::new_stream_decoder(
                XZ_MEMORY,
                liblzma::stream::CONCATENATED,
            )
            .map_err(io::Error::other)?;
            Box::new(liblzma::bufread::XzDecoder::new_stream(file, stream))
        }
        ArchiveKind::TarBz2 | ArchiveKind::Bz2 => {
            Box::new(bzip2::bufread::MultiBzDecoder::new(file))
        }
    };
    // Headers and padding come on top of the files' bytes.
    let slack = 1 << 20;
    Ok(Box::new(Bounded::new(
        stream,
        limits.max_unpacked.saturating_add(slack),
        limits.read_timeout,
    )))
}

/// Decompresses `download` into the unnamed file `out`, at most `max_unpacked` bytes.
pub fn decompress_into(
    kind: ArchiveKind,
    download: File,
    out: &File,
    limits: &Limits,
) -> Result<u64, UnpackError> {
    let io = |error: io::Error| UnpackError::Format(error.to_string());
    let reader = decompressed(kind, download, limits).map_err(io)?;
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
        tree::check_staging(root.as_fd()).map_err(setup)?;
        let mut tree = Tree::new(root.as_fd(), limits, give);
        match kind {
            ArchiveKind::Zip => unzip(download, &mut tree, limits)?,
            _ => {
                let again = download.try_clone().map_err(setup)?;
                scan_tar(decompressed(kind, download, limits).map_err(setup)?, limits)?;
                untar(decompressed(kind, again, limits).map_err(setup)?, &mut tree)?
            }
        }
        tree.links_stay_inside()?;
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

/// A first pass over the tar's headers alone, before anything is written: no header of
/// headers larger than [`MAX_TAR_METADATA`] (the tar crate would read it whole into the
/// agent's memory), no more entries than the limit, and no more bytes declared than it.
fn scan_tar(stream: Box<dyn Read>, limits: &Limits) -> Result<(), UnpackError> {
    let format = |error: io::Error| UnpackError::Format(format!("reading the tar stream: {error}"));
    let mut archive = tar::Archive::new(stream);
    let mut entries = 0u64;
    let mut declared = 0u64;
    for entry in archive.entries().map_err(format)?.raw(true) {
        let entry = entry.map_err(format)?;
        let header = entry.header();
        let size = header.entry_size().map_err(format)?;
        let kind = header.entry_type();
        let metadata = kind.is_gnu_longname()
            || kind.is_gnu_longlink()
            || kind.is_pax_local_extensions()
            || kind.is_pax_global_extensions();
        if metadata {
            if size > MAX_TAR_METADATA {
                return Err(UnpackError::Format(format!(
                    "the tar holds a {size}-byte header of headers (a long name or PAX \
                     records); berth reads those of up to {MAX_TAR_METADATA} bytes"
                )));
            }
            continue;
        }
        entries += 1;
        declared = declared.saturating_add(size);
        if entries > limits.max_files {
            return Err(UnpackError::TooManyEntries {
                limit: limits.max_files,
            });
        }
        if declared > limits.max_unpacked {
            return Err(UnpackError::TooLarge {
                limit: limits.max_unpacked,
            });
        }
    }
    Ok(())
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

fn unzip(download: File, tree: &mut Tree<'_>, limits: &Limits) -> Result<(), UnpackError> {
    let format =
        |error: zip::result::ZipError| UnpackError::Format(format!("reading the zip: {error}"));
    // Its reading, the central directory's included, within the time limit.
    let reader = Seekable::new(
        BufReader::with_capacity(BUFFER, download),
        limits.read_timeout,
    );
    let mut archive = zip::ZipArchive::new(reader).map_err(format)?;
    if archive.len() as u64 > limits.max_files {
        return Err(UnpackError::TooManyEntries {
            limit: limits.max_files,
        });
    }
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

/// A seekable file read within a time limit (a zip is read by seeking).
struct Seekable<R> {
    inner: R,
    deadline: Instant,
    budget: Duration,
}

impl<R> Seekable<R> {
    fn new(inner: R, budget: Duration) -> Seekable<R> {
        Seekable {
            inner,
            deadline: Instant::now() + budget,
            budget,
        }
    }

    fn in_time(&self) -> io::Result<()> {
        if Instant::now() > self.deadline {
            return Err(too_slow(self.budget));
        }
        Ok(())
    }
}

impl<R: Read> Read for Seekable<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.in_time()?;
        self.inner.read(buf)
    }
}

impl<R: Seek> Seek for Seekable<R> {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        self.in_time()?;
        self.inner.seek(to)
    }
}
