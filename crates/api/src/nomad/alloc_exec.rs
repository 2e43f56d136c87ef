//! Nomad's `alloc exec`: a command run inside a running task, its streams carried over a
//! websocket.
//!
//! | method | path | query |
//! |---|---|---|
//! | GET (websocket) | `/v1/client/allocation/:alloc_id/exec` | `task`, `command` (a JSON array: `["/bin/sh","-c","id"]`), `tty` (`true`: a terminal) |
//!
//! The frames are Nomad's ([`berth_nomad_api::exec`]): the client sends `stdin` bytes,
//! `stdin.close`, `tty_size`, and `{}` as a heartbeat; the agent sends `stdout` and
//! `stderr` bytes (a terminal's output is all `stdout`), each stream's `close`, and
//! last `{"exited":true,"result":{"exit_code":N}}`, then closes the socket. A command
//! killed by a signal exits with 128 + the signal's number, as a shell reports it.
//!
//! The command runs as the task's user, in its namespaces, root, cgroup and seccomp
//! filter ([`berth_sys::process::session`]), and only in a task whose driver declares
//! the `exec` capability. It needs a token of scope `alloc-exec` (or `plugin`) that
//! owns the alloc's job, or the operator: checked, like every refusal here (an unknown
//! alloc or task, a task not running, a bad command), before the websocket is opened,
//! so a refusal is a plain HTTP answer. A client that goes away takes its command with
//! it: a closed socket kills the command's whole process group.
//!
//! Asked of a member that does not run the alloc, as Nomad's servers forward to the
//! client that does: this member checks the token and the job's owner, then carries
//! the frames to and from the node through the store ([`berth_cluster::relay`]); the
//! node starts the command ([`super::exec_session`]), and a refusal there is still the
//! HTTP answer here.

use std::sync::Arc;
use std::time::Duration;

use axum::Extension;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade, close_code};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use berth_cluster::relay::Relay;
use berth_nomad_api::exec::{ExecStreamingInput, ExecStreamingOutput};
use futures_util::{SinkExt as _, StreamExt as _};
use serde::Deserialize;
use tokio::sync::mpsc;

use super::exec_session::{Down, FromClient, Opening, ToClient};
use super::{NomadError, bad_request};
use crate::listen::ConnectionPlace;
use berth_client::agent::{Agent, JobAction, Submitter};

/// The largest frame a client may send (its stdin, a few KiB at a time in practice).
const MAX_INPUT_FRAME: usize = 1 << 20;

/// The most bytes of stdin one frame relayed to another node carries (its frames are
/// bounded by the store's).
const RELAYED_INPUT_CHUNK: usize = 16 << 10;

/// How often a session pings its client.
const PING_EVERY: Duration = Duration::from_secs(10);

/// The most arguments of a command, before the driver's own bounds.
const MAX_COMMAND_ARGS: usize = 4096;

/// How long the node that runs the alloc has to take a session asked of another member.
const RELAY_TAKEN_WITHIN: Duration = Duration::from_secs(10);

#[derive(Debug, Deserialize)]
pub struct ExecQuery {
    #[serde(default)]
    task: String,
    #[serde(default)]
    command: String,
    #[serde(default)]
    tty: Option<String>,
}

/// `GET /v1/client/allocation/:alloc_id/exec`, upgraded to a websocket.
pub async fn exec(
    State(agent): State<Arc<Agent>>,
    submitter: Option<Extension<Submitter>>,
    Path(id): Path<String>,
    Query(query): Query<ExecQuery>,
    place: Option<Extension<ConnectionPlace>>,
    upgrade: WebSocketUpgrade,
) -> Result<Response, NomadError> {
    let argv = command_of(&query.command)?;
    let tty = match query.tty.as_deref() {
        None | Some("" | "false") => false,
        Some("true") => true,
        Some(other) => {
            return Err(bad_request(format!(
                "tty is {other:?}; it takes true or false"
            )));
        }
    };
    let who = super::submission::submitter_of(submitter.clone());
    let upgrade = upgrade
        .max_message_size(MAX_INPUT_FRAME)
        .max_frame_size(MAX_INPUT_FRAME);
    let local = super::alloc_actions::runner(&agent, &id, submitter, JobAction::ExecAlloc);
    let runner = match local {
        Ok(runner) => runner,
        Err(NomadError(StatusCode::NOT_FOUND, not_here)) => {
            let opening = Opening {
                alloc_id: id,
                task: query.task,
                argv,
                tty,
            };
            return remote(&agent, &who, opening, upgrade, place, not_here).await;
        }
        Err(refused) => return Err(refused),
    };
    let opening = Opening {
        alloc_id: runner.id.clone(),
        task: query.task,
        argv,
        tty,
    };
    let (session, permit) = super::exec_session::start(&runner, &opening).await?;
    tracing::info!(alloc = %runner.id, submitter = ?who, "alloc exec session opened");
    Ok(upgrade.on_upgrade(move |socket| async move {
        // The connection counts against the listener's limits while the session runs.
        let _held = (place, permit);
        let (sink, stream) = socket.split();
        let (from_client, inputs) = mpsc::channel(4);
        let (outputs, to_client) = mpsc::channel(4);
        let (gone, client_gone) = tokio::sync::oneshot::channel();
        let reader = tokio::spawn(read_client(stream, from_client, None, gone));
        let writer = tokio::spawn(write_client(sink, to_client, None));
        super::exec_session::run(session, inputs, outputs, client_gone).await;
        let _ = writer.await;
        reader.abort();
    }))
}

