//! The agent config's `cluster` block: the store (embedded or etcd), etcd's endpoints,
//! TLS and auth.

use std::path::PathBuf;

use berth_hcl::Problem;
use berth_hcl::fields::Fields;
use berth_hcl::tree::BlockNode;
use berth_model::cluster::{ClientCert, ClusterSettings, EtcdAuth, EtcdTls, StoreKind};

pub(super) fn cluster_settings(block: &BlockNode, problems: &mut Vec<Problem>) -> ClusterSettings {
    let mut fields = Fields::new(
        &block.body,
        "config.cluster".into(),
        block.at,
        &[
            "store",
            "endpoints",
            "prefix",
            "dial_timeout",
            "heartbeat_ttl",
            "lost_claim_grace",
            "ca_file",
            "cert_file",
            "key_file",
            "username",
            "password_file",
            "password",
        ],
    );
    let defaults = ClusterSettings::default();
    let store_text = fields.string("store", problems);
    let store = match store_text {
        None => StoreKind::Embedded,
        Some(text) => fields
            .choose(
                Some(text),
                "store",
                &[("embedded", StoreKind::Embedded), ("etcd", StoreKind::Etcd)],
                problems,
                |other| format!("unknown store {other:?} (use \"embedded\" or \"etcd\")"),
            )
            .unwrap_or_default(),
    };
    let endpoints = if fields.attr("endpoints").is_some() {
        fields.string_list("endpoints", problems)
    } else {
        defaults.endpoints.clone()
    };
    let tls = etcd_tls(&mut fields, problems);
    let auth = etcd_auth(&mut fields, problems);
    check_endpoints(&mut fields, &endpoints, tls.is_some(), problems);
    if endpoints.is_empty() {
        fields.problem_with(
            problems,
            "endpoints",
            "name at least one etcd endpoint".into(),
        );
    }
    let prefix = fields.string("prefix", problems).unwrap_or(defaults.prefix);
    let prefix_ok = prefix.starts_with('/')
        && prefix.len() > 1
        && !prefix.ends_with('/')
        && prefix
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '/' | '-' | '_' | '.'));
    if !prefix_ok {
        fields.problem_with(
            problems,
            "prefix",
            format!(
                "{prefix:?} must start with / and not end with one, in letters, digits, \
                 '-', '_', '.' and '/' (e.g. \"/berth\")"
            ),
        );
    }
    let dial_timeout = fields
        .duration("dial_timeout", problems)
        .unwrap_or(defaults.dial_timeout);
    let heartbeat_ttl = fields
        .duration("heartbeat_ttl", problems)
        .unwrap_or(defaults.heartbeat_ttl);
    if heartbeat_ttl < std::time::Duration::from_secs(1) {
        fields.problem_with(
            problems,
            "heartbeat_ttl",
            "must be at least 1s (etcd's leases count whole seconds)".into(),
        );
    }
    let lost_claim_grace = fields
        .duration("lost_claim_grace", problems)
        .unwrap_or(defaults.lost_claim_grace);
    fields.finish(problems);
    ClusterSettings {
        store,
        endpoints,
        prefix,
        dial_timeout,
        heartbeat_ttl,
        lost_claim_grace,
        tls,
        auth,
    }
}

/// Every endpoint is an etcd client URL, all `https://` when `ca_file` is set and all
/// `http://` when not (a mix would send credentials in clear to some of them).
pub(super) fn check_endpoints(
    fields: &mut Fields<'_>,
    endpoints: &[String],
    tls: bool,
    problems: &mut Vec<Problem>,
) {
    for endpoint in endpoints {
        let problem = if endpoint.starts_with("https://") && !tls {
            Some(format!(
                "{endpoint:?} is a TLS endpoint: set ca_file to the CA that signed etcd's \
                 certificate (berth trusts no system roots for etcd)"
            ))
        } else if endpoint.starts_with("http://") && tls {
            Some(format!(
                "{endpoint:?} is plain HTTP, but ca_file is set: use https:// for every \
                 endpoint (mixing them would send credentials in clear)"
            ))
        } else if !endpoint.starts_with("http://") && !endpoint.starts_with("https://") {
            Some(format!(
                "{endpoint:?} is not an etcd client URL such as \"http://127.0.0.1:2379\""
            ))
        } else {
            None
        };
        if let Some(problem) = problem {
            fields.problem_with(problems, "endpoints", problem);
        }
    }
}

/// An absolute path in `field`, or a problem naming it.
pub(super) fn absolute_path(
    fields: &mut Fields<'_>,
    field: &'static str,
    problems: &mut Vec<Problem>,
) -> Option<PathBuf> {
    let path = fields.string(field, problems).map(PathBuf::from)?;
    if !path.is_absolute() {
        fields.problem_with(
            problems,
            field,
            format!("{:?} must be an absolute path", path.display()),
        );
        return None;
    }
    Some(path)
}

/// `ca_file`, and `cert_file` with `key_file` (both or neither).
pub(super) fn etcd_tls(fields: &mut Fields<'_>, problems: &mut Vec<Problem>) -> Option<EtcdTls> {
    let ca_file = absolute_path(fields, "ca_file", problems);
    let cert_file = absolute_path(fields, "cert_file", problems);
    let key_file = absolute_path(fields, "key_file", problems);
    let client_cert = match (cert_file, key_file) {
        (Some(cert_file), Some(key_file)) => Some(ClientCert {
            cert_file,
            key_file,
        }),
        (Some(_), None) => {
            fields.problem_with(
                problems,
                "cert_file",
                "is set without key_file: a client certificate needs its private key".into(),
            );
            None
        }
        (None, Some(_)) => {
            fields.problem_with(
                problems,
                "key_file",
                "is set without cert_file: a private key needs its certificate".into(),
            );
            None
        }
        (None, None) => None,
    };
    match ca_file {
        Some(ca_file) => Some(EtcdTls {
            ca_file,
            client_cert,
        }),
        None => {
            if client_cert.is_some() {
                fields.problem_with(
                    problems,
                    "cert_file",
                    "a client certificate is shown over TLS only: set ca_file and use \
                     https:// endpoints"
                        .into(),
                );
            }
            None
        }
    }
}

/// `username` with `password_file` (both or neither); an inline `password` is refused.
pub(super) fn etcd_auth(fields: &mut Fields<'_>, problems: &mut Vec<Problem>) -> Option<EtcdAuth> {
    if fields.string("password", problems).is_some() {
        fields.problem_with(
            problems,
            "password",
            "berth takes etcd's password only from a file: put it in a file only the \
             agent's user can read and set password_file to its path"
                .into(),
        );
    }
    let username = fields.string("username", problems);
    let password_file = absolute_path(fields, "password_file", problems);
    match (username, password_file) {
        (Some(username), Some(password_file)) if !username.is_empty() => Some(EtcdAuth {
            username,
            password_file,
        }),
        (Some(_), Some(_)) => {
            fields.problem_with(problems, "username", "must not be empty".into());
            None
        }
        (Some(_), None) => {
            if fields.attr("password_file").is_none() {
                fields.problem_with(
                    problems,
                    "password_file",
                    "is needed with username: the file that holds the user's password".into(),
                );
            }
            None
        }
        (None, Some(_)) => {
            fields.problem_with(
                problems,
                "username",
                "is needed with password_file: the etcd user the password is for".into(),
            );
            None
        }
        (None, None) => None,
    }
}
