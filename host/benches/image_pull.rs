//! An image's pull (manifest, blobs checked against their digests, layers unpacked into
//! the store) by berth's image store, next to `skopeo copy` into an OCI layout then
//! `umoci unpack` of the same image from the same loopback registry (Debian's
//! `docker-registry`), interleaved in the same run, medians of each. The image is a
//! busybox layer and one like an application's: 200 files in 10 directories, half text
//! that compresses well, half random bytes (48 MiB unpacked at full size). The issue's
//! bound: berth within 1.2x of skopeo plus umoci.
//!
//! `cargo bench -p berth --bench image_pull`
//!
//! It ends with `summary: name = value` lines, one figure each (`common::summary`).

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use berth_image::{ImageStore, PullOptions, Reference, StoreConfig};
use berth_testkit::registry::{ImageSpec, OciLayout, Registry};
use common::{block_on, median, micros, ratio, sized};

fn application(root: &Path, files: usize, size: usize) {
    let mut random = vec![0u8; size];
    for i in 0..files {
        let dir = root.join(format!("app/lib/part{}", i % 10));
        std::fs::create_dir_all(&dir).unwrap();
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
        std::fs::write(dir.join(format!("file{i}")), body).unwrap();
    }
}

fn run(command: &mut Command) {
    let output = command.output().unwrap();
    assert!(
        output.status.success(),
        "{command:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

fn main() {
    let files = sized(200, 20);
    let size = sized(240 << 10, 16 << 10);
    let rounds = sized(9, 3);
    let registry = Registry::start();
    let layout = OciLayout::new();
    layout.busybox(
        "base",
        &[],
        &ImageSpec {
            entrypoint: &["/bin/sh"],
            ..ImageSpec::default()
        },
    );
    layout.layer("base", "app", |root| application(root, files, size));
    registry.push(&layout, "app", "bench/app:1");
    let reference = Reference::parse(&format!("{}/bench/app:1", registry.address)).unwrap();
    let work = tempfile::tempdir().unwrap();
    let options = PullOptions {
        credentials: None,
        force: false,
        timeout: Duration::from_secs(300),
    };
    let (mut berth, mut baseline) = (Vec::new(), Vec::new());
    let mut layers = 0;
    block_on(async {
        for round in 0..rounds + 1 {
            let store_root = work.path().join("store");
            let _ = std::fs::remove_dir_all(&store_root);
            let started = Instant::now();
            let store = ImageStore::open(StoreConfig::new(store_root.clone())).unwrap();
            let image = store.pull(&reference, &options, &|_| {}).await.unwrap();
            let took = started.elapsed();
            layers = image.layers.len();

            let oci = work.path().join("oci");
            let bundle = work.path().join("bundle");
            let _ = std::fs::remove_dir_all(&oci);
            let _ = std::fs::remove_dir_all(&bundle);
            let started = Instant::now();
            run(Command::new("skopeo").args([
                "copy",
                "--quiet",
                "--insecure-policy",
                "--src-tls-verify=false",
                &format!("docker://{reference}"),
                &format!("oci:{}:app", oci.display()),
            ]));
            run(Command::new("umoci").args([
                "unpack",
                "--image",
                &format!("{}:app", oci.display()),
                bundle.to_str().unwrap(),
            ]));
            let baseline_took = started.elapsed();
            // The first round warms the page cache and the registry: not counted.
            if round > 0 {
                berth.push(took);
                baseline.push(baseline_took);
            }
        }
    });
    // Both unpacked the application's files.
    let count = |dir: &Path| {
        std::fs::read_dir(dir.join("app/lib/part0"))
            .map(|d| d.count())
            .unwrap_or(0)
    };
    let store = work.path().join("store/layers");
    let app_layer = std::fs::read_dir(&store)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.join("app").is_dir())
        .expect("the application's layer is in the store");
    assert_eq!(count(&app_layer), count(&work.path().join("bundle/rootfs")));
    let (berth, baseline) = (median(berth), median(baseline));
    println!(
        "image: {layers} layers, the application's {files} files of {} KiB; {rounds} rounds, interleaved",
        size >> 10
    );
    println!("berth pull (manifest, blobs, digests, unpack): median {berth:?}");
    println!("skopeo copy then umoci unpack:                 median {baseline:?}");
    common::summary("image_pull_us", micros(berth));
    common::summary("skopeo_umoci_us", micros(baseline));
    common::summary("image_pull_over_skopeo_umoci", ratio(berth, baseline));
}
