//! One `GET`, streamed into a file while its digest is taken: HTTP/1.1 over TCP, or TLS
//! (rustls, the system's roots, `SSL_CERT_FILE` honoured) for `https://`. Redirects are
//! followed (at most 10, never from https down to http, the artifact's headers never sent
//! to another host); a refused connection, a reset or a 5xx answer is tried again (three
//! tries, 1 s then 2 s apart); the whole of it stops at the operator's `http_read_timeout`
//! and its size at `http_max_size`.

use std::io::Write;
use std::time::Duration;

use berth_jobspec::artifact::{ChecksumKind, FetchPlan};
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use crate::Limits;

#[derive(Debug, thiserror::Error)]
pub enum DownloadError {
    #[error("GET {url}: {status}")]
    Status { url: String, status: u16 },
    #[error("GET {url}: {reason}")]
    Failed { url: String, reason: String },
    #[error("GET {url}: no answer within {after:?} (the agent's artifact http_read_timeout)")]
    TimedOut { url: String, after: Duration },
    #[error("GET {url}: more than {limit} bytes (the agent's artifact http_max_size)")]
    TooLarge { url: String, limit: u64 },
    #[error("GET {url}: more than 10 redirects")]
    Redirects { url: String },
    #[error("GET {url}: redirected from https to {to}, which berth does not follow")]
    Downgrade { url: String, to: String },
    #[error("writing the download: {0}")]
    Write(#[source] std::io::Error),
}

/// What was fetched: its size and its digest in the plan's checksum kind (sha256 when the
/// plan has none).
#[derive(Debug)]
pub struct Downloaded {
    pub bytes: u64,
    pub digest: Vec<u8>,
}

enum Hasher {
    Md5(md5::Md5),
    Sha1(sha1::Sha1),
    Sha256(sha2::Sha256),
    Sha512(sha2::Sha512),
}

impl Hasher {
    fn new(kind: ChecksumKind) -> Hasher {
        use sha2::Digest;
        match kind {
            ChecksumKind::Md5 => Hasher::Md5(md5::Md5::new()),
            ChecksumKind::Sha1 => Hasher::Sha1(sha1::Sha1::new()),
            ChecksumKind::Sha256 => Hasher::Sha256(sha2::Sha256::new()),
            ChecksumKind::Sha512 => Hasher::Sha512(sha2::Sha512::new()),
        }
    }

    fn update(&mut self, bytes: &[u8]) {
        use sha2::Digest;
        match self {
            Hasher::Md5(h) => h.update(bytes),
            Hasher::Sha1(h) => h.update(bytes),
            Hasher::Sha256(h) => h.update(bytes),
            Hasher::Sha512(h) => h.update(bytes),
        }
    }

