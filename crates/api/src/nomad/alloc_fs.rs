//! An alloc's files as Nomad's fs endpoints show them: `GET /v1/client/fs/ls/:alloc_id`,
//! `/stat/`, `/cat/` and `/readat/` with `?path=` (and `offset`, `limit` for readat).
//! `ls` and `stat` answer `AllocFileInfo`s (`Name, IsDir, Size, FileMode, ModTime,
//! ContentType`); `cat` and `readat` answer the bytes.
//!
//! **The view is Nomad's, the layout berth's.** Nomad shows an alloc dir holding `alloc/`
//! and one directory per task; berth keeps task directories in `tasks/<task>`
//! (`alloc_dir.rs`). So `alloc/...` is the alloc's `alloc/`, `<task>/...` is
//! `tasks/<task>/...` (or `<task>/` for an alloc of the old layout), and the root lists
//! `alloc` and the alloc's tasks, nothing else berth keeps there. A task's `secrets/` is
//! not served (Nomad refuses it too).
//!
//! **A task writes these directories, and may be hostile.** It can plant symbolic links,
//! FIFOs, device nodes and sockets, and a client can ask for `..`. So: a path with `..` is
//! refused; every path is opened from a descriptor of the alloc root with `openat2`
//! (`RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS`) as `O_PATH`, which
//! opens nothing (no FIFO waits, no device's open runs); a link is shown (`ls`, `stat`)
//! and never followed; only a regular file is read, reopened through its own descriptor
//! (`/proc/self/fd`), so the file read is the one checked; and `cat` and `readat` answer
//! [`MAX_READ`] bytes at most, `ls` [`MAX_ENTRIES`] entries.
//!
//! **A reader may not read.** The bytes of a `cat` or `readat` stay in the agent's
//! memory until its client has read them: at most [`MAX_READS_IN_MEMORY`] answers are
//! held at once (a 429 past that), each sent in chunks and counted until the last one
//! is handed to the connection, so clients that never read hold 256 MiB at most.

use std::io::{Read as _, Seek as _, SeekFrom};
use std::os::fd::{AsFd as _, AsRawFd as _, BorrowedFd, OwnedFd};
use std::path::PathBuf;
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use berth_nomad_api::allocs::AllocFileInfo;
use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags};
use serde::Deserialize;

use super::{NomadError, bad_request};
use berth_client::agent::Agent;
use berth_client::agent::api_places::{self, Places};
use berth_sys::alloc_dir::AllocDir;

pub use berth_client::agent::api_places::MAX_READS_IN_MEMORY;

/// A place among the answers the agent holds in memory (`reads`), or Nomad's 429.
fn memory_place(reads: &Places) -> Result<api_places::Place, NomadError> {
    reads.enter().ok_or_else(|| {
        NomadError(
            StatusCode::TOO_MANY_REQUESTS,
            format!(
                "{MAX_READS_IN_MEMORY} file reads (cat, readat) are being answered on this \
                 agent, the most it holds at once: try again when one has been read"
            ),
        )
    })
}

/// How much of an answer is handed to the connection at a time: the connection takes
/// the next piece only when it has room, so the slot is held until nearly all is sent.
const CHUNK: usize = 64 << 10;

/// The most bytes `cat` and `readat` answer.
pub const MAX_READ: u64 = 8 << 20;
/// The most entries `ls` answers.
pub const MAX_ENTRIES: usize = 10_000;
/// What is read of a file to tell its content type, as Go's `http.DetectContentType`.
const SNIFF: u64 = 512;

#[derive(Debug, Default, Deserialize)]
pub struct FsQuery {
    path: Option<String>,
    offset: Option<String>,
    limit: Option<String>,
}

