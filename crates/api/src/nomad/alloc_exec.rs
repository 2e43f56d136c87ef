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

use std::sync::Arc;

use axum::Extension;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade, close_code};
use axum::extract::{Path, Query, State};
use axum::response::Response;
use berth_nomad_api::exec::{
    ExecStreamingExitResult, ExecStreamingInput, ExecStreamingIoOperation, ExecStreamingOutput,
};
use futures_util::{SinkExt as _, StreamExt as _};
use serde::Deserialize;
use tokio::sync::mpsc;

use super::alloc_actions::{action_error, runner};
use super::{NomadError, bad_request};
use berth_client::agent::{Agent, JobAction, Submitter};
use berth_client::task_runner::SessionCommand;
use berth_sys::process::ExitStatus;
use berth_sys::process::session::{Session, SessionInput, SessionOutput, WindowSize};

/// The largest frame a client may send (its stdin, a few KiB at a time in practice).
const MAX_INPUT_FRAME: usize = 1 << 20;

/// The most bytes of output one frame carries.
const OUTPUT_CHUNK: usize = 16 << 10;

/// A terminal's size until the client says (Nomad's CLI sends it first thing).
const DEFAULT_SIZE: WindowSize = WindowSize { rows: 24, cols: 80 };

/// How often a session pings its client.
const PING_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// The most arguments of a command, before the driver's own bounds.
const MAX_COMMAND_ARGS: usize = 4096;

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
    let runner = runner(&agent, &id, submitter.clone(), JobAction::ExecAlloc)?;
    let task = match query.task.as_str() {
        "" => match runner.group.tasks.as_slice() {
            [only] => only.name.clone(),
            tasks => {
                let names: Vec<&str> = tasks.iter().map(|t| t.name.as_str()).collect();
                return Err(bad_request(format!(
                    "alloc {} has {} tasks ({}): name one (task=, or -task in the CLI)",
                    runner.id,
                    names.len(),
                    names.join(", ")
                )));
            }
        },
        named => named.to_string(),
    };
    let command = SessionCommand {
        argv: argv.clone(),
        terminal: tty.then_some(DEFAULT_SIZE),
    };
    let session = runner
        .start_session(&task, command)
        .await
        .map_err(action_error)?;
    let who = super::submission::submitter_of(submitter);
    tracing::info!(alloc = %runner.id, task, ?argv, tty, submitter = ?who, "alloc exec started");
    Ok(upgrade
        .max_message_size(MAX_INPUT_FRAME)
        .max_frame_size(MAX_INPUT_FRAME)
        .on_upgrade(move |socket| carry(socket, session)))
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

/// Why the client's side ended before the command did.
enum ClientEnd {
    /// It closed the socket, or the connection broke.
    Gone,
    /// It sent a frame that is not Nomad's.
    BadFrame(String),
}

/// Carries the session's streams over `socket` until the command exits (then its exit
/// is the last frame) or the client goes (then the command is killed).
async fn carry(socket: WebSocket, session: Session) {
    let Session {
        input,
        output,
        errors,
        mut end,
    } = session;
    let (mut output, mut errors) = (Some(output), errors);
    let (mut sink, stream) = socket.split();
    let (ended, mut client_end) = mpsc::channel(1);
    // The client's frames are read on a task of their own: a command that does not read
    // its stdin holds up only that task, never the output.
    let reader = tokio::spawn(read_input(stream, input, ended));
    let mut out_buffer = vec![0u8; OUTPUT_CHUNK];
    let mut err_buffer = vec![0u8; OUTPUT_CHUNK];
    let mut exit = None;
    // A quiet session is not an idle connection: pings keep bytes moving both ways (the
    // client answers them), within the listener's idle limit.
    let mut ping = tokio::time::interval(PING_EVERY);
    ping.tick().await;
    let outcome = loop {
        let frame = tokio::select! {
            _ = ping.tick() => {
                if sink.send(Message::Ping(Default::default())).await.is_err() {
                    break Err(ClientEnd::Gone);
                }
                continue;
            }
            read = read_some(&mut output, &mut out_buffer) => {
                stream_frame(&mut output, read, &out_buffer, |op| ExecStreamingOutput {
                    stdout: Some(op),
                    ..Default::default()
                })
            }
            read = read_some(&mut errors, &mut err_buffer) => {
                stream_frame(&mut errors, read, &err_buffer, |op| ExecStreamingOutput {
                    stderr: Some(op),
                    ..Default::default()
                })
            }
            status = end.wait(), if exit.is_none() => {
                exit = Some(status);
                // What it left running may hold its output open: not for long.
                let grace = tokio::time::sleep(std::time::Duration::from_millis(500));
                tokio::pin!(grace);
                drain(&mut output, &mut errors, &mut sink, &mut grace).await;
                break Ok(());
            }
            why = client_end.recv() => break Err(why.unwrap_or(ClientEnd::Gone)),
        };
        if let Some(frame) = frame
            && send(&mut sink, &frame).await.is_err()
        {
            break Err(ClientEnd::Gone);
        }
    };
    reader.abort();
    match outcome {
        Ok(()) => {
            let status = exit.unwrap_or(ExitStatus {
                code: None,
                signal: None,
            });
            let last = ExecStreamingOutput {
                exited: true,
                result: Some(ExecStreamingExitResult {
                    exit_code: exit_code(status),
                }),
                ..Default::default()
            };
            let _ = send(&mut sink, &last).await;
            let _ = sink
                .send(Message::Close(Some(CloseFrame {
                    code: close_code::NORMAL,
                    reason: "".into(),
                })))
                .await;
        }
        Err(why) => {
            end.kill().await;
            if let ClientEnd::BadFrame(reason) = why {
                let _ = sink
                    .send(Message::Close(Some(CloseFrame {
                        code: close_code::INVALID,
                        reason: reason.into(),
                    })))
                    .await;
            }
        }
    }
}

