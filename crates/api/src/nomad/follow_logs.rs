//! `GET /v1/client/fs/logs/:alloc_id?follow=true`: a task's log as the task writes it,
//! as Nomad streams it. Without `plain=true` the body is JSON frames, one a line,
//! `{"Data": base64, "File": "alloc/logs/<task>.<type>.<n>", "Offset": N}` (at most
//! [`FRAME_SIZE`] bytes each; `Offset` is the place in that file after the frame's
//! bytes), and `{}` after [`HEARTBEAT`] with nothing to send; with `plain=true` the bytes
//! alone.
//!
//! It reads through berth's log reader (`agent/logs.rs`: no link followed, regular files
//! only), from file to file as the collector rotates them, and ends once the task is dead
//! and what it wrote is sent (Nomad's CLI ends there too), or when the alloc is collected.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::response::Response;
use base64::Engine as _;
use berth_nomad_api::allocs::StreamFrame;

use super::streams::{self, Ended, Feed};
use super::{NomadError, log_error, read_whole_log};
use berth_client::agent::Agent;
use berth_client::agent::logs::{LogQuery, offset_in_file};
use berth_model::events::TaskStateKind;

/// The most bytes of one frame, as Nomad's.
pub const FRAME_SIZE: usize = 64 * 1024;
/// A frame `{}` after this long with nothing sent, as Nomad's (it tells a client the
/// stream is alive, and finds a client that left).
pub const HEARTBEAT: Duration = Duration::from_secs(1);
/// How often the log is looked at for more, as Nomad batches it.
const POLL: Duration = Duration::from_millis(200);

/// Where a follow starts.
pub enum Start {
    /// From the start of what the rotated files hold, leaving out `skip` bytes.
    Beginning { skip: usize },
    /// With the last `bytes` bytes written.
    End { bytes: usize },
}

pub struct Follow {
    pub alloc: String,
    pub task: Option<String>,
    pub stream: String,
    pub plain: bool,
    pub start: Start,
}

/// Checks what can be refused before the answer starts (the alloc, the task, the type,
/// the place among streams), then streams.
pub fn answer(agent: Arc<Agent>, follow: Follow) -> Result<Response, NomadError> {
    let query = LogQuery {
        task: follow.task.clone(),
        stream: Some(follow.stream.clone()),
        offset: None,
    };
    let (task, tail, offset, skip) = match follow.start {
        Start::End { bytes } => {
            let (task, whole, end) =
                berth_sys::blocking::run(|| read_whole_log(&agent, &follow.alloc, query))?;
            let tail = whole[whole.len().saturating_sub(bytes)..].to_vec();
            (task, tail, end, 0)
        }
        Start::Beginning { skip } => {
            // An offset past every file: checks the alloc, task and type, reads nothing.
            let check = LogQuery {
                offset: Some(u64::MAX),
                ..query
            };
            berth_sys::blocking::run(|| agent.task_log(&follow.alloc, &check))
                .map_err(log_error)?;
            let status = agent.alloc(&follow.alloc)?;
            let task = match follow.task {
                Some(task) => task,
                None => status.tasks.keys().next().cloned().unwrap_or_default(),
            };
            (task, Vec::new(), 0, skip)
        }
    };
    let alloc = agent.alloc(&follow.alloc)?.id;
    let content_type = if follow.plain {
        "text/plain; charset=utf-8"
    } else {
        "application/json"
    };
    let reader = LogReader {
        agent: agent.clone(),
        alloc,
        task,
        stream: follow.stream,
        plain: follow.plain,
        offset,
        skip,
    };
    streams::streamed(&agent, content_type, move |feed| async move {
        let mut feed = feed;
        match reader.run(tail, &mut feed).await {
            Done::Drained => tracing::debug!("a log follow ended: the task is dead"),
            Done::Unreadable => tracing::debug!("a log follow ended: the log is gone"),
            Done::Stream(reason) => tracing::debug!(%reason, "a log follow ended"),
        }
    })
}

struct LogReader {
    agent: Arc<Agent>,
    alloc: String,
    task: String,
    stream: String,
    plain: bool,
    /// Where the next read starts (berth's log offset: file index and place).
    offset: u64,
    /// Bytes still to leave out (`offset` with `origin=start`).
    skip: usize,
}

/// Why a follow ended, besides the stream's own reasons.
#[derive(Debug)]
enum Done {
    /// The task is dead and what it wrote is sent.
    Drained,
    /// The alloc is gone (collected) or its log cannot be read.
    Unreadable,
    Stream(Ended),
}

impl From<Ended> for Done {
    fn from(ended: Ended) -> Done {
        Done::Stream(ended)
    }
}

impl LogReader {
    async fn run(mut self, tail: Vec<u8>, feed: &mut Feed) -> Done {
        let mut last_sent = Instant::now();
        if !tail.is_empty() {
            if let Err(ended) = self.send(&tail, self.offset, feed).await {
                return ended.into();
            }
            last_sent = Instant::now();
        }
        // Once the task is dead, the collector writes what is left in its pipes a moment
        // later: one more look after a pause before the end.
        let mut looked_after_death = false;
        loop {
            let query = LogQuery {
                task: Some(self.task.clone()),
                stream: Some(self.stream.clone()),
                offset: Some(self.offset),
            };
            let Ok(chunk) = berth_sys::blocking::run(|| self.agent.task_log(&self.alloc, &query))
            else {
                return Done::Unreadable;
            };
            let mut bytes = chunk.bytes();
            if !bytes.is_empty() {
                self.offset = chunk.offset;
                let left_out = self.skip.min(bytes.len());
                self.skip -= left_out;
                bytes.drain(..left_out);
                if !bytes.is_empty() {
                    if let Err(ended) = self.send(&bytes, chunk.offset, feed).await {
                        return ended.into();
                    }
                    last_sent = Instant::now();
                }
                continue;
            }
            if self.task_is_dead() {
                if looked_after_death {
                    return Done::Drained;
                }
                looked_after_death = true;
            }
            if !self.plain && last_sent.elapsed() >= HEARTBEAT {
                if let Err(ended) = feed.send(&b"{}\n"[..]).await {
                    return ended.into();
                }
                last_sent = Instant::now();
            }
            if let Err(ended) = feed.pause(POLL).await {
                return ended.into();
            }
        }
    }

    fn task_is_dead(&self) -> bool {
        self.agent.alloc(&self.alloc).map_or(true, |status| {
            status
                .tasks
                .get(&self.task)
                .is_none_or(|state| state.state == TaskStateKind::Dead)
        })
    }

    /// Sends `bytes`, which end at berth's log offset `end`, in frames.
    async fn send(&self, bytes: &[u8], end: u64, feed: &mut Feed) -> Result<(), Ended> {
        if self.plain {
            return feed.send(bytes.to_vec()).await;
        }
        let (file_index, end_in_file) = offset_in_file(end);
        let file = format!("alloc/logs/{}.{}.{file_index}", self.task, self.stream);
        let mut place = end_in_file.saturating_sub(bytes.len() as u64);
        for piece in bytes.chunks(FRAME_SIZE) {
            place += piece.len() as u64;
            let frame = StreamFrame {
                offset: place,
                data: base64::engine::general_purpose::STANDARD.encode(piece),
                file: file.clone(),
            };
            let mut line = serde_json::to_vec(&frame).unwrap_or_default();
            line.push(b'\n');
            feed.send(line).await?;
        }
        Ok(())
    }
}