/// Why a path is not served.
#[derive(Debug, thiserror::Error)]
enum FsError {
    #[error("path {0:?} leaves the alloc dir: \"..\" is not allowed")]
    Escapes(String),
    #[error("file not found: {0}")]
    NotFound(String),
    #[error("{0} goes through a symbolic link: berth does not follow links in an alloc dir")]
    Link(String),
    #[error("{0} is in a task's secrets dir, which is not served")]
    Secret(String),
    #[error("{0} is not a directory")]
    NotDirectory(String),
    #[error("{0} is a directory")]
    Directory(String),
    #[error("{path} is a {kind}, not a regular file: only regular files are read")]
    NotRegular { path: String, kind: &'static str },
    #[error(
        "{path} is {size} bytes, more than the {MAX_READ} one answer carries: read it in \
         parts with /v1/client/fs/readat (offset, limit)"
    )]
    TooLarge { path: String, size: u64 },
    #[error("{0} holds more than {MAX_ENTRIES} entries, more than one answer lists")]
    TooMany(String),
    #[error("this kernel has no openat2 (Linux 5.6), which berth needs to read alloc files safely")]
    NoOpenat2,
    #[error("reading {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
}

impl From<FsError> for NomadError {
    fn from(error: FsError) -> NomadError {
        let status = match &error {
            FsError::NotFound(_) => StatusCode::NOT_FOUND,
            FsError::Secret(_) => StatusCode::FORBIDDEN,
            FsError::NoOpenat2 | FsError::Io { .. } => StatusCode::INTERNAL_SERVER_ERROR,
            _ => StatusCode::BAD_REQUEST,
        };
        NomadError(status, error.to_string())
    }
}

/// Where a Nomad path is, in berth's layout.
enum Place {
    /// The alloc dir itself: `alloc` and the tasks.
    Root,
    /// Relative to the alloc root (`alloc/logs`, `tasks/web/local/x`), and its name.
    Beneath { relative: PathBuf, name: String },
}

/// The alloc (its root and tasks) and where `path` is in it.
fn locate(agent: &Agent, alloc: &str, path: &str) -> Result<(Alloc, Place), NomadError> {
    let status = agent.alloc(alloc)?;
    let alloc = Alloc {
        dir: AllocDir::existing(agent.data_dir(), &status.id),
        tasks: status.tasks.keys().cloned().collect(),
    };
    if path.contains('\0') {
        return Err(bad_request("path must not contain a NUL byte"));
    }
    let parts: Vec<&str> = path
        .split('/')
        .filter(|part| !part.is_empty() && *part != ".")
        .collect();
    if parts.contains(&"..") {
        return Err(FsError::Escapes(path.to_string()).into());
    }
    let Some((first, rest)) = parts.split_first() else {
        return Ok((alloc, Place::Root));
    };
    let base = if *first == "alloc" {
        PathBuf::from("alloc")
    } else if alloc.tasks.iter().any(|task| task == first) {
        if rest.first() == Some(&"secrets") {
            return Err(FsError::Secret(path.to_string()).into());
        }
        alloc.task_relative(first)
    } else {
        return Err(FsError::NotFound(path.to_string()).into());
    };
    let relative = rest.iter().fold(base, |relative, part| relative.join(part));
    let name = parts.last().copied().unwrap_or_default().to_string();
    Ok((alloc, Place::Beneath { relative, name }))
}

struct Alloc {
    dir: AllocDir,
    tasks: Vec<String>,
}

impl Alloc {
    /// A task's directory relative to the alloc root.
    fn task_relative(&self, task: &str) -> PathBuf {
        let task_dir = self.dir.task_dir(task);
        task_dir
            .strip_prefix(self.dir.root())
            .map(PathBuf::from)
            .unwrap_or_else(|_| PathBuf::from(task))
    }

    fn open_root(&self) -> Result<OwnedFd, FsError> {
        rustix::fs::open(
            self.dir.root(),
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| io_error("the alloc dir", e))
    }
}

fn io_error(path: &str, error: rustix::io::Errno) -> FsError {
    FsError::Io {
        path: path.to_string(),
        source: error.into(),
    }
}

