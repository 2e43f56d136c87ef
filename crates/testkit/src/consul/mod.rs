//! **`ConsulDouble`: a double of Consul's HTTP API**, for tests only (Consul cannot be
//! installed where berth is built). It answers the endpoints berth calls, with the
//! request and response shapes, status codes and bodies of Consul's documentation and
//! of its agent's HTTP handlers:
//!
//! - the local agent's services and checks: `PUT /v1/agent/service/register` (with
//!   `replace-existing-checks`; a Connect service's sidecar registered as
//!   `<ID>-sidecar-proxy`), `PUT /v1/agent/service/deregister/:id`,
//!   `GET /v1/agent/services`, `GET /v1/agent/service/:id`, `GET /v1/agent/checks`;
//! - TTL checks: a check registered with `TTL` starts critical, takes its status from
//!   `PUT /v1/agent/check/update/:check_id` (`{"Status", "Output"}`; 400 "Invalid check
//!   status", 404 "Unknown check ID" for a check that is not there, 403 without
//!   `service:write` on its service, 500 "does not have associated TTL" for another
//!   kind; the output kept to Consul's 4 KiB), and turns critical ("TTL expired") when
//!   no update came within its TTL;
//! - ACL tokens: `PUT /v1/acl/token`, and `DELETE /v1/acl/token/:accessor`, which
//!   answers 200 `true` also for a token that is not there (Consul: "the token does not
//!   exist - return early as there is nothing to do");
//! - ACLs, when a test turns them on: the token in `X-Consul-Token`; a token Consul
//!   does not know is refused with 403 "ACL not found" (and `DELETE /v1/acl/token`
//!   with 404 "Cannot find token to delete", as Consul's handler maps it); a known token
//!   that lacks a permission gets 403 `Permission denied: token with AccessorID '…'
//!   lacks permission 'service:write' on "api"` on writes, and lists
//!   (`/v1/agent/services`, `/v1/agent/checks`) come back 200 with what it may not read
//!   left out and `X-Consul-Results-Filtered-By-ACLs: true`; no token is the anonymous
//!   token, which may do nothing (`default_policy = "deny"`);
//! - what templates read: `GET /v1/kv/:key` (404 with an empty body for a key that is
//!   not there, 403 for one the token may not read) and `?recurse` (every key under a
//!   prefix, the unreadable left out), `GET /v1/health/service/:name` (with `?tag=` and
//!   `?passing`; a service the token may not read is an empty list, as Consul's
//!   handler returns it, "tested" in its comment), `GET /v1/catalog/services`; each
//!   instance carries its checks and the node's `serfHealth`, the node is `double` at
//!   127.0.0.1 in `dc1`;
//! - the agent's anti-entropy as a client of the agent sees it: an edit of a service's
//!   tags in the catalog ([`ConsulDouble::edit_catalog_tags`]) shows on the agent only
//!   for a service registered with `EnableTagOverride`; without it Consul restores the
//!   agent's tags in the catalog and the agent's copy never changes.
//!
//! It records every request, and fails on demand (500 "No cluster leader").

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Extension, Path, Query, State};
use axum::http::{HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use serde_json::{Value, json};

mod ttl;
use ttl::{expire_ttls, go_duration, update_check};

/// One request the double answered.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub at: Instant,
    pub method: Method,
    pub path: String,
    pub body: Value,
    pub status: u16,
    /// Answered with `X-Consul-Results-Filtered-By-ACLs: true`.
    pub filtered: bool,
}

/// What a token may do: the few rules of a Consul ACL policy that berth meets.
/// `service_prefix "<p>" { policy = "write" }` for each of `service_write` (write
/// implies read), `policy = "read"` for each of `service_read`, `key_prefix "<p>" {
/// policy = "read" }` for each of `key_read`, and `acl = "write"`.
#[derive(Debug, Clone, Default)]
pub struct Policy {
    pub service_write: Vec<String>,
    pub service_read: Vec<String>,
    pub key_read: Vec<String>,
    pub acl_write: bool,
}

impl Policy {
    /// Everything (the `global-management` policy).
    pub fn management() -> Policy {
        Policy {
            service_write: vec![String::new()],
            service_read: Vec::new(),
            key_read: vec![String::new()],
            acl_write: true,
        }
    }

    fn may_read_key(&self, key: &str) -> bool {
        self.key_read.iter().any(|p| key.starts_with(p))
    }

