//! The cluster's keyring: the keys that sign workload identities, one set for the whole
//! cluster (a lone agent's one-node cluster included), so that a token one node signs
//! verifies against the JWKS any node serves. A key belongs to a period of the rotation
//! threshold (`keyring/<period>`): the first node to need a period's key writes it with
//! a put-if-absent, and every other node takes the one written. Keys are kept, so tokens
//! signed with an older one still verify.

use serde::{Deserialize, Serialize};

use super::{Cluster, ClusterError};
use crate::etcd::{Condition, Write};

/// One signing key as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SigningKeyRecord {
    /// The JWT header's `kid`, and the JWKS entry's.
    pub kid: String,
    /// `EdDSA` (Ed25519).
    pub algorithm: String,
    pub created_ms: u64,
    /// The key pair as PKCS#8 DER, base64 (standard alphabet).
    pub private_pkcs8: String,
    /// The public key's 32 bytes, base64url without padding (the JWK's `x`).
    pub public: String,
}

impl Cluster {
    fn keyring_prefix(&self) -> String {
        format!("{}/", self.key(&["keyring"]))
    }

    /// Every signing key, oldest first.
    pub fn signing_keys(&self) -> Result<Vec<SigningKeyRecord>, ClusterError> {
        let prefix = self.keyring_prefix();
        let store = self.store().clone();
        let (entries, _) = self
            .store()
            .block(async move { store.list(&prefix).await })?;
        let mut keys: Vec<SigningKeyRecord> = entries
            .iter()
            .filter_map(|entry| serde_json::from_slice(&entry.value).ok())
            .collect();
        keys.sort_by(|a, b| (a.created_ms, &a.kid).cmp(&(b.created_ms, &b.kid)));
        Ok(keys)
    }

    /// Writes `key` unless a key of its `kid` is there; `false` when one was (another
    /// node wrote that period's key first: read it back).
    pub fn add_signing_key(&self, key: &SigningKeyRecord) -> Result<bool, ClusterError> {
        let name = format!("{}{}", self.keyring_prefix(), key.kid);
        let value = serde_json::to_vec(key).map_err(|e| ClusterError::Local(e.to_string()))?;
        let store = self.store().clone();
        Ok(self.store().block(async move {
            store
                .transaction(
                    vec![Condition::ModRevision(name.clone(), 0)],
                    vec![Write::Put {
                        key: name,
                        value,
                        lease: 0,
                    }],
                )
                .await
        })?)
    }
}
