//! **A double of Consul's agent HTTP API**, for tests only: Consul cannot be installed
//! where berth is built. It answers the endpoints berth calls with the request and
//! response shapes of Consul's documentation (`/v1/agent/service/register` with
//! `replace-existing-checks`, `/v1/agent/service/deregister/:id`, `/v1/agent/services`,
//! `/v1/agent/service/:id`, `/v1/agent/checks`, `PUT /v1/acl/token` and
//! `DELETE /v1/acl/token/:accessor`; the token in `X-Consul-Token`, 403 with "ACL not
//! found" for a wrong one; a Connect service's sidecar registered as
//! `<ID>-sidecar-proxy`), records every request, edits tags as an operator would in
//! Consul, and fails on demand.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use serde_json::{Value, json};

/// One request the double answered.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub at: Instant,
    pub method: Method,
    pub path: String,
    pub body: Value,
    pub status: u16,
}

#[derive(Default)]
struct DoubleState {
    services: BTreeMap<String, Value>,
    checks: BTreeMap<String, Value>,
    /// ACL tokens by accessor.
    tokens: BTreeMap<String, Value>,
    requests: Vec<Recorded>,
    /// Answer this many next requests with a 500.
    fail_next: u32,
    /// The token requests need, when ACLs are on.
    token: Option<String>,
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

    pub fn require_token(&self, token: &str) {
        self.state.lock().unwrap().token = Some(token.to_string());
    }

    pub fn fail_next(&self, requests: u32) {
        self.state.lock().unwrap().fail_next = requests;
    }

    /// The agent's services, as `GET /v1/agent/services` shows them.
    pub fn services(&self) -> BTreeMap<String, Value> {
        self.state.lock().unwrap().services.clone()
    }

    pub fn checks(&self) -> BTreeMap<String, Value> {
        self.state.lock().unwrap().checks.clone()
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

    /// Tags edited in Consul by an operator: with `EnableTagOverride`, Consul keeps them
    /// on the agent's copy too (its anti-entropy takes the catalog's tags).
    pub fn edit_tags(&self, id: &str, tags: &[&str]) {
        let mut state = self.state.lock().unwrap();
        let service = state.services.get_mut(id).expect("a registered service");
        service["Tags"] = json!(tags);
    }
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
            Some((
                StatusCode::INTERNAL_SERVER_ERROR,
                "rpc error: No cluster leader",
            ))
        } else if state.token.is_some() && state.token != token {
            Some((StatusCode::FORBIDDEN, "ACL not found"))
        } else {
            None
        }
    };
    let response = match refusal {
        Some(refusal) => refusal.into_response(),
        None => {
            let request = axum::extract::Request::from_parts(parts, axum::body::Body::from(bytes));
            next.run(request).await
        }
    };
    state.lock().unwrap().requests.push(Recorded {
        at: Instant::now(),
        method,
        path,
        body: body_json,
        status: response.status().as_u16(),
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
        let kind = if check.get("HTTP").is_some_and(|v| !v.is_null()) {
            "http"
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
async fn create_token(State(state): State<Shared>, body: Bytes) -> Response {
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

/// `DELETE /v1/acl/token/:accessor`: `true`, or 404 for a token that is not there.
async fn delete_token(State(state): State<Shared>, Path(accessor): Path<String>) -> Response {
    match state.lock().unwrap().tokens.remove(&accessor) {
        Some(_) => axum::Json(true).into_response(),
        None => (StatusCode::NOT_FOUND, "ACL not found").into_response(),
    }
}

async fn deregister(State(state): State<Shared>, Path(id): Path<String>) -> Response {
    let mut state = state.lock().unwrap();
    if state.services.remove(&id).is_none() {
        return (StatusCode::NOT_FOUND, format!("Unknown service ID {id:?}")).into_response();
    }
    state
        .checks
        .retain(|_, check| check["ServiceID"] != json!(id));
    // The sidecar goes with its service.
    state.services.remove(&format!("{id}-sidecar-proxy"));
    StatusCode::OK.into_response()
}

async fn services(State(state): State<Shared>) -> Response {
    axum::Json(state.lock().unwrap().services.clone()).into_response()
}

async fn service(State(state): State<Shared>, Path(id): Path<String>) -> Response {
    match state.lock().unwrap().services.get(&id) {
        Some(service) => axum::Json(service.clone()).into_response(),
        None => (StatusCode::NOT_FOUND, format!("unknown service ID: {id}")).into_response(),
    }
}

async fn checks(State(state): State<Shared>) -> Response {
    axum::Json(state.lock().unwrap().checks.clone()).into_response()
}