    fn may_read(&self, service: &str) -> bool {
        self.may_write(service) || self.service_read.iter().any(|p| service.starts_with(p))
    }

    fn may_write(&self, service: &str) -> bool {
        self.service_write.iter().any(|p| service.starts_with(p))
    }
}

/// The anonymous token's accessor, as Consul names it.
const ANONYMOUS: &str = "00000000-0000-0000-0000-000000000002";

/// The token a request came with, resolved: its accessor and what it may do.
#[derive(Debug, Clone)]
struct Authz {
    accessor: String,
    /// The request named a token (the filtered header is only set then).
    named: bool,
    policy: Policy,
}

impl Authz {
    fn everything() -> Authz {
        Authz {
            accessor: ANONYMOUS.into(),
            named: false,
            policy: Policy::management(),
        }
    }

    /// Consul's 403 for a permission the token lacks, with its exact body.
    fn denied(&self, permission: &str, on: Option<&str>) -> Response {
        let on = on.map(|name| format!(" on \"{name}\"")).unwrap_or_default();
        (
            StatusCode::FORBIDDEN,
            format!(
                "Permission denied: token with AccessorID '{}' lacks permission '{permission}'{on}",
                self.accessor
            ),
        )
            .into_response()
    }
}

/// Marks a list response whose items the token could not all read.
fn filtered_list(authz: &Authz, list: Value, removed: bool) -> Response {
    let mut response = axum::Json(list).into_response();
    if removed && authz.named {
        response.headers_mut().insert(
            "X-Consul-Results-Filtered-By-ACLs",
            HeaderValue::from_static("true"),
        );
    }
    response
}

#[derive(Default)]
struct DoubleState {
    services: BTreeMap<String, Value>,
    checks: BTreeMap<String, Value>,
    /// The TTL checks: their TTL, and when they turn critical unless updated.
    ttls: BTreeMap<String, (std::time::Duration, Instant)>,
    /// ACL tokens by accessor.
    tokens: BTreeMap<String, Value>,
    requests: Vec<Recorded>,
    /// Answer this many next requests with a 500.
    fail_next: u32,
    /// The KV store: key, value, modify index.
    kv: BTreeMap<String, (Vec<u8>, u64)>,
    /// The last index Consul's raft log handed out.
    index: u64,
    /// ACL tokens a test gave out, by secret, with their accessor and policy; `None`:
    /// ACLs are off and every request may do everything.
    acl: Option<BTreeMap<String, (String, Policy)>>,
}

/// A Consul agent API double on a free port of 127.0.0.1, for as long as it lives.
pub struct ConsulDouble {
    address: SocketAddr,
    state: Arc<Mutex<DoubleState>>,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for ConsulDouble {
    fn drop(&mut self) {
        self.server.abort();
    }
}

type Shared = Arc<Mutex<DoubleState>>;

impl ConsulDouble {
    pub async fn start() -> ConsulDouble {
        let state: Shared = Arc::default();
        let app = Router::new()
            .route("/v1/agent/service/register", put(register))
            .route("/v1/agent/service/deregister/{id}", put(deregister))
            .route("/v1/agent/services", get(services))
            .route("/v1/agent/service/{id}", get(service))
            .route("/v1/agent/checks", get(checks))
            .route("/v1/agent/check/update/{id}", put(update_check))
            .route("/v1/kv/{*key}", get(kv_get))
            .route("/v1/health/service/{name}", get(health_service))
            .route("/v1/catalog/services", get(catalog_services))
            .route("/v1/acl/token", put(create_token))
            .route(
                "/v1/acl/token/{accessor}",
                axum::routing::delete(delete_token),
            )
            .layer(axum::middleware::from_fn_with_state(state.clone(), gate))
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        ConsulDouble {
            address,
            state,
            server,
        }
    }

    /// `host:port`, as the agent config's `consul { address }` takes it.
    pub fn address(&self) -> String {
        self.address.to_string()
    }

    /// Turns ACLs on with `token` as a management token (it may do everything); any
    /// other token is one Consul does not know.
    pub fn require_token(&self, token: &str) {
        self.add_token(token, Policy::management());
    }

    /// Turns ACLs on (if they are not) and adds a token that may do what `policy`
    /// grants. Returns its accessor, which Consul's refusals name.
    pub fn add_token(&self, secret: &str, policy: Policy) -> String {
        let mut state = self.state.lock().unwrap();
        let acl = state.acl.get_or_insert_default();
        let accessor = format!("b1c2d3e4-0000-4000-8000-{:012x}", acl.len() + 1);
        acl.insert(secret.to_string(), (accessor.clone(), policy));
        accessor
    }

