//! An artifact's fetch (download, sha256 check, unpack of a `.tar.gz` into a task's
//! directory) by berth's fetcher, next to `curl -o` then `tar -xzf` of the same file from
//! the same loopback server, interleaved in the same run, medians of each. The release
//! is what a real one looks like: 200 files in nested directories, text that compresses
//! well and binary that does not (48 MiB unpacked at full size), packed by tar(1) and
//! gzip. The bound: berth within 1.2x of curl plus tar.
//!
//! `cargo bench -p berth --bench artifact_fetch`
//!
//! It ends with `summary: name = value` lines, one figure each (`common::summary`).

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use berth_jobspec::artifact::Artifact;
use berth_testkit::file_server::{Answer, FileServer};
use common::{block_on, median, micros, ratio, sized};
use sha2::Digest;

/// `files` files of `size` bytes each, half text, half random bytes, in 10 directories,
/// packed with tar(1) -z.
fn release(dir: &Path, files: usize, size: usize) -> Vec<u8> {
    let tree = dir.join("release");
    let mut random = vec![0u8; size];
    for i in 0..files {
        let sub = tree.join(format!("lib/part{}", i % 10));
        std::fs::create_dir_all(&sub).unwrap();
        let body = if i % 2 == 0 {
            (0..)
                .map(|n| format!("line {n} of file {i}: key_{n} = value-{}\n", n * 7 % 13))
                .flat_map(String::into_bytes)
                .take(size)
                .collect::<Vec<u8>>()
        } else {
            rustix::rand::getrandom(&mut random, rustix::rand::GetRandomFlags::empty()).unwrap();
            random.clone()
        };
        std::fs::write(sub.join(format!("file{i}")), body).unwrap();
    }
    let tarball = dir.join("release.tar.gz");
    let status = Command::new("tar")
        .arg("-czf")
        .arg(&tarball)
        .arg("-C")
        .arg(&tree)
        .arg("lib")
        .status()
        .unwrap();
    assert!(status.success());
    std::fs::read(tarball).unwrap()
}

fn fresh(dir: &Path) {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir.join("local")).unwrap();
}

fn main() {
    // The jobspec reader, as the `berth` binary installs it at its start.
    berth_jobspec_hcl::install();
    let files = sized(200, 20);
    let size = sized(240 << 10, 16 << 10);
    let rounds = sized(9, 3);
    let work = tempfile::tempdir().unwrap();
    let body = release(work.path(), files, size);
    let sum: String = sha2::Sha256::digest(&body)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let server = FileServer::start();
    let url = server.serve("/release.tar.gz", vec![Answer::body(body.clone())]);
    let plan = Artifact {
        source: url.clone(),
        destination: "local/".into(),
        mode: "any".into(),
        options: vec![("checksum".into(), format!("sha256:{sum}"))],
        headers: Vec::new(),
        chown: false,
        at: Default::default(),
    }
    .plan(&|s: &str| s.to_string())
    .unwrap();
    // The server is on loopback, which the agent's default denies.
    let limits = berth_artifact::Limits {
        denied_networks: std::sync::Arc::from([]),
        ..Default::default()
    };
    let berth_dir = work.path().join("berth-task");
    let baseline_dir = work.path().join("baseline-task");
    let (mut berth, mut baseline) = (Vec::new(), Vec::new());
    let unpacked = files as u64 * size as u64;
    block_on(async {
        for round in 0..rounds + 1 {
            fresh(&berth_dir);
            let started = Instant::now();
            let fetched = berth_artifact::fetch(&plan, &berth_dir, &limits, None)
                .await
                .unwrap();
            let took = started.elapsed();
            assert_eq!(fetched.unpacked_bytes, unpacked);

            fresh(&baseline_dir);
            let started = Instant::now();
            let download = baseline_dir.join("release.tar.gz");
            let curl = Command::new("curl")
                .args(["-sSf", "-o"])
                .arg(&download)
                .arg(&url)
                .status()
                .unwrap();
            let tar = Command::new("tar")
                .arg("-xzf")
                .arg(&download)
                .arg("-C")
                .arg(baseline_dir.join("local"))
                .status()
                .unwrap();
            let baseline_took = started.elapsed();
            assert!(curl.success() && tar.success());
            // The first round warms the page cache and the server: not counted.
            if round > 0 {
                berth.push(took);
                baseline.push(baseline_took);
            }
        }
    });
    // Both unpacked the same tree.
    let listing = |dir: &Path| {
        let out = Command::new("find")
            .arg(dir.join("local/lib"))
            .arg("-type")
            .arg("f")
            .output()
            .unwrap();
        let mut lines: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| l.replace(&dir.display().to_string(), ""))
            .collect();
        lines.sort();
        lines
    };
    assert_eq!(listing(&berth_dir), listing(&baseline_dir));
    let (berth, baseline) = (median(berth), median(baseline));
    println!(
        "release: {} files, {} KiB unpacked, {} KiB gzipped; {rounds} rounds, interleaved",
        files,
        unpacked >> 10,
        body.len() >> 10
    );
    println!("berth fetch (download, sha256, unpack): median {berth:?}");
    println!("curl -o then tar -xzf:                   median {baseline:?}");
    common::summary("artifact_fetch_us", micros(berth));
    common::summary("curl_tar_us", micros(baseline));
    common::summary("artifact_fetch_over_curl_tar", ratio(berth, baseline));
}
