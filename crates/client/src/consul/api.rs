//! The few endpoints of the local Consul agent's HTTP API that berth calls, with
//! Consul's JSON shapes (`/v1/agent/service/register`, `/v1/agent/service/deregister/:id`,
//! `/v1/agent/services`, `/v1/agent/checks`). One connection per request, a deadline on
//! each, and a bounded response: Consul is trusted by the operator, but a wrong address
//! must not hang or flood the agent.

use std::collections::BTreeMap;
use std::time::Duration;

use http_body_util::{BodyExt as _, Full, Limited};
use hyper::body::Bytes;
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// How long one call may take, connection included.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest response read (the list of every service on the Consul agent).
const MAX_RESPONSE: usize = 16 << 20;

/// A call to Consul that failed, in words an operator acts on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConsulError {
    #[error("Consul at {address} is unreachable: {reason}")]
    Unreachable { address: String, reason: String },
    #[error("Consul at {address} did not answer {call} within {}s", CALL_TIMEOUT.as_secs())]
    Timeout { address: String, call: String },
    /// Consul said no: 403 is its ACL refusal, with the reason in the body.
    #[error("Consul refused {call}: {status}: {message}")]
    Refused {
        call: String,
        status: u16,
        message: String,
    },
    #[error("Consul's answer to {call} could not be read: {reason}")]
    Garbled { call: String, reason: String },
}

impl ConsulError {
    /// Whether the ACL system refused the call (a token without the permission).
    pub fn is_permission(&self) -> bool {
        matches!(self, ConsulError::Refused { status: 403, .. })
    }

    /// Whether a TTL update named a check the Consul agent does not hold: 404 today;
    /// a 500 that says so before Consul 1.11.
    pub fn is_unknown_check(&self) -> bool {
        match self {
            ConsulError::Refused { status: 404, .. } => true,
            ConsulError::Refused {
                status: 500,
                message,
                ..
            } => message.contains("does not have associated TTL"),
            _ => false,
        }
    }
}

/// A service as berth registers it: `PUT /v1/agent/service/register`'s body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ServiceRegistration {
    #[serde(rename = "ID")]
    pub id: String,
    pub name: String,
    pub tags: Vec<String>,
    pub address: String,
    pub port: u16,
    pub meta: BTreeMap<String, String>,
    pub enable_tag_override: bool,
    pub checks: Vec<CheckRegistration>,
    /// A Connect service: Consul registers its sidecar proxy service with it
    /// (`<ID>-sidecar-proxy`).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub connect: Option<ConnectRegistration>,
}

/// `Connect` of a registration: the sidecar service Consul makes for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ConnectRegistration {
    pub sidecar_service: SidecarRegistration,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct SidecarRegistration {
    /// `None`: Consul picks one from its sidecar port range.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub port: Option<u16>,
    pub proxy: ProxyRegistration,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ProxyRegistration {
    pub upstreams: Vec<UpstreamRegistration>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct UpstreamRegistration {
    pub destination_name: String,
    pub local_bind_port: u16,
}

/// A token Consul's ACL system made (`PUT /v1/acl/token`), the parts berth keeps.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct AclToken {
    #[serde(rename = "AccessorID")]
    pub accessor_id: String,
    #[serde(rename = "SecretID")]
    pub secret_id: String,
}

impl std::fmt::Debug for AclToken {
    /// Never the secret.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AclToken")
            .field("accessor_id", &self.accessor_id)
            .finish_non_exhaustive()
    }
}

