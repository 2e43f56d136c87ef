//! An `alloc exec` session on the node that runs the alloc: the command's streams
//! carried to and from its client, whatever carries the client's frames (the websocket
//! of a local request, or the relay from the member that has the websocket,
//! [`berth_cluster::relay`]).

use std::sync::Arc;
use std::time::Duration;

use berth_client::agent::Agent;
use berth_client::alloc_runner::AllocRunner;
use berth_client::task_runner::SessionCommand;
use berth_cluster::relay::Relay;
use berth_nomad_api::exec::{
    ExecStreamingExitResult, ExecStreamingInput, ExecStreamingIoOperation, ExecStreamingOutput,
};
use berth_sys::process::ExitStatus;
use berth_sys::process::session::{Session, SessionInput, SessionOutput, WindowSize};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use super::NomadError;
use super::alloc_actions::action_error;
use super::bad_request;

/// The most bytes of output one frame carries.
const OUTPUT_CHUNK: usize = 16 << 10;

/// A terminal's size until the client says (Nomad's CLI sends it first thing).
const DEFAULT_SIZE: WindowSize = WindowSize { rows: 24, cols: 80 };

/// After the command exits, how long what it left running may hold its output open.
const OUTPUT_GRACE: Duration = Duration::from_millis(500);

/// The most sessions this agent runs at once, its own and those asked through other
/// members; past it a session is refused (503) until one ends.
pub const MAX_SESSIONS: usize = 128;

/// The sessions running on this node: each holds a permit.
static SESSIONS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(MAX_SESSIONS);

/// A running session's place among [`MAX_SESSIONS`].
pub(super) type SessionPermit = tokio::sync::SemaphorePermit<'static>;

/// What a client sends a session.
pub(super) enum FromClient {
    Input(ExecStreamingInput),
    /// A frame that is not Nomad's: the session ends, saying why.
    Bad(String),
}

/// What a session sends its client; the end of the channel is the end of the session
/// (after the `exited` frame, when the command exited).
pub(super) enum ToClient {
    Output(ExecStreamingOutput),
    /// The session ended on the client's bad frame.
    Refuse(String),
}

/// Where a session is asked to run, as the member with the websocket sends it to the
/// node that runs the alloc.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct Opening {
    pub alloc_id: String,
    pub task: String,
    pub argv: Vec<String>,
    pub tty: bool,
}

/// What the node sends back over a relay.
#[derive(Debug, Serialize, Deserialize)]
pub(super) enum Down {
    /// The command runs: its frames follow.
    Started,
    /// It could not be started: an HTTP status and why.
    Refused {
        status: u16,
        message: String,
    },
    Output(ExecStreamingOutput),
    Refuse(String),
}

/// Starts the command `opening` names in a running task of this node's alloc `runner`;
/// the permit is the session's place among [`MAX_SESSIONS`], held while it runs.
pub(super) async fn start(
    runner: &AllocRunner,
    opening: &Opening,
) -> Result<(Session, SessionPermit), NomadError> {
    let Ok(permit) = SESSIONS.try_acquire() else {
        return Err(NomadError(
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "this node runs {MAX_SESSIONS} alloc exec sessions, its most at once: try \
                 again when one has ended"
            ),
        ));
    };
    let task = match opening.task.as_str() {
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
        argv: opening.argv.clone(),
        terminal: opening.tty.then_some(DEFAULT_SIZE),
    };
    let session = runner
        .start_session(&task, command)
        .await
        .map_err(action_error)?;
    tracing::info!(alloc = %runner.id, task, argv = ?opening.argv, tty = opening.tty,
        "alloc exec started");
    Ok((session, permit))
}

/// Serves the sessions other members ask of this node's allocs (they checked the
/// asker's token and its ownership of the job, as for a session of their own).
pub fn serve_remote_sessions(agent: &Arc<Agent>) {
    let serving = agent.clone();
    let handler: berth_cluster::relay::RelayHandler = Arc::new(move |opening, relay| {
        let agent = serving.clone();
        Box::pin(async move { serve_relay(&agent, opening, relay).await })
    });
    agent.cluster().serve_relays(handler);
}

async fn serve_relay(agent: &Agent, opening: Vec<u8>, relay: Relay) {
    let Relay {
        send,
        mut frames,
        peer_gone,
    } = relay;
    let refused = |status: u16, message: String| {
        serde_json::to_vec(&Down::Refused { status, message }).unwrap_or_default()
    };
    let opening: Opening = match serde_json::from_slice(&opening) {
        Ok(opening) => opening,
        Err(error) => {
            let _ = send
                .send(refused(400, format!("not a session opening: {error}")))
                .await;
            return;
        }
    };
    let Some(runner) = agent.alloc_runner(&opening.alloc_id) else {
        let message = format!("alloc {} does not run on this node", opening.alloc_id);
        let _ = send.send(refused(404, message)).await;
        return;
    };
    let (session, _permit) = match start(&runner, &opening).await {
        Ok(started) => started,
        Err(NomadError(status, message)) => {
            let _ = send.send(refused(status.as_u16(), message)).await;
            return;
        }
    };
    let Ok(started) = serde_json::to_vec(&Down::Started) else {
        return;
    };
    if send.send(started).await.is_err() {
        return;
    }
    let (from_client, inputs) = mpsc::channel(4);
    let (outputs, mut to_client) = mpsc::channel(4);
    tokio::spawn(async move {
        while let Some(frame) = frames.recv().await {
            let frame = match serde_json::from_slice::<ExecStreamingInput>(&frame) {
                Ok(input) => FromClient::Input(input),
                Err(error) => FromClient::Bad(format!("not an exec input frame: {error}")),
            };
            if from_client.send(frame).await.is_err() {
                return;
            }
        }
    });
    tokio::spawn(async move {
        while let Some(out) = to_client.recv().await {
            let down = match out {
                ToClient::Output(frame) => Down::Output(frame),
                ToClient::Refuse(reason) => Down::Refuse(reason),
            };
            let Ok(bytes) = serde_json::to_vec(&down) else {
                return;
            };
            if send.send(bytes).await.is_err() {
                return;
            }
        }
    });
    // The caller gone (its client, or the member itself) ends the session at once,
    // whatever of its input is still on the way.
    run(session, inputs, outputs, peer_gone).await;
}

