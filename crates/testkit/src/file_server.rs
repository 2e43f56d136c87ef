//! A small HTTP/1.1 file server on loopback for the artifact tests and bench: each path
//! answers a body, a status, a redirect, or nothing at all (a server that never answers),
//! in turn; the request heads it saw are kept.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the server answers for a path: a body, a status, a redirect, or silence.
#[derive(Clone)]
pub enum Answer {
    Ok(std::sync::Arc<Vec<u8>>),
    Status(u16),
    Redirect(String),
    Silent,
}

impl Answer {
    pub fn body(bytes: impl Into<Vec<u8>>) -> Answer {
        Answer::Ok(Arc::new(bytes.into()))
    }
}

pub struct FileServer {
    /// `http://127.0.0.1:<port>`.
    pub base: String,
    answers: Arc<Mutex<BTreeMap<String, Vec<Answer>>>>,
    /// The request heads it saw.
    pub seen: Arc<Mutex<Vec<String>>>,
}

impl FileServer {
    /// Listens on a loopback port, one thread per connection.
    pub fn start() -> FileServer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let answers: Arc<Mutex<BTreeMap<String, Vec<Answer>>>> = Arc::default();
        let seen: Arc<Mutex<Vec<String>>> = Arc::default();
        let (a, s) = (answers.clone(), seen.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let (a, s) = (a.clone(), s.clone());
                std::thread::spawn(move || {
                    let mut reader = BufReader::new(stream.try_clone().unwrap());
                    let mut head = String::new();
                    loop {
                        let mut line = String::new();
                        if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                            break;
                        }
                        head.push_str(&line);
                    }
                    let path = head.split(' ').nth(1).unwrap_or("/").to_string();
                    s.lock().unwrap().push(head);
                    let answer = {
                        let mut answers = a.lock().unwrap();
                        match answers.get_mut(&path) {
                            Some(list) if list.len() > 1 => list.remove(0),
                            Some(list) => list[0].clone(),
                            None => Answer::Status(404),
                        }
                    };
                    let reply = |status: &str, extra: &str, body: &[u8]| {
                        let mut out = format!(
                            "HTTP/1.1 {status}\r\ncontent-length: {}\r\nconnection: close\r\n{extra}\r\n",
                            body.len()
                        )
                        .into_bytes();
                        out.extend_from_slice(body);
                        out
                    };
                    let bytes = match answer {
                        Answer::Ok(body) => {
                            let head = format!(
                                "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                                body.len()
                            );
                            let _ = stream.write_all(head.as_bytes());
                            let _ = stream.write_all(&body);
                            return;
                        }
                        Answer::Status(code) => reply(&format!("{code} X"), "", b""),
                        Answer::Redirect(to) => {
                            reply("302 Found", &format!("location: {to}\r\n"), b"")
                        }
                        Answer::Silent => {
                            std::thread::sleep(Duration::from_secs(30));
                            return;
                        }
                    };
                    let _ = stream.write_all(&bytes);
                });
            }
        });
        FileServer {
            base,
            answers,
            seen,
        }
    }

    /// Answers `path` with `answers` in turn, the last one from then on; its URL.
    pub fn serve(&self, path: &str, answers: Vec<Answer>) -> String {
        self.answers.lock().unwrap().insert(path.into(), answers);
        format!("{}{path}", self.base)
    }
}