    pub fn fail_next(&self, requests: u32) {
        self.state.lock().unwrap().fail_next = requests;
    }

    /// The agent's services, as `GET /v1/agent/services` shows them.
    pub fn services(&self) -> BTreeMap<String, Value> {
        self.state.lock().unwrap().services.clone()
    }

    pub fn checks(&self) -> BTreeMap<String, Value> {
        let mut state = self.state.lock().unwrap();
        expire_ttls(&mut state);
        state.checks.clone()
    }

    /// The ACL tokens made and not deleted, by accessor.
    pub fn tokens(&self) -> BTreeMap<String, Value> {
        self.state.lock().unwrap().tokens.clone()
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.state.lock().unwrap().requests.clone()
    }

    /// Registers a service as something other than berth would (another tool, an
    /// operator), without touching the request log.
    pub fn add_service(&self, id: &str, name: &str) {
        self.state.lock().unwrap().services.insert(
            id.to_string(),
            agent_service(&json!({ "ID": id, "Name": name })),
        );
    }

    /// Drops a service and its checks, as a Consul agent restarted without its data
    /// dir, or an operator's `consul services deregister`, would; the request log is
    /// untouched.
    pub fn forget_service(&self, id: &str) {
        let mut state = self.state.lock().unwrap();
        state.services.remove(id);
        state
            .checks
            .retain(|_, check| check["ServiceID"] != json!(id));
    }

    /// A check of service `service_id` that something other than berth registered.
    pub fn add_check(&self, check_id: &str, service_id: &str) {
        let mut state = self.state.lock().unwrap();
        let name = state.services[service_id]["Service"].clone();
        state.checks.insert(
            check_id.to_string(),
            json!({
                "Node": "double",
                "CheckID": check_id,
                "Name": check_id,
                "Status": "passing",
                "ServiceID": service_id,
                "ServiceName": name,
                "Type": "tcp",
            }),
        );
    }

    /// Writes a key (`consul kv put`), as another client of Consul would.
    pub fn put_key(&self, key: &str, value: &str) {
        let mut state = self.state.lock().unwrap();
        state.index += 1;
        let index = state.index;
        state
            .kv
            .insert(key.to_string(), (value.as_bytes().to_vec(), index));
    }

    /// Deletes a key (`consul kv delete`).
    pub fn delete_key(&self, key: &str) {
        self.state.lock().unwrap().kv.remove(key);
    }

    /// A check's status changes (`passing`, `warning`, `critical`), as Consul's own
    /// check runs would change it.
    pub fn set_check_status(&self, check_id: &str, status: &str) {
        let mut state = self.state.lock().unwrap();
        let check = state.checks.get_mut(check_id).expect("a registered check");
        check["Status"] = json!(status);
    }

    /// An operator edits a service's tags in the catalog (`PUT /v1/catalog/register`).
    /// Consul's anti-entropy then syncs the agent and the catalog: with
    /// `EnableTagOverride`, the agent takes the catalog's tags into its own copy, which
    /// `/v1/agent/services` shows; without it, the agent's copy wins and the catalog's
    /// tags are restored, so the agent's copy never changes. Returns whether the edit
    /// stuck.
    pub fn edit_catalog_tags(&self, id: &str, tags: &[&str]) -> bool {
        let mut state = self.state.lock().unwrap();
        let service = state.services.get_mut(id).expect("a registered service");
        if service["EnableTagOverride"] != json!(true) {
            return false;
        }
        service["Tags"] = json!(tags);
        true
    }

    /// Another client of the same Consul agent registers a service with berth's ID
    /// (`PUT /v1/agent/service/register`), with other tags: the agent takes it as it
    /// takes any registration, whatever `EnableTagOverride` says. Not in the request log.
    pub fn register_as_another_client(&self, id: &str, tags: &[&str]) {
        let mut state = self.state.lock().unwrap();
        let service = state.services.get_mut(id).expect("a registered service");
        service["Tags"] = json!(tags);
    }

    /// An operator deletes a token a test gave out (berth's own): Consul no longer
    /// knows it.
    pub fn forget_acl_token(&self, secret: &str) {
        if let Some(acl) = self.state.lock().unwrap().acl.as_mut() {
            acl.remove(secret);
        }
    }

