//! A real OCI registry on loopback (Debian's `docker-registry`, the CNCF distribution
//! registry) in a temp dir, stopped and removed when dropped; and small images built
//! the way people build them without a daemon: a root filesystem from `busybox-static`
//! packed by `umoci` into an OCI layout, pushed with `skopeo`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A registry that serves plain HTTP on `127.0.0.1:<port>`.
pub struct Registry {
    /// `127.0.0.1:<port>`, as an image reference names it.
    pub address: String,
    child: Child,
    dir: tempfile::TempDir,
    /// `user:password` when it asks for them (Basic, from an htpasswd file).
    credentials: Option<String>,
}

impl Registry {
    pub fn start() -> Registry {
        Registry::start_with(None)
    }

    /// A registry that serves only `user` with `password` (Basic authentication from a
    /// bcrypt htpasswd file, as an operator sets one up).
    pub fn with_credentials(user: &str, password: &str) -> Registry {
        Registry::start_with(Some((user, password)))
    }

    fn start_with(credentials: Option<(&str, &str)>) -> Registry {
        let dir = tempfile::tempdir().unwrap();
        let auth = match credentials {
            None => String::new(),
            Some((user, password)) => {
                let hash = Command::new("python3")
                    .args([
                        "-W",
                        "ignore",
                        "-c",
                        "import crypt, sys; print(crypt.crypt(sys.argv[1], crypt.mksalt(crypt.METHOD_BLOWFISH)))",
                        password,
                    ])
                    .output()
                    .unwrap();
                assert!(hash.status.success(), "bcrypt from python3's crypt");
                let htpasswd = dir.path().join("htpasswd");
                let line = format!("{user}:{}", String::from_utf8_lossy(&hash.stdout));
                std::fs::write(&htpasswd, line).unwrap();
                format!(
                    "auth:\n  htpasswd:\n    realm: berth-test\n    path: {}\n",
                    htpasswd.display()
                )
            }
        };
        let port = crate::etcd::free_port();
        let address = format!("127.0.0.1:{port}");
        let config = dir.path().join("config.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    \
                 rootdirectory: {}\n  delete:\n    enabled: true\n{auth}http:\n  addr: {address}\n",
                dir.path().join("data").display()
            ),
        )
        .unwrap();
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("registry.log")).unwrap())
            .spawn()
            .expect("docker-registry runs (Debian's docker-registry; .ci/test installs it)");
        let registry = Registry {
            address,
            child,
            dir,
            credentials: credentials.map(|(user, password)| format!("{user}:{password}")),
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(&registry.address).is_err() {
            assert!(
                Instant::now() < deadline,
                "the registry did not listen: {}",
                registry.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        registry
    }

    /// Removes the bytes of blob `digest` from the registry's storage, leaving the
    /// manifests that name it: a registry that lists a layer it cannot serve.
    pub fn forget_blob(&self, digest: &str) {
        let hex = digest.trim_start_matches("sha256:");
        let data = self
            .dir
            .path()
            .join("data/docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data");
        std::fs::remove_file(&data).unwrap_or_else(|e| panic!("{}: {e}", data.display()));
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default()
    }

    /// Pushes `image` (an [`OciLayout`] tag) as `<address>/<name>`; the manifest's digest.
    pub fn push(&self, layout: &OciLayout, tag: &str, name: &str) -> String {
        let digest_file = layout.dir.path().join("pushed-digest");
        let mut copy = Command::new("skopeo");
        copy.args([
            "copy",
            "--quiet",
            "--insecure-policy",
            "--dest-tls-verify=false",
            "--digestfile",
            digest_file.to_str().unwrap(),
        ]);
        if let Some(credentials) = &self.credentials {
            copy.args(["--dest-creds", credentials]);
        }
        run(copy.args([
            &format!("oci:{}:{tag}", layout.path().display()),
            &format!("docker://{}/{name}", self.address),
        ]));
        std::fs::read_to_string(digest_file)
            .unwrap()
            .trim()
            .to_string()
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn run(command: &mut Command) -> String {
    let output = command.output().expect("the image tools run");
    assert!(
        output.status.success(),
        "{command:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// An OCI image layout in a temp dir, its images made with `umoci`.
pub struct OciLayout {
    dir: tempfile::TempDir,
}

/// What an image's config says (Docker's defaults for a container).
#[derive(Default)]
pub struct ImageSpec<'a> {
    pub entrypoint: &'a [&'a str],
    pub cmd: &'a [&'a str],
    pub env: &'a [&'a str],
    pub working_dir: Option<&'a str>,
    /// Docker's `User`: `name`, `uid`, `name:group`.
    pub user: Option<&'a str>,
}

/// The busybox applets the test images link.
const APPLETS: &[&str] = &[
    "sh", "echo", "cat", "sleep", "id", "ls", "pwd", "touch", "httpd", "env", "stat", "wc", "head",
    "printf", "test", "true", "chown", "mkdir", "readlink", "grep", "ip",
];

impl Default for OciLayout {
    fn default() -> Self {
        OciLayout::new()
    }
}

impl OciLayout {
    pub fn new() -> OciLayout {
        let dir = tempfile::tempdir().unwrap();
        run(Command::new("umoci").args([
            "init",
            "--layout",
            dir.path().join("layout").to_str().unwrap(),
        ]));
        OciLayout { dir }
    }

    pub fn path(&self) -> PathBuf {
        self.dir.path().join("layout")
    }

    fn image(&self, tag: &str) -> String {
        format!("{}:{tag}", self.path().display())
    }

    /// Tag `tag`: one layer with busybox (`/bin/busybox`, its applets as links), `/tmp`
    /// (1777) and `/data/from-image`; `files` are written into the layer too (a path
    /// relative to the root, its text and mode).
    pub fn busybox(&self, tag: &str, files: &[(&str, &str, u32)], spec: &ImageSpec) {
        run(Command::new("umoci").args(["new", "--image", &self.image(tag)]));
        self.layer(tag, tag, |rootfs| {
            let bin = rootfs.join("bin");
            std::fs::create_dir_all(&bin).unwrap();
            std::fs::copy("/bin/busybox", bin.join("busybox")).unwrap();
            for applet in APPLETS {
                std::os::unix::fs::symlink("busybox", bin.join(applet)).unwrap();
            }
            for dir in ["tmp", "data"] {
                std::fs::create_dir_all(rootfs.join(dir)).unwrap();
            }
            set_mode(&rootfs.join("tmp"), 0o1777);
            std::fs::write(rootfs.join("data/from-image"), "hello from the image\n").unwrap();
            write_files(rootfs, files);
        });
        self.configure(tag, spec);
    }

    /// Tag `tag`: `base` with one more layer holding `files`, and `spec` for its config.
    pub fn on_top(&self, base: &str, tag: &str, files: &[(&str, &str, u32)], spec: &ImageSpec) {
        self.layer(base, tag, |rootfs| write_files(rootfs, files));
        self.configure(tag, spec);
    }

    /// Tag `to`: `from` with one more layer, made by `change` on its root filesystem
    /// (its config is `from`'s).
    pub fn layer(&self, from: &str, to: &str, change: impl FnOnce(&Path)) {
        let bundle = self.dir.path().join(format!("bundle-{to}"));
        run(Command::new("umoci").args([
            "unpack",
            "--image",
            &self.image(from),
            bundle.to_str().unwrap(),
        ]));
        change(&bundle.join("rootfs"));
        run(Command::new("umoci").args([
            "repack",
            "--image",
            &self.image(to),
            bundle.to_str().unwrap(),
        ]));
        std::fs::remove_dir_all(&bundle).unwrap();
    }

    fn configure(&self, tag: &str, spec: &ImageSpec) {
        let mut args: Vec<String> = vec!["config".into(), "--image".into(), self.image(tag)];
        for (flag, values) in [
            ("--config.entrypoint", spec.entrypoint),
            ("--config.cmd", spec.cmd),
            ("--config.env", spec.env),
        ] {
            for value in values {
                args.extend([flag.to_string(), value.to_string()]);
            }
        }
        if let Some(dir) = spec.working_dir {
            args.extend(["--config.workingdir".into(), dir.into()]);
        }
        if let Some(user) = spec.user {
            args.extend(["--config.user".into(), user.into()]);
        }
        if args.len() == 3 {
            return;
        }
        run(Command::new("umoci").args(&args));
    }
}

fn write_files(rootfs: &Path, files: &[(&str, &str, u32)]) {
    for (path, text, mode) in files {
        let path = rootfs.join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, text).unwrap();
        set_mode(&path, *mode);
    }
}

fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}
