//! The operator's registry credentials in Docker's `config.json` (`docker login` writes
//! it): `auths`, keyed by registry (`registry.example.com:5000`, with or without a
//! scheme; Docker Hub as `https://index.docker.io/v1/`), each an `auth` of
//! base64 `user:password` or a `username` and `password`. Credential helpers
//! (`credsStore`, `credHelpers`) run programs, which berth does not: a registry only
//! they serve is named in the error.

use base64::Engine as _;

use crate::registry::Credentials;

/// The most of a config file read.
pub const MAX_CONFIG: u64 = 1 << 20;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DockerConfigError {
    #[error("is not Docker's config.json: {0}")]
    Unreadable(String),
    #[error("its entry for {registry} has an auth that is not base64 of user:password")]
    BadAuth { registry: String },
    #[error(
        "it leaves {registry} to a credential helper ({helper}), which berth does not run: \
         put the registry's auth in \"auths\" (docker login with no helper writes it there)"
    )]
    Helper { registry: String, helper: String },
}

#[derive(serde::Deserialize, Default)]
struct Config {
    #[serde(default)]
    auths: std::collections::BTreeMap<String, Entry>,
    #[serde(default, rename = "credsStore")]
    creds_store: Option<String>,
    #[serde(default, rename = "credHelpers")]
    cred_helpers: std::collections::BTreeMap<String, String>,
}

#[derive(serde::Deserialize, Default)]
struct Entry {
    #[serde(default)]
    auth: Option<String>,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<String>,
}

/// The host part of an `auths` key: `https://ghcr.io/v1/` is `ghcr.io`.
fn host_of(key: &str) -> &str {
    let key = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key);
    key.split('/').next().unwrap_or(key)
}

/// The names Docker Hub goes by in `auths`.
const DOCKER_HUB: &[&str] = &["docker.io", "index.docker.io", "registry-1.docker.io"];

/// `registry`'s credentials in the config `text`, if it has some.
pub fn credentials_for(
    text: &str,
    registry: &str,
) -> Result<Option<Credentials>, DockerConfigError> {
    let config: Config =
        serde_json::from_str(text).map_err(|e| DockerConfigError::Unreadable(e.to_string()))?;
    let same = |key: &str| {
        let host = host_of(key);
        host == registry || (DOCKER_HUB.contains(&host) && DOCKER_HUB.contains(&registry))
    };
    if let Some((_, entry)) = config.auths.iter().find(|(key, _)| same(key)) {
        if let (Some(username), Some(password)) = (&entry.username, &entry.password) {
            return Ok(Some(Credentials {
                username: username.clone(),
                password: password.clone(),
            }));
        }
        if let Some(auth) = &entry.auth {
            let bad = || DockerConfigError::BadAuth {
                registry: registry.to_string(),
            };
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(auth.trim())
                .map_err(|_| bad())?;
            let decoded = String::from_utf8(decoded).map_err(|_| bad())?;
            let (username, password) = decoded.split_once(':').ok_or_else(bad)?;
            return Ok(Some(Credentials {
                username: username.to_string(),
                password: password.to_string(),
            }));
        }
    }
    let helper = config
        .cred_helpers
        .iter()
        .find(|(key, _)| same(key))
        .map(|(_, helper)| helper.clone())
        .or(config.creds_store);
    match helper {
        Some(helper) => Err(DockerConfigError::Helper {
            registry: registry.to_string(),
            helper,
        }),
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn creds(username: &str, password: &str) -> Option<Credentials> {
        Some(Credentials {
            username: username.into(),
            password: password.into(),
        })
    }

    #[test]
    fn finds_a_registrys_auth_by_host_with_or_without_a_scheme() {
        let text = r#"{"auths": {
            "https://index.docker.io/v1/": {"auth": "aHViOnNlY3JldA=="},
            "registry.example.com:5000": {"auth": "dGVhbTpwYTpzcw=="},
            "https://ghcr.io": {"username": "me", "password": "tok"}
        }}"#;
        assert_eq!(
            credentials_for(text, "docker.io"),
            Ok(creds("hub", "secret"))
        );
        assert_eq!(
            credentials_for(text, "registry.example.com:5000"),
            Ok(creds("team", "pa:ss")),
            "the password may hold a colon"
        );
        assert_eq!(credentials_for(text, "ghcr.io"), Ok(creds("me", "tok")));
        assert_eq!(credentials_for(text, "registry.example.com"), Ok(None));
        assert_eq!(credentials_for("{}", "ghcr.io"), Ok(None));
    }

    #[test]
    fn a_helper_a_bad_auth_or_a_broken_file_is_an_error_that_says_which() {
        let helper = r#"{"credHelpers": {"123.dkr.ecr.us-east-1.amazonaws.com": "ecr-login"}}"#;
        let error = credentials_for(helper, "123.dkr.ecr.us-east-1.amazonaws.com").unwrap_err();
        assert!(
            error
                .to_string()
                .contains("(ecr-login), which berth does not run")
        );
        assert_eq!(credentials_for(helper, "ghcr.io"), Ok(None));
        let store = r#"{"auths": {}, "credsStore": "desktop"}"#;
        assert!(credentials_for(store, "ghcr.io").is_err());
        let bad = r#"{"auths": {"ghcr.io": {"auth": "bm8tY29sb24="}}}"#;
        assert_eq!(
            credentials_for(bad, "ghcr.io"),
            Err(DockerConfigError::BadAuth {
                registry: "ghcr.io".into()
            })
        );
        assert!(credentials_for("[1, 2", "ghcr.io").is_err());
    }
}
