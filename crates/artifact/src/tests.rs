//! Fetches from a local HTTP server into a real directory: archives as real tools make
//! them, and the archives an attacker would.

use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::Duration;

use berth_testkit::file_server::{Answer, FileServer as Server};

use berth_jobspec::artifact::{Artifact, FetchPlan};
use sha2::Digest;

use crate::{ArtifactError, Limits, fetch};

fn plan(source: &str, destination: &str, mode: &str, options: &[(&str, &str)]) -> FetchPlan {
    Artifact {
        source: source.into(),
        destination: destination.into(),
        mode: mode.into(),
        options: options
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        headers: vec![("X-Token".into(), "secret".into())],
        chown: false,
        at: Default::default(),
    }
    .plan(&|s: &str| s.to_string())
    .unwrap()
}

/// The limits with no network denied: these tests' server is on loopback.
fn open() -> Limits {
    Limits {
        denied_networks: std::sync::Arc::from([]),
        ..Limits::default()
    }
}

fn task_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("local")).unwrap();
    dir
}

/// Every path below `dir`, with `/` after directories and `@target` after links.
fn listing(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir).unwrap().flatten().collect();
        entries.sort_by_key(|e| e.file_name());
        for entry in entries {
            let path = entry.path();
            let rel = path.strip_prefix(root).unwrap().display().to_string();
            let kind = entry.file_type().unwrap();
            if kind.is_symlink() {
                out.push(format!(
                    "{rel}@{}",
                    std::fs::read_link(&path).unwrap().display()
                ));
            } else if kind.is_dir() {
                out.push(format!("{rel}/"));
                walk(root, &path, out);
            } else {
                out.push(rel);
            }
        }
    }
    walk(dir, dir, &mut out);
    out
}

fn sha256(bytes: &[u8]) -> String {
    let digest = sha2::Sha256::digest(bytes);
    format!(
        "sha256:{}",
        digest
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    )
}

/// A tar built by the `tar` crate's builder, as GNU tar writes: a directory, an
/// executable, a setuid file, a relative link and a hard link.
fn good_tar() -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    let mut add = |path: &str, kind: tar::EntryType, mode: u32, body: &[u8], link: Option<&str>| {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(kind);
        header.set_mode(mode);
        header.set_size(body.len() as u64);
        if let Some(link) = link {
            header.set_link_name(link).unwrap();
        }
        header.set_path(path).unwrap();
        header.set_cksum();
        builder.append(&header, body).unwrap();
    };
    add("app/", tar::EntryType::Directory, 0o755, b"", None);
    add(
        "app/bin/run",
        tar::EntryType::Regular,
        0o755,
        b"#!/bin/sh\necho hi\n",
        None,
    );
    add("app/suid", tar::EntryType::Regular, 0o4755, b"x", None);
    add(
        "app/current",
        tar::EntryType::Symlink,
        0o777,
        b"",
        Some("bin/run"),
    );
    add(
        "app/again",
        tar::EntryType::Link,
        0o644,
        b"",
        Some("app/bin/run"),
    );
    // A name past the header's 100 bytes: a GNU long-name entry before it.
    let mut header = tar::Header::new_gnu();
    header.set_mode(0o644);
    header.set_size(4);
    builder
        .append_data(
            &mut header,
            format!("app/{}", "n".repeat(150)),
            &b"long"[..],
        )
        .unwrap();
    builder.into_inner().unwrap()
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    encoder.write_all(bytes).unwrap();
    encoder.finish().unwrap()
}

/// A tar with one entry whose name is written raw (the builder refuses `..`).
fn raw_tar(entries: &[(&str, tar::EntryType, &str)]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for (name, kind, link) in entries {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(*kind);
        header.set_mode(0o644);
        let body: &[u8] = if *kind == tar::EntryType::Regular {
            b"pwned"
        } else {
            b""
        };
        header.set_size(body.len() as u64);
        let raw = &mut header.as_gnu_mut().unwrap().name;
        raw[..name.len()].copy_from_slice(name.as_bytes());
        if !link.is_empty() {
            let raw = &mut header.as_gnu_mut().unwrap().linkname;
            raw[..link.len()].copy_from_slice(link.as_bytes());
        }
        header.set_cksum();
        builder.append(&header, body).unwrap();
    }
    builder.into_inner().unwrap()
}

