//! `berth alloc exec [-task T] [-i] [-t] ID command…`: a command run inside a running
//! task, over Nomad's websocket (`GET /v1/client/allocation/:id/exec`, its JSON frames).
//!
//! As Nomad's CLI: stdin is passed unless `-i=false`; a terminal is used when stdin is
//! one, unless `-t=false` (and `-t` asks for one anyway). With a terminal, the local one
//! is put in raw mode for the session (restored however it ends), its size is sent
//! first and again on each SIGWINCH. The exit status is the command's.

use std::process::ExitCode;

use berth_api::client::{Client, WebSocket, WebSocketMessage};
use berth_nomad_api::exec::{
    ExecStreamingInput, ExecStreamingIoOperation, ExecStreamingOutput, TerminalSize,
};
use futures_util::{SinkExt as _, StreamExt as _};
use tokio::io::AsyncReadExt as _;

use super::nomad_shapes::{path_escape, resolve_alloc};
use super::output::write_session_output;

/// How often the client sends a heartbeat (`{}`), as Nomad's does.
const HEARTBEAT_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// What the user asked.
pub(super) struct ExecArgs<'a> {
    pub id: &'a str,
    pub task: Option<&'a str>,
    pub stdin: bool,
    pub tty: Option<bool>,
    pub command: &'a [String],
}

pub(super) async fn exec(client: &Client, args: ExecArgs<'_>) -> anyhow::Result<ExitCode> {
    let id = resolve_alloc(client, args.id).await?;
    let stdin_is_terminal = rustix::termios::isatty(std::io::stdin());
    let tty = args.tty.unwrap_or(args.stdin && stdin_is_terminal);
    let command = serde_json::to_string(args.command)?;
    let mut path = format!(
        "/v1/client/allocation/{}/exec?command={}&tty={tty}",
        path_escape(&id),
        path_escape(&command)
    );
    if let Some(task) = args.task {
        path.push_str(&format!("&task={}", path_escape(task)));
    }
    let socket = client.websocket(&path).await?;
    // Raw only once the session is open: a refusal prints as usual.
    let _raw = match tty && stdin_is_terminal {
        true => Some(RawTerminal::enter()?),
        false => None,
    };
    carry(socket, args.stdin, tty).await
}

async fn carry(socket: WebSocket, pass_stdin: bool, tty: bool) -> anyhow::Result<ExitCode> {
    let (mut sink, mut stream) = socket.split();
    let (frames, mut to_send) = tokio::sync::mpsc::channel::<ExecStreamingInput>(16);
    if tty && let Some(size) = local_size() {
        frames.try_send(size_frame(size)).ok();
    }
    let mut tasks = tokio::task::JoinSet::new();
    if pass_stdin {
        tasks.spawn(send_stdin(frames.clone()));
    } else {
        frames.try_send(stdin_closed()).ok();
    }
    if tty {
        tasks.spawn(send_sizes(frames.clone()));
    }
    tasks.spawn(heartbeats(frames));
    // A command that exits at once may have its exit, and the agent's close, on the way
    // while this side still sends (its stdin's end, a heartbeat): a send that fails stops
    // the sending, and what the agent sent is still read to its end.
    let mut sending = true;
    let code = loop {
        tokio::select! {
            Some(frame) = to_send.recv(), if sending => {
                let text = serde_json::to_string(&frame)?;
                if sink.send(WebSocketMessage::Text(text.into())).await.is_err() {
                    sending = false;
                }
            }
            message = stream.next() => {
                let text = match message {
                    Some(Ok(WebSocketMessage::Text(text))) => text,
                    Some(Ok(WebSocketMessage::Close(frame))) => {
                        let reason = frame.map(|f| f.reason.to_string()).unwrap_or_default();
                        anyhow::bail!("the agent ended the session before the command exited{}",
                            if reason.is_empty() { String::new() } else { format!(": {reason}") });
                    }
                    Some(Ok(_)) => continue,
                    Some(Err(error)) => anyhow::bail!("the session broke: {error}"),
                    None => anyhow::bail!("the agent's connection ended before the command exited"),
                };
                let frame: ExecStreamingOutput = serde_json::from_str(text.as_str())
                    .map_err(|e| anyhow::format_err!("the agent sent a frame that is not Nomad's: {e}"))?;
                if let Some(out) = frame.stdout {
                    write_session_output(&out.data, false, tty)?;
                }
                if let Some(err) = frame.stderr {
                    write_session_output(&err.data, true, tty)?;
                }
                if frame.exited {
                    break frame.result.map_or(1, |r| r.exit_code);
                }
            }
        }
    };
    tasks.abort_all();
    let _ = sink.send(WebSocketMessage::Close(None)).await;
    // A code outside a process's (the agent's -1: the command's end unknown) is a failure.
    Ok(ExitCode::from(u8::try_from(code).unwrap_or(1)))
}

