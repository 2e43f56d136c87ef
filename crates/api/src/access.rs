//! Who may use the API. The trust model: the operator (root, or the members of
//! `http.socket_group`) drives the agent; any other local user, and any web page a
//! browser on this machine opens, may not.
//!
//! - **The Unix socket** (`<data_dir>/api.sock`, the default) is guarded by the file
//!   system: mode 0600 for the agent's user, or 0660 for `socket_group`, inside a data dir
//!   only they may enter.
//! - **A TCP listener** is opt-in (`http { address }`) and needs a bearer token
//!   (`X-Berth-Token: <secret>` or `Authorization: Bearer <secret>`): none is 401, a wrong
//!   one 403, a `read` token on a route that changes something 403 (the route table's
//!   scope, `routes.rs`). `berth agent -dev` keeps an open
//!   loopback listener, and says so loudly.
//! - **Browsers**: a TCP request whose `Host` is not the listener's own address (DNS
//!   rebinding) or whose `Origin` is another site is refused with 403, token or not.

use std::io;
use std::net::SocketAddr;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::Json;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::ApiError;
use crate::routes::Scope;
use berth_client::agent::Submitter;
use berth_client::config::{ApiToken, HttpConfig, TokenScope};
use berth_sys::secret_file::{SecretFileError, read_secret_file};

/// The API socket's name in the data dir.
pub const SOCKET_NAME: &str = "api.sock";

/// Why the agent will not open its API as configured. Each says what to fix.
#[derive(Debug, thiserror::Error)]
pub enum AccessError {
    #[error(
        "http.address {0} opens a TCP listener, which needs a token: add token_file = \"/path\" \
         (the agent creates it) or a token \"name\" {{ secret = ..., scope = ... }} block to the \
         http block, or leave address out and use the Unix socket"
    )]
    TcpWithoutToken(SocketAddr),
    #[error(
        "dev mode answers without a token only on loopback, and {0} is reachable from other \
         machines: anyone there could run jobs on this node as root. Listen on 127.0.0.1, or \
         add token_file = \"/path\" (or a token block) to the agent config's http block"
    )]
    DevOffLoopback(SocketAddr),
    #[error(transparent)]
    TokenFileRefused(#[from] SecretFileError),
    #[error("the token file {}: {source}", path.display())]
    TokenFile { path: PathBuf, source: io::Error },
    #[error(
        "{} exists and is not a socket: move it away (the agent serves its API there)",
        .0.display()
    )]
    NotASocket(PathBuf),
    #[error("another agent is serving at {}: stop it first", .0.display())]
    SocketInUse(PathBuf),
    #[error("no group {0:?} on this machine (http.socket_group)")]
    NoSuchGroup(String),
    #[error("the API socket {}: {source}", path.display())]
    Socket { path: PathBuf, source: io::Error },
}

/// What one listener asks of a request.
#[derive(Debug)]
pub struct AccessPolicy {
    tokens: Vec<ApiToken>,
    /// No token needed: the Unix socket (guarded by its mode) or a `-dev` listener.
    open: bool,
    /// For TCP: the `Host` values (and `Origin` hosts) that name this listener.
    hosts: Option<Vec<String>>,
}

impl AccessPolicy {
    /// The Unix socket: its mode is the access control.
    pub fn socket() -> AccessPolicy {
        AccessPolicy {
            tokens: Vec::new(),
            open: true,
            hosts: None,
        }
    }

    /// A TCP listener at `address` that needs one of `tokens` (or none, with `open`).
    pub fn tcp(address: SocketAddr, tokens: Vec<ApiToken>, open: bool) -> AccessPolicy {
        let port = address.port();
        let mut hosts = vec![address.to_string()];
        if address.ip().is_loopback() || address.ip().is_unspecified() {
            hosts.extend([
                format!("localhost:{port}"),
                format!("127.0.0.1:{port}"),
                format!("[::1]:{port}"),
            ]);
        }
        AccessPolicy {
            tokens,
            open,
            hosts: Some(hosts),
        }
    }

