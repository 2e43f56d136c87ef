//! The cluster store against a real etcd secured as an operator would: TLS with client
//! certificates, and etcd's users. Each hostile case is a client a task on the host
//! could be: it reaches etcd's port, but holds none of berth's files.

use std::os::unix::fs::PermissionsExt as _;
use std::time::{Duration, Instant};

use super::catalog::EtcdCatalog;
use super::etcd::{Etcd, EtcdError};
use super::etcd_access::EtcdAccess;
use super::tests::{node, volume, writer};
use super::{Cluster, ClusterError};
use berth_state::catalog::Catalog;
use berth_testkit::etcd::{EtcdServer, Security};

const EVERYTHING: Security = Security {
    tls: true,
    client_cert_auth: true,
    auth: true,
    prefix: "/berth",
    auth_token_ttl: None,
};

#[test]
fn a_client_without_credentials_can_neither_read_nor_write_berths_keys() {
    // Auth alone (plain HTTP): a client with no user is refused every key under the
    // prefix, reading and writing.
    let server = EtcdServer::start_secured(Security {
        tls: false,
        client_cert_auth: false,
        ..EVERYTHING
    });
    let dir = tempfile::tempdir().unwrap();
    let member = Cluster::join(&server.settings("/berth"), dir.path(), node("a")).unwrap();
    let stranger = Etcd::connect(&EtcdAccess::plain(
        &[server.endpoint()],
        Duration::from_secs(2),
    ));
    let stranger = match stranger {
        // etcd may refuse it at once (the connect probe)...
        Err(error) => {
            assert!(
                matches!(error, EtcdError::CredentialsNeeded { .. }),
                "{error}"
            );
            None
        }
        Ok(etcd) => Some(etcd),
    };
    if let Some(stranger) = stranger {
        let key = member.key(&["meta", "cluster-id"]);
        let forged = member.key(&["placements", "forged"]);
        let read = stranger.block({
            let (etcd, key) = (stranger.clone(), key.clone());
            async move { etcd.get(&key).await }
        });
        let write = stranger.block({
            let (etcd, key) = (stranger.clone(), forged.clone());
            async move { etcd.put(&key, b"{}".to_vec(), 0).await }
        });
        for answer in [read.map(|_| ()), write] {
            let error = answer.unwrap_err();
            assert!(
                matches!(error, EtcdError::CredentialsNeeded { .. }),
                "{error}"
            );
            assert!(error.to_string().contains("requires a user"), "{error}");
        }
        let etcd = member.store().clone();
        let written = member
            .store()
            .block(async move { etcd.get(&forged).await })
            .unwrap();
        assert_eq!(written, None, "the stranger's write must not land");
    }

    // TLS with client certificates: without one, the connection itself is refused,
    // even with the right CA.
    let server = EtcdServer::start_secured(EVERYTHING);
    let mut no_certificate = EtcdAccess::from_settings(&server.settings("/berth")).unwrap();
    no_certificate.credentials = None;
    if let Some(tls) = no_certificate.tls.as_mut() {
        tls.identity = None;
    }
    let error = Etcd::connect(&no_certificate).unwrap_err();
    assert!(matches!(error, EtcdError::Unavailable { .. }), "{error}");
}

#[test]
fn a_wrong_password_is_refused_with_the_user_named() {
    let server = EtcdServer::start_secured(Security {
        tls: false,
        client_cert_auth: false,
        ..EVERYTHING
    });
    let dir = tempfile::tempdir().unwrap();
    let wrong = dir.path().join("wrong-password");
    std::fs::write(&wrong, "not-the-password\n").unwrap();
    std::fs::set_permissions(&wrong, std::fs::Permissions::from_mode(0o600)).unwrap();
    let mut settings = server.settings("/berth");
    if let Some(auth) = settings.auth.as_mut() {
        auth.password_file = wrong.clone();
    }
    let error = Cluster::join(&settings, dir.path(), node("a")).unwrap_err();
    assert_eq!(
        error.to_string(),
        "etcd refused the credentials of user \"berth\": check cluster.username and the \
         password in cluster.password_file"
    );
    // A password file others can read is refused before etcd is asked.
    std::fs::set_permissions(&wrong, std::fs::Permissions::from_mode(0o644)).unwrap();
    let error = Cluster::join(&settings, dir.path(), node("a")).unwrap_err();
    assert!(matches!(error, ClusterError::AccessFile(_)), "{error}");
    assert!(
        error
            .to_string()
            .starts_with("cluster.password_file: the password file"),
        "{error}"
    );
}