    /// An operator deletes an ACL token in Consul (`consul acl token delete`).
    pub fn delete_token_as_operator(&self, accessor: &str) {
        self.state.lock().unwrap().tokens.remove(accessor);
    }
}

/// The token of a request, resolved, or Consul's answer to a token it does not know.
fn resolve(
    state: &DoubleState,
    token: Option<&str>,
    method: &Method,
    path: &str,
) -> Result<Authz, (StatusCode, &'static str)> {
    let Some(acl) = &state.acl else {
        return Ok(Authz::everything());
    };
    let secret = token.filter(|t| !t.is_empty());
    let Some(secret) = secret else {
        // The anonymous token, which default_policy = "deny" leaves nothing.
        return Ok(Authz {
            accessor: ANONYMOUS.into(),
            named: false,
            policy: Policy::default(),
        });
    };
    if let Some((accessor, policy)) = acl.get(secret) {
        return Ok(Authz {
            accessor: accessor.clone(),
            named: true,
            policy: policy.clone(),
        });
    }
    // A service identity token made here: service:write on its services and their
    // sidecars, read on all services.
    if let Some(made) = state
        .tokens
        .values()
        .find(|t| t["SecretID"] == json!(secret))
    {
        let names: Vec<String> = made["ServiceIdentities"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|i| i["ServiceName"].as_str())
            .flat_map(|n| [n.to_string(), format!("{n}-sidecar-proxy")])
            .collect();
        return Ok(Authz {
            accessor: made["AccessorID"].as_str().unwrap_or_default().to_string(),
            named: true,
            policy: Policy {
                service_write: names,
                service_read: vec![String::new()],
                key_read: Vec::new(),
                acl_write: false,
            },
        });
    }
    // Consul's ACL resolver says "ACL not found"; the HTTP layer makes that a 403,
    // except where the token-delete handler maps it to a 404 of its own.
    if *method == Method::DELETE && path.starts_with("/v1/acl/token/") {
        return Err((StatusCode::NOT_FOUND, "Cannot find token to delete"));
    }
    Err((StatusCode::FORBIDDEN, "ACL not found"))
}

/// Records each request, answers the failures asked for, and checks the token.
async fn gate(
    State(state): State<Shared>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let method = request.method().clone();
    let path = request
        .uri()
        .path_and_query()
        .map(|p| p.to_string())
        .unwrap_or_default();
    let token = request
        .headers()
        .get("x-consul-token")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let (parts, body) = request.into_parts();
    let bytes = axum::body::to_bytes(body, 1 << 20)
        .await
        .unwrap_or_default();
    let body_json: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    let refusal = {
        let mut state = state.lock().unwrap();
        if state.fail_next > 0 {
            state.fail_next -= 1;
            Err((
                StatusCode::INTERNAL_SERVER_ERROR,
                "rpc error: No cluster leader",
            )
                .into_response())
        } else {
            let bare = path.split('?').next().unwrap_or_default();
            resolve(&state, token.as_deref(), &method, bare).map_err(IntoResponse::into_response)
        }
    };
    let response = match refusal {
        Err(refusal) => refusal,
        Ok(authz) => {
            let mut request =
                axum::extract::Request::from_parts(parts, axum::body::Body::from(bytes));
            request.extensions_mut().insert(authz);
            next.run(request).await
        }
    };
    let filtered = response
        .headers()
        .get("X-Consul-Results-Filtered-By-ACLs")
        .is_some_and(|v| v == "true");
    state.lock().unwrap().requests.push(Recorded {
        at: Instant::now(),
        method,
        path,
        body: body_json,
        status: response.status().as_u16(),
        filtered,
    });
    response
}

/// An `AgentService` from a registration body: Consul fills in what is left out.
fn agent_service(registration: &Value) -> Value {
    let name = registration["Name"].clone();
    let id = registration
        .get("ID")
        .filter(|v| !v.is_null())
        .cloned()
        .unwrap_or(name.clone());
    json!({
        "ID": id,
        "Service": name,
        "Tags": registration.get("Tags").cloned().unwrap_or(json!([])),
        "Meta": registration.get("Meta").cloned().unwrap_or(json!({})),
        "Port": registration.get("Port").cloned().unwrap_or(json!(0)),
        "Address": registration.get("Address").cloned().unwrap_or(json!("")),
        "EnableTagOverride": registration.get("EnableTagOverride").cloned().unwrap_or(json!(false)),
        "Weights": { "Passing": 1, "Warning": 1 },
        "Datacenter": "dc1",
    })
}

async fn register(
    State(state): State<Shared>,
    Extension(authz): Extension<Authz>,
    Query(query): Query<BTreeMap<String, String>>,
    body: Bytes,
) -> Response {
    let Ok(registration) = serde_json::from_slice::<Value>(&body) else {
        return (StatusCode::BAD_REQUEST, "Request decode failed").into_response();
    };
    let name = registration["Name"].as_str().unwrap_or_default();
    if name.is_empty() {
        return (StatusCode::BAD_REQUEST, "Missing service name").into_response();
    }
    // The service, then its sidecar, need service:write (Consul vets both before it
    // registers either).
    if !authz.policy.may_write(name) {
        return authz.denied("service:write", Some(name));
    }
    let sidecar_name = format!("{name}-sidecar-proxy");
    let has_sidecar = registration
        .get("Connect")
        .and_then(|c| c.get("SidecarService"))
        .is_some_and(|s| !s.is_null());
    if has_sidecar && !authz.policy.may_write(&sidecar_name) {
        return authz.denied("service:write", Some(&sidecar_name));
    }
    let service = agent_service(&registration);
    let id = service["ID"].as_str().unwrap_or_default().to_string();
    let mut state = state.lock().unwrap();
    if query.get("replace-existing-checks").map(String::as_str) == Some("true") {
        state
            .checks
            .retain(|_, check| check["ServiceID"] != json!(id));
    }
    let checks = registration["Checks"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for (index, check) in checks.iter().enumerate() {
        let check_id = check["CheckID"]
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| format!("service:{id}:{}", index + 1));
        let set = |field: &str| check.get(field).is_some_and(|v| !v.is_null());
        let kind = if set("HTTP") {
            "http"
        } else if set("GRPC") {
            "grpc"
        } else if set("TTL") {
            let Some(ttl) = check["TTL"].as_str().and_then(go_duration) else {
                return (StatusCode::BAD_REQUEST, "Request decode failed: TTL").into_response();
            };
            state
                .ttls
                .insert(check_id.clone(), (ttl, Instant::now() + ttl));
            "ttl"
        } else {
            "tcp"
        };
        state.checks.insert(
            check_id.clone(),
            json!({
                "Node": "double",
                "CheckID": check_id,
                "Name": check["Name"],
                "Status": "critical",
                "Notes": "",
                "Output": "",
                "ServiceID": id,
                "ServiceName": name,
                "ServiceTags": service["Tags"],
                "Type": kind,
            }),
        );
    }
    // Consul registers a Connect service's sidecar proxy with it.
    if let Some(sidecar) = registration
        .get("Connect")
        .and_then(|c| c.get("SidecarService"))
        .filter(|s| !s.is_null())
    {
        let sidecar_id = format!("{id}-sidecar-proxy");
        let mut proxy = agent_service(&json!({
            "ID": sidecar_id,
            "Name": format!("{name}-sidecar-proxy"),
            "Port": sidecar.get("Port").cloned().unwrap_or(json!(21000)),
            "Address": service["Address"],
        }));
        proxy["Kind"] = json!("connect-proxy");
        proxy["Proxy"] = json!({
            "DestinationServiceName": name,
            "DestinationServiceID": id,
            "Upstreams": sidecar["Proxy"]["Upstreams"],
        });
        state.services.insert(sidecar_id, proxy);
    }
    state.services.insert(id, service);
    StatusCode::OK.into_response()
}

/// `PUT /v1/acl/token`: a new token with fresh accessor and secret IDs.
async fn create_token(
    State(state): State<Shared>,
    Extension(authz): Extension<Authz>,
    body: Bytes,
) -> Response {
    if !authz.policy.acl_write {
        return authz.denied("acl:write", None);
    }
    let Ok(request) = serde_json::from_slice::<Value>(&body) else {
        return (StatusCode::BAD_REQUEST, "Request decode failed").into_response();
    };
    let mut state = state.lock().unwrap();
    let serial = state.tokens.len() + state.requests.len();
    let token = json!({
        "AccessorID": format!("6a1253d2-1785-24fd-91c2-{serial:012x}"),
        "SecretID": format!("45a3bd52-07c7-47a4-52fd-{serial:012x}"),
        "Description": request["Description"],
        "ServiceIdentities": request["ServiceIdentities"],
        "Local": request["Local"],
        "CreateIndex": 59,
        "ModifyIndex": 59,
    });
    let accessor = token["AccessorID"].as_str().unwrap().to_string();
    state.tokens.insert(accessor, token.clone());
    axum::Json(token).into_response()
}

/// `DELETE /v1/acl/token/:accessor`: `true`, also for a token that is not there (Consul
/// returns early: nothing to do).
async fn delete_token(
    State(state): State<Shared>,
    Extension(authz): Extension<Authz>,
    Path(accessor): Path<String>,
) -> Response {
    if !authz.policy.acl_write {
        return authz.denied("acl:write", None);
    }
    state.lock().unwrap().tokens.remove(&accessor);
    axum::Json(true).into_response()
}

async fn deregister(
    State(state): State<Shared>,
    Extension(authz): Extension<Authz>,
    Path(id): Path<String>,
) -> Response {
    let mut state = state.lock().unwrap();
    let Some(service) = state.services.get(&id) else {
        return (StatusCode::NOT_FOUND, format!("Unknown service ID {id:?}")).into_response();
    };
    let name = service["Service"].as_str().unwrap_or_default().to_string();
    if !authz.policy.may_write(&name) {
        return authz.denied("service:write", Some(&name));
    }
    state.services.remove(&id);
    state
        .checks
        .retain(|_, check| check["ServiceID"] != json!(id));
    // The sidecar goes with its service.
    state.services.remove(&format!("{id}-sidecar-proxy"));
    StatusCode::OK.into_response()
}

/// The agent's services the token may read; the others left out, and said so.
async fn services(State(state): State<Shared>, Extension(authz): Extension<Authz>) -> Response {
    let all = state.lock().unwrap().services.clone();
    let total = all.len();
    let readable: BTreeMap<String, Value> = all
        .into_iter()
        .filter(|(_, s)| {
            authz
                .policy
                .may_read(s["Service"].as_str().unwrap_or_default())
        })
        .collect();
    let removed = readable.len() != total;
    filtered_list(&authz, json!(readable), removed)
}

async fn service(
    State(state): State<Shared>,
    Extension(authz): Extension<Authz>,
    Path(id): Path<String>,
) -> Response {
    match state.lock().unwrap().services.get(&id) {
        Some(service) => {
            let name = service["Service"].as_str().unwrap_or_default();
            if !authz.policy.may_read(name) {
                return authz.denied("service:read", Some(name));
            }
            axum::Json(service.clone()).into_response()
        }
        None => (StatusCode::NOT_FOUND, format!("unknown service ID: {id}")).into_response(),
    }
}

/// The agent's checks of services the token may read; the others left out, and said so.
async fn checks(State(state): State<Shared>, Extension(authz): Extension<Authz>) -> Response {
    let all = {
        let mut state = state.lock().unwrap();
        expire_ttls(&mut state);
        state.checks.clone()
    };
    let total = all.len();
    let readable: BTreeMap<String, Value> = all
        .into_iter()
        .filter(|(_, c)| {
            authz
                .policy
                .may_read(c["ServiceName"].as_str().unwrap_or_default())
        })
        .collect();
    let removed = readable.len() != total;
    filtered_list(&authz, json!(readable), removed)
}

/// The one node of the double, as the catalog shows it.
fn double_node() -> Value {
    json!({
        "ID": "40e4a748-2192-161a-0510-9bf59fe950b5",
        "Node": "double",
        "Address": "127.0.0.1",
        "Datacenter": "dc1",
        "TaggedAddresses": { "lan": "127.0.0.1", "wan": "127.0.0.1" },
        "Meta": {},
    })
}

/// A KV entry as `GET /v1/kv` shows it: the value in base64, `null` when empty.
fn kv_entry(key: &str, value: &[u8], index: u64) -> Value {
    use base64::Engine as _;
    let value = if value.is_empty() {
        Value::Null
    } else {
        json!(base64::engine::general_purpose::STANDARD.encode(value))
    };
    json!({
        "LockIndex": 0,
        "Key": key,
        "Flags": 0,
        "Value": value,
        "CreateIndex": index,
        "ModifyIndex": index,
    })
}

/// `GET /v1/kv/:key`, and `?recurse` for every key under a prefix.
async fn kv_get(
    State(state): State<Shared>,
    Extension(authz): Extension<Authz>,
    Path(key): Path<String>,
    Query(query): Query<BTreeMap<String, String>>,
) -> Response {
    let state = state.lock().unwrap();
    let index = HeaderValue::from(state.index.max(1));
    let mut response = if query.contains_key("recurse") {
        let under: Vec<_> = state
            .kv
            .iter()
            .filter(|(k, _)| k.starts_with(&key))
            .collect();
        let readable: Vec<Value> = under
            .iter()
            .filter(|(k, _)| authz.policy.may_read_key(k))
            .map(|(k, (v, i))| kv_entry(k, v, *i))
            .collect();
        if readable.is_empty() {
            // Consul answers an empty listing as it answers a missing key.
            StatusCode::NOT_FOUND.into_response()
        } else {
            filtered_list(&authz, json!(readable), readable.len() != under.len())
        }
    } else if !authz.policy.may_read_key(&key) {
        authz.denied("key:read", Some(&key))
    } else {
        match state.kv.get(&key) {
            Some((value, index)) => {
                axum::Json(json!([kv_entry(&key, value, *index)])).into_response()
            }
            None => StatusCode::NOT_FOUND.into_response(),
        }
    };
    response.headers_mut().insert("X-Consul-Index", index);
    response
}

/// The worst status among checks: critical, then warning, then passing.
fn aggregated_status(checks: &[Value]) -> &'static str {
    let statuses: Vec<&str> = checks.iter().filter_map(|c| c["Status"].as_str()).collect();
    if statuses.contains(&"critical") {
        "critical"
    } else if statuses.contains(&"warning") {
        "warning"
    } else {
        "passing"
    }
}

