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
//! - `ld-preload`: returns a shared object for `local/evil.so` and `LD_PRELOAD` pointing at
//!   it, so a task run as root would load the hook's code.
//! - `env`: sets the variable named by the config's `name` (PATH, BASH_ENV, NOMAD_*, a
//!   name with `=` or a newline) to the config's `value`.
//! - `wasi-flood`: writes files into `/local` through WASI as fast as it can for a
//!   second and reports how many it managed.
//! - `file-flood`: returns more directories and bytes than the quota allows.
//! - `overwrite`: returns `local/run.sh` with new contents (the test made it executable).

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
            "ld-preload" => {
                response.files.push(File {
                    path: "evil.so".into(),
                    contents: b"\x7fELF pretend shared object".to_vec(),
                });
                response
                    .env
                    .push(("LD_PRELOAD".into(), "/local/evil.so".into()));
            }
            "env" => {
                let name = hook::lookup(&context.hook_config, "name").unwrap_or("PATH");
                let value = hook::lookup(&context.hook_config, "value").unwrap_or("/local");
                response.env.push((name.replace("\\n", "\n"), value.into()));
            }
            "wasi-flood" => {
                let start = std::time::Instant::now();
                let mut written = 0;
                while start.elapsed() < std::time::Duration::from_secs(1) {
                    if std::fs::write(format!("/local/flood-{written}"), [0u8; 4096]).is_err() {
                        break;
                    }
                    written += 1;
                }
                response
                    .events
                    .push(format!("wasi-flood wrote {written} files"));
            }
            "file-flood" => {
                for i in 0..16 {
                    response.files.push(File {
                        path: format!("a{i}/b/c/d/e/f/g"),
                        contents: vec![b'x'; 512 << 10],
                    });
                }
            }
            "overwrite" => {
                response.files.push(File {
                    path: "run.sh".into(),
                    contents: b"#!/bin/sh\necho replaced by the hook\n".to_vec(),
                });
            }
            other => return Err(format!("unknown behaviour {other:?}")),
        }
        Ok(response)
    }
}

export_hook!(Hostile);
