//! How berth proves who it is to etcd and checks that it talks to the real one: TLS
//! (etcd's certificate checked against the operator's `ca_file` only, and a client
//! certificate when configured) and etcd's own users (a password from `password_file`
//! exchanged for a token with `Auth.Authenticate`, which then rides in the `token`
//! metadata of every request, and is exchanged again when etcd says it is no longer
//! valid: etcd's simple tokens expire after `--auth-token-ttl` of disuse).
//!
//! The files are read once, when the agent joins; what they hold stays in memory.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use berth_proto::etcd::etcdserverpb::{self as pb, auth_client::AuthClient};
use tonic::metadata::{AsciiMetadataValue, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

use berth_model::cluster::{ClusterSettings, EtcdTls};
use berth_sys::secret_file::{SecretFileError, read_secret_file};

/// What berth needs to reach etcd: where it is and how to prove who berth is.
#[derive(Clone)]
pub struct EtcdAccess {
    pub endpoints: Vec<String>,
    pub dial_timeout: Duration,
    pub tls: Option<TlsMaterial>,
    pub credentials: Option<Credentials>,
}

impl std::fmt::Debug for EtcdAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the password or the private key.
        f.debug_struct("EtcdAccess")
            .field("endpoints", &self.endpoints)
            .field("tls", &self.tls.is_some())
            .field(
                "user",
                &self.credentials.as_ref().map(|c| c.username.as_str()),
            )
            .finish()
    }
}

/// The PEM contents of the TLS files.
#[derive(Clone)]
pub struct TlsMaterial {
    pub ca: Vec<u8>,
    /// The client certificate and its key.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
}

/// An etcd user and its password.
#[derive(Clone)]
pub struct Credentials {
    pub username: String,
    pub password: String,
}

/// A file of the cluster block that cannot be used. Each says which and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AccessFileError {
    #[error("cluster.password_file: {0}")]
    Password(#[from] SecretFileError),
    #[error("cluster.{field}: cannot read {}: {reason}", path.display())]
    Unreadable {
        field: &'static str,
        path: PathBuf,
        reason: String,
    },
    #[error("cluster.{field}: {} holds no PEM {what} (\"-----BEGIN ...\")", path.display())]
    NotPem {
        field: &'static str,
        path: PathBuf,
        what: &'static str,
    },
}

impl EtcdAccess {
    /// Plain access to `endpoints`: no TLS, no user (tests, and clusters without either).
    pub fn plain(endpoints: &[String], dial_timeout: Duration) -> EtcdAccess {
        EtcdAccess {
            endpoints: endpoints.to_vec(),
            dial_timeout,
            tls: None,
            credentials: None,
        }
    }

    /// Reads the files the cluster block names (the password file checked as the API's
    /// token file is: the agent's user's own, mode 0600).
    pub fn from_settings(settings: &ClusterSettings) -> Result<EtcdAccess, AccessFileError> {
        let tls = settings.tls.as_ref().map(read_tls).transpose()?;
        let credentials = match &settings.auth {
            Some(auth) => Some(Credentials {
                username: auth.username.clone(),
                password: read_secret_file("password file", &auth.password_file)?,
            }),
            None => None,
        };
        Ok(EtcdAccess {
            endpoints: settings.endpoints.clone(),
            dial_timeout: settings.dial_timeout,
            tls,
            credentials,
        })
    }

    /// rustls's settings for etcd's endpoints: the CA as the only root, the client
    /// certificate when there is one.
    pub(super) fn client_tls(&self) -> Option<ClientTlsConfig> {
        let tls = self.tls.as_ref()?;
        let config = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&tls.ca));
        Some(match &tls.identity {
            Some((cert, key)) => config.identity(Identity::from_pem(cert, key)),
            None => config,
        })
    }
}

