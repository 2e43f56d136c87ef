//! Workload identities, as Nomad's: a JWT per task identity, signed (EdDSA, Ed25519) with
//! the cluster's current key (`berth_cluster::keyring`), its `kid` in the header, and
//! the JWKS of every key at `/.well-known/jwks.json`. The key of the current rotation
//! period is made by the first node that needs it; all nodes sign with it and serve the
//! same JWKS, so a token from one node verifies against another's.
//!
//! The next period's key is made with the current one and published before any node
//! signs with it (Nomad's prepublished key), and a node's JWKS read is kept for at most a
//! second and never across a period: a token signed under a new key verifies against
//! any node's JWKS read right after it, even with the nodes' clocks a little apart.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use berth_cluster::Cluster;
use berth_cluster::keyring::SigningKeyRecord;
use ring::signature::{Ed25519KeyPair, KeyPair};
use serde_json::{Value, json};

#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("this agent has no cluster keyring to sign identities with")]
    Detached,
    #[error("the cluster's keyring cannot be read or written: {0}")]
    Store(#[from] berth_cluster::ClusterError),
    #[error("making a signing key: {0}")]
    Generate(String),
    #[error("the keyring's key {kid:?} is not a usable Ed25519 key")]
    BadKey { kid: String },
    #[error("the cluster's keyring has no key for this period after writing one")]
    Vanished,
    #[error("signing was interrupted (the agent is stopping)")]
    Interrupted,
}

/// A key's `kid` and its Ed25519 public key, base64url (a JWK's `x`).
pub type PublicKey = (String, String);

struct Current {
    period: u64,
    kid: String,
    pair: Arc<Ed25519KeyPair>,
}

/// The signer and JWKS of one agent, over its cluster's keyring.
pub struct Keyring {
    cluster: Option<Arc<Cluster>>,
    rotation: Duration,
    current: Mutex<Option<Current>>,
    /// The public keys last read: when, in which period, and the keys.
    published: Mutex<Option<(std::time::Instant, u64, Vec<PublicKey>)>>,
}

impl std::fmt::Debug for Keyring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keyring")
            .field("attached", &self.cluster.is_some())
            .field("rotation", &self.rotation)
            .finish()
    }
}

fn now_ms() -> u64 {
    berth_cluster::now_ms()
}

impl Keyring {
    /// Over `cluster`'s keyring; a key is the current one for `rotation` (zero: Nomad's
    /// 720h).
    pub fn new(cluster: Arc<Cluster>, rotation: Duration) -> Keyring {
        Keyring {
            cluster: Some(cluster),
            rotation: if rotation.is_zero() {
                crate::config::keyring::DEFAULT_ROTATION
            } else {
                rotation
            },
            current: Mutex::new(None),
            published: Mutex::new(None),
        }
    }

    /// No keyring (runners tested alone): signing fails, and says why.
    pub fn detached() -> Keyring {
        Keyring {
            cluster: None,
            rotation: crate::config::keyring::DEFAULT_ROTATION,
            current: Mutex::new(None),
            published: Mutex::new(None),
        }
    }

    fn period(&self) -> u64 {
        now_ms() / (self.rotation.as_millis().max(1) as u64)
    }

    /// The current period's key: the cached one, else the keyring's, else a new one
    /// written (or the one another node wrote first). Blocks on the cluster's store.
    fn current(&self) -> Result<(String, Arc<Ed25519KeyPair>), IdentityError> {
        let cluster = self.cluster.as_ref().ok_or(IdentityError::Detached)?;
        let period = self.period();
        if let Some(current) = &*self.current.lock().unwrap()
            && current.period == period
        {
            return Ok((current.kid.clone(), current.pair.clone()));
        }
        let id: String = cluster.cluster_id().chars().take(8).collect();
        let kid_of = |period: u64| format!("{id}-{period}");
        let kid = kid_of(period);
        let record = period_key(cluster, &kid)?;
        // Prepublished: in every JWKS read from now on, before any node's clock reaches
        // its period.
        period_key(cluster, &kid_of(period + 1))?;
        let pair = Arc::new(key_pair(&record)?);
        *self.current.lock().unwrap() = Some(Current {
            period,
            kid: kid.clone(),
            pair: pair.clone(),
        });
        Ok((kid, pair))
    }

    /// `claims` as a signed JWT (`header.payload.signature`). Blocks on the store.
    pub fn sign(&self, claims: &Value) -> Result<String, IdentityError> {
        let (kid, pair) = self.current()?;
        let header = json!({ "alg": "EdDSA", "typ": "JWT", "kid": kid });
        let signing_input = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode(claims.to_string())
        );
        let signature = pair.sign(signing_input.as_bytes());
        Ok(format!(
            "{signing_input}.{}",
            URL_SAFE_NO_PAD.encode(signature.as_ref())
        ))
    }

    /// Every key of the keyring as `(kid, public key)`, the public key base64url (a
    /// JWK's `x`, derived from the key pair, not taken from the record), oldest first.
    /// Read from the store at most once a second (the JWKS route needs no token).
    /// Blocks on the store.
    pub fn public_keys(&self) -> Result<Vec<(String, String)>, IdentityError> {
        let cluster = self.cluster.as_ref().ok_or(IdentityError::Detached)?;
        let period = self.period();
        if let Some((at, read_in, keys)) = &*self.published.lock().unwrap()
            && at.elapsed() < Duration::from_secs(1)
            && *read_in == period
        {
            return Ok(keys.clone());
        }
        // Making the current period's key (and the next) first: a JWKS read before any
        // token verifies the first token, and one read in this period has every key a
        // token of this period can name.
        self.current()?;
        let keys: Vec<(String, String)> = cluster
            .signing_keys()?
            .iter()
            .filter_map(|record| {
                let pair = key_pair(record).ok()?;
                Some((
                    record.kid.clone(),
                    URL_SAFE_NO_PAD.encode(pair.public_key().as_ref()),
                ))
            })
            .collect();
        *self.published.lock().unwrap() = Some((std::time::Instant::now(), period, keys.clone()));
        Ok(keys)
    }
}