#[test]
fn a_server_certificate_the_ca_file_did_not_sign_is_refused() {
    let server = EtcdServer::start_secured(Security {
        auth: false,
        ..EVERYTHING
    });
    let dir = tempfile::tempdir().unwrap();
    let mut settings = server.settings("/berth");
    if let Some(tls) = settings.tls.as_mut() {
        tls.ca_file = server.rogue_ca_file();
    }
    let error = Cluster::join(&settings, dir.path(), node("a")).unwrap_err();
    let text = error.to_string();
    assert!(
        text.contains("invalid peer certificate") && text.contains("UnknownIssuer"),
        "{text}"
    );
    // The same agent with the right CA joins.
    Cluster::join(&server.settings("/berth"), dir.path(), node("a")).unwrap();
}

#[test]
fn a_member_over_tls_with_a_user_claims_watches_and_keeps_its_lease() {
    let server = EtcdServer::start_secured(EVERYTHING);
    let dir = tempfile::tempdir().unwrap();
    let member = Cluster::join(&server.settings("/berth"), dir.path(), node("a")).unwrap();
    assert_eq!(member.nodes().unwrap().len(), 1);
    let catalog = EtcdCatalog::new(member.clone());
    catalog.register_volume(volume("data")).unwrap();
    catalog.claim("data", writer("first", "a")).unwrap();
    assert_eq!(catalog.volume("data").unwrap().claims.len(), 1);
    assert!(member.revision().unwrap() > 0);
}

#[test]
fn an_expired_token_is_replaced_and_the_node_keeps_its_lease_and_its_watch() {
    // etcd forgets a token after 2 s unused (etcd 3.4 asks none of a lease renewal,
    // so the node's keep-alives do not keep it fresh).
    let server = EtcdServer::start_secured(Security {
        tls: false,
        client_cert_auth: false,
        auth_token_ttl: Some(Duration::from_secs(2)),
        ..EVERYTHING
    });
    let dir = tempfile::tempdir().unwrap();
    let member = Cluster::join(&server.settings("/berth"), dir.path(), node("a")).unwrap();
    let lease = member.lease();
    let etcd = member.store().clone();
    let watched = etcd.watch(&member.key(&["volumes"]), 0);
    let exchanges = etcd.token_exchanges();
    std::thread::sleep(Duration::from_secs(4));
    // The token expired: a read is refused for it, and sent again with a new one.
    assert_eq!(member.nodes().unwrap().len(), 1);
    assert!(
        etcd.token_exchanges() > exchanges,
        "the token was never replaced: the test did not wait past its expiry"
    );
    assert_eq!(member.lease(), lease, "the node lost its lease");
    // Idle past the token's TTL again: a claim, and a watch made now, both work.
    std::thread::sleep(Duration::from_secs(3));
    let late_watch = etcd.watch(&member.key(&["volumes"]), 0);
    std::thread::sleep(Duration::from_secs(3));
    let catalog = EtcdCatalog::new(member.clone());
    catalog.register_volume(volume("data")).unwrap();
    catalog.claim("data", writer("first", "a")).unwrap();
    for (name, mut watch) in [("the first watch", watched), ("the late watch", late_watch)] {
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut seen = false;
        while !seen && Instant::now() < deadline {
            match watch.try_recv() {
                Ok(super::etcd::Change::Put(entry)) => seen = entry.key.ends_with("/data"),
                Ok(_) => {}
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
        assert!(seen, "{name} did not see the volume written");
    }
    assert_eq!(member.lease(), lease);
}

#[test]
fn a_user_for_an_etcd_whose_auth_is_off_is_refused_at_join() {
    let server = EtcdServer::start();
    let dir = tempfile::tempdir().unwrap();
    let password_file = dir.path().join("password");
    std::fs::write(&password_file, "unused\n").unwrap();
    std::fs::set_permissions(&password_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let mut settings = server.settings("/berth");
    settings.auth = Some(berth_model::cluster::EtcdAuth {
        username: "berth".into(),
        password_file,
    });
    let error = Cluster::join(&settings, dir.path(), node("a")).unwrap_err();
    assert!(
        matches!(error, ClusterError::Store(EtcdError::AuthNotEnabled { .. })),
        "{error}"
    );
}