type Sink = futures_util::stream::SplitSink<WebSocket, Message>;

/// After the exit: sends what is left of both outputs, until they end or `grace` runs
/// out.
async fn drain(
    output: &mut Option<SessionOutput>,
    errors: &mut Option<SessionOutput>,
    sink: &mut Sink,
    grace: &mut std::pin::Pin<&mut tokio::time::Sleep>,
) {
    let mut out_buffer = vec![0u8; OUTPUT_CHUNK];
    let mut err_buffer = vec![0u8; OUTPUT_CHUNK];
    while output.is_some() || errors.is_some() {
        let frame = tokio::select! {
            read = read_some(output, &mut out_buffer) => {
                stream_frame(output, read, &out_buffer, |op| ExecStreamingOutput {
                    stdout: Some(op),
                    ..Default::default()
                })
            }
            read = read_some(errors, &mut err_buffer) => {
                stream_frame(errors, read, &err_buffer, |op| ExecStreamingOutput {
                    stderr: Some(op),
                    ..Default::default()
                })
            }
            () = grace.as_mut() => return,
        };
        if let Some(frame) = frame
            && send(sink, &frame).await.is_err()
        {
            return;
        }
    }
}

/// Reads from a stream still open; never ready for one that ended.
async fn read_some(stream: &mut Option<SessionOutput>, buffer: &mut [u8]) -> Option<usize> {
    match stream {
        Some(stream) => stream.read(buffer).await,
        None => std::future::pending().await,
    }
}

/// The frame for what a read gave: bytes, or the stream's close (and it is forgotten).
fn stream_frame(
    stream: &mut Option<SessionOutput>,
    read: Option<usize>,
    buffer: &[u8],
    frame: impl Fn(ExecStreamingIoOperation) -> ExecStreamingOutput,
) -> Option<ExecStreamingOutput> {
    match read {
        Some(n) => Some(frame(ExecStreamingIoOperation {
            data: buffer[..n].to_vec(),
            close: false,
        })),
        None => {
            *stream = None;
            Some(frame(ExecStreamingIoOperation {
                data: Vec::new(),
                close: true,
            }))
        }
    }
}

async fn send(sink: &mut Sink, frame: &ExecStreamingOutput) -> Result<(), ()> {
    let text = serde_json::to_string(frame).map_err(|_| ())?;
    sink.send(Message::Text(text.into())).await.map_err(|_| ())
}

/// The client's frames, until it goes or sends one that is not Nomad's.
async fn read_input(
    mut stream: futures_util::stream::SplitStream<WebSocket>,
    mut input: SessionInput,
    ended: mpsc::Sender<ClientEnd>,
) {
    let why = loop {
        let frame = match stream.next().await {
            None | Some(Err(_)) | Some(Ok(Message::Close(_))) => break ClientEnd::Gone,
            Some(Ok(Message::Text(text))) => text,
            Some(Ok(Message::Binary(_))) => {
                break ClientEnd::BadFrame("frames are JSON text, as Nomad's".into());
            }
            Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
        };
        let frame: ExecStreamingInput = match serde_json::from_str(frame.as_str()) {
            Ok(frame) => frame,
            Err(error) => break ClientEnd::BadFrame(format!("not an exec input frame: {error}")),
        };
        if let Some(size) = frame.tty_size
            && size.height > 0
            && size.width > 0
        {
            // A command that already ended has nothing to resize.
            let _ = input.resize(WindowSize {
                rows: size.height,
                cols: size.width,
            });
        }
        if let Some(stdin) = frame.stdin {
            // Input for a command that stopped reading is dropped, as a closed pipe's.
            if !stdin.data.is_empty() {
                let _ = input.write(&stdin.data).await;
            }
            if stdin.close {
                let _ = input.close().await;
            }
        }
    };
    let _ = ended.send(why).await;
}

/// The exit code a shell would report: the code, or 128 + the signal.
fn exit_code(status: ExitStatus) -> i32 {
    match (status.code, status.signal) {
        (Some(code), _) => code,
        (None, Some(signal)) => 128 + signal,
        (None, None) => -1,
    }
}
