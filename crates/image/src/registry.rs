//! One repository of an OCI-distribution registry, read over HTTP/1.1: manifests and
//! blobs by `GET /v2/<repository>/{manifests,blobs}/<ref>`. HTTPS (rustls, the system's
//! roots), or plain HTTP to this machine and to the operator's `insecure_registries`.
//! A `401` is answered as the registry's challenge asks: a token from its realm
//! (`Bearer`, the credentials sent there as Basic auth), or the credentials themselves
//! (`Basic`). A blob's redirect (to a storage service) is followed without the
//! registry's `Authorization`, never from https down to http. Every connection goes
//! through the operator's denied networks ([`berth_artifact::networks`]).

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use sha2::Digest;

use crate::reference::Reference;
use berth_artifact::networks::{Guarded, Network};

/// The largest manifest or index read (Docker's own limit is 4 MiB).
pub const MAX_MANIFEST: u64 = 4 << 20;
/// The largest token answer read.
const MAX_TOKEN_ANSWER: u64 = 64 << 10;

pub const ACCEPTED_MANIFESTS: &str = "application/vnd.oci.image.index.v1+json, \
    application/vnd.docker.distribution.manifest.list.v2+json, \
    application/vnd.oci.image.manifest.v1+json, \
    application/vnd.docker.distribution.manifest.v2+json";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credentials {
    pub username: String,
    pub password: String,
}

#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("{url}: {reason}")]
    Failed { url: String, reason: String },
    #[error("{url}: the registry answered {status}{hint}")]
    Status {
        url: String,
        status: u16,
        hint: &'static str,
    },
    #[error("{url}: more than {limit} bytes")]
    TooLarge { url: String, limit: u64 },
    #[error("{url}: the registry sent {got}, not the {expected} asked for")]
    DigestMismatch {
        url: String,
        expected: String,
        got: String,
    },
    #[error(
        "{registry} is not on this machine and not in the agent's image insecure_registries, \
         and berth speaks only HTTPS to it"
    )]
    Insecure { registry: String },
    #[error("{url}: {ip} is in {network} (the agent's image denied_networks)")]
    Denied {
        url: String,
        ip: std::net::IpAddr,
        network: Network,
    },
    #[error("writing a blob: {0}")]
    Write(#[source] std::io::Error),
}

type HttpsClient = Client<
    hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector<Guarded>>,
    Empty<Bytes>,
>;

/// A repository of a registry, with what its challenge asked for.
pub struct Registry {
    client: HttpsClient,
    base: String,
    repository: String,
    credentials: Option<Credentials>,
    /// `Authorization` for the registry, once a challenge was answered.
    authorization: Option<String>,
    /// Whether the registry asked for authentication and the task's credentials were
    /// given: the image may be private to who holds them.
    sent_credentials: bool,
    denied: Arc<[Network]>,
}

/// sha256 of `bytes` as `sha256:<hex>`.
pub fn digest_of(bytes: &[u8]) -> String {
    format!("sha256:{}", hex(&sha2::Sha256::digest(bytes)))
}

pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

impl Registry {
    pub fn new(
        reference: &Reference,
        credentials: Option<Credentials>,
        insecure: &[String],
        denied: Arc<[Network]>,
    ) -> Result<Registry, RegistryError> {
        let plain = reference.is_loopback() || insecure.contains(&reference.registry);
        let scheme = if plain { "http" } else { "https" };
        let mut http =
            hyper_util::client::legacy::connect::HttpConnector::new_with_resolver(Guarded {
                denied: denied.clone(),
            });
        http.enforce_http(false);
        http.set_connect_timeout(Some(Duration::from_secs(30)));
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_native_roots()
            .map_err(|e| RegistryError::Failed {
                url: reference.registry.clone(),
                reason: format!("reading the system's TLS roots: {e}"),
            })?
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        Ok(Registry {
            client: Client::builder(TokioExecutor::new()).build(connector),
            base: format!("{scheme}://{}", reference.api_host()),
            repository: reference.repository.clone(),
            credentials,
            authorization: None,
            sent_credentials: false,
            denied,
        })
    }

