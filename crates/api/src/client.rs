//! A small client of the HTTP API, for the CLI and the tests.

use std::path::{Path, PathBuf};

use http_body_util::BodyExt;
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::ApiError;

type Body = http_body_util::Full<hyper::body::Bytes>;

/// The agent's TCP address when nothing else is found (Nomad's port; a `-dev` agent).
pub const DEFAULT_ADDRESS: &str = "http://127.0.0.1:4646";

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot reach the berth agent at {address} ({reason}); {hint}")]
    Unreachable {
        address: String,
        reason: String,
        hint: &'static str,
    },
    /// The agent answered with an error; the message is the agent's.
    #[error("{}", .0.error)]
    Api(ApiError, StatusCode),
    #[error("the agent at {address} sent an answer this client does not understand: {reason}")]
    Garbled { address: String, reason: String },
    #[error("{0:?} is not an agent address: use unix:///path/to/api.sock or http://host:port")]
    BadAddress(String),
}

/// Where the agent listens.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Endpoint {
    Unix(PathBuf),
    /// `host:port`.
    Tcp(String),
}

pub struct Client {
    address: String,
    endpoint: Endpoint,
    token: Option<String>,
}

impl Client {
    /// A client of the agent at `address`: `unix:///path/api.sock` or `http://host:port`.
    pub fn new(address: &str) -> Result<Client, ClientError> {
        let trimmed = address.trim_end_matches('/');
        let endpoint = if let Some(path) = trimmed.strip_prefix("unix://") {
            Endpoint::Unix(PathBuf::from(path))
        } else if let Some(authority) = trimmed.strip_prefix("http://") {
            if authority.is_empty() || authority.contains('/') {
                return Err(ClientError::BadAddress(address.to_string()));
            }
            Endpoint::Tcp(authority.to_string())
        } else {
            return Err(ClientError::BadAddress(address.to_string()));
        };
        Ok(Client {
            address: trimmed.to_string(),
            endpoint,
            token: None,
        })
    }

    /// A client of the agent whose Unix socket is `socket`.
    pub fn unix(socket: &Path) -> Client {
        Client {
            address: format!("unix://{}", socket.display()),
            endpoint: Endpoint::Unix(socket.to_path_buf()),
            token: None,
        }
    }

    /// Sends `token` with every request (`Authorization: Bearer`).
    pub fn with_token(mut self, token: Option<String>) -> Client {
        self.token = token.filter(|t| !t.is_empty());
        self
    }

    pub fn address(&self) -> &str {
        &self.address
    }

    pub async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, ClientError> {
        self.call(Method::GET, path, None::<&()>)
            .await
            .map(|(v, _)| v)
    }

    /// A paged GET: the value and the `next_token` of the next page, if any.
    pub async fn get_page<T: DeserializeOwned>(
        &self,
        path: &str,
    ) -> Result<(T, Option<String>), ClientError> {
        self.call(Method::GET, path, None::<&()>).await
    }

    pub async fn post<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<T, ClientError> {
        self.call(Method::POST, path, Some(body))
            .await
            .map(|(v, _)| v)
    }

    pub async fn delete<T: DeserializeOwned>(&self, path: &str) -> Result<T, ClientError> {
        self.call(Method::DELETE, path, None::<&()>)
            .await
            .map(|(v, _)| v)
    }

    pub async fn put<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<T, ClientError> {
        self.call(Method::PUT, path, Some(body))
            .await
            .map(|(v, _)| v)
    }

    /// A GET whose answer is bytes, not JSON (a task's log with `plain=true`).
    pub async fn get_bytes(&self, path: &str) -> Result<Vec<u8>, ClientError> {
        let response = self.send(Method::GET, path, None::<&()>).await?;
        let response = self.success(response).await?;
        self.collect(response).await
    }