/// A session for an alloc another member runs: the node is asked through the store,
/// and its refusal, if any, is the answer here.
async fn remote(
    agent: &Arc<Agent>,
    who: &Submitter,
    opening: Opening,
    upgrade: WebSocketUpgrade,
    place: Option<Extension<ConnectionPlace>>,
    not_here: String,
) -> Result<Response, NomadError> {
    let failed = |error: String| NomadError(StatusCode::INTERNAL_SERVER_ERROR, error);
    let node = match agent
        .alloc_elsewhere(who, &opening.alloc_id, JobAction::ExecAlloc)
        .await
    {
        Ok(Ok(Some(node))) => node,
        Ok(Ok(None)) => return Err(NomadError(StatusCode::NOT_FOUND, not_here)),
        Ok(Err(refused)) => return Err(refused.into()),
        Err(error) => {
            return Err(failed(format!(
                "finding alloc {}: {error}",
                opening.alloc_id
            )));
        }
    };
    let bytes = serde_json::to_vec(&opening).map_err(|e| failed(e.to_string()))?;
    let mut relay = agent
        .cluster()
        .open_relay(&node, bytes, RELAY_TAKEN_WITHIN)
        .await
        .map_err(|e| {
            NomadError(
                StatusCode::BAD_GATEWAY,
                format!("reaching node {node:?}, which runs the alloc: {e}"),
            )
        })?;
    let first = tokio::time::timeout(RELAY_TAKEN_WITHIN * 3, relay.frames.recv()).await;
    let gone = || {
        NomadError(
            StatusCode::BAD_GATEWAY,
            format!("node {node:?}, which runs the alloc, did not start the command"),
        )
    };
    let first: Down = match first {
        Ok(Some(bytes)) => serde_json::from_slice(&bytes).map_err(|_| gone())?,
        _ => return Err(gone()),
    };
    match first {
        Down::Started => {}
        Down::Refused { status, message } => {
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
            return Err(NomadError(status, message));
        }
        Down::Output(_) | Down::Refuse(_) => return Err(gone()),
    }
    tracing::info!(alloc = %opening.alloc_id, node, submitter = ?who,
        "alloc exec session opened on another node");
    Ok(upgrade.on_upgrade(move |socket| async move {
        let _held = place;
        bridge(socket, relay).await;
    }))
}

/// Carries a websocket's frames to a relay and back.
async fn bridge(socket: WebSocket, relay: Relay) {
    // The node's end (`peer_gone`) is read as the end of its frames: every frame it
    // sent is delivered first.
    let Relay {
        send, mut frames, ..
    } = relay;
    let (sink, stream) = socket.split();
    let (from_client, mut inputs) = mpsc::channel(4);
    let (outputs, to_client) = mpsc::channel(4);
    let (gone, mut client_gone) = tokio::sync::oneshot::channel();
    let reader = tokio::spawn(read_client(
        stream,
        from_client,
        Some(RELAYED_INPUT_CHUNK),
        gone,
    ));
    let gone_reason = "the node that runs the alloc went away";
    let writer = tokio::spawn(write_client(sink, to_client, Some(gone_reason)));
    let upward = tokio::spawn(async move {
        while let Some(frame) = inputs.recv().await {
            match frame {
                FromClient::Input(input) => {
                    let Ok(bytes) = serde_json::to_vec(&input) else {
                        return;
                    };
                    if send.send(bytes).await.is_err() {
                        return;
                    }
                }
                // Dropping the relay's sender ends the session there.
                FromClient::Bad(_) => return,
            }
        }
    });
    loop {
        let bytes = tokio::select! {
            bytes = frames.recv() => match bytes {
                Some(bytes) => bytes,
                None => break,
            },
            // The client went: the relay's sender goes with `upward`, which ends the
            // session on the node, whatever input it was still waiting to send.
            _ = &mut client_gone => break,
        };
        let out = match serde_json::from_slice::<Down>(&bytes) {
            Ok(Down::Output(frame)) => ToClient::Output(frame),
            Ok(Down::Refuse(reason)) => ToClient::Refuse(reason),
            Ok(Down::Started | Down::Refused { .. }) | Err(_) => continue,
        };
        if outputs.send(out).await.is_err() {
            break;
        }
    }
    drop(outputs);
    let _ = writer.await;
    upward.abort();
    reader.abort();
}