fn read_pem(
    field: &'static str,
    path: &Path,
    what: &'static str,
) -> Result<Vec<u8>, AccessFileError> {
    let bytes = std::fs::read(path).map_err(|e| AccessFileError::Unreadable {
        field,
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    // rustls would only say so at the first connection, as a handshake failure.
    if !bytes.windows(11).any(|w| w == b"-----BEGIN ") {
        return Err(AccessFileError::NotPem {
            field,
            path: path.to_path_buf(),
            what,
        });
    }
    Ok(bytes)
}

fn read_tls(tls: &EtcdTls) -> Result<TlsMaterial, AccessFileError> {
    let ca = read_pem("ca_file", &tls.ca_file, "certificate")?;
    let identity = match &tls.client_cert {
        Some(client) => Some((
            read_pem("cert_file", &client.cert_file, "certificate")?,
            read_pem("key_file", &client.key_file, "private key")?,
        )),
        None => None,
    };
    Ok(TlsMaterial { ca, identity })
}

/// The connection every request goes through: it adds etcd's auth token, if any.
pub(super) type Transport = InterceptedService<Channel, TokenCell>;

/// The token etcd gave for berth's user, shared by every request of a connection.
#[derive(Clone, Default)]
pub struct TokenCell(Arc<RwLock<Option<AsciiMetadataValue>>>);

impl TokenCell {
    pub(super) fn current(&self) -> Option<AsciiMetadataValue> {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn set(&self, token: AsciiMetadataValue) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = Some(token);
    }
}

impl tonic::service::Interceptor for TokenCell {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(token) = self.current() {
            request.metadata_mut().insert("token", token);
        }
        Ok(request)
    }
}

/// Why authenticating failed.
#[derive(Debug)]
pub(super) enum AuthFailure {
    /// etcd refused the user or its password.
    Refused,
    /// etcd's auth is not enabled: there is nothing to authenticate to.
    NotEnabled,
    /// The call did not get through (etcd away, TLS refused).
    Call(tonic::Status),
}

/// Exchanges the password for a token, one exchange at a time: the requests that found
/// the same token stale wait for one new token instead of each asking for their own
/// (etcd checks a password with bcrypt, which is slow on purpose).
pub(super) struct Authenticator {
    credentials: Credentials,
    /// Without the token interceptor: Authenticate takes none.
    channel: Channel,
    pub(super) token: TokenCell,
    exchange: tokio::sync::Mutex<()>,
    /// How many tokens etcd gave (tests see a token replaced).
    pub(super) exchanges: std::sync::atomic::AtomicU64,
}

impl Authenticator {
    pub(super) fn new(credentials: Credentials, channel: Channel) -> Authenticator {
        Authenticator {
            credentials,
            channel,
            token: TokenCell::default(),
            exchange: tokio::sync::Mutex::new(()),
            exchanges: std::sync::atomic::AtomicU64::new(0),
        }
    }

    pub(super) fn username(&self) -> &str {
        &self.credentials.username
    }

    /// A new token, unless another request already replaced `stale` (the token the
    /// failed request carried).
    pub(super) async fn refresh(
        &self,
        stale: Option<&AsciiMetadataValue>,
    ) -> Result<(), AuthFailure> {
        let _one_at_a_time = self.exchange.lock().await;
        if self.token.current().as_ref() != stale {
            return Ok(());
        }
        let answer = AuthClient::new(self.channel.clone())
            .authenticate(pb::AuthenticateRequest {
                name: self.credentials.username.clone(),
                password: self.credentials.password.clone(),
            })
            .await;
        match answer {
            Ok(answer) => {
                let token = MetadataValue::try_from(answer.into_inner().token).map_err(|_| {
                    AuthFailure::Call(tonic::Status::internal(
                        "etcd answered a token that is not ASCII",
                    ))
                })?;
                self.token.set(token);
                self.exchanges
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                Ok(())
            }
            Err(status) if status.message().contains("authentication failed") => {
                Err(AuthFailure::Refused)
            }
            Err(status) if status.message().contains("authentication is not enabled") => {
                Err(AuthFailure::NotEnabled)
            }
            Err(status) => Err(AuthFailure::Call(status)),
        }
    }
}

/// Whether etcd refused a request for its token (expired, from before an auth change,
/// or absent) rather than for what it asked: asking again with a new token may work.
/// etcd's messages are its API (its own Go client matches them the same way).
pub(super) fn token_refused(message: &str) -> bool {
    [
        "invalid auth token",
        "user name is empty",
        "revision of auth store is old",
    ]
    .iter()
    .any(|m| message.contains(m))
}

/// A transport error with its causes (tonic's own message is often only "transport
/// error"; the cause, such as a certificate etcd's CA did not sign, is below it).
pub(super) fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    with_causes(error.to_string(), error.source())
}

/// A status's message with the causes of the transport error under it.
pub(super) fn status_text(status: &tonic::Status) -> String {
    with_causes(
        status.message().to_string(),
        std::error::Error::source(status),
    )
}

fn with_causes(mut text: String, mut source: Option<&(dyn std::error::Error + 'static)>) -> String {
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}