    /// A GET whose answer is a stream (a followed log): `on_bytes` gets each piece as it
    /// comes, until the agent ends the stream.
    pub async fn stream(
        &self,
        path: &str,
        mut on_bytes: impl FnMut(&[u8]) -> std::io::Result<()>,
    ) -> Result<(), ClientError> {
        let response = self.send(Method::GET, path, None::<&()>).await?;
        let mut body = self.success(response).await?.into_body();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| self.garbled(e.to_string()))?;
            if let Some(data) = frame.data_ref() {
                on_bytes(data).map_err(|e| self.garbled(e.to_string()))?;
            }
        }
        Ok(())
    }

    fn garbled(&self, reason: String) -> ClientError {
        ClientError::Garbled {
            address: self.address.clone(),
            reason,
        }
    }

    async fn call<B: Serialize, T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
    ) -> Result<(T, Option<String>), ClientError> {
        let response = self.send(method, path, body).await?;
        let response = self.success(response).await?;
        let next_token = response
            .headers()
            .get(super::NEXT_TOKEN_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let body = self.collect(response).await?;
        let value = serde_json::from_slice(&body).map_err(|e| self.garbled(e.to_string()))?;
        Ok((value, next_token))
    }

    async fn collect(
        &self,
        response: hyper::Response<hyper::body::Incoming>,
    ) -> Result<Vec<u8>, ClientError> {
        Ok(response
            .into_body()
            .collect()
            .await
            .map_err(|e| self.garbled(e.to_string()))?
            .to_bytes()
            .to_vec())
    }

    /// The response of a success; an error's body as a [`ClientError::Api`]: berth's own
    /// JSON error, or the plain text of Nomad's API.
    async fn success(
        &self,
        response: hyper::Response<hyper::body::Incoming>,
    ) -> Result<hyper::Response<hyper::body::Incoming>, ClientError> {
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let body = self.collect(response).await?;
        Err(api_error(status, &body))
    }

    async fn send<B: Serialize>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
    ) -> Result<hyper::Response<hyper::body::Incoming>, ClientError> {
        let garbled = |reason: String| self.garbled(reason);
        let unreachable = |reason: String| ClientError::Unreachable {
            address: self.address.clone(),
            reason,
            hint: match self.endpoint {
                Endpoint::Unix(_) => {
                    "is `berth agent` running with this data dir (--data-dir, or data_dir in --config)?"
                }
                Endpoint::Tcp(_) => "is `berth agent -dev` running, or is the address right?",
            },
        };
        let bytes = match body {
            Some(body) => serde_json::to_vec(body).map_err(|e| garbled(e.to_string()))?,
            None => Vec::new(),
        };
        let host = match &self.endpoint {
            Endpoint::Unix(_) => "localhost",
            Endpoint::Tcp(authority) => authority.as_str(),
        };
        let mut request = Request::builder()
            .method(method)
            .uri(path)
            .header("host", host)
            .header("content-type", "application/json");
        if let Some(token) = &self.token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        let request = request
            .body(Body::from(bytes))
            .map_err(|e| garbled(e.to_string()))?;
        // One connection per request: the CLI makes a few, and there is no pool to go stale.
        let mut sender = match &self.endpoint {
            Endpoint::Unix(socket) => {
                let stream = tokio::net::UnixStream::connect(socket)
                    .await
                    .map_err(|e| unreachable(e.to_string()))?;
                handshake(stream).await
            }
            Endpoint::Tcp(authority) => {
                let stream = tokio::net::TcpStream::connect(authority)
                    .await
                    .map_err(|e| unreachable(e.to_string()))?;
                handshake(stream).await
            }
        }
        .map_err(|e| unreachable(root_cause(&e)))?;
        sender
            .send_request(request)
            .await
            .map_err(|e| unreachable(root_cause(&e)))
    }
}

/// An error answer's body: berth's own JSON error, or the plain text of Nomad's API.
fn api_error(status: StatusCode, body: &[u8]) -> ClientError {
    let error = serde_json::from_slice::<ApiError>(body).unwrap_or_else(|_| {
        let text = String::from_utf8_lossy(body).trim().to_string();
        ApiError {
            error: if text.is_empty() {
                status.to_string()
            } else {
                text
            },
            problems: Vec::new(),
        }
    });
    ClientError::Api(error, status)
}

/// A stream to the agent, whichever its endpoint.
pub trait Connection: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Connection for T {}

pub use tokio_tungstenite::tungstenite::Message as WebSocketMessage;

/// A websocket to the agent (`alloc exec`).
pub type WebSocket = tokio_tungstenite::WebSocketStream<Box<dyn Connection>>;

impl Client {
    /// Opens a websocket at `path` (with the query). A refusal before the upgrade is the
    /// agent's error, as for any request.
    pub async fn websocket(&self, path: &str) -> Result<WebSocket, ClientError> {
        use tokio_tungstenite::tungstenite;
        use tungstenite::client::IntoClientRequest as _;
        let unreachable = |reason: String| ClientError::Unreachable {
            address: self.address.clone(),
            reason,
            hint: "is the agent running, and is the address right?",
        };
        let (stream, host): (Box<dyn Connection>, &str) = match &self.endpoint {
            Endpoint::Unix(socket) => {
                let stream = tokio::net::UnixStream::connect(socket)
                    .await
                    .map_err(|e| unreachable(e.to_string()))?;
                (Box::new(stream), "localhost")
            }
            Endpoint::Tcp(authority) => {
                let stream = tokio::net::TcpStream::connect(authority)
                    .await
                    .map_err(|e| unreachable(e.to_string()))?;
                (Box::new(stream), authority.as_str())
            }
        };
        let mut request = format!("ws://{host}{path}")
            .into_client_request()
            .map_err(|e| self.garbled(e.to_string()))?;
        if let Some(token) = &self.token {
            let value = format!("Bearer {token}")
                .parse()
                .map_err(|_| self.garbled("the token is not a header value".into()))?;
            request.headers_mut().insert("authorization", value);
        }
        match tokio_tungstenite::client_async(request, stream).await {
            Ok((socket, _)) => Ok(socket),
            Err(tungstenite::Error::Http(response)) => {
                let status = response.status();
                let body = response.into_body().unwrap_or_default();
                Err(api_error(status, &body))
            }
            Err(error) => Err(unreachable(error.to_string())),
        }
    }
}

async fn handshake<S>(
    stream: S,
) -> Result<hyper::client::conn::http1::SendRequest<Body>, hyper::Error>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(async move {
        if let Err(error) = connection.await {
            tracing::debug!(%error, "the API connection ended");
        }
    });
    Ok(sender)
}

/// The innermost error's text: "Connection refused (os error 111)" rather than
/// "client error (Connect)".
fn root_cause(error: &(dyn std::error::Error + 'static)) -> String {
    let mut current = error;
    while let Some(source) = current.source() {
        current = source;
    }
    current.to_string()
}