    /// Whether `request` may pass, and who it comes from; the refusal otherwise.
    fn check(
        &self,
        method: &Method,
        matched: Option<&str>,
        headers: &HeaderMap,
    ) -> Result<Option<Submitter>, (StatusCode, String)> {
        if let Some(hosts) = &self.hosts {
            // Two Host or Origin headers: which one a proxy or the browser meant is not
            // for the agent to guess.
            for name in [header::HOST, header::ORIGIN] {
                if headers.get_all(&name).iter().count() > 1 {
                    return Err((
                        StatusCode::BAD_REQUEST,
                        format!("the request has more than one {name} header"),
                    ));
                }
            }
            let host = headers
                .get(header::HOST)
                .and_then(|h| h.to_str().ok())
                .unwrap_or("");
            if !hosts.iter().any(|h| h.eq_ignore_ascii_case(host)) {
                return Err((
                    StatusCode::FORBIDDEN,
                    format!(
                        "the Host header {host:?} does not name this agent ({}); requests \
                         through other names are refused (DNS rebinding)",
                        hosts[0]
                    ),
                ));
            }
            if let Some(origin) = headers.get(header::ORIGIN) {
                let origin = origin.to_str().unwrap_or("");
                // The listener speaks plain HTTP: its own pages' origin is http://host.
                let same = origin
                    .split_once("://")
                    .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("http"))
                    .is_some_and(|(_, host)| hosts.iter().any(|h| h.eq_ignore_ascii_case(host)));
                if !same {
                    return Err((
                        StatusCode::FORBIDDEN,
                        format!("cross-origin requests are refused (Origin {origin:?})"),
                    ));
                }
            }
            let cross_site = headers
                .get("sec-fetch-site")
                .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"cross-site"));
            if cross_site {
                return Err((
                    StatusCode::FORBIDDEN,
                    "cross-site requests are refused".into(),
                ));
            }
        }
        // A public route (the JWKS) with no token: answered, as no one in particular.
        if crate::routes::scope_of(method, matched) == Scope::Public
            && presented_token(headers).is_none()
        {
            return Ok(None);
        }
        if self.open {
            // The socket's mode is the operator's word; an open (-dev) TCP listener is
            // anyone's on this machine.
            return Ok(Some(match self.hosts {
                None => Submitter::Operator,
                Some(_) => Submitter::Dev,
            }));
        }
        let Some(presented) = presented_token(headers) else {
            return Err((
                StatusCode::UNAUTHORIZED,
                "this listener needs a token: set BERTH_TOKEN (or pass --token), or use the \
                 agent's Unix socket"
                    .into(),
            ));
        };
        let Some(token) = self
            .tokens
            .iter()
            .find(|t| constant_time_eq(t.secret.as_bytes(), presented.as_bytes()))
        else {
            return Err((StatusCode::FORBIDDEN, "the token is not valid".into()));
        };
        let needed = crate::routes::scope_of(method, matched);
        let allowed = match needed {
            Scope::Public | Scope::Read => true,
            Scope::Submit => token.scope != TokenScope::Read,
            Scope::Exec => matches!(token.scope, TokenScope::AllocExec | TokenScope::Plugin),
        };
        if !allowed {
            let has = match token.scope {
                TokenScope::Read => "read",
                TokenScope::Submit => "submit",
                TokenScope::AllocExec => "alloc-exec",
                TokenScope::Plugin => "plugin",
            };
            return Err((
                StatusCode::FORBIDDEN,
                format!(
                    "token {:?} has scope {has:?}; {method} {} needs a token of scope {:?}",
                    token.name,
                    matched.unwrap_or("this path"),
                    needed.as_str(),
                ),
            ));
        }
        Ok(Some(Submitter::Token {
            name: token.name.clone(),
            may_run_plugins: token.scope == TokenScope::Plugin,
        }))
    }
}

impl AccessPolicy {
    /// Whether requests need a token here (a TCP listener outside dev mode).
    pub fn needs_token(&self) -> bool {
        !self.open
    }

    /// Whether `headers` carry one of the listener's tokens, of any scope: what a
    /// connection let into the reserve kept for token holders must show on its first
    /// request (the access check still runs on it, as on every request).
    pub fn token_check(&self, headers: &HeaderMap) -> Result<(), (StatusCode, String)> {
        let Some(presented) = presented_token(headers) else {
            return Err((
                StatusCode::UNAUTHORIZED,
                "the agent is at its connection limit; only a request with a token is \
                 answered now"
                    .into(),
            ));
        };
        if self
            .tokens
            .iter()
            .any(|t| constant_time_eq(t.secret.as_bytes(), presented.as_bytes()))
        {
            Ok(())
        } else {
            Err((StatusCode::FORBIDDEN, "the token is not valid".into()))
        }
    }
}

/// The axum middleware that applies a listener's policy.
pub async fn enforce(
    State(policy): State<Arc<AccessPolicy>>,
    mut request: Request,
    next: Next,
) -> Response {
    let matched = request
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .cloned();
    let matched = matched.as_ref().map(axum::extract::MatchedPath::as_str);
    match policy.check(request.method(), matched, request.headers()) {
        Ok(None) => next.run(request).await,
        Ok(Some(submitter)) => {
            let operator = submitter == Submitter::Operator;
            request.extensions_mut().insert(submitter);
            if operator {
                berth_jobspec::pool::in_operator_lane(next.run(request)).await
            } else {
                next.run(request).await
            }
        }
        Err((status, error)) => (
            status,
            Json(ApiError {
                error,
                problems: Vec::new(),
            }),
        )
            .into_response(),
    }
}