/// `relative` beneath `dir`, as `O_PATH` (nothing is opened for reading, so no FIFO
/// waits and no device's open runs); a link as the last part is the link itself.
fn open_beneath(
    dir: BorrowedFd<'_>,
    relative: &std::path::Path,
    shown: &str,
) -> Result<OwnedFd, FsError> {
    rustix::fs::openat2(
        dir,
        relative,
        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    )
    .map_err(|error| match error {
        rustix::io::Errno::NOENT | rustix::io::Errno::NOTDIR => {
            FsError::NotFound(shown.to_string())
        }
        rustix::io::Errno::LOOP => FsError::Link(shown.to_string()),
        rustix::io::Errno::XDEV => FsError::Escapes(shown.to_string()),
        rustix::io::Errno::NOSYS => FsError::NoOpenat2,
        other => io_error(shown, other),
    })
}

fn kind_of(stat: &rustix::fs::Stat) -> FileType {
    FileType::from_raw_mode(stat.st_mode)
}

fn kind_name(kind: FileType) -> &'static str {
    match kind {
        FileType::RegularFile => "regular file",
        FileType::Directory => "directory",
        FileType::Symlink => "symbolic link",
        FileType::Fifo => "FIFO",
        FileType::Socket => "socket",
        FileType::CharacterDevice => "character device",
        FileType::BlockDevice => "block device",
        FileType::Unknown => "file of unknown kind",
    }
}

/// A regular file checked through its `O_PATH` descriptor, opened for reading through
/// that same descriptor: whatever is renamed in meanwhile, this is the file checked.
fn reopen_regular(path_fd: &OwnedFd, shown: &str) -> Result<std::fs::File, FsError> {
    let checked = rustix::fs::fstat(path_fd).map_err(|e| io_error(shown, e))?;
    let kind = kind_of(&checked);
    if kind != FileType::RegularFile {
        return Err(match kind {
            FileType::Directory => FsError::Directory(shown.to_string()),
            FileType::Symlink => FsError::Link(shown.to_string()),
            kind => FsError::NotRegular {
                path: shown.to_string(),
                kind: kind_name(kind),
            },
        });
    }
    let file = rustix::fs::open(
        format!("/proc/self/fd/{}", path_fd.as_raw_fd()),
        OFlags::RDONLY | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| io_error(shown, e))?;
    let opened = rustix::fs::fstat(&file).map_err(|e| io_error(shown, e))?;
    if (opened.st_dev, opened.st_ino) != (checked.st_dev, checked.st_ino)
        || kind_of(&opened) != FileType::RegularFile
    {
        return Err(FsError::NotFound(shown.to_string()));
    }
    Ok(std::fs::File::from(file))
}

/// Go's `os.FileMode` string: `-rw-r--r--`, `drwxr-xr-x`, `Lrwxrwxrwx`, `prw-r--r--`,
/// `Dcrw-rw-rw-`, `urwxr-xr-x`...
fn go_file_mode(mode: u32) -> String {
    let mut text = String::new();
    let kind = FileType::from_raw_mode(mode);
    match kind {
        FileType::Directory => text.push('d'),
        FileType::Symlink => text.push('L'),
        FileType::BlockDevice => text.push('D'),
        FileType::CharacterDevice => text.push_str("Dc"),
        FileType::Fifo => text.push('p'),
        FileType::Socket => text.push('S'),
        _ => {}
    }
    if mode & 0o4000 != 0 {
        text.push('u');
    }
    if mode & 0o2000 != 0 {
        text.push('g');
    }
    if mode & 0o1000 != 0 {
        text.push('t');
    }
    if text.is_empty() {
        text.push('-');
    }
    for (bit, letter) in [
        (0o400, 'r'),
        (0o200, 'w'),
        (0o100, 'x'),
        (0o040, 'r'),
        (0o020, 'w'),
        (0o010, 'x'),
        (0o004, 'r'),
        (0o002, 'w'),
        (0o001, 'x'),
    ] {
        text.push(if mode & bit != 0 { letter } else { '-' });
    }
    text
}