/// `GET /v1/health/service/:name`: each instance with its node and checks (the
/// node's `serfHealth` among them); `?tag=` keeps those with the tag, `?passing` those
/// whose every check passes. A service the token may not read is an empty list.
async fn health_service(
    State(state): State<Shared>,
    Extension(authz): Extension<Authz>,
    Path(name): Path<String>,
    Query(query): Query<Vec<(String, String)>>,
) -> Response {
    if !authz.policy.may_read(&name) {
        return filtered_list(&authz, json!([]), true);
    }
    let mut state = state.lock().unwrap();
    expire_ttls(&mut state);
    let tags: Vec<&str> = query
        .iter()
        .filter(|(k, _)| k == "tag")
        .map(|(_, v)| v.as_str())
        .collect();
    let passing = query.iter().any(|(k, _)| k == "passing");
    let serf = json!({
        "Node": "double",
        "CheckID": "serfHealth",
        "Name": "Serf Health Status",
        "Status": "passing",
        "ServiceID": "",
        "ServiceName": "",
    });
    let entries: Vec<Value> = state
        .services
        .values()
        .filter(|s| s["Service"] == json!(name))
        .filter(|s| {
            let has: Vec<&str> = s["Tags"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            tags.iter().all(|t| has.contains(t))
        })
        .map(|s| {
            let mut checks = vec![serf.clone()];
            checks.extend(
                state
                    .checks
                    .values()
                    .filter(|c| c["ServiceID"] == s["ID"])
                    .cloned(),
            );
            json!({ "Node": double_node(), "Service": s, "Checks": checks })
        })
        .filter(|e| {
            !passing || aggregated_status(e["Checks"].as_array().map_or(&[], |c| c)) == "passing"
        })
        .collect();
    let mut response = axum::Json(json!(entries)).into_response();
    response
        .headers_mut()
        .insert("X-Consul-Index", HeaderValue::from(state.index.max(1)));
    response
}

/// `GET /v1/catalog/services`: every service name the token may read, with the tags
/// of all its instances.
async fn catalog_services(
    State(state): State<Shared>,
    Extension(authz): Extension<Authz>,
) -> Response {
    let state = state.lock().unwrap();
    let mut names: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut removed = false;
    for service in state.services.values() {
        let name = service["Service"].as_str().unwrap_or_default();
        if !authz.policy.may_read(name) {
            removed = true;
            continue;
        }
        let tags = names.entry(name.to_string()).or_default();
        for tag in service["Tags"].as_array().into_iter().flatten() {
            if let Some(tag) = tag.as_str().filter(|t| !tags.iter().any(|x| x == t)) {
                tags.push(tag.to_string());
            }
        }
    }
    filtered_list(&authz, json!(names), removed)
}