/// Why the client's side ended before the command did.
enum ClientEnd {
    Gone,
    Bad(String),
}

/// Carries the session's streams to `outputs` and `inputs` to it, until the command
/// exits (then its exit is the last frame) or the client goes (then the command is
/// killed, with what it started in its process group).
pub(super) async fn run(
    session: Session,
    inputs: mpsc::Receiver<FromClient>,
    outputs: mpsc::Sender<ToClient>,
    client_gone: tokio::sync::oneshot::Receiver<()>,
) {
    // Ready (or dropped) once the client is gone: heard here, not through the input,
    // which a command that does not read its stdin holds up.
    let mut client_gone = client_gone;
    let Session {
        input,
        output,
        errors,
        mut end,
    } = session;
    let mut streams = Streams {
        output: Some(output),
        errors,
        out_buffer: vec![0u8; OUTPUT_CHUNK],
        err_buffer: vec![0u8; OUTPUT_CHUNK],
    };
    let (ended, mut client_end) = mpsc::channel(1);
    // The client's frames are taken on a task of their own: a command that does not
    // read its stdin holds up only that task, never the output.
    let reader = tokio::spawn(apply_inputs(inputs, input, ended));
    let outcome = loop {
        tokio::select! {
            frame = streams.next() => {
                if let Some(frame) = frame
                    && outputs.send(ToClient::Output(frame)).await.is_err()
                {
                    break Err(ClientEnd::Gone);
                }
            }
            status = end.wait() => {
                let grace = tokio::time::sleep(OUTPUT_GRACE);
                tokio::pin!(grace);
                while streams.open() {
                    tokio::select! {
                        frame = streams.next() => {
                            if let Some(frame) = frame
                                && outputs.send(ToClient::Output(frame)).await.is_err()
                            {
                                break;
                            }
                        }
                        () = &mut grace => break,
                    }
                }
                break Ok(status);
            }
            why = client_end.recv() => break Err(why.unwrap_or(ClientEnd::Gone)),
            _ = &mut client_gone => break Err(ClientEnd::Gone),
            () = outputs.closed() => break Err(ClientEnd::Gone),
        }
    };
    reader.abort();
    match outcome {
        Ok(status) => {
            let last = ExecStreamingOutput {
                exited: true,
                result: Some(ExecStreamingExitResult {
                    exit_code: exit_code(status),
                }),
                ..Default::default()
            };
            let _ = outputs.send(ToClient::Output(last)).await;
        }
        Err(why) => {
            end.kill().await;
            if let ClientEnd::Bad(reason) = why {
                let _ = outputs.send(ToClient::Refuse(reason)).await;
            }
        }
    }
}

/// The command's outputs still open, and their buffers.
struct Streams {
    output: Option<SessionOutput>,
    errors: Option<SessionOutput>,
    out_buffer: Vec<u8>,
    err_buffer: Vec<u8>,
}

impl Streams {
    fn open(&self) -> bool {
        self.output.is_some() || self.errors.is_some()
    }

    /// The next frame: bytes of either output, or one's close (it is then forgotten).
    /// Never ready once both are closed.
    async fn next(&mut self) -> Option<ExecStreamingOutput> {
        let Streams {
            output,
            errors,
            out_buffer,
            err_buffer,
        } = self;
        tokio::select! {
            read = read_some(output, out_buffer) => {
                let op = operation(output, read, out_buffer);
                Some(ExecStreamingOutput { stdout: Some(op), ..Default::default() })
            }
            read = read_some(errors, err_buffer) => {
                let op = operation(errors, read, err_buffer);
                Some(ExecStreamingOutput { stderr: Some(op), ..Default::default() })
            }
        }
    }
}

async fn read_some(stream: &mut Option<SessionOutput>, buffer: &mut [u8]) -> Option<usize> {
    match stream {
        Some(stream) => stream.read(buffer).await,
        None => std::future::pending().await,
    }
}

/// Bytes read, or the stream's close (and it is forgotten).
fn operation(
    stream: &mut Option<SessionOutput>,
    read: Option<usize>,
    buffer: &[u8],
) -> ExecStreamingIoOperation {
    match read {
        Some(n) => ExecStreamingIoOperation {
            data: buffer[..n].to_vec(),
            close: false,
        },
        None => {
            *stream = None;
            ExecStreamingIoOperation {
                data: Vec::new(),
                close: true,
            }
        }
    }
}

/// The client's frames, applied to the command's input until the client goes.
async fn apply_inputs(
    mut inputs: mpsc::Receiver<FromClient>,
    mut input: SessionInput,
    ended: mpsc::Sender<ClientEnd>,
) {
    let why = loop {
        let frame = match inputs.recv().await {
            None => break ClientEnd::Gone,
            Some(FromClient::Bad(reason)) => break ClientEnd::Bad(reason),
            Some(FromClient::Input(frame)) => frame,
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