/// The content type of a file's first bytes: a simpler sniff than Go's (text or not).
fn content_type(name: &str, first: &[u8]) -> &'static str {
    let text = !first.contains(&0)
        && match std::str::from_utf8(first) {
            Ok(_) => true,
            // Cut in the middle of a character by the sniff's end.
            Err(error) => error.error_len().is_none(),
        };
    match (text, name.ends_with(".json")) {
        (true, true) => "application/json",
        (true, false) => "text/plain; charset=utf-8",
        (false, _) => "application/octet-stream",
    }
}

/// An `AllocFileInfo` of what `stat` describes (not followed when a link); the content
/// type of a regular file from its first bytes, read through `path_fd` when given.
fn file_info(name: &str, stat: &rustix::fs::Stat, path_fd: Option<&OwnedFd>) -> AllocFileInfo {
    let kind = kind_of(stat);
    let content = match (kind, path_fd) {
        (FileType::RegularFile, Some(path_fd)) => {
            let mut first = Vec::new();
            match reopen_regular(path_fd, name) {
                Ok(file) => match file.take(SNIFF).read_to_end(&mut first) {
                    Ok(_) => content_type(name, &first),
                    Err(_) => "application/octet-stream",
                },
                Err(_) => "application/octet-stream",
            }
        }
        _ => "application/octet-stream",
    };
    let modified = chrono::DateTime::<chrono::Utc>::from_timestamp(
        stat.st_mtime,
        u32::try_from(stat.st_mtime_nsec).unwrap_or(0),
    )
    .unwrap_or_default()
    .to_rfc3339_opts(chrono::SecondsFormat::Nanos, true);
    AllocFileInfo {
        name: name.to_string(),
        is_dir: kind == FileType::Directory,
        size: stat.st_size,
        file_mode: go_file_mode(stat.st_mode),
        mod_time: modified,
        content_type: content.to_string(),
    }
}

fn path_of(query: &FsQuery) -> &str {
    query.path.as_deref().unwrap_or("/")
}

/// `GET /v1/client/fs/ls/:alloc_id?path=`: a directory's entries, by name.
pub async fn list(
    State(agent): State<Arc<Agent>>,
    Path(alloc): Path<String>,
    Query(query): Query<FsQuery>,
) -> Result<Response, NomadError> {
    let path = path_of(&query).to_string();
    let (alloc, place) = locate(&agent, &alloc, &path)?;
    let entries = berth_sys::blocking::run(|| list_place(&alloc, &place, &path))?;
    Ok(axum::Json(entries).into_response())
}

