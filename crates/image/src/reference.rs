//! Image references as Docker reads them: `[registry/]repository[:tag][@sha256:…]`.
//! A name without a registry is Docker Hub's (`redis` is `docker.io/library/redis`), a
//! name without a tag or digest is `:latest`. Anything else is refused with its reason,
//! before a connection is made.

use std::fmt;

/// Docker Hub, as references name it, and the host its API answers on.
pub const DOCKER_HUB: &str = "docker.io";
const DOCKER_HUB_API: &str = "registry-1.docker.io";

/// The longest reference accepted (Docker's own limit on a repository name is 255).
const MAX_LEN: usize = 512;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Reference {
    /// `docker.io`, `localhost:5000`, `ghcr.io`.
    pub registry: String,
    /// `library/redis`.
    pub repository: String,
    /// `latest` when neither a tag nor a digest was given.
    pub tag: Option<String>,
    /// `sha256:<64 hex digits>`.
    pub digest: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("image reference {reference:?}: {reason}")]
pub struct ReferenceError {
    pub reference: String,
    pub reason: &'static str,
}

impl Reference {
    pub fn parse(text: &str) -> Result<Reference, ReferenceError> {
        let bad = |reason| ReferenceError {
            reference: text.chars().take(80).collect(),
            reason,
        };
        if text.is_empty() {
            return Err(bad("is empty"));
        }
        if text.len() > MAX_LEN {
            return Err(bad("is longer than 512 bytes"));
        }
        let (name, digest) = match text.split_once('@') {
            Some((name, digest)) => {
                if !is_digest(digest) {
                    return Err(bad(
                        "its digest is not sha256:<64 lowercase hex digits> (the only kind berth checks)",
                    ));
                }
                (name, Some(digest.to_string()))
            }
            None => (text, None),
        };
        // The tag is after the last ':' that is past the last '/': `host:5000/a` has none.
        let last_slash = name.rfind('/').map_or(0, |i| i + 1);
        let (name, tag) = match name[last_slash..].rfind(':') {
            Some(i) => {
                let tag = &name[last_slash + i + 1..];
                if !is_tag(tag) {
                    return Err(bad(
                        "its tag is not 1 to 128 letters, digits, '_', '.' or '-' (not starting with '.' or '-')",
                    ));
                }
                (&name[..last_slash + i], Some(tag.to_string()))
            }
            None => (name, None),
        };
        let (registry, repository) = match name.split_once('/') {
            Some((first, rest))
                if first.contains('.') || first.contains(':') || first == "localhost" =>
            {
                (first.to_string(), rest.to_string())
            }
            _ => (DOCKER_HUB.to_string(), name.to_string()),
        };
        if !is_host(&registry) {
            return Err(bad("its registry is not a host name with an optional port"));
        }
        let repository = if registry == DOCKER_HUB && !repository.contains('/') {
            format!("library/{repository}")
        } else {
            repository
        };
        if !is_repository(&repository) {
            return Err(bad(
                "its repository is not lowercase letters and digits in parts separated by '/', each joined by '.', '_', '__' or '-'",
            ));
        }
        let tag = match (&tag, &digest) {
            (None, None) => Some("latest".to_string()),
            _ => tag,
        };
        Ok(Reference {
            registry,
            repository,
            tag,
            digest,
        })
    }

    /// What the manifest is asked for by: the digest when there is one.
    pub fn manifest_ref(&self) -> &str {
        self.digest
            .as_deref()
            .or(self.tag.as_deref())
            .unwrap_or("latest")
    }

    /// The host the registry's API answers on.
    pub fn api_host(&self) -> &str {
        if self.registry == DOCKER_HUB {
            DOCKER_HUB_API
        } else {
            &self.registry
        }
    }

    /// The registry is this machine (plain HTTP is allowed to it, as Docker allows).
    pub fn is_loopback(&self) -> bool {
        let host = match self.registry.rsplit_once(':') {
            Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => host,
            _ => &self.registry,
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        host == "localhost"
            || host
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback())
    }
}

impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.registry, self.repository)?;
        if let Some(tag) = &self.tag {
            write!(f, ":{tag}")?;
        }
        if let Some(digest) = &self.digest {
            write!(f, "@{digest}")?;
        }
        Ok(())
    }
}

/// `sha256:` and 64 lowercase hex digits.
pub fn is_digest(text: &str) -> bool {
    text.strip_prefix("sha256:").is_some_and(|hex| {
        hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    })
}

fn is_tag(tag: &str) -> bool {
    !tag.is_empty()
        && tag.len() <= 128
        && !tag.starts_with(['.', '-'])
        && tag
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

fn is_host(host: &str) -> bool {
    let (name, port) = match host.rsplit_once(':') {
        Some((name, port)) if !name.ends_with(':') && !name.contains('[') => (name, Some(port)),
        _ => (host, None),
    };
    let port_ok = port.is_none_or(|p| !p.is_empty() && p.len() <= 5 && p.parse::<u16>().is_ok());
    let name_ok = !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        });
    port_ok && name_ok
}

fn is_repository(repository: &str) -> bool {
    !repository.is_empty()
        && repository.len() <= 255
        && repository.split('/').all(|part| {
            let bytes = part.as_bytes();
            let alnum = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
            !bytes.is_empty()
                && bytes.first().is_some_and(alnum)
                && bytes.last().is_some_and(alnum)
                && bytes
                    .iter()
                    .all(|b| alnum(b) || matches!(b, b'.' | b'_' | b'-'))
                && !part.contains("..")
                && !part.contains("___")
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_read_as_docker_reads_them() {
        let r = Reference::parse("redis").unwrap();
        assert_eq!(
            (r.registry.as_str(), r.repository.as_str()),
            ("docker.io", "library/redis")
        );
        assert_eq!(r.tag.as_deref(), Some("latest"));
        assert_eq!(r.api_host(), "registry-1.docker.io");
        let r = Reference::parse("localhost:5000/team/app:1.2").unwrap();
        assert_eq!(r.registry, "localhost:5000");
        assert_eq!(r.repository, "team/app");
        assert_eq!(r.tag.as_deref(), Some("1.2"));
        assert!(r.is_loopback());
        let digest = format!("sha256:{}", "a".repeat(64));
        let r = Reference::parse(&format!("127.0.0.1:5000/app@{digest}")).unwrap();
        assert_eq!(
            (r.tag.as_deref(), r.digest.as_deref()),
            (None, Some(digest.as_str()))
        );
        assert_eq!(r.manifest_ref(), digest);
        assert!(r.is_loopback());
        let r = Reference::parse("ghcr.io/o/app:v1").unwrap();
        assert!(!r.is_loopback());
        assert_eq!(r.to_string(), "ghcr.io/o/app:v1");
    }

    #[test]
    fn odd_references_are_refused_with_their_reason() {
        for (text, reason) in [
            ("", "is empty"),
            ("Redis", "repository"),
            ("redis:", "tag"),
            ("redis:-x", "tag"),
            ("redis@sha256:abc", "digest"),
            ("redis@md5:aaaa", "digest"),
            ("a/../b", "repository"),
            ("host:99999/app", "registry"),
            ("a//b", "repository"),
            ("localhost:5000/", "repository"),
            ("x y", "repository"),
        ] {
            let error = Reference::parse(text).unwrap_err();
            assert!(error.reason.contains(reason), "{text:?}: {error}");
        }
        assert!(Reference::parse(&"a".repeat(600)).is_err());
    }
}