    /// Whether the registry asked for authentication and was given the task's
    /// credentials.
    pub fn sent_credentials(&self) -> bool {
        self.sent_credentials
    }

    /// The manifest (or index) `reference` names, its media type and its digest (taken
    /// of the bytes received; when `reference` is a digest, it must be that).
    pub async fn manifest(
        &mut self,
        reference: &str,
    ) -> Result<(Vec<u8>, String, String), RegistryError> {
        let url = format!("{}/v2/{}/manifests/{reference}", self.base, self.repository);
        let response = self.get(&url, Some(ACCEPTED_MANIFESTS)).await?;
        let media_type = response
            .headers()
            .get(hyper::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        let body = read_bounded(&url, response, MAX_MANIFEST).await?;
        let digest = digest_of(&body);
        if crate::reference::is_digest(reference) && digest != reference {
            return Err(RegistryError::DigestMismatch {
                url,
                expected: reference.to_string(),
                got: digest,
            });
        }
        Ok((body, media_type, digest))
    }

    /// The blob `digest`, written to `file` as it arrives, at most `limit` bytes; its
    /// digest checked once it is whole. `progress` hears the bytes so far.
    pub async fn blob(
        &mut self,
        digest: &str,
        file: &mut std::fs::File,
        limit: u64,
        progress: &mut (dyn FnMut(u64) + Send),
    ) -> Result<u64, RegistryError> {
        let url = format!("{}/v2/{}/blobs/{digest}", self.base, self.repository);
        let response = self.get(&url, None).await?;
        let too_large = || RegistryError::TooLarge {
            url: url.clone(),
            limit,
        };
        if let Some(length) = content_length(&response)
            && length > limit
        {
            return Err(too_large());
        }
        let mut hasher = sha2::Sha256::new();
        let mut bytes = 0u64;
        let mut body = response.into_body();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| RegistryError::Failed {
                url: url.clone(),
                reason: format!("reading the body: {e}"),
            })?;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            bytes += data.len() as u64;
            if bytes > limit {
                return Err(too_large());
            }
            hasher.update(&data);
            file.write_all(&data).map_err(RegistryError::Write)?;
            progress(bytes);
        }
        let got = format!("sha256:{}", hex(&hasher.finalize()));
        if got != digest {
            return Err(RegistryError::DigestMismatch {
                url,
                expected: digest.to_string(),
                got,
            });
        }
        Ok(bytes)
    }

    /// `GET url`, answering one challenge and following redirects (at most 5).
    async fn get(
        &mut self,
        url: &str,
        accept: Option<&str>,
    ) -> Result<hyper::Response<hyper::body::Incoming>, RegistryError> {
        let mut current = url.to_string();
        let mut challenged = false;
        for _ in 0..6 {
            let same_origin = current.starts_with(&format!("{}/", self.base));
            let authorization = if same_origin {
                self.authorization.clone()
            } else {
                None
            };
            let response = self
                .send(&current, accept, authorization.as_deref())
                .await?;
            let status = response.status();
            if status == hyper::StatusCode::UNAUTHORIZED && same_origin && !challenged {
                challenged = true;
                let challenge = response
                    .headers()
                    .get(hyper::header::WWW_AUTHENTICATE)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_string();
                self.authorization = Some(self.answer(&current, &challenge).await?);
                self.sent_credentials |= self.credentials.is_some();
                continue;
            }
            if status.is_redirection() {
                let to = response
                    .headers()
                    .get(hyper::header::LOCATION)
                    .and_then(|v| v.to_str().ok())
                    .ok_or_else(|| RegistryError::Failed {
                        url: current.clone(),
                        reason: format!("{status} without a Location"),
                    })?;
                let next = if to.starts_with('/') {
                    let origin_end = current[8..].find('/').map_or(current.len(), |i| i + 8);
                    format!("{}{to}", &current[..origin_end])
                } else {
                    to.to_string()
                };
                if current.starts_with("https://") && !next.starts_with("https://") {
                    return Err(RegistryError::Failed {
                        url: current,
                        reason: "redirected from https to http, which berth does not follow".into(),
                    });
                }
                current = next;
                continue;
            }
            if !status.is_success() {
                let hint = match status.as_u16() {
                    401 | 403 => " (the credentials are missing or refused: the task's auth block)",
                    404 => " (no such image, tag or digest in this repository)",
                    _ => "",
                };
                return Err(RegistryError::Status {
                    url: current,
                    status: status.as_u16(),
                    hint,
                });
            }
            return Ok(response);
        }
        Err(RegistryError::Failed {
            url: url.to_string(),
            reason: "more than 5 redirects".into(),
        })
    }

    async fn send(
        &self,
        url: &str,
        accept: Option<&str>,
        authorization: Option<&str>,
    ) -> Result<hyper::Response<hyper::body::Incoming>, RegistryError> {
        let uri: hyper::Uri =
            url.parse()
                .map_err(|e: hyper::http::uri::InvalidUri| RegistryError::Failed {
                    url: url.to_string(),
                    reason: e.to_string(),
                })?;
        // An address written as such is not resolved: checked here.
        if let Some(ip) = uri
            .host()
            .and_then(|h| h.trim_start_matches('[').trim_end_matches(']').parse().ok())
            && let Some(network) = berth_artifact::networks::denied_by(&self.denied, ip)
        {
            return Err(RegistryError::Denied {
                url: url.to_string(),
                ip,
                network,
            });
        }
        let mut request = hyper::Request::get(uri).header(hyper::header::USER_AGENT, "berth");
        if let Some(accept) = accept {
            request = request.header(hyper::header::ACCEPT, accept);
        }
        if let Some(authorization) = authorization {
            request = request.header(hyper::header::AUTHORIZATION, authorization);
        }
        let request = request
            .body(Empty::<Bytes>::new())
            .map_err(|e| RegistryError::Failed {
                url: url.to_string(),
                reason: e.to_string(),
            })?;
        self.client
            .request(request)
            .await
            .map_err(|e| RegistryError::Failed {
                url: url.to_string(),
                reason: chain(&e),
            })
    }

    /// The `Authorization` a challenge asks for.
    async fn answer(&self, url: &str, challenge: &str) -> Result<String, RegistryError> {
        let basic = self.credentials.as_ref().map(|c| {
            let pair = format!("{}:{}", c.username, c.password);
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(pair)
            )
        });
        let (scheme, params) = challenge.split_once(' ').unwrap_or((challenge, ""));
        if scheme.eq_ignore_ascii_case("basic") {
            return basic.ok_or_else(|| RegistryError::Status {
                url: url.to_string(),
                status: 401,
                hint: " (the registry asks for credentials: the task's auth block)",
            });
        }
        if !scheme.eq_ignore_ascii_case("bearer") {
            return Err(RegistryError::Failed {
                url: url.to_string(),
                reason: format!(
                    "the registry asks for {scheme:?} authentication, which berth does not speak"
                ),
            });
        }
        let params = challenge_params(params);
        let realm = params
            .iter()
            .find(|(k, _)| k == "realm")
            .map(|(_, v)| v.clone())
            .ok_or_else(|| RegistryError::Failed {
                url: url.to_string(),
                reason: "a Bearer challenge without a realm".into(),
            })?;
        if self.base.starts_with("https://") && !realm.starts_with("https://") {
            return Err(RegistryError::Failed {
                url: url.to_string(),
                reason: format!(
                    "the token realm {realm:?} is not https; berth sends no credentials there"
                ),
            });
        }
        let mut query = Vec::new();
        for key in ["service", "scope"] {
            if let Some((_, value)) = params.iter().find(|(k, _)| k == key) {
                query.push(format!("{key}={}", percent_encode(value)));
            }
        }
        if !params.iter().any(|(k, _)| k == "scope") {
            query.push(format!(
                "scope={}",
                percent_encode(&format!("repository:{}:pull", self.repository))
            ));
        }
        let separator = if realm.contains('?') { '&' } else { '?' };
        let token_url = format!("{realm}{separator}{}", query.join("&"));
        let response = self.send(&token_url, None, basic.as_deref()).await?;
        if !response.status().is_success() {
            return Err(RegistryError::Status {
                url: token_url,
                status: response.status().as_u16(),
                hint: " (the token service refused: the task's auth block)",
            });
        }
        let body = read_bounded(&token_url, response, MAX_TOKEN_ANSWER).await?;
        #[derive(serde::Deserialize)]
        struct Token {
            token: Option<String>,
            access_token: Option<String>,
        }
        let token: Token = serde_json::from_slice(&body).map_err(|e| RegistryError::Failed {
            url: token_url.clone(),
            reason: format!("the token answer is not JSON with a token: {e}"),
        })?;
        let token = token
            .token
            .or(token.access_token)
            .filter(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_graphic()))
            .ok_or_else(|| RegistryError::Failed {
                url: token_url,
                reason: "the token answer holds no usable token".into(),
            })?;
        Ok(format!("Bearer {token}"))
    }
}