fn list_place(alloc: &Alloc, place: &Place, shown: &str) -> Result<Vec<AllocFileInfo>, FsError> {
    let root = alloc.open_root()?;
    let Place::Beneath { relative, .. } = place else {
        // Nomad's view: `alloc` and the task dirs.
        let mut entries = Vec::new();
        let names = std::iter::once(("alloc".to_string(), PathBuf::from("alloc"))).chain(
            alloc
                .tasks
                .iter()
                .map(|task| (task.clone(), alloc.task_relative(task))),
        );
        for (name, relative) in names {
            let Ok(fd) = open_beneath(root.as_fd(), &relative, &name) else {
                continue;
            };
            let stat = rustix::fs::fstat(&fd).map_err(|e| io_error(&name, e))?;
            entries.push(file_info(&name, &stat, None));
        }
        return Ok(entries);
    };
    let fd = open_beneath(root.as_fd(), relative, shown)?;
    let stat = rustix::fs::fstat(&fd).map_err(|e| io_error(shown, e))?;
    match kind_of(&stat) {
        FileType::Directory => {}
        FileType::Symlink => return Err(FsError::Link(shown.to_string())),
        _ => return Err(FsError::NotDirectory(shown.to_string())),
    }
    let dir = rustix::fs::openat(
        &fd,
        ".",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| io_error(shown, e))?;
    let reader = rustix::fs::Dir::read_from(&dir).map_err(|e| io_error(shown, e))?;
    let mut names = Vec::new();
    for entry in reader {
        let entry = entry.map_err(|e| io_error(shown, e))?;
        let name = entry.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        if names.len() == MAX_ENTRIES {
            return Err(FsError::TooMany(shown.to_string()));
        }
        names.push(entry.file_name().to_owned());
    }
    names.sort();
    let mut entries = Vec::with_capacity(names.len());
    for name in names {
        let shown_name = name.to_string_lossy().into_owned();
        // Gone since it was listed: left out.
        let Ok(stat) = rustix::fs::statat(&dir, name.as_c_str(), AtFlags::SYMLINK_NOFOLLOW) else {
            continue;
        };
        let path_fd = (kind_of(&stat) == FileType::RegularFile)
            .then(|| open_beneath(dir.as_fd(), std::path::Path::new(&shown_name), &shown_name))
            .and_then(Result::ok);
        entries.push(file_info(&shown_name, &stat, path_fd.as_ref()));
    }
    Ok(entries)
}

/// `GET /v1/client/fs/stat/:alloc_id?path=`: one `AllocFileInfo` (a link is described,
/// not followed).
pub async fn stat(
    State(agent): State<Arc<Agent>>,
    Path(alloc): Path<String>,
    Query(query): Query<FsQuery>,
) -> Result<Response, NomadError> {
    let path = path_of(&query).to_string();
    let (alloc, place) = locate(&agent, &alloc, &path)?;
    let info = berth_sys::blocking::run(|| -> Result<AllocFileInfo, FsError> {
        let root = alloc.open_root()?;
        let (fd, name) = match &place {
            Place::Root => (root, "/".to_string()),
            Place::Beneath { relative, name } => {
                (open_beneath(root.as_fd(), relative, &path)?, name.clone())
            }
        };
        let stat = rustix::fs::fstat(&fd).map_err(|e| io_error(&path, e))?;
        Ok(file_info(&name, &stat, Some(&fd)))
    })?;
    Ok(axum::Json(info).into_response())
}

/// `GET /v1/client/fs/cat/:alloc_id?path=`: a regular file's bytes ([`MAX_READ`] at
/// most: a larger file is refused, not cut).
pub async fn cat(
    State(agent): State<Arc<Agent>>,
    Path(alloc): Path<String>,
    Query(query): Query<FsQuery>,
) -> Result<Response, NomadError> {
    let path = path_of(&query).to_string();
    let (alloc, place) = locate(&agent, &alloc, &path)?;
    let slot = memory_place(&agent.api_places().reads)?;
    let bytes = berth_sys::blocking::run(|| read_place(&alloc, &place, &path, 0, None))?;
    Ok(bytes_answer(bytes, slot))
}

/// `GET /v1/client/fs/readat/:alloc_id?path=&offset=&limit=`: `limit` bytes of a regular
/// file from `offset` (at most [`MAX_READ`]).
pub async fn read_at(
    State(agent): State<Arc<Agent>>,
    Path(alloc): Path<String>,
    Query(query): Query<FsQuery>,
) -> Result<Response, NomadError> {
    let number = |name: &str, value: Option<&str>| -> Result<Option<u64>, NomadError> {
        match value.filter(|v| !v.is_empty()) {
            None => Ok(None),
            Some(text) => text.parse().map(Some).map_err(|_| {
                bad_request(format!("{name} must be a number of bytes, not {text:?}"))
            }),
        }
    };
    let offset = number("offset", query.offset.as_deref())?.unwrap_or(0);
    let limit = number("limit", query.limit.as_deref())?.unwrap_or(MAX_READ);
    if limit > MAX_READ {
        return Err(bad_request(format!(
            "limit {limit} is more than the {MAX_READ} bytes one answer carries"
        )));
    }
    let path = path_of(&query).to_string();
    let (alloc, place) = locate(&agent, &alloc, &path)?;
    let slot = memory_place(&agent.api_places().reads)?;
    let bytes =
        berth_sys::blocking::run(|| read_place(&alloc, &place, &path, offset, Some(limit)))?;
    Ok(bytes_answer(bytes, slot))
}