#[tokio::test]
async fn a_tar_gz_is_checked_and_unpacked_with_its_links_and_without_setuid() {
    let server = Server::start();
    let body = gzip(&good_tar());
    let url = server.serve("/dl/app.tar.gz", vec![Answer::body(body.clone())]);
    let dir = task_dir();
    let p = plan(&url, "local/", "any", &[("checksum", &sha256(&body))]);
    let fetched = fetch(&p, dir.path(), &open(), None).await.unwrap();
    assert_eq!(fetched.downloaded, body.len() as u64);
    assert_eq!(
        listing(&dir.path().join("local")),
        [
            "app/",
            "app/again",
            "app/bin/",
            "app/bin/run",
            "app/current@bin/run",
            &format!("app/{}", "n".repeat(150)),
            "app/suid"
        ]
    );
    let local = dir.path().join("local/app");
    assert_eq!(
        std::fs::read(local.join("again")).unwrap(),
        b"#!/bin/sh\necho hi\n"
    );
    assert_eq!(
        std::fs::metadata(local.join("again")).unwrap().ino(),
        std::fs::metadata(local.join("bin/run")).unwrap().ino()
    );
    let mode = |p: &str| {
        std::fs::metadata(local.join(p))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777
    };
    assert_eq!((mode("bin/run"), mode("suid")), (0o755, 0o755));
    // The header the job set went to its server.
    assert!(
        server.seen.lock().unwrap()[0]
            .to_lowercase()
            .contains("x-token: secret")
    );
}

#[tokio::test]
async fn a_wrong_checksum_leaves_nothing_behind() {
    let server = Server::start();
    let body = gzip(&good_tar());
    let url = server.serve("/app.tgz", vec![Answer::body(body)]);
    let dir = task_dir();
    let wrong = sha256(b"something else");
    let p = plan(&url, "local/deep/er", "any", &[("checksum", &wrong)]);
    let error = fetch(&p, dir.path(), &open(), None).await.unwrap_err();
    assert!(
        matches!(&error, ArtifactError::Checksum { expected, .. } if *expected == wrong),
        "{error}"
    );
    assert!(
        error
            .to_string()
            .starts_with("checksum mismatch: expected sha256:"),
        "{error}"
    );
    // Not the download, not the directories made for it.
    assert_eq!(listing(dir.path()), ["local/"]);
}

#[tokio::test]
async fn archives_that_escape_are_refused_and_nothing_is_placed() {
    let server = Server::start();
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "dotdot",
            raw_tar(&[
                ("ok", tar::EntryType::Regular, ""),
                ("../../evil", tar::EntryType::Regular, ""),
            ]),
            "climbs out",
        ),
        (
            "absolute",
            raw_tar(&[("/etc/evil", tar::EntryType::Regular, "")]),
            "absolute path",
        ),
        (
            "link-out",
            raw_tar(&[("etc", tar::EntryType::Symlink, "/etc")]),
            "leads out of the destination",
        ),
        (
            "link-up",
            raw_tar(&[("a/b", tar::EntryType::Symlink, "../../x")]),
            "leads out of the destination",
        ),
        (
            "through-link",
            raw_tar(&[
                ("d", tar::EntryType::Symlink, "sub"),
                ("sub/", tar::EntryType::Directory, ""),
                ("d/x", tar::EntryType::Regular, ""),
            ]),
            "through a link",
        ),
        (
            "hardlink-out",
            raw_tar(&[("h", tar::EntryType::Link, "/etc/passwd")]),
            "absolute path",
        ),
        (
            "device",
            raw_tar(&[("null", tar::EntryType::Char, "")]),
            "device node",
        ),
        (
            // Each link's own text stays inside; the chain climbs out.
            "link-chain",
            raw_tar(&[
                ("s", tar::EntryType::Symlink, "."),
                ("t", tar::EntryType::Symlink, "s/.."),
            ]),
            "leads out of the destination",
        ),
        (
            // A GNU long name of 1 MiB: the tar crate would hold it whole in memory.
            "long-name",
            {
                let mut builder = tar::Builder::new(Vec::new());
                let mut header = tar::Header::new_gnu();
                header.set_entry_type(tar::EntryType::GNULongName);
                header.set_size(1 << 20);
                header.set_cksum();
                builder
                    .append(&header, std::io::Read::take(std::io::repeat(b'a'), 1 << 20))
                    .unwrap();
                builder.into_inner().unwrap()
            },
            "1048576-byte header of headers",
        ),
    ];
    for (name, tar, expected) in cases {
        let url = server.serve(&format!("/{name}.tar"), vec![Answer::body(tar)]);
        let dir = task_dir();
        std::fs::write(dir.path().join("local/kept"), b"mine").unwrap();
        let error = fetch(&plan(&url, "local", "any", &[]), dir.path(), &open(), None)
            .await
            .unwrap_err()
            .to_string();
        assert!(error.contains(expected), "{name}: {error}");
        assert_eq!(listing(dir.path()), ["local/", "local/kept"], "{name}");
    }
}

