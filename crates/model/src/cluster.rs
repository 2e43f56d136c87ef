//! The operator's `cluster { ... }` block: where the cluster store is. Plain data; the
//! store itself is `cluster/`.

use std::path::PathBuf;
use std::time::Duration;

/// Where the catalog and the cluster's state live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StoreKind {
    /// The agent's own store (`<data_dir>/cluster.db`): a one-node cluster (the default).
    #[default]
    Embedded,
    /// An etcd cluster shared by every agent of the berth cluster.
    Etcd,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterSettings {
    pub store: StoreKind,
    /// etcd's client URLs (`http://host:2379`).
    pub endpoints: Vec<String>,
    /// Every key berth writes starts with this; one prefix is one berth cluster.
    pub prefix: String,
    /// How long connecting to etcd may take at start.
    pub dial_timeout: Duration,
    /// A node's lease: a node whose agent has not renewed it for this long is down.
    pub heartbeat_ttl: Duration,
    /// How long a down node's CSI claims are kept before they are released (Nomad's
    /// `max_client_disconnect` idea): its allocs may still be writing.
    pub lost_claim_grace: Duration,
    /// TLS to etcd (`https://` endpoints); `None`: plain HTTP.
    pub tls: Option<EtcdTls>,
    /// The etcd user berth authenticates as; `None`: no authentication.
    pub auth: Option<EtcdAuth>,
}

/// How berth checks etcd's certificate, and the certificate it shows etcd.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdTls {
    /// The CA (PEM) that signed etcd's server certificate; the only root trusted.
    pub ca_file: PathBuf,
    /// A client certificate for etcd's `--client-cert-auth`.
    pub client_cert: Option<ClientCert>,
}

/// A client certificate and its private key, both PEM files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientCert {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
}

/// An etcd user and the file that holds its password (never the password itself: the
/// config file is often readable by more users than the agent's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdAuth {
    pub username: String,
    pub password_file: PathBuf,
}

impl Default for ClusterSettings {
    fn default() -> Self {
        ClusterSettings {
            store: StoreKind::Embedded,
            endpoints: vec!["http://127.0.0.1:2379".into()],
            prefix: "/berth".into(),
            dial_timeout: Duration::from_secs(5),
            heartbeat_ttl: Duration::from_secs(10),
            lost_claim_grace: Duration::from_secs(60),
            tls: None,
            auth: None,
        }
    }
}

impl ClusterSettings {
    pub fn uses_etcd(&self) -> bool {
        self.store == StoreKind::Etcd
    }

    /// Whether berth proves who it is to etcd (a user, or a client certificate): when
    /// not, whoever reaches etcd is as powerful as berth.
    pub fn presents_credentials(&self) -> bool {
        self.auth.is_some() || self.tls.as_ref().is_some_and(|t| t.client_cert.is_some())
    }
}