/// The bytes as a body sent in [`CHUNK`]s, holding `slot` until the last is taken.
fn bytes_answer(bytes: Vec<u8>, slot: api_places::Place) -> Response {
    let length = bytes.len();
    let bytes = axum::body::Bytes::from(bytes);
    let chunks = (0..length)
        .step_by(CHUNK)
        .map(move |start| bytes.slice(start..(start + CHUNK).min(length)));
    let body = tokio_stream::StreamExt::map(tokio_stream::iter(chunks), move |chunk| {
        let _held = &slot;
        Ok::<_, std::convert::Infallible>(chunk)
    });
    (
        [
            ("content-type", "application/octet-stream".to_string()),
            ("content-length", length.to_string()),
        ],
        axum::body::Body::from_stream(body),
    )
        .into_response()
}

/// Bytes of a regular file from `offset`: `limit` at most, or the whole file (refused
/// past [`MAX_READ`]).
fn read_place(
    alloc: &Alloc,
    place: &Place,
    shown: &str,
    offset: u64,
    limit: Option<u64>,
) -> Result<Vec<u8>, FsError> {
    let Place::Beneath { relative, .. } = place else {
        return Err(FsError::Directory(shown.to_string()));
    };
    let root = alloc.open_root()?;
    let fd = open_beneath(root.as_fd(), relative, shown)?;
    let mut file = reopen_regular(&fd, shown)?;
    let io = |source| FsError::Io {
        path: shown.to_string(),
        source,
    };
    let most = match limit {
        Some(limit) => limit,
        None => {
            let size = file.metadata().map_err(io)?.len();
            if size > MAX_READ {
                return Err(FsError::TooLarge {
                    path: shown.to_string(),
                    size,
                });
            }
            MAX_READ
        }
    };
    file.seek(SeekFrom::Start(offset)).map_err(io)?;
    let mut bytes = Vec::new();
    // One more than allowed: a file that grew past the cap since its size was read.
    file.take(most.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(io)?;
    if bytes.len() as u64 > most {
        if limit.is_some() {
            bytes.truncate(most as usize);
        } else {
            return Err(FsError::TooLarge {
                path: shown.to_string(),
                size: bytes.len() as u64,
            });
        }
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_modes_are_written_as_go_writes_them() {
        assert_eq!(go_file_mode(0o100644), "-rw-r--r--");
        assert_eq!(go_file_mode(0o040755), "drwxr-xr-x");
        assert_eq!(go_file_mode(0o120777), "Lrwxrwxrwx");
        assert_eq!(go_file_mode(0o010644), "prw-r--r--");
        assert_eq!(go_file_mode(0o020666), "Dcrw-rw-rw-");
        assert_eq!(go_file_mode(0o104755), "urwxr-xr-x");
        assert_eq!(go_file_mode(0o041777), "dtrwxrwxrwx");
    }

    #[test]
    fn content_types_tell_text_from_bytes() {
        assert_eq!(
            content_type("a.txt", b"hello\n"),
            "text/plain; charset=utf-8"
        );
        assert_eq!(content_type("a.json", b"{}"), "application/json");
        assert_eq!(
            content_type("a.bin", b"\x7fELF\0\0"),
            "application/octet-stream"
        );
        // A sniff that ends inside a character is still text.
        assert_eq!(
            content_type("a", "é".as_bytes().split_at(1).0),
            "text/plain; charset=utf-8"
        );
    }
}
