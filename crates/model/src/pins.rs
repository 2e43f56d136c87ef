//! What ties a component to what the operator approved: its SHA-256 digest, pinned in the
//! agent config (`plugin "name" { sha256 = "..." }`, `hook "name" { sha256 = "..." }`),
//! with `require_pinned = true` refusing every third-party component that is not.
//! Built-in drivers are embedded in the `berth` binary, so they are pinned by the build.

use std::collections::BTreeMap;

use sha2::{Digest as _, Sha256};

/// The lowercase hex SHA-256 of `bytes`, as `sha256sum` prints it.
pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a SHA-256 digest: use the 64 hex digits `sha256sum FILE` prints")]
pub struct PinError(pub String);

/// A digest as the operator wrote it: 64 hex digits, optionally prefixed `sha256:`;
/// returned lowercase.
pub fn parse_sha256(text: &str) -> Result<String, PinError> {
    let hex = text.trim().strip_prefix("sha256:").unwrap_or(text.trim());
    if hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(hex.to_ascii_lowercase())
    } else {
        Err(PinError(text.to_string()))
    }
}

/// The driver pins of an agent config.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DriverPins {
    /// Refuse a driver from the plugin dir that no pin names.
    pub require_pinned: bool,
    /// Digest by driver name.
    pub by_name: BTreeMap<String, String>,
}

impl DriverPins {
    /// The name under which `digest` is pinned, if any.
    pub fn name_for(&self, digest: &str) -> Option<&str> {
        self.by_name
            .iter()
            .find(|(_, pinned)| *pinned == digest)
            .map(|(name, _)| name.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_are_sha256sum_hex() {
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        let upper = "BA7816BF8F01CFEA414140DE5DAE2223B00361A396177A9CB410FF61F20015AD";
        assert_eq!(parse_sha256(upper).unwrap(), sha256_hex(b"abc"));
        assert_eq!(
            parse_sha256(&format!("sha256:{upper}")).unwrap(),
            sha256_hex(b"abc")
        );
        assert!(parse_sha256("abc").is_err());
        assert!(parse_sha256(&"g".repeat(64)).is_err());
    }
}