    fn finish(self) -> Vec<u8> {
        use sha2::Digest;
        match self {
            Hasher::Md5(h) => h.finalize().to_vec(),
            Hasher::Sha1(h) => h.finalize().to_vec(),
            Hasher::Sha256(h) => h.finalize().to_vec(),
            Hasher::Sha512(h) => h.finalize().to_vec(),
        }
    }
}

type HttpsClient = Client<
    hyper_rustls::HttpsConnector<
        hyper_util::client::legacy::connect::HttpConnector<crate::networks::Guarded>,
    >,
    Empty<Bytes>,
>;

fn client(url: &str, limits: &Limits) -> Result<HttpsClient, DownloadError> {
    let url = shown(url);
    let mut http = hyper_util::client::legacy::connect::HttpConnector::new_with_resolver(
        crate::networks::Guarded {
            denied: limits.denied_networks.clone(),
        },
    );
    http.enforce_http(false);
    http.set_connect_timeout(Some(Duration::from_secs(30)));
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_native_roots()
        .map_err(|e| DownloadError::Failed {
            url: shown(&url.to_string()),
            reason: format!("reading the system's TLS roots: {e}"),
        })?
        .https_or_http()
        .enable_http1()
        .wrap_connector(http);
    Ok(Client::builder(TokioExecutor::new()).build(connector))
}

const TRIES: u32 = 3;

/// Fetches `plan.url` into `file` (truncated at each try), within `limits`.
pub async fn get(
    plan: &FetchPlan,
    file: std::fs::File,
    limits: &Limits,
) -> Result<Downloaded, DownloadError> {
    let whole = limits.read_timeout;
    match tokio::time::timeout(whole, tries(plan, file, limits)).await {
        Ok(result) => result,
        Err(_) => Err(DownloadError::TimedOut {
            url: shown(&plan.url),
            after: whole,
        }),
    }
}

async fn tries(
    plan: &FetchPlan,
    mut file: std::fs::File,
    limits: &Limits,
) -> Result<Downloaded, DownloadError> {
    let client = client(&plan.url, limits)?;
    let mut attempt = 0;
    loop {
        attempt += 1;
        file.set_len(0).map_err(DownloadError::Write)?;
        use std::io::Seek;
        file.rewind().map_err(DownloadError::Write)?;
        match once(&client, plan, &mut file, limits).await {
            Err(Retry::Again(error)) if attempt < TRIES => {
                tracing::info!(url = %shown(&plan.url), %error, attempt, "artifact download failed; trying again");
                tokio::time::sleep(Duration::from_secs(u64::from(attempt))).await;
            }
            Err(Retry::Again(error) | Retry::Final(error)) => return Err(error),
            Ok(done) => return Ok(done),
        }
    }
}

enum Retry {
    Again(DownloadError),
    Final(DownloadError),
}

fn origin(url: &hyper::Uri) -> (Option<&str>, Option<&str>, Option<u16>) {
    (url.scheme_str(), url.host(), url.port_u16())
}

async fn once(
    client: &HttpsClient,
    plan: &FetchPlan,
    file: &mut std::fs::File,
    limits: &Limits,
) -> Result<Downloaded, Retry> {
    let first: hyper::Uri = plan
        .url
        .parse()
        .map_err(|e: hyper::http::uri::InvalidUri| {
            Retry::Final(DownloadError::Failed {
                url: shown(&plan.url),
                reason: e.to_string(),
            })
        })?;
    let mut url = first.clone();
    let mut redirects = 0;
    let response = loop {
        let failed = |reason: String| DownloadError::Failed {
            url: shown(&url.to_string()),
            reason,
        };
        // An address written as such is not resolved: checked here, a redirect's too.
        if let Some(ip) = url
            .host()
            .and_then(|h| h.trim_start_matches('[').trim_end_matches(']').parse().ok())
            && let Some(network) = crate::networks::denied_by(&limits.denied_networks, ip)
        {
            return Err(Retry::Final(failed(format!(
                "{ip} is in {network} (the agent's artifact denied_networks)"
            ))));
        }
        let mut request = hyper::Request::get(url.clone());
        // Headers go to the origin the job named, and only there.
        if origin(&url) == origin(&first) {
            for (name, value) in &plan.headers {
                request = request.header(name.as_str(), value.as_str());
            }
        }
        let request = request
            .header(hyper::header::USER_AGENT, "berth-artifact")
            .body(Empty::<Bytes>::new())
            .map_err(|e| Retry::Final(failed(e.to_string())))?;
        let response = client.request(request).await.map_err(|e| {
            use std::error::Error;
            let mut reason = e.to_string();
            let mut source = e.source();
            while let Some(inner) = source {
                reason = format!("{reason}: {inner}");
                source = inner.source();
            }
            // Connection-level failures may be passing (a restarting server).
            Retry::Again(failed(reason))
        })?;
        let status = response.status();
        if status.is_redirection() {
            let to = response
                .headers()
                .get(hyper::header::LOCATION)
                .and_then(|v| v.to_str().ok())
                .ok_or_else(|| Retry::Final(failed(format!("{status} without a Location"))))?;
            let next = resolve(&url, to).ok_or_else(|| {
                Retry::Final(failed(format!("{status} to {to:?}, which is not a URL")))
            })?;
            if url.scheme_str() == Some("https") && next.scheme_str() != Some("https") {
                return Err(Retry::Final(DownloadError::Downgrade {
                    url: shown(&plan.url),
                    to: shown(&next.to_string()),
                }));
            }
            redirects += 1;
            if redirects > 10 {
                return Err(Retry::Final(DownloadError::Redirects {
                    url: shown(&plan.url),
                }));
            }
            url = next;
            continue;
        }
        if !status.is_success() {
            let error = DownloadError::Status {
                url: shown(&url.to_string()),
                status: status.as_u16(),
            };
            return Err(if status.is_server_error() || status.as_u16() == 429 {
                Retry::Again(error)
            } else {
                Retry::Final(error)
            });
        }
        break response;
    };
    let too_large = || DownloadError::TooLarge {
        url: shown(&plan.url),
        limit: limits.max_download,
    };
    if let Some(length) = response
        .headers()
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
        && length > limits.max_download
    {
        return Err(Retry::Final(too_large()));
    }
    let mut hasher = Hasher::new(
        plan.checksum
            .as_ref()
            .map_or(ChecksumKind::Sha256, |c| c.kind),
    );
    let mut bytes = 0u64;
    let mut body = response.into_body();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| {
            Retry::Again(DownloadError::Failed {
                url: shown(&plan.url),
                reason: format!("reading the body: {e}"),
            })
        })?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        bytes += data.len() as u64;
        if bytes > limits.max_download {
            return Err(Retry::Final(too_large()));
        }
        hasher.update(&data);
        file.write_all(&data)
            .map_err(|e| Retry::Final(DownloadError::Write(e)))?;
    }
    Ok(Downloaded {
        bytes,
        digest: hasher.finish(),
    })
}

/// A URL as events and logs show it: without its user, password and query (which may
/// hold a token or a signature).
pub fn shown(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let rest = rest.split(['?', '#']).next().unwrap_or("");
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let host = authority.rsplit('@').next().unwrap_or("");
    let query = if url.contains('?') { "?…" } else { "" };
    format!("{scheme}://{host}{path}{query}")
}

/// A `Location` read against the URL it answered.
fn resolve(base: &hyper::Uri, location: &str) -> Option<hyper::Uri> {
    if location.starts_with("http://") || location.starts_with("https://") {
        return location.parse().ok();
    }
    let scheme = base.scheme_str()?;
    let authority = base.authority()?.as_str();
    if let Some(rest) = location.strip_prefix("//") {
        return format!("{scheme}://{rest}").parse().ok();
    }
    let path = if location.starts_with('/') {
        location.to_string()
    } else {
        let current = base.path();
        let dir = &current[..current.rfind('/').map_or(0, |i| i + 1)];
        format!("{dir}{location}")
    };
    format!("{scheme}://{authority}{path}").parse().ok()
}
