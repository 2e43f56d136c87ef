//! A hook that misbehaves on request, to show the sandbox holds. The behaviour comes
//! from the hook config's `behave`:
//!
//! - `ok`: adds `HOSTILE_OK=1`.
//! - `loop`: spins forever (stopped at the deadline).
//! - `sleep`: blocks in a WASI sleep for an hour (stopped by the wall-clock bound).
//! - `hog`: allocates until the memory cap.
//! - `trap`: panics.
//! - `flood`: returns 100 000 environment variables.
//! - `escape-dotdot`, `escape-absolute`, `escape-symlink`: asks the host to write a file
//!   at `../escaped`, `/tmp/escaped`, or `link/escaped` (the test plants `local/link`
//!   pointing outside).
//! - `wasi-escape`: tries to reach outside `/local` through WASI itself and reports, as
//!   an event, how many attempts were denied.
//! - `net`: tries to connect to the config's `address` and reports what happened.

use berth_plugin_sdk::export_hook;
use berth_plugin_sdk::hook::{self, File, Hook, PrestartResponse, TaskContext};

struct Hostile;

impl Hook for Hostile {
    fn prestart(context: TaskContext) -> Result<PrestartResponse, String> {
        let behave = hook::lookup(&context.hook_config, "behave").unwrap_or("ok");
        let mut response = hook::response();
        match behave {
            "ok" => response.env.push(("HOSTILE_OK".into(), "1".into())),
            "loop" => {
                let mut n: u64 = 0;
                loop {
                    n = std::hint::black_box(n.wrapping_add(1));
                }
            }
            "sleep" => std::thread::sleep(std::time::Duration::from_secs(3600)),
            "hog" => {
                let mut hoard: Vec<Vec<u8>> = Vec::new();
                loop {
                    hoard.push(vec![1u8; 1 << 20]);
                    std::hint::black_box(&hoard);
                }
            }
            "trap" => panic!("the hostile hook blew up on purpose"),
            "flood" => {
                for i in 0..100_000 {
                    response.env.push((format!("FLOOD_{i}"), "x".repeat(64)));
                }
            }
            "escape-dotdot" | "escape-absolute" | "escape-symlink" => {
                let path = match behave {
                    "escape-dotdot" => "../escaped",
                    "escape-absolute" => "/tmp/escaped",
                    _ => "link/escaped",
                };
                response.files.push(File {
                    path: path.into(),
                    contents: b"escaped".to_vec(),
                });
            }
            "wasi-escape" => {
                let attempts = [
                    "/etc/hostname",
                    "/local/../../../etc/hostname",
                    "/local/link/escaped",
                    "/tmp",
                ];
                let mut escaped = Vec::new();
                for path in attempts {
                    let read = std::fs::read(path).is_ok() || std::fs::read_dir(path).is_ok();
                    let wrote = std::fs::write(path, b"escaped").is_ok();
                    if read || wrote {
                        escaped.push(path);
                    }
                }
                let inside = std::fs::write("/local/inside.txt", b"allowed").is_ok();
                response.events.push(if escaped.is_empty() {
                    format!(
                        "contained: {} attempts outside /local denied; inside write ok: {inside}",
                        attempts.len()
                    )
                } else {
                    format!("ESCAPED through {escaped:?}")
                });
            }
            "net" => {
                let address = hook::lookup(&context.hook_config, "address").unwrap_or("");
                response
                    .events
                    .push(match std::net::TcpStream::connect(address) {
                        Ok(_) => format!("CONNECTED to {address}"),
                        Err(error) => format!("network denied: {error}"),
                    });
            }
            other => return Err(format!("unknown behaviour {other:?}")),
        }
        Ok(response)
    }
}

export_hook!(Hostile);