/// A check of a registered service (`AgentServiceCheck`): Consul runs it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct CheckRegistration {
    #[serde(rename = "CheckID")]
    pub check_id: String,
    pub name: String,
    /// A Go duration ("10s").
    pub interval: String,
    pub timeout: String,
    #[serde(rename = "HTTP", skip_serializing_if = "Option::is_none", default)]
    pub http: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub method: Option<String>,
    #[serde(rename = "TCP", skip_serializing_if = "Option::is_none", default)]
    pub tcp: Option<String>,
    /// `host:port` or `host:port/service`.
    #[serde(rename = "GRPC", skip_serializing_if = "Option::is_none", default)]
    pub grpc: Option<String>,
    #[serde(
        rename = "GRPCUseTLS",
        skip_serializing_if = "std::ops::Not::not",
        default
    )]
    pub grpc_use_tls: bool,
    /// A TTL check (a Go duration): a script check berth runs and reports.
    #[serde(rename = "TTL", skip_serializing_if = "Option::is_none", default)]
    pub ttl: Option<String>,
}

/// A service as `GET /v1/agent/services` shows it (`AgentService`), and as an instance
/// of `GET /v1/health/service/:name` carries it (the same fields).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct AgentService {
    #[serde(rename = "ID")]
    pub id: String,
    pub service: String,
    #[serde(default)]
    pub tags: Option<Vec<String>>,
    #[serde(default)]
    pub meta: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub port: u16,
    #[serde(default)]
    pub address: String,
    #[serde(default)]
    pub enable_tag_override: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// A check as `GET /v1/agent/checks` shows it (`AgentCheck`), the parts berth reads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct AgentCheck {
    #[serde(rename = "CheckID")]
    pub check_id: String,
    #[serde(rename = "ServiceID", default)]
    pub service_id: String,
    #[serde(default)]
    pub status: String,
}

/// The local Consul agent's API.
#[derive(Clone)]
pub struct ConsulApi {
    /// `host:port`.
    address: String,
    token: Option<String>,
}

impl std::fmt::Debug for ConsulApi {
    /// Never the token.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsulApi")
            .field("address", &self.address)
            .finish_non_exhaustive()
    }
}

impl ConsulApi {
    pub fn new(address: String, token: Option<String>) -> ConsulApi {
        ConsulApi { address, token }
    }

    pub fn address(&self) -> &str {
        &self.address
    }

    pub async fn register(&self, service: &ServiceRegistration) -> Result<(), ConsulError> {
        let body = serde_json::to_vec(service).map_err(|e| ConsulError::Garbled {
            call: "service register".into(),
            reason: e.to_string(),
        })?;
        self.call(
            Method::PUT,
            // Checks the registration no longer has are removed with it.
            "/v1/agent/service/register?replace-existing-checks=true",
            body,
            &format!("registering service {:?}", service.name),
        )
        .await
        .map(drop)
    }

    pub async fn deregister(&self, id: &str) -> Result<(), ConsulError> {
        self.call(
            Method::PUT,
            &format!("/v1/agent/service/deregister/{}", path_escape(id)),
            Vec::new(),
            &format!("deregistering service ID {id:?}"),
        )
        .await
        .map(drop)
    }

    /// Sets a TTL check's status and output (`PUT /v1/agent/check/update/:check_id`):
    /// how a script check berth runs for a Consul service reaches Consul.
    pub async fn update_ttl(
        &self,
        check_id: &str,
        status: &str,
        output: &str,
    ) -> Result<(), ConsulError> {
        let body = serde_json::json!({ "Status": status, "Output": output });
        self.call(
            Method::PUT,
            &format!("/v1/agent/check/update/{}", path_escape(check_id)),
            body.to_string().into_bytes(),
            &format!("updating check {check_id:?}"),
        )
        .await
        .map(drop)
    }

    /// A Service Identity token for `service` (`PUT /v1/acl/token`), local to the
    /// datacenter, as Nomad derives one for a Connect sidecar.
    pub async fn create_service_identity_token(
        &self,
        service: &str,
        description: &str,
    ) -> Result<AclToken, ConsulError> {
        let call = format!("creating a service identity token for {service:?}");
        let body = serde_json::json!({
            "Description": description,
            "ServiceIdentities": [{ "ServiceName": service }],
            "Local": true,
        });
        let bytes = self
            .call(
                Method::PUT,
                "/v1/acl/token",
                body.to_string().into_bytes(),
                &call,
            )
            .await?;
        serde_json::from_slice(&bytes).map_err(|e| ConsulError::Garbled {
            call,
            reason: e.to_string(),
        })
    }