/// The command line from `command=`: a JSON array of strings, not empty.
fn command_of(text: &str) -> Result<Vec<String>, NomadError> {
    if text.is_empty() {
        return Err(bad_request(
            "command is required: a JSON array such as [\"/bin/sh\"]",
        ));
    }
    let argv: Vec<String> = serde_json::from_str(text).map_err(|e| {
        bad_request(format!(
            "command must be a JSON array of strings such as [\"/bin/sh\",\"-c\",\"id\"]: {e}"
        ))
    })?;
    match argv.first() {
        None => Err(bad_request("command is empty: name a program to run")),
        Some(program) if program.is_empty() => Err(bad_request("the command's program is empty")),
        Some(_) if argv.len() > MAX_COMMAND_ARGS => Err(bad_request(format!(
            "command has {} arguments; at most {MAX_COMMAND_ARGS}",
            argv.len()
        ))),
        Some(_) => Ok(argv),
    }
}

type Sink = futures_util::stream::SplitSink<WebSocket, Message>;

/// The client's websocket frames, parsed, until it goes (the channel ends) or sends one
/// that is not Nomad's. Stdin larger than `chunk` is cut into frames of it.
async fn read_client(
    mut stream: futures_util::stream::SplitStream<WebSocket>,
    from_client: mpsc::Sender<FromClient>,
    chunk: Option<usize>,
    // Dropped on the way out: the client is gone (or sent what ends the session).
    _gone: tokio::sync::oneshot::Sender<()>,
) {
    loop {
        let text = match stream.next().await {
            None | Some(Err(_)) | Some(Ok(Message::Close(_))) => return,
            Some(Ok(Message::Text(text))) => text,
            Some(Ok(Message::Binary(_))) => {
                let bad = FromClient::Bad("frames are JSON text, as Nomad's".into());
                let _ = from_client.send(bad).await;
                return;
            }
            Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
        };
        let frame: ExecStreamingInput = match serde_json::from_str(text.as_str()) {
            Ok(frame) => frame,
            Err(error) => {
                let bad = FromClient::Bad(format!("not an exec input frame: {error}"));
                let _ = from_client.send(bad).await;
                return;
            }
        };
        for frame in cut(frame, chunk) {
            if from_client.send(FromClient::Input(frame)).await.is_err() {
                return;
            }
        }
    }
}

/// A frame whose stdin is larger than `chunk`, as frames of at most `chunk` bytes.
fn cut(frame: ExecStreamingInput, chunk: Option<usize>) -> Vec<ExecStreamingInput> {
    let (Some(chunk), Some(stdin)) = (chunk, frame.stdin.as_ref()) else {
        return vec![frame];
    };
    if stdin.data.len() <= chunk {
        return vec![frame];
    }
    let mut frames: Vec<ExecStreamingInput> = stdin
        .data
        .chunks(chunk)
        .map(|part| ExecStreamingInput {
            stdin: Some(berth_nomad_api::exec::ExecStreamingIoOperation {
                data: part.to_vec(),
                close: false,
            }),
            tty_size: None,
        })
        .collect();
    if let Some(last) = frames.last_mut().and_then(|f| f.stdin.as_mut()) {
        last.close = stdin.close;
    }
    if let Some(first) = frames.first_mut() {
        first.tty_size = frame.tty_size;
    }
    frames
}

/// Writes a session's frames to the client, pinging it meanwhile; closes the socket at
/// the end: normally after the command's exit, with the reason after a bad frame, or
/// with `cut_reason` when the session ended without an exit (its node went away).
async fn write_client(
    mut sink: Sink,
    mut to_client: mpsc::Receiver<ToClient>,
    cut_reason: Option<&'static str>,
) {
    // A quiet session is not an idle connection: pings keep bytes moving both ways (the
    // client answers them), within the listener's idle limit.
    let mut ping = tokio::time::interval(PING_EVERY);
    ping.tick().await;
    let mut exited = false;
    let close = loop {
        tokio::select! {
            _ = ping.tick() => {
                if sink.send(Message::Ping(Default::default())).await.is_err() {
                    return;
                }
            }
            out = to_client.recv() => match out {
                Some(ToClient::Output(frame)) => {
                    exited |= frame.exited;
                    if send(&mut sink, &frame).await.is_err() {
                        return;
                    }
                }
                Some(ToClient::Refuse(reason)) => break (close_code::INVALID, close_reason(&reason)),
                None if exited => break (close_code::NORMAL, String::new()),
                None => break (close_code::ERROR, cut_reason.unwrap_or("the session ended").to_string()),
            },
        }
    };
    let (code, reason) = close;
    let _ = sink
        .send(Message::Close(Some(CloseFrame {
            code,
            reason: reason.into(),
        })))
        .await;
}

/// A close frame's reason: at most 123 bytes (a control frame carries 125, the code 2),
/// cut at a character's boundary.
fn close_reason(reason: &str) -> String {
    let mut end = reason.len().min(123);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    reason[..end].to_string()
}

async fn send(sink: &mut Sink, frame: &ExecStreamingOutput) -> Result<(), ()> {
    let text = serde_json::to_string(frame).map_err(|_| ())?;
    sink.send(Message::Text(text.into())).await.map_err(|_| ())
}