fn stdin_closed() -> ExecStreamingInput {
    ExecStreamingInput {
        stdin: Some(ExecStreamingIoOperation {
            data: Vec::new(),
            close: true,
        }),
        tty_size: None,
    }
}

fn size_frame(size: TerminalSize) -> ExecStreamingInput {
    ExecStreamingInput {
        stdin: None,
        tty_size: Some(size),
    }
}

/// Stdin, as it comes, then its end.
async fn send_stdin(frames: tokio::sync::mpsc::Sender<ExecStreamingInput>) {
    let mut stdin = tokio::io::stdin();
    let mut buffer = vec![0u8; 16 << 10];
    loop {
        let frame = match stdin.read(&mut buffer).await {
            Ok(0) | Err(_) => stdin_closed(),
            Ok(n) => ExecStreamingInput {
                stdin: Some(ExecStreamingIoOperation {
                    data: buffer[..n].to_vec(),
                    close: false,
                }),
                tty_size: None,
            },
        };
        let last = frame.stdin.as_ref().is_some_and(|s| s.close);
        if frames.send(frame).await.is_err() || last {
            return;
        }
    }
}

/// The local terminal's size, again on each SIGWINCH.
async fn send_sizes(frames: tokio::sync::mpsc::Sender<ExecStreamingInput>) {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut resized) = signal(SignalKind::window_change()) else {
        return;
    };
    while resized.recv().await.is_some() {
        if let Some(size) = local_size()
            && frames.send(size_frame(size)).await.is_err()
        {
            return;
        }
    }
}

async fn heartbeats(frames: tokio::sync::mpsc::Sender<ExecStreamingInput>) {
    let mut every = tokio::time::interval(HEARTBEAT_EVERY);
    every.tick().await;
    loop {
        every.tick().await;
        if frames.send(ExecStreamingInput::default()).await.is_err() {
            return;
        }
    }
}

fn local_size() -> Option<TerminalSize> {
    let size = rustix::termios::tcgetwinsize(std::io::stdin()).ok()?;
    Some(TerminalSize {
        height: size.ws_row,
        width: size.ws_col,
    })
}

/// The local terminal in raw mode (keys go to the command as typed: ^C is the
/// command's), restored when dropped.
struct RawTerminal {
    before: rustix::termios::Termios,
}

impl RawTerminal {
    fn enter() -> anyhow::Result<RawTerminal> {
        use rustix::termios::{OptionalActions, tcgetattr, tcsetattr};
        let stdin = std::io::stdin();
        let before = tcgetattr(&stdin)?;
        let mut raw = before.clone();
        raw.make_raw();
        tcsetattr(&stdin, OptionalActions::Now, &raw)?;
        Ok(RawTerminal { before })
    }
}

impl Drop for RawTerminal {
    fn drop(&mut self) {
        let _ = rustix::termios::tcsetattr(
            std::io::stdin(),
            rustix::termios::OptionalActions::Now,
            &self.before,
        );
    }
}
