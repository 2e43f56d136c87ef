//! Task logs as `berth alloc logs` and `GET /v1/client/fs/logs/{alloc}` serve them (the
//! shape of Nomad's endpoint): a chunk of a task's `stdout` or `stderr` file in the alloc's
//! `alloc/logs/` from an offset, so a client follows a log by asking again from where it
//! stopped. Each task has its own files, so no line of one task is shown as another's.

use std::io::{Read as _, Seek as _, SeekFrom};

use base64::Engine as _;
use serde::{Deserialize, Serialize};

use super::{Agent, LookupError};
use crate::model::status::ClientStatus;

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
        // Task names are checked path segments, and this one is the alloc's own.
        let path = status
            .alloc_dir
            .join("alloc/logs")
            .join(format!("{task}.{stream}.0"));
        let offset = query.offset.unwrap_or(0);
        let finished = matches!(
            status.client_status,
            ClientStatus::Complete | ClientStatus::Failed
        );
        let io = |source| LogError::Io {
            task: task.clone(),
            source,
        };
        let mut bytes = Vec::new();
        match std::fs::File::open(&path) {
            Ok(mut file) => {
                file.seek(SeekFrom::Start(offset)).map_err(io)?;
                file.take(MAX_CHUNK).read_to_end(&mut bytes).map_err(io)?;
            }
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => return Err(io(error)),
        }
        Ok(LogChunk {
            offset: offset + bytes.len() as u64,
            data: base64::engine::general_purpose::STANDARD.encode(&bytes),
            finished,
        })
    }
}