/// The token as presented, compared exactly (no trimming: a secret with a space is
/// another secret).
fn presented_token(headers: &HeaderMap) -> Option<&str> {
    for name in ["x-berth-token", "x-nomad-token"] {
        if let Some(token) = headers.get(name).and_then(|v| v.to_str().ok()) {
            return Some(token);
        }
    }
    let authorization = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (kind, token) = authorization.split_once(' ')?;
    kind.eq_ignore_ascii_case("bearer").then_some(token)
}

/// Compares without an early exit, so the time taken says nothing about the secret.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |diff, (x, y)| diff | (x ^ y)) == 0
}

/// The tokens a TCP listener accepts: the config's, and the token file's (created with a
/// fresh random secret, mode 0600, when missing). Refuses a TCP listener with no token.
pub fn tcp_tokens(http: &HttpConfig, address: SocketAddr) -> Result<Vec<ApiToken>, AccessError> {
    let mut tokens = http.tokens.clone();
    if let Some(path) = &http.token_file {
        let secret = load_or_create_token_file(path)?;
        tokens.push(ApiToken {
            name: "token_file".into(),
            secret,
            scope: TokenScope::Submit,
        });
    }
    if tokens.is_empty() {
        return Err(AccessError::TcpWithoutToken(address));
    }
    Ok(tokens)
}

fn load_or_create_token_file(path: &Path) -> Result<String, AccessError> {
    let file_error = |source| AccessError::TokenFile {
        path: path.to_path_buf(),
        source,
    };
    match read_secret_file("token file", path) {
        Ok(secret) => Ok(secret),
        Err(error) if error.is_missing() => {
            let mut bytes = [0u8; 24];
            rustix::rand::getrandom(&mut bytes, rustix::rand::GetRandomFlags::empty())
                .map_err(|e| file_error(e.into()))?;
            let secret: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(path)
                .map_err(file_error)?;
            io::Write::write_all(&mut file, format!("{secret}\n").as_bytes())
                .map_err(file_error)?;
            // The path, never the value.
            tracing::info!(path = %path.display(), "created the API token file (mode 0600)");
            Ok(secret)
        }
        Err(error) => Err(error.into()),
    }
}

/// Binds the API socket in `data_dir`: 0600, or 0660 for `group` (and then the data dir
/// is 0710 for that group, so its members can reach the socket and nothing else). A
/// socket left by an agent that died is replaced; anything else at that path is not.
pub fn bind_socket(
    data_dir: &Path,
    group: Option<&str>,
) -> Result<tokio::net::UnixListener, AccessError> {
    let path = data_dir.join(SOCKET_NAME);
    let socket_error = |source| AccessError::Socket {
        path: path.clone(),
        source,
    };
    let gid = group.map(group_id).transpose()?;
    match std::fs::symlink_metadata(&path) {
        Ok(meta) if !meta.file_type().is_socket() => {
            return Err(AccessError::NotASocket(path));
        }
        Ok(_) => {
            if std::os::unix::net::UnixStream::connect(&path).is_ok() {
                return Err(AccessError::SocketInUse(path));
            }
            std::fs::remove_file(&path).map_err(socket_error)?;
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(socket_error(e)),
    }
    let listener = tokio::net::UnixListener::bind(&path).map_err(socket_error)?;
    let mode = match gid {
        Some(gid) => {
            let gid = Some(rustix::fs::Gid::from_raw(gid));
            rustix::fs::chown(&path, None, gid).map_err(|e| socket_error(e.into()))?;
            rustix::fs::chown(data_dir, None, gid).map_err(|e| socket_error(e.into()))?;
            std::fs::set_permissions(data_dir, std::fs::Permissions::from_mode(0o710))
                .map_err(socket_error)?;
            0o660
        }
        None => 0o600,
    };
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).map_err(socket_error)?;
    Ok(listener)
}

