//! A small client of the HTTP API, for the CLI and the tests.

use http_body_util::BodyExt;
use hyper::{Method, Request, StatusCode};
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::ApiError;

type Body = http_body_util::Full<hyper::body::Bytes>;

/// The agent's address when none is given (Nomad's port).
pub const DEFAULT_ADDRESS: &str = "http://127.0.0.1:4646";

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot reach the berth agent at {address} ({reason}); is `berth agent -dev` running?")]
    Unreachable { address: String, reason: String },
    /// The agent answered with an error; the message is the agent's.
    #[error("{}", .0.error)]
    Api(ApiError, StatusCode),
    #[error("the agent at {address} sent an answer this client does not understand: {reason}")]
    Garbled { address: String, reason: String },
}

pub struct Client {
    address: String,
    http: HyperClient<HttpConnector, Body>,
}

impl Client {
    pub fn new(address: &str) -> Client {
        Client {
            address: address.trim_end_matches('/').to_string(),
            http: HyperClient::builder(TokioExecutor::new()).build_http(),
        }
    }

    pub fn address(&self) -> &str {
        &self.address
    }

    pub async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, ClientError> {
        self.call(Method::GET, path, None::<&()>).await
    }

    pub async fn post<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<T, ClientError> {
        self.call(Method::POST, path, Some(body)).await
    }

    pub async fn delete<T: DeserializeOwned>(&self, path: &str) -> Result<T, ClientError> {
        self.call(Method::DELETE, path, None::<&()>).await
    }

    async fn call<B: Serialize, T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
    ) -> Result<T, ClientError> {
        let garbled = |reason: String| ClientError::Garbled {
            address: self.address.clone(),
            reason,
        };
        let bytes = match body {
            Some(body) => serde_json::to_vec(body).map_err(|e| garbled(e.to_string()))?,
            None => Vec::new(),
        };
        let request = Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.address))
            .header("content-type", "application/json")
            .body(Body::from(bytes))
            .map_err(|e| garbled(e.to_string()))?;
        let response = self
            .http
            .request(request)
            .await
            .map_err(|e| ClientError::Unreachable {
                address: self.address.clone(),
                reason: root_cause(&e),
            })?;
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| garbled(e.to_string()))?
            .to_bytes();
        if !status.is_success() {
            let error = serde_json::from_slice::<ApiError>(&body).unwrap_or_else(|_| ApiError {
                error: format!("{status}: {}", String::from_utf8_lossy(&body)),
                problems: Vec::new(),
            });
            return Err(ClientError::Api(error, status));
        }
        serde_json::from_slice(&body).map_err(|e| garbled(e.to_string()))
    }
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