/// The keyring's key `kid`, made and written when it is not there (or the one another
/// node wrote first).
fn period_key(cluster: &Cluster, kid: &str) -> Result<SigningKeyRecord, IdentityError> {
    let find = |keys: Vec<SigningKeyRecord>| keys.into_iter().find(|k| k.kid == kid);
    if let Some(record) = find(cluster.signing_keys()?) {
        return Ok(record);
    }
    let made = generate(kid)?;
    if cluster.add_signing_key(&made)? {
        Ok(made)
    } else {
        find(cluster.signing_keys()?).ok_or(IdentityError::Vanished)
    }
}

fn generate(kid: &str) -> Result<SigningKeyRecord, IdentityError> {
    let random = ring::rand::SystemRandom::new();
    let pkcs8 = Ed25519KeyPair::generate_pkcs8(&random)
        .map_err(|e| IdentityError::Generate(e.to_string()))?;
    let pair = Ed25519KeyPair::from_pkcs8(pkcs8.as_ref())
        .map_err(|e| IdentityError::Generate(e.to_string()))?;
    Ok(SigningKeyRecord {
        kid: kid.to_string(),
        algorithm: "EdDSA".into(),
        created_ms: now_ms(),
        private_pkcs8: STANDARD.encode(pkcs8.as_ref()),
        public: URL_SAFE_NO_PAD.encode(pair.public_key().as_ref()),
    })
}

fn key_pair(record: &SigningKeyRecord) -> Result<Ed25519KeyPair, IdentityError> {
    let bad = || IdentityError::BadKey {
        kid: record.kid.clone(),
    };
    let der = STANDARD.decode(&record.private_pkcs8).map_err(|_| bad())?;
    Ed25519KeyPair::from_pkcs8_maybe_unchecked(&der).map_err(|_| bad())
}

/// What a task's identity says of it: Nomad's claims (`nomad_namespace`,
/// `nomad_job_id`, `nomad_allocation_id`, `nomad_task`, `sub`), its audience, when it
/// was made, and when it expires if it has a `ttl`.
pub struct Subject<'a> {
    pub job: &'a str,
    pub group: &'a str,
    pub task: &'a str,
    pub alloc: &'a str,
}

pub fn claims(subject: &Subject<'_>, identity: &berth_jobspec::Identity) -> Value {
    let now = now_ms() / 1000;
    let mut jti = [0u8; 16];
    let _ = rustix::rand::getrandom(&mut jti, rustix::rand::GetRandomFlags::empty());
    let mut claims = json!({
        "aud": identity.audience,
        "iat": now,
        "nbf": now,
        "jti": jti.iter().map(|b| format!("{b:02x}")).collect::<String>(),
        "sub": format!(
            "global:default:{}:{}:{}:{}",
            subject.job, subject.group, subject.task, identity.name
        ),
        "nomad_namespace": "default",
        "nomad_job_id": subject.job,
        "nomad_allocation_id": subject.alloc,
        "nomad_task": subject.task,
    });
    if let Some(ttl) = identity.ttl {
        claims["exp"] = json!(now + ttl.as_secs().max(1));
    }
    claims
}

#[cfg(test)]
mod tests {
    use super::*;
    use berth_cluster::embedded::Embedded;
    use berth_cluster::store::Store;
    use berth_model::cluster::ClusterSettings;

    fn member(store: &Store, dir: &std::path::Path, name: &str) -> Arc<Cluster> {
        let node = berth_cluster::NodeRecord {
            id: berth_cluster::random_id(),
            name: name.into(),
            datacenter: "dc1".into(),
            node_pool: "default".into(),
            node_class: String::new(),
            http_addr: None,
            attributes: Default::default(),
            drivers: Default::default(),
            host_volumes: Vec::new(),
            host_volume_paths: Default::default(),
            eligibility: "eligible".into(),
            drain: false,
            cpu_mhz: 1000,
            memory_mb: 1024,
            disk_mb: 0,
            reserved: Default::default(),
            reserved_ports: Vec::new(),
            registered_ms: 0,
        };
        Cluster::join_store(store.clone(), &ClusterSettings::default(), dir, node).unwrap()
    }

    fn kid_of(token: &str) -> String {
        let header = token.split('.').next().unwrap();
        let header: Value =
            serde_json::from_slice(&URL_SAFE_NO_PAD.decode(header).unwrap()).unwrap();
        header["kid"].as_str().unwrap().to_string()
    }

    /// Node b's JWKS, read right after node a signs, names a's key, across rotations:
    /// the key a new period signs with was published in the period before.
    #[test]
    fn a_token_signed_under_a_new_key_verifies_against_another_nodes_jwks_read_right_after() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::embedded(Embedded::in_memory()).unwrap();
        let rotation = Duration::from_millis(700);
        let a = Keyring::new(member(&store, dir.path(), "a"), rotation);
        let b = Keyring::new(member(&store, dir.path(), "b"), rotation);
        let mut kids = std::collections::BTreeSet::new();
        let end = std::time::Instant::now() + Duration::from_millis(2500);
        while std::time::Instant::now() < end {
            let kid = kid_of(&a.sign(&json!({"sub": "t"})).unwrap());
            let published = b.public_keys().unwrap();
            assert!(
                published.iter().any(|(k, _)| *k == kid),
                "{kid} not in {published:?}"
            );
            kids.insert(kid);
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(kids.len() >= 3, "rotated: {kids:?}");
    }
}
