//! The checks berth runs itself (every check of a provider "nomad" service, as Nomad's
//! client does): an http check is a GET (2xx passes, 429 warns, anything else fails), a
//! tcp check a connection, a grpc check the gRPC health protocol's Check (SERVING
//! passes), a script check a command run inside its task (the task
//! runner's `checks_hook`: exit 0 passes, 1 warns, anything else or its timeout fails).
//! Their latest results are kept per alloc, as Nomad's `GET
//! /v1/client/allocation/:id/checks` shows them.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use http_body_util::{BodyExt, Empty, Limited};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;

/// How a check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    Passing,
    Warning,
    Critical,
}

/// One run of a check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub health: Health,
    /// What it said (a response's start, a script's output, why it failed).
    pub output: String,
    /// An http check's status code.
    pub status_code: Option<u16>,
}

/// A check's latest result, with what it belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckResult {
    pub id: String,
    pub check: String,
    pub service: String,
    pub group: String,
    pub task: String,
    pub outcome: Outcome,
    /// Seconds since the Unix epoch.
    pub timestamp: u64,
}

/// The most of a response or a script's output a result keeps.
pub const OUTPUT_LIMIT: usize = 4096;

/// The latest result of every check berth runs, by alloc and check id.
#[derive(Debug, Default)]
pub struct CheckResults(Mutex<BTreeMap<String, BTreeMap<String, CheckResult>>>);

impl CheckResults {
    pub fn record(&self, alloc: &str, result: CheckResult) {
        let mut all = self.0.lock().unwrap();
        all.entry(alloc.to_string())
            .or_default()
            .insert(result.id.clone(), result);
    }

    pub fn of_alloc(&self, alloc: &str) -> Vec<CheckResult> {
        let all = self.0.lock().unwrap();
        all.get(alloc)
            .map(|checks| checks.values().cloned().collect())
            .unwrap_or_default()
    }

    pub fn forget_alloc(&self, alloc: &str) {
        self.0.lock().unwrap().remove(alloc);
    }

    /// How the checks of service `service` of `alloc` (of `task`, or its group's) stand:
    /// "passing", or the first that is not ("warning: x", "critical: x"); `None` when
    /// berth runs none for it.
    pub fn summary(&self, alloc: &str, service: &str, task: Option<&str>) -> Option<String> {
        let all = self.0.lock().unwrap();
        let results: Vec<&CheckResult> = all
            .get(alloc)?
            .values()
            .filter(|r| r.service == service && task.is_none_or(|t| r.task == t))
            .collect();
        if results.is_empty() {
            return None;
        }
        let worst = results.iter().max_by_key(|r| match r.outcome.health {
            Health::Passing => 0,
            Health::Warning => 1,
            Health::Critical => 2,
        })?;
        Some(match worst.outcome.health {
            Health::Passing => "passing".into(),
            Health::Warning => format!("warning: {}", worst.check),
            Health::Critical => format!("critical: {}", worst.check),
        })
    }

    /// Forgets a task's results (it stopped; a restart runs its checks anew).
    pub fn forget_task(&self, alloc: &str, task: &str) {
        let mut all = self.0.lock().unwrap();
        if let Some(checks) = all.get_mut(alloc) {
            checks.retain(|_, result| result.task != task);
            if checks.is_empty() {
                all.remove(alloc);
            }
        }
    }
}

fn cut(text: &[u8]) -> String {
    let text = String::from_utf8_lossy(&text[..text.len().min(OUTPUT_LIMIT)]);
    text.trim().to_string()
}