    /// Revokes a token (`DELETE /v1/acl/token/:accessor`).
    pub async fn delete_token(&self, accessor: &str) -> Result<(), ConsulError> {
        self.call(
            Method::DELETE,
            &format!("/v1/acl/token/{}", path_escape(accessor)),
            Vec::new(),
            &format!("revoking token {accessor}"),
        )
        .await
        .map(drop)
    }

    pub async fn services(&self) -> Result<BTreeMap<String, AgentService>, ConsulError> {
        self.get("/v1/agent/services", "listing the agent's services")
            .await
    }

    pub async fn checks(&self) -> Result<BTreeMap<String, AgentCheck>, ConsulError> {
        self.get("/v1/agent/checks", "listing the agent's checks")
            .await
    }

    /// A key (`GET /v1/kv/:key`); `None` when Consul has no such key.
    pub async fn key(&self, key: &str) -> Result<Option<KvEntry>, ConsulError> {
        let call = format!("reading key {key:?}");
        let path = format!("/v1/kv/{}", key_escape(key));
        let entries: Option<Vec<KvEntry>> = self.get_or_missing(&path, &call).await?;
        Ok(entries.and_then(|entries| entries.into_iter().find(|e| e.key == key)))
    }

    /// Every key under `prefix` the token may read (`GET /v1/kv/:prefix?recurse`).
    pub async fn keys_under(&self, prefix: &str) -> Result<Vec<KvEntry>, ConsulError> {
        let call = format!("listing keys under {prefix:?}");
        let path = format!("/v1/kv/{}?recurse=true", key_escape(prefix));
        let entries: Option<Vec<KvEntry>> = self.get_or_missing(&path, &call).await?;
        Ok(entries.unwrap_or_default())
    }

    /// The instances of `service` with their node and checks
    /// (`GET /v1/health/service/:name`), those with `tag`, only those whose checks all
    /// pass when `passing`.
    pub async fn service_health(
        &self,
        service: &str,
        tag: Option<&str>,
        passing: bool,
    ) -> Result<Vec<HealthEntry>, ConsulError> {
        let mut path = format!("/v1/health/service/{}", path_escape(service));
        let mut query = Vec::new();
        if let Some(tag) = tag {
            query.push(format!("tag={}", path_escape(tag)));
        }
        if passing {
            query.push("passing=1".to_string());
        }
        if !query.is_empty() {
            path = format!("{path}?{}", query.join("&"));
        }
        self.get(&path, &format!("reading the health of service {service:?}"))
            .await
    }

    /// Every service name in the catalog with its tags (`GET /v1/catalog/services`).
    pub async fn catalog_services(&self) -> Result<BTreeMap<String, Vec<String>>, ConsulError> {
        self.get("/v1/catalog/services", "listing the catalog's services")
            .await
    }

    /// `None` for Consul's 404 (no such key, nothing under a prefix).
    async fn get_or_missing<T: DeserializeOwned>(
        &self,
        path: &str,
        call: &str,
    ) -> Result<Option<T>, ConsulError> {
        match self.get(path, call).await {
            Ok(found) => Ok(Some(found)),
            Err(ConsulError::Refused { status: 404, .. }) => Ok(None),
            Err(other) => Err(other),
        }
    }

