//! Task logs as `berth alloc logs` and `GET /v1/client/fs/logs/{alloc}` serve them (the
//! shape of Nomad's endpoint): a chunk of a task's `stdout` or `stderr` file in the alloc's
//! `alloc/logs/` from an offset, so a client follows a log by asking again from where it
//! stopped. Each task has its own files, so no line of one task is shown as another's.

use std::io::{Read as _, Seek as _, SeekFrom};
use std::os::fd::AsFd as _;
use std::path::Path;

use base64::Engine as _;
use serde::{Deserialize, Serialize};

use super::{Agent, LookupError};
use berth_model::status::ClientStatus;

/// The most bytes one chunk carries.
pub const MAX_CHUNK: u64 = 256 * 1024;

/// `GET /v1/client/fs/logs/{alloc}` parameters, as Nomad names them.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct LogQuery {
    /// The task; may be left out when the alloc has one.
    pub task: Option<String>,
    /// `stdout` (the default) or `stderr`.
    #[serde(rename = "type")]
    pub stream: Option<String>,
    pub offset: Option<u64>,
}

/// A piece of a task's log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogChunk {
    /// The bytes, base64 (a task writes what it likes, not UTF-8).
    pub data: String,
    /// Where the next chunk starts.
    pub offset: u64,
    /// The alloc has finished: what the file holds now is all there will be.
    pub finished: bool,
}

impl LogChunk {
    pub fn bytes(&self) -> Vec<u8> {
        base64::engine::general_purpose::STANDARD
            .decode(&self.data)
            .unwrap_or_default()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error(transparent)]
    Lookup(#[from] LookupError),
    #[error("alloc {alloc} has no task {task:?} (its tasks: {})", tasks.join(", "))]
    NoSuchTask {
        alloc: String,
        task: String,
        tasks: Vec<String>,
    },
    #[error("alloc {alloc} has several tasks ({}): name one", tasks.join(", "))]
    WhichTask { alloc: String, tasks: Vec<String> },
    #[error("unknown log type {0:?} (use stdout or stderr)")]
    Stream(String),
    #[error("reading the log of task {task:?}: {source}")]
    Io {
        task: String,
        source: std::io::Error,
    },
}

impl Agent {
    /// Up to [`MAX_CHUNK`] bytes of a task's log from `offset`. A log that does not exist
    /// yet (the task has not started) is empty.
    pub fn task_log(&self, alloc: &str, query: &LogQuery) -> Result<LogChunk, LogError> {
        let status = self.alloc(alloc)?;
        let tasks: Vec<String> = status.tasks.keys().cloned().collect();
        let task = match &query.task {
            Some(task) if status.tasks.contains_key(task) => task.clone(),
            Some(task) => {
                return Err(LogError::NoSuchTask {
                    alloc: status.id,
                    task: task.clone(),
                    tasks,
                });
            }
            None => match tasks.as_slice() {
                [only] => only.clone(),
                _ => {
                    return Err(LogError::WhichTask {
                        alloc: status.id,
                        tasks,
                    });
                }
            },
        };
        let stream = query.stream.as_deref().unwrap_or("stdout");
        if stream != "stdout" && stream != "stderr" {
            return Err(LogError::Stream(stream.to_string()));
        }
        let offset = query.offset.unwrap_or(0);
        let finished = matches!(
            status.client_status,
            ClientStatus::Complete | ClientStatus::Failed
        );
        let io = |source| LogError::Io {
            task: task.clone(),
            source,
        };
        // Task names are checked path segments, and this one is the alloc's own.
        let read = read_rotated(
            &status.alloc_dir.join("alloc"),
            &format!("{task}.{stream}"),
            offset,
        );
        let (bytes, offset) = match read {
            // Its directory is not made yet (its disk is being limited): nothing written.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !finished => (Vec::new(), offset),
            other => other.map_err(io)?,
        };
        Ok(LogChunk {
            offset,
            data: base64::engine::general_purpose::STANDARD.encode(&bytes),
            finished,
        })
    }
}

/// An offset names a file of the stream (its index, in the high bits) and a place in
/// it: files rotate, and the oldest are deleted while a client follows.
const INDEX_SHIFT: u32 = 40;

/// The file index and the place in that file an offset of [`LogChunk`] names.
pub fn offset_in_file(offset: u64) -> (u64, u64) {
    (offset >> INDEX_SHIFT, offset & ((1 << INDEX_SHIFT) - 1))
}

/// Up to [`MAX_CHUNK`] bytes of stream `base` (`web.stdout`) in `<shared>/logs/` from
/// `offset`, and the offset after them: from the named file on, or from the oldest file
/// left when it is gone; on to the next file at the end of one. The task can write into
/// `logs/`: nothing there is followed through a symlink, and only regular files are
/// read.
fn read_rotated(shared: &Path, base: &str, offset: u64) -> std::io::Result<(Vec<u8>, u64)> {
    use rustix::fs::{Mode, OFlags};
    let shared = rustix::fs::open(
        shared,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let dir = match rustix::fs::openat(
        &shared,
        "logs",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(dir) => dir,
        // Not made yet, or not a directory any more: nothing to show.
        Err(_) => return Ok((Vec::new(), offset)),
    };
    let (mut index, mut position) = offset_in_file(offset);
    for file_index in berth_sys::process::logmon::indices(dir.as_fd(), base) {
        if file_index < index {
            continue;
        }
        if file_index > index {
            (index, position) = (file_index, 0);
        }
        let name = berth_sys::process::logmon::file_name(base, file_index);
        let Ok(mut file) =
            berth_sys::process::logmon::open_regular(dir.as_fd(), &name, OFlags::RDONLY)
        else {
            continue;
        };
        file.seek(SeekFrom::Start(position))?;
        let mut bytes = Vec::new();
        file.take(MAX_CHUNK).read_to_end(&mut bytes)?;
        if !bytes.is_empty() {
            let next = (index << INDEX_SHIFT) | (position + bytes.len() as u64);
            return Ok((bytes, next));
        }
    }
    Ok((Vec::new(), (index << INDEX_SHIFT) | position))
}