/// The id of group `name`, from `/etc/group`.
fn group_id(name: &str) -> Result<u32, AccessError> {
    let groups = std::fs::read_to_string("/etc/group").unwrap_or_default();
    groups
        .lines()
        .filter_map(|line| {
            let mut fields = line.split(':');
            let group = fields.next()?;
            let gid = fields.nth(1)?.parse().ok()?;
            (group == name).then_some(gid)
        })
        .next()
        .ok_or_else(|| AccessError::NoSuchGroup(name.to_string()))
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    fn token(name: &str, secret: &str, scope: TokenScope) -> ApiToken {
        ApiToken {
            name: name.into(),
            secret: secret.into(),
            scope,
        }
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, HeaderValue::from_str(value).unwrap());
        }
        map
    }

    #[test]
    fn tcp_needs_the_right_token_and_scope_and_its_own_host() {
        let policy = AccessPolicy::tcp(
            "127.0.0.1:4646".parse().unwrap(),
            vec![
                token("ci", "submit-secret-0123456789", TokenScope::Submit),
                token("viewer", "read-secret-0123456789", TokenScope::Read),
                token("csi", "plugin-secret-0123456789", TokenScope::Plugin),
                token("ops", "exec-secret-0123456789", TokenScope::AllocExec),
            ],
            false,
        );
        let host = ("host", "127.0.0.1:4646");
        let code_at = |method: Method, path: Option<&str>, extra: &[(&'static str, &str)]| {
            let mut pairs = vec![host];
            pairs.extend_from_slice(extra);
            policy
                .check(&method, path, &headers(&pairs))
                .map_err(|(code, _)| code)
        };
        let code = |method: Method, extra: &[(&'static str, &str)]| {
            code_at(method, Some("/v1/jobs"), extra)
        };
        assert_eq!(code(Method::GET, &[]), Err(StatusCode::UNAUTHORIZED));
        assert_eq!(
            code(Method::GET, &[("x-berth-token", "wrong-secret-0123456789")]),
            Err(StatusCode::FORBIDDEN)
        );
        let token = |name: &str| {
            Ok(Some(Submitter::Token {
                name: name.into(),
                may_run_plugins: false,
            }))
        };
        // The JWKS needs no token; with one, the token is checked as anywhere.
        assert_eq!(
            code_at(Method::GET, Some("/.well-known/jwks.json"), &[]),
            Ok(None)
        );
        assert_eq!(
            code_at(
                Method::GET,
                Some("/.well-known/jwks.json"),
                &[("x-berth-token", "wrong-secret-0123456789")]
            ),
            Err(StatusCode::FORBIDDEN)
        );
        assert_eq!(
            code_at(Method::POST, Some("/.well-known/jwks.json"), &[]),
            Err(StatusCode::UNAUTHORIZED)
        );
        assert_eq!(
            code(Method::GET, &[("x-berth-token", "read-secret-0123456789")]),
            token("viewer")
        );
        assert_eq!(
            code(
                Method::POST,
                &[("authorization", "Bearer read-secret-0123456789")]
            ),
            Err(StatusCode::FORBIDDEN)
        );
        assert_eq!(
            code(
                Method::POST,
                &[("authorization", "Bearer submit-secret-0123456789")]
            ),
            token("ci")
        );
        // The route table says what a route needs, for the route axum matched.
        let read_token = [("x-berth-token", "read-secret-0123456789")];
        assert_eq!(
            code_at(Method::GET, Some("/v1/job/{id}"), &read_token),
            token("viewer")
        );
        assert_eq!(
            code_at(Method::POST, Some("/v1/jobs/parse"), &read_token),
            Err(StatusCode::FORBIDDEN)
        );
        assert_eq!(
            code_at(Method::POST, None, &read_token),
            Err(StatusCode::FORBIDDEN)
        );
        // alloc exec needs a token of scope alloc-exec (or plugin), whatever its method.
        let exec = Some("/v1/client/allocation/{id}/exec");
        for (secret, allowed) in [
            ("read-secret-0123456789", false),
            ("submit-secret-0123456789", false),
            ("exec-secret-0123456789", true),
            ("plugin-secret-0123456789", true),
        ] {
            let presented = [("x-berth-token", secret)];
            let answer = code_at(Method::GET, exec, &presented);
            assert_eq!(answer.is_ok(), allowed, "{secret}: {answer:?}");
        }
        assert_eq!(
            code_at(
                Method::POST,
                Some("/v1/jobs"),
                &[("x-berth-token", "exec-secret-0123456789")]
            ),
            token("ops")
        );
        // A client that always sends its read token reads the JWKS too.
        assert_eq!(
            code_at(Method::GET, Some("/.well-known/jwks.json"), &read_token),
            token("viewer")
        );
        // Only a token of scope "plugin" may run plugin jobs.
        assert_eq!(
            code(
                Method::POST,
                &[("authorization", "Bearer plugin-secret-0123456789")]
            ),
            Ok(Some(Submitter::Token {
                name: "csi".into(),
                may_run_plugins: true
            }))
        );
        let rebound = policy.check(
            &Method::GET,
            Some("/v1/jobs"),
            &headers(&[
                ("host", "evil.example:4646"),
                ("x-berth-token", "submit-secret-0123456789"),
            ]),
        );
        assert_eq!(
            rebound.map_err(|(code, _)| code),
            Err(StatusCode::FORBIDDEN)
        );
        assert_eq!(
            code(
                Method::POST,
                &[
                    ("origin", "http://evil.example"),
                    ("x-berth-token", "submit-secret-0123456789")
                ]
            ),
            Err(StatusCode::FORBIDDEN)
        );
        assert_eq!(
            code(
                Method::GET,
                &[
                    ("origin", "http://localhost:4646"),
                    ("x-berth-token", "read-secret-0123456789")
                ]
            ),
            token("viewer")
        );
    }

    #[test]
    fn duplicated_headers_another_scheme_and_padded_tokens_are_refused() {
        let policy = AccessPolicy::tcp(
            "127.0.0.1:4646".parse().unwrap(),
            vec![token("ci", "submit-secret-0123456789", TokenScope::Submit)],
            false,
        );
        let check = |pairs: &[(&'static str, &str)]| {
            let mut map = HeaderMap::new();
            for (name, value) in pairs {
                map.append(*name, HeaderValue::from_str(value).unwrap());
            }
            policy
                .check(&Method::GET, Some("/v1/jobs"), &map)
                .map(|_| ())
                .map_err(|(code, _)| code)
        };
        let good = ("x-berth-token", "submit-secret-0123456789");
        assert_eq!(check(&[("host", "127.0.0.1:4646"), good]), Ok(()));
        assert_eq!(
            check(&[("host", "127.0.0.1:4646"), ("host", "evil.example"), good]),
            Err(StatusCode::BAD_REQUEST)
        );
        assert_eq!(
            check(&[
                ("host", "127.0.0.1:4646"),
                ("origin", "http://127.0.0.1:4646"),
                ("origin", "http://evil.example"),
                good
            ]),
            Err(StatusCode::BAD_REQUEST)
        );
        assert_eq!(
            check(&[
                ("host", "127.0.0.1:4646"),
                ("origin", "https://127.0.0.1:4646"),
                good
            ]),
            Err(StatusCode::FORBIDDEN)
        );
        assert_eq!(
            check(&[("host", "127.0.0.1:4646"), ("origin", "null"), good]),
            Err(StatusCode::FORBIDDEN)
        );
        assert_eq!(
            check(&[
                ("host", "127.0.0.1:4646"),
                ("x-berth-token", " submit-secret-0123456789")
            ]),
            Err(StatusCode::FORBIDDEN)
        );
    }

    #[test]
    fn a_token_file_another_user_owns_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "someone-elses-token-0123\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        rustix::fs::chown(
            &path,
            Some(rustix::fs::Uid::from_raw(65534)),
            Some(rustix::fs::Gid::from_raw(65534)),
        )
        .unwrap();
        let error = load_or_create_token_file(&path).unwrap_err();
        assert!(
            error.to_string().contains("is owned by uid 65534"),
            "{error}"
        );
    }

    #[test]
    fn the_socket_needs_no_token_and_checks_no_host() {
        let policy = AccessPolicy::socket();
        assert_eq!(
            policy.check(&Method::POST, Some("/v1/jobs"), &headers(&[])),
            Ok(Some(Submitter::Operator))
        );
        // An open (-dev) TCP listener is anyone's on the machine: not the operator.
        let open = AccessPolicy::tcp("127.0.0.1:4646".parse().unwrap(), Vec::new(), true);
        assert_eq!(
            open.check(
                &Method::POST,
                Some("/v1/jobs"),
                &headers(&[("host", "127.0.0.1:4646")])
            ),
            Ok(Some(Submitter::Dev))
        );
    }

    #[test]
    fn token_files_are_created_private_and_refused_when_open() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("api-token");
        let created = load_or_create_token_file(&path).unwrap();
        assert_eq!(created.len(), 48);
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(load_or_create_token_file(&path).unwrap(), created);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let error = load_or_create_token_file(&path).unwrap_err();
        assert_eq!(
            error.to_string(),
            format!(
                "the token file {} is open to others (mode 644): run `chmod 600 {}`",
                path.display(),
                path.display()
            )
        );
    }

    #[test]
    fn tcp_without_a_token_is_refused() {
        let http = HttpConfig::default();
        let error = tcp_tokens(&http, "127.0.0.1:4646".parse().unwrap()).unwrap_err();
        assert!(matches!(error, AccessError::TcpWithoutToken(_)), "{error}");
    }
}