/// Why an http check got no answer to judge.
#[derive(Debug, thiserror::Error)]
enum ProbeError {
    #[error("not a URL: {0}")]
    Url(#[from] hyper::http::uri::InvalidUri),
    #[error("berth runs http checks over plain http only")]
    NotHttp,
    #[error("the URL has no host")]
    NoHost,
    #[error("not an HTTP method")]
    Method,
    #[error("{0}")]
    Connect(#[from] std::io::Error),
    #[error("{0}")]
    Http(#[from] hyper::Error),
    #[error("{0}")]
    Request(#[from] hyper::http::Error),
}

fn critical(output: String) -> Outcome {
    Outcome {
        health: Health::Critical,
        output,
        status_code: None,
    }
}

/// A GET (or `method`) of `url` (`http://host:port/path`), within `timeout`.
pub async fn http(url: &str, method: Option<&str>, timeout: Duration) -> Outcome {
    match tokio::time::timeout(timeout, http_once(url, method)).await {
        Ok(Ok(outcome)) => outcome,
        Ok(Err(reason)) => critical(format!("{url}: {reason}")),
        Err(_) => critical(format!("{url}: no answer within {timeout:?}")),
    }
}

async fn http_once(url: &str, method: Option<&str>) -> Result<Outcome, ProbeError> {
    let uri: hyper::Uri = url.parse()?;
    if uri.scheme_str() != Some("http") {
        return Err(ProbeError::NotHttp);
    }
    let host = uri.host().ok_or(ProbeError::NoHost)?;
    let port = uri.port_u16().unwrap_or(80);
    let address = format!(
        "{}:{port}",
        host.trim_start_matches('[').trim_end_matches(']')
    );
    let stream = tokio::net::TcpStream::connect(&address).await?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    let method_name = method.unwrap_or("GET");
    let method =
        hyper::Method::from_bytes(method_name.as_bytes()).map_err(|_| ProbeError::Method)?;
    let authority = uri
        .authority()
        .map(|a| a.as_str().to_string())
        .unwrap_or_default();
    let request = hyper::Request::builder()
        .method(method)
        .uri(uri.path_and_query().map_or("/", |p| p.as_str()))
        .header(hyper::header::HOST, authority)
        .header(hyper::header::USER_AGENT, "berth health check")
        .body(Empty::<Bytes>::new())?;
    let response = sender.send_request(request).await?;
    let status = response.status();
    // Only the start of a body is kept; the rest is not read.
    let body = Limited::new(response.into_body(), OUTPUT_LIMIT)
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let health = if status.is_success() {
        Health::Passing
    } else if status.as_u16() == 429 {
        Health::Warning
    } else {
        Health::Critical
    };
    Ok(Outcome {
        health,
        output: format!("HTTP {method_name} {url}: {status} Output: {}", cut(&body)),
        status_code: Some(status.as_u16()),
    })
}

/// A TCP connection to `address` (`host:port`), within `timeout`.
pub async fn tcp(address: &str, timeout: Duration) -> Outcome {
    let bare = address.replace(['[', ']'], "");
    match tokio::time::timeout(timeout, tokio::net::TcpStream::connect(&bare)).await {
        Ok(Ok(_)) => Outcome {
            health: Health::Passing,
            output: format!("TCP connect {address}: Success"),
            status_code: None,
        },
        Ok(Err(error)) => critical(format!("TCP connect {address}: {error}")),
        Err(_) => critical(format!(
            "TCP connect {address}: no answer within {timeout:?}"
        )),
    }
}

/// A gRPC health check of `service` at `address` (`host:port`, plaintext gRPC):
/// SERVING passes; any other answer, or none within `timeout`, fails.
pub async fn grpc(address: &str, service: &str, timeout: Duration) -> Outcome {
    use berth_csi::grpc_health::{Serving, check};
    let Ok(target) = address.parse::<std::net::SocketAddr>() else {
        return critical(format!(
            "gRPC check of {address:?}: not an address and port"
        ));
    };
    let shown = match service {
        "" => address.to_string(),
        service => format!("{address}/{service}"),
    };
    match check(target, service, timeout).await {
        Ok(Serving::Serving) => Outcome {
            health: Health::Passing,
            output: format!("gRPC check {shown}: success"),
            status_code: None,
        },
        Ok(other) => critical(format!("gRPC check {shown}: {other:?}")),
        Err(error) => critical(format!("gRPC check {shown}: {error}")),
    }
}

/// A script that could not be run, as a check's outcome.
pub fn script_not_run(why: impl std::fmt::Display) -> Outcome {
    critical(why.to_string())
}

/// A script's end as a check's outcome.
pub fn script(ran: &berth_sys::process::enter::Ran, timeout: Duration) -> Outcome {
    match ran {
        ran if ran.timed_out => Outcome {
            health: Health::Critical,
            output: format!(
                "did not end within its timeout of {timeout:?}: {}",
                cut(&ran.output)
            ),
            status_code: None,
        },
        ran => Outcome {
            health: match ran.status.code {
                Some(0) => Health::Passing,
                Some(1) => Health::Warning,
                _ => Health::Critical,
            },
            output: cut(&ran.output),
            status_code: None,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn http_and_tcp_checks_say_how_they_went() {
        let server = berth_testkit::file_server::FileServer::start();
        let ok = server.serve(
            "/health",
            vec![berth_testkit::file_server::Answer::body(&b"all good"[..])],
        );
        let busy = server.serve(
            "/busy",
            vec![berth_testkit::file_server::Answer::Status(429)],
        );
        let bad = server.serve(
            "/bad",
            vec![berth_testkit::file_server::Answer::Status(500)],
        );
        let second = Duration::from_secs(1);
        let outcome = http(&ok, None, second).await;
        assert_eq!(
            (outcome.health, outcome.status_code),
            (Health::Passing, Some(200))
        );
        assert!(outcome.output.ends_with("all good"), "{}", outcome.output);
        assert_eq!(http(&busy, None, second).await.health, Health::Warning);
        assert_eq!(http(&bad, None, second).await.health, Health::Critical);
        let silent = server.serve("/silent", vec![berth_testkit::file_server::Answer::Silent]);
        let outcome = http(&silent, None, Duration::from_millis(200)).await;
        assert!(
            outcome.output.ends_with("no answer within 200ms"),
            "{}",
            outcome.output
        );
        let address = server.base.trim_start_matches("http://");
        assert_eq!(tcp(address, second).await.health, Health::Passing);
        // A port nothing listens on.
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = closed.local_addr().unwrap().port();
        drop(closed);
        let outcome = tcp(&format!("127.0.0.1:{port}"), second).await;
        assert_eq!(outcome.health, Health::Critical);
        assert!(outcome.output.contains("refused"), "{}", outcome.output);
    }
}
