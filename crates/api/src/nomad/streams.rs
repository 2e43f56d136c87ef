//! Long answers: a log followed (`/v1/client/fs/logs/:alloc_id?follow=true`) and the
//! event stream (`/v1/event/stream`). Each is a response body fed by a task of its own,
//! and each holds a place among [`MAX_STREAMS`] for as long as it is open: past that
//! many, a new one is refused with 429, so streams never take every connection.
//!
//! A stream ends when its client goes (the body is dropped, and the next send fails),
//! when its client stops reading for [`STALLED_READER`] (a full socket would otherwise
//! hold the place for good), and when the agent shuts down.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use tokio::sync::{mpsc, watch};

use super::NomadError;
use berth_client::agent::Agent;
use berth_client::agent::api_places::{Place, Places};

pub use berth_client::agent::api_places::MAX_STREAMS;
/// How long a client may leave what is sent unread before its stream is ended.
pub const STALLED_READER: Duration = Duration::from_secs(30);

/// A place among the agent's open `streams`, or Nomad's 429 when they are all taken.
fn stream_place(streams: &Places) -> Result<Place, NomadError> {
    streams.enter().ok_or_else(|| {
        NomadError(
            StatusCode::TOO_MANY_REQUESTS,
            format!(
                "{MAX_STREAMS} streams (log follows and event streams) are open on this \
                 agent, the most it serves at once: try again when one has ended"
            ),
        )
    })
}

/// Why a stream stopped sending.
#[derive(Debug, thiserror::Error)]
pub enum Ended {
    #[error("the client went away")]
    ClientGone,
    #[error("the client read nothing for {0:?}")]
    ClientStalled(Duration),
    #[error("the agent is shutting down")]
    ShuttingDown,
}

/// Where a stream's task sends its chunks.
pub struct Feed {
    sender: mpsc::Sender<Result<Bytes, std::io::Error>>,
    shutting_down: watch::Receiver<bool>,
}

impl Feed {
    /// Sends one chunk; fails once the stream should end.
    pub async fn send(&mut self, chunk: impl Into<Bytes>) -> Result<(), Ended> {
        if *self.shutting_down.borrow() {
            return Err(Ended::ShuttingDown);
        }
        match self
            .sender
            .send_timeout(Ok(chunk.into()), STALLED_READER)
            .await
        {
            Ok(()) => Ok(()),
            Err(mpsc::error::SendTimeoutError::Closed(_)) => Err(Ended::ClientGone),
            Err(mpsc::error::SendTimeoutError::Timeout(_)) => {
                Err(Ended::ClientStalled(STALLED_READER))
            }
        }
    }

    /// Waits `pause`, or less when the agent shuts down or the client goes.
    pub async fn pause(&mut self, pause: Duration) -> Result<(), Ended> {
        tokio::select! {
            () = tokio::time::sleep(pause) => Ok(()),
            _ = self.shutting_down.wait_for(|down| *down) => Err(Ended::ShuttingDown),
            () = self.sender.closed() => Err(Ended::ClientGone),
        }
    }

    /// Runs `work` until it ends, or the agent shuts down, or the client goes.
    pub async fn until_stopped<T>(
        &mut self,
        work: impl std::future::Future<Output = T>,
    ) -> Result<T, Ended> {
        tokio::select! {
            done = work => Ok(done),
            _ = self.shutting_down.wait_for(|down| *down) => Err(Ended::ShuttingDown),
            () = self.sender.closed() => Err(Ended::ClientGone),
        }
    }
}

/// A streamed answer: `feed` runs in a task of its own with a [`Feed`] and the stream's
/// place, and what it sends is the body. The place is taken before the answer starts,
/// so a refusal is a plain 429.
pub fn streamed<F, Fut>(
    agent: &Agent,
    content_type: &'static str,
    feed: F,
) -> Result<Response, NomadError>
where
    F: FnOnce(Feed) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let slot = stream_place(&agent.api_places().streams)?;
    // A few chunks in flight: what the client has not read waits here, not in memory
    // without end.
    let (sender, receiver) = mpsc::channel(8);
    let work = feed(Feed {
        sender,
        shutting_down: agent.shutting_down(),
    });
    tokio::spawn(async move {
        work.await;
        drop(slot);
    });
    let body = Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(receiver));
    Ok((
        [
            ("content-type", content_type),
            // Not buffered by a proxy on the way: the point is to see it as it comes.
            ("x-accel-buffering", "no"),
            ("cache-control", "no-cache"),
        ],
        body,
    )
        .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn past_the_cap_a_stream_is_refused_with_429_and_a_place_comes_back_when_one_ends() {
        let streams = berth_client::agent::api_places::ApiPlaces::default().streams;
        let mut slots: Vec<Place> = (0..MAX_STREAMS)
            .map(|_| stream_place(&streams).unwrap())
            .collect();
        let refused = stream_place(&streams).err().unwrap();
        assert_eq!(refused.0, StatusCode::TOO_MANY_REQUESTS);
        assert!(refused.1.contains("128 streams"), "{}", refused.1);
        slots.pop();
        assert!(stream_place(&streams).is_ok());
    }
}