    async fn get<T: DeserializeOwned>(&self, path: &str, call: &str) -> Result<T, ConsulError> {
        let body = self.call(Method::GET, path, Vec::new(), call).await?;
        serde_json::from_slice(&body).map_err(|e| ConsulError::Garbled {
            call: call.to_string(),
            reason: e.to_string(),
        })
    }

    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Vec<u8>,
        call: &str,
    ) -> Result<Bytes, ConsulError> {
        match tokio::time::timeout(CALL_TIMEOUT, self.exchange(method, path, body, call)).await {
            Ok(result) => result,
            Err(_) => Err(ConsulError::Timeout {
                address: self.address.clone(),
                call: call.to_string(),
            }),
        }
    }

    async fn exchange(
        &self,
        method: Method,
        path: &str,
        body: Vec<u8>,
        call: &str,
    ) -> Result<Bytes, ConsulError> {
        let unreachable = |reason: String| ConsulError::Unreachable {
            address: self.address.clone(),
            reason,
        };
        let garbled = |reason: String| ConsulError::Garbled {
            call: call.to_string(),
            reason,
        };
        let mut request = Request::builder()
            .method(method)
            .uri(path)
            .header("host", &self.address)
            .header("content-type", "application/json");
        if let Some(token) = &self.token {
            request = request.header("x-consul-token", token);
        }
        let request = request
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| garbled(e.to_string()))?;
        let stream = tokio::net::TcpStream::connect(&self.address)
            .await
            .map_err(|e| unreachable(e.to_string()))?;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| unreachable(e.to_string()))?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| unreachable(e.to_string()))?;
        let status = response.status();
        let body = Limited::new(response.into_body(), MAX_RESPONSE)
            .collect()
            .await
            .map_err(|e| garbled(e.to_string()))?
            .to_bytes();
        if status != StatusCode::OK {
            let message = String::from_utf8_lossy(&body);
            return Err(ConsulError::Refused {
                call: call.to_string(),
                status: status.as_u16(),
                message: berth_model::text::clip(message.trim(), 512),
            });
        }
        Ok(body)
    }
}

/// A key as a path: each segment escaped, the slashes kept.
fn key_escape(key: &str) -> String {
    key.split('/')
        .map(path_escape)
        .collect::<Vec<_>>()
        .join("/")
}

/// A KV entry (`GET /v1/kv/:key`), the parts templates read.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct KvEntry {
    pub key: String,
    /// Base64; `None` for an empty value.
    #[serde(default)]
    pub value: Option<String>,
    #[serde(default)]
    pub modify_index: u64,
}

impl KvEntry {
    /// The value as text; an empty value (or one Consul sent garbled) is `""`.
    pub fn text(&self) -> Result<String, ConsulError> {
        use base64::Engine as _;
        let Some(encoded) = &self.value else {
            return Ok(String::new());
        };
        let garbled = |reason: String| ConsulError::Garbled {
            call: format!("reading key {:?}", self.key),
            reason,
        };
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .map_err(|e| garbled(e.to_string()))?;
        String::from_utf8(bytes).map_err(|_| garbled("the value is not UTF-8 text".into()))
    }
}

/// An instance of a service with its node and checks (`GET /v1/health/service/:name`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct HealthEntry {
    pub node: HealthNode,
    pub service: AgentService,
    #[serde(default)]
    pub checks: Vec<HealthCheck>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct HealthNode {
    #[serde(rename = "ID", default)]
    pub id: String,
    pub node: String,
    #[serde(default)]
    pub address: String,
    #[serde(default)]
    pub datacenter: String,
    #[serde(default)]
    pub tagged_addresses: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub meta: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct HealthCheck {
    #[serde(rename = "CheckID", default)]
    pub check_id: String,
    #[serde(default)]
    pub name: String,
    pub status: String,
    #[serde(rename = "ServiceID", default)]
    pub service_id: String,
    #[serde(default)]
    pub output: String,
}

/// A service ID as one path segment: berth's IDs hold `[A-Za-z0-9._-]` and job, group,
/// task and service names, which may hold more.
fn path_escape(segment: &str) -> String {
    let mut out = String::with_capacity(segment.len());
    for byte in segment.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~') {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}