#[tokio::test]
async fn a_link_the_task_planted_is_not_followed() {
    let server = Server::start();
    let url = server.serve("/conf.txt", vec![Answer::body(b"config".to_vec())]);
    let dir = task_dir();
    let outside = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(outside.path(), dir.path().join("local/conf")).unwrap();
    let error = fetch(
        &plan(&url, "local/conf", "any", &[]),
        dir.path(),
        &open(),
        None,
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(error.contains("berth does not follow symlinks"), "{error}");
    assert_eq!(listing(outside.path()), Vec::<String>::new());
}

#[tokio::test]
async fn zips_single_files_and_modes() {
    let server = Server::start();
    let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let options = zip::write::SimpleFileOptions::default().unix_permissions(0o750);
    zip.add_directory("site/", options).unwrap();
    zip.start_file("site/index.html", options).unwrap();
    zip.write_all(b"<h1>hi</h1>").unwrap();
    let zip = zip.finish().unwrap().into_inner();
    let url = server.serve("/site.zip", vec![Answer::body(zip)]);
    let dir = task_dir();
    fetch(
        &plan(&url, "local/www", "dir", &[]),
        dir.path(),
        &open(),
        None,
    )
    .await
    .unwrap();
    assert_eq!(
        std::fs::read(dir.path().join("local/www/site/index.html")).unwrap(),
        b"<h1>hi</h1>"
    );

    let url = server.serve("/tool.gz", vec![Answer::body(gzip(b"binary"))]);
    fetch(
        &plan(&url, "local/bin", "any", &[]),
        dir.path(),
        &open(),
        None,
    )
    .await
    .unwrap();
    assert_eq!(
        std::fs::read(dir.path().join("local/bin/tool")).unwrap(),
        b"binary"
    );

    let url = server.serve("/raw.tar.gz", vec![Answer::body(b"not unpacked".to_vec())]);
    let p = plan(&url, "secrets/token", "file", &[("archive", "false")]);
    std::fs::create_dir(dir.path().join("secrets")).unwrap();
    fetch(&p, dir.path(), &open(), None).await.unwrap();
    assert_eq!(
        std::fs::read(dir.path().join("secrets/token")).unwrap(),
        b"not unpacked"
    );
    let mode = std::fs::metadata(dir.path().join("secrets/token"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o644);
}

#[tokio::test]
async fn the_operator_limits_bound_a_bomb_a_hoard_and_a_silent_server() {
    let server = Server::start();
    let limits = Limits {
        read_timeout: Duration::from_millis(1500),
        max_download: 512 << 10,
        max_unpacked: 1 << 20,
        max_files: 10,
        denied_networks: std::sync::Arc::from([]),
    };
    // 64 MiB of zeros gzip to well under 512 KiB: past the unpack limit, not the download limit.
    let mut bomb = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.set_size(64 << 20);
    header.set_mode(0o644);
    header.set_path("zeros").unwrap();
    header.set_cksum();
    bomb.append(&header, std::io::Read::take(std::io::repeat(0), 64 << 20))
        .unwrap();
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    encoder.write_all(&bomb.into_inner().unwrap()).unwrap();
    let bomb = encoder.finish().unwrap();
    assert!(bomb.len() < 512 << 10, "{}", bomb.len());
    let url = server.serve("/bomb.tar.gz", vec![Answer::body(bomb)]);
    let dir = task_dir();
    let error = fetch(&plan(&url, "local", "any", &[]), dir.path(), &limits, None)
        .await
        .unwrap_err()
        .to_string();
    assert!(error.contains("more than 1048576 bytes"), "{error}");
    assert_eq!(listing(dir.path()), ["local/"]);

    let many: Vec<(String, tar::EntryType, &str)> = (0..11)
        .map(|i| (format!("f{i}"), tar::EntryType::Regular, ""))
        .collect();
    let many: Vec<(&str, tar::EntryType, &str)> =
        many.iter().map(|(n, k, l)| (n.as_str(), *k, *l)).collect();
    let url = server.serve("/many.tar", vec![Answer::body(raw_tar(&many))]);
    let error = fetch(&plan(&url, "local", "any", &[]), dir.path(), &limits, None)
        .await
        .unwrap_err()
        .to_string();
    assert!(error.contains("more than 10 entries"), "{error}");

    let url = server.serve("/big", vec![Answer::body(vec![7; 513 << 10])]);
    let error = fetch(&plan(&url, "local", "any", &[]), dir.path(), &limits, None)
        .await
        .unwrap_err()
        .to_string();
    assert!(error.contains("more than 524288 bytes"), "{error}");

    let url = server.serve("/silent", vec![Answer::Silent]);
    let started = std::time::Instant::now();
    let error = fetch(&plan(&url, "local", "any", &[]), dir.path(), &limits, None)
        .await
        .unwrap_err()
        .to_string();
    assert!(error.contains("no answer within 1.5s"), "{error}");
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(listing(dir.path()), ["local/"]);
}

#[tokio::test]
async fn a_passing_failure_is_tried_again_and_redirects_keep_headers_home() {
    let server = Server::start();
    let url = server.serve(
        "/flaky.txt",
        vec![Answer::Status(503), Answer::body(b"second try".to_vec())],
    );
    let dir = task_dir();
    fetch(&plan(&url, "local", "any", &[]), dir.path(), &open(), None)
        .await
        .unwrap();
    assert_eq!(
        std::fs::read(dir.path().join("local/flaky.txt")).unwrap(),
        b"second try"
    );

    let url = server.serve("/gone.txt", vec![Answer::Status(404)]);
    let error = fetch(&plan(&url, "local", "any", &[]), dir.path(), &open(), None)
        .await
        .unwrap_err()
        .to_string();
    assert!(error.ends_with(": 404"), "{error}");

    // Another host (the same server by another name): the job's header stays behind.
    let other = server.base.replace("127.0.0.1", "localhost");
    server.serve("/real.txt", vec![Answer::body(b"moved".to_vec())]);
    let url = server.serve(
        "/moved.txt",
        vec![Answer::Redirect(format!("{other}/real.txt"))],
    );
    server.seen.lock().unwrap().clear();
    fetch(
        &plan(&url, "local/m", "file", &[]),
        dir.path(),
        &open(),
        None,
    )
    .await
    .unwrap();
    assert_eq!(std::fs::read(dir.path().join("local/m")).unwrap(), b"moved");
    let seen = server.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2);
    assert!(seen[0].to_lowercase().contains("x-token"));
    assert!(!seen[1].to_lowercase().contains("x-token"), "{}", seen[1]);
}

#[tokio::test]
async fn by_default_no_download_reaches_loopback_by_address_or_by_name() {
    let server = Server::start();
    let url = server.serve("/secret", vec![Answer::body(&b"agent-only"[..])]);
    let dir = task_dir();
    let error = fetch(
        &plan(&url, "local", "any", &[]),
        dir.path(),
        &Limits::default(),
        None,
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(
        error.contains("127.0.0.1 is in 127.0.0.0/8 (the agent's artifact denied_networks)"),
        "{error}"
    );
    let by_name = url.replace("127.0.0.1", "localhost");
    let error = fetch(
        &plan(&by_name, "local", "any", &[]),
        dir.path(),
        &Limits::default(),
        None,
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(error.contains("denied_networks"), "{error}");
    assert!(
        server.seen.lock().unwrap().is_empty(),
        "nothing reached the server"
    );
    assert_eq!(listing(dir.path()), ["local/"]);
}