fn content_length(response: &hyper::Response<hyper::body::Incoming>) -> Option<u64> {
    response
        .headers()
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse().ok())
}

async fn read_bounded(
    url: &str,
    response: hyper::Response<hyper::body::Incoming>,
    limit: u64,
) -> Result<Vec<u8>, RegistryError> {
    let too_large = || RegistryError::TooLarge {
        url: url.to_string(),
        limit,
    };
    if content_length(&response).is_some_and(|l| l > limit) {
        return Err(too_large());
    }
    let mut body = response.into_body();
    let mut bytes = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| RegistryError::Failed {
            url: url.to_string(),
            reason: format!("reading the body: {e}"),
        })?;
        if let Ok(data) = frame.into_data() {
            if bytes.len() as u64 + data.len() as u64 > limit {
                return Err(too_large());
            }
            bytes.extend_from_slice(&data);
        }
    }
    Ok(bytes)
}

fn chain(error: &dyn std::error::Error) -> String {
    let mut reason = error.to_string();
    let mut source = error.source();
    while let Some(inner) = source {
        reason = format!("{reason}: {inner}");
        source = inner.source();
    }
    reason
}

/// `realm="x",service="y"` as pairs (quoted values, commas inside quotes kept).
fn challenge_params(text: &str) -> Vec<(String, String)> {
    let mut params = Vec::new();
    let mut rest = text.trim();
    while !rest.is_empty() {
        let Some((key, after)) = rest.split_once('=') else {
            break;
        };
        let key = key
            .trim()
            .trim_start_matches(',')
            .trim()
            .to_ascii_lowercase();
        let after = after.trim_start();
        let (value, remainder) = if let Some(quoted) = after.strip_prefix('"') {
            match quoted.find('"') {
                Some(end) => (&quoted[..end], &quoted[end + 1..]),
                None => (quoted, ""),
            }
        } else {
            match after.find(',') {
                Some(end) => (&after[..end], &after[end..]),
                None => (after, ""),
            }
        };
        params.push((key, value.to_string()));
        rest = remainder.trim_start().trim_start_matches(',').trim_start();
    }
    params
}

fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bearer_challenge_reads_into_its_parameters() {
        let params = challenge_params(
            r#"realm="https://auth.example/token",service="registry.example",scope="repository:a/b:pull,push""#,
        );
        assert_eq!(
            params,
            [
                (
                    "realm".to_string(),
                    "https://auth.example/token".to_string()
                ),
                ("service".to_string(), "registry.example".to_string()),
                ("scope".to_string(), "repository:a/b:pull,push".to_string()),
            ]
        );
        assert_eq!(
            percent_encode("repository:a/b:pull"),
            "repository%3Aa%2Fb%3Apull"
        );
    }
}
