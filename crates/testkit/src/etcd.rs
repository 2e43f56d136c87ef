//! A real etcd for tests and benches (the agent never uses this): the `etcd` binary
//! (Debian's `etcd-server`) in a temp dir on free loopback ports, stopped and its dir
//! removed when dropped. It can be stopped and started again on the same ports and data
//! (an outage), or frozen (a hung store).
//!
//! It can be secured as an operator would ([`Security`]): TLS with a CA, server and
//! client certificates made in its dir by the `openssl` command, and etcd's auth with a
//! `root` user and a `berth` user whose role may read and write one prefix, set up with
//! `etcdctl` (Debian's `etcd-client`) as an operator does it. A client of it is
//! configured from [`EtcdServer::settings`], as an agent is from its config file.

use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use berth_model::cluster::{ClientCert, ClusterSettings, EtcdAuth, EtcdTls, StoreKind};

/// The user berth runs as on a secured test etcd, and its password.
pub const BERTH_USER: &str = "berth";
const BERTH_PASSWORD: &str = "berth-test-password";
const ROOT_PASSWORD: &str = "root-test-password";

/// How a test etcd is secured.
#[derive(Debug, Clone, Copy)]
pub struct Security {
    /// TLS on the client port (`--cert-file`, `--key-file`, `--trusted-ca-file`).
    pub tls: bool,
    /// Clients must show a certificate the CA signed (`--client-cert-auth`).
    pub client_cert_auth: bool,
    /// etcd's auth, with the `berth` user granted readwrite on `prefix` only.
    pub auth: bool,
    pub prefix: &'static str,
    /// etcd's `--auth-token-ttl` (its default is 5 minutes).
    pub auth_token_ttl: Option<Duration>,
}

impl Security {
    /// No TLS, no auth: etcd as the tests ran it before.
    pub const NONE: Security = Security {
        tls: false,
        client_cert_auth: false,
        auth: false,
        prefix: "/berth",
        auth_token_ttl: None,
    };
}

pub struct EtcdServer {
    dir: tempfile::TempDir,
    client_port: u16,
    peer_port: u16,
    child: Option<Child>,
    security: Security,
    /// Whether auth has been turned on (it stays on across a restart).
    auth_enabled: bool,
}

/// A loopback port no one listens on, for a server a test starts (and may stop and
/// start again on it). It is taken below the kernel's ephemeral range, where the
/// outgoing connections of every other test get their ports: a port from that range
/// (the kernel's answer to a bind on port 0) may be taken by some client while its
/// server restarts, and the restart fails with "address in use". Below the agents'
/// dynamic ports too (20000-32000), which other tests' tasks listen on. Never the same
/// port twice in one test process.
pub fn free_port() -> u16 {
    use std::collections::HashSet;
    use std::sync::Mutex;
    static HANDED_OUT: Mutex<Option<HashSet<u16>>> = Mutex::new(None);
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|text| text.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    // Below Nomad's dynamic ports (20000-32000) too: a task of another test's agent
    // listens on one of those, and an agent restarted on its port must find it free.
    let (low, high) = (10_000u16, ephemeral_low.clamp(10_001, 20_000));
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|p| p.into_inner());
    let handed_out = handed_out.get_or_insert_with(HashSet::new);
    for _ in 0..1000 {
        let mut bytes = [0u8; 2];
        let _ = rustix::rand::getrandom(&mut bytes, rustix::rand::GetRandomFlags::empty());
        let port = low + u16::from_le_bytes(bytes) % (high - low);
        if handed_out.contains(&port) || TcpListener::bind(("127.0.0.1", port)).is_err() {
            continue;
        }
        handed_out.insert(port);
        return port;
    }
    panic!("no free loopback port below {ephemeral_low}");
}

impl EtcdServer {
    pub fn start() -> EtcdServer {
        EtcdServer::start_secured(Security::NONE)
    }

    pub fn start_secured(security: Security) -> EtcdServer {
        let mut server = EtcdServer {
            dir: tempfile::Builder::new()
                .prefix("berth-etcd")
                .tempdir()
                .expect("a temp dir for etcd"),
            client_port: free_port(),
            peer_port: free_port(),
            child: None,
            security,
            auth_enabled: false,
        };
        if security.tls {
            make_certificates(&server.tls_dir());
        }
        if security.auth {
            write_private(&server.password_file(), BERTH_PASSWORD);
        }
        server.resume();
        if security.auth {
            server.enable_auth();
        }
        server
    }

    pub fn endpoint(&self) -> String {
        let scheme = if self.security.tls { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.client_port)
    }

    fn tls_dir(&self) -> PathBuf {
        self.dir.path().join("tls")
    }

    /// The CA that signed etcd's and the client's certificates.
    pub fn ca_file(&self) -> PathBuf {
        self.tls_dir().join("ca.pem")
    }

    /// Another CA, which signed nothing etcd shows.
    pub fn rogue_ca_file(&self) -> PathBuf {
        self.tls_dir().join("rogue-ca.pem")
    }

    pub fn client_cert(&self) -> ClientCert {
        ClientCert {
            cert_file: self.tls_dir().join("client.pem"),
            key_file: self.tls_dir().join("client-key.pem"),
        }
    }

    /// The `berth` user's password file (mode 0600).
    pub fn password_file(&self) -> PathBuf {
        self.dir.path().join("berth-password")
    }

    /// The cluster block an agent of this etcd is configured with: its endpoint, its CA
    /// and client certificate, its `berth` user.
    pub fn settings(&self, prefix: &str) -> ClusterSettings {
        ClusterSettings {
            store: StoreKind::Etcd,
            endpoints: vec![self.endpoint()],
            prefix: prefix.into(),
            tls: self.security.tls.then(|| EtcdTls {
                ca_file: self.ca_file(),
                client_cert: self.security.client_cert_auth.then(|| self.client_cert()),
            }),
            auth: self.security.auth.then(|| EtcdAuth {
                username: BERTH_USER.into(),
                password_file: self.password_file(),
            }),
            ..ClusterSettings::default()
        }
    }

    /// The `cluster { }` lines of an agent config for this etcd (without `store`,
    /// `endpoints` and `prefix`).
    pub fn config_lines(&self) -> String {
        let mut lines = String::new();
        if self.security.tls {
            lines.push_str(&format!("  ca_file = {:?}\n", self.ca_file()));
            if self.security.client_cert_auth {
                let client = self.client_cert();
                lines.push_str(&format!("  cert_file = {:?}\n", client.cert_file));
                lines.push_str(&format!("  key_file = {:?}\n", client.key_file));
            }
        }
        if self.security.auth {
            lines.push_str(&format!("  username = {BERTH_USER:?}\n"));
            lines.push_str(&format!("  password_file = {:?}\n", self.password_file()));
        }
        lines
    }

    /// Runs `etcdctl` against this etcd with `args`, over TLS as configured (with the
    /// client certificate), as `root` once auth is on.
    fn etcdctl(&self, args: &[&str]) -> Output {
        let mut command = Command::new("etcdctl");
        command
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", self.endpoint()))
            .arg("--dial-timeout=2s")
            .arg("--command-timeout=5s");
        if self.security.tls {
            command.arg("--cacert").arg(self.ca_file());
            if self.security.client_cert_auth {
                let client = self.client_cert();
                command
                    .arg("--cert")
                    .arg(client.cert_file)
                    .arg("--key")
                    .arg(client.key_file);
            }
        }
        if self.auth_enabled {
            command.arg(format!("--user=root:{ROOT_PASSWORD}"));
        }
        command
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("etcdctl runs (apt-get install etcd-client)")
    }

    /// Creates `root` and `berth` (readwrite on the prefix only), then turns auth on:
    /// what an operator does with `etcdctl user add`, `role grant-permission --prefix`
    /// and `auth enable`.
    fn enable_auth(&mut self) {
        let role = format!("{BERTH_USER}-readwrite");
        let root = format!("root:{ROOT_PASSWORD}");
        let berth = format!("{BERTH_USER}:{BERTH_PASSWORD}");
        let steps: [&[&str]; 7] = [
            &["user", "add", &root],
            &["user", "grant-role", "root", "root"],
            &["user", "add", &berth],
            &["role", "add", &role],
            &[
                "role",
                "grant-permission",
                &role,
                "readwrite",
                "--prefix=true",
                self.security.prefix,
            ],
            &["user", "grant-role", BERTH_USER, &role],
            &["auth", "enable"],
        ];
        for args in steps {
            let output = self.etcdctl(args);
            assert!(
                output.status.success(),
                "etcdctl {args:?}: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        self.auth_enabled = true;
    }

    /// Starts etcd (again) and waits until it answers.
    pub fn resume(&mut self) {
        let url = self.endpoint();
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let mut command = Command::new("etcd");
        command
            .arg("--data-dir")
            .arg(self.dir.path().join("data"))
            .args(["--name", "test", "--listen-client-urls", &url])
            .args(["--advertise-client-urls", &url, "--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("test={peer}")])
            .args(["--heartbeat-interval", "10", "--election-timeout", "50"])
            .args(["--log-level", "error"])
            // The cheapest password hash etcd allows: tests authenticate often.
            .args(["--bcrypt-cost", "4"]);
        if self.security.tls {
            let tls = self.tls_dir();
            command
                .arg("--cert-file")
                .arg(tls.join("server.pem"))
                .arg("--key-file")
                .arg(tls.join("server-key.pem"));
            // etcd 3.4 asks every client for a certificate once it has a CA for them.
            if self.security.client_cert_auth {
                command
                    .arg("--trusted-ca-file")
                    .arg(tls.join("ca.pem"))
                    .arg("--client-cert-auth");
            }
        }
        if let Some(ttl) = self.security.auth_token_ttl {
            command.arg(format!("--auth-token-ttl={}", ttl.as_secs().max(1)));
        }
        let child = command
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("etcd runs (apt-get install etcd-server)");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            // Listening is not serving: wait until a call answers.
            if std::net::TcpStream::connect(("127.0.0.1", self.client_port)).is_ok()
                && self.etcdctl(&["endpoint", "health"]).status.success()
            {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("etcd did not answer on {url} within 10 s");
    }

    /// Stops the server process where it is (SIGSTOP): connections stay open and go
    /// unanswered, as a hung store's do. [`EtcdServer::thaw`] lets it go on.
    pub fn freeze(&self) {
        self.signal(rustix::process::Signal::STOP);
    }

    pub fn thaw(&self) {
        self.signal(rustix::process::Signal::CONT);
    }

    fn signal(&self, signal: rustix::process::Signal) {
        let pid = self.child.as_ref().and_then(|child| {
            rustix::process::Pid::from_raw(i32::try_from(child.id()).unwrap_or(0))
        });
        if let Some(pid) = pid {
            let _ = rustix::process::kill_process(pid, signal);
        }
    }

    /// Stops etcd (SIGKILL: an outage, not a goodbye).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // A frozen server dies only once it runs again.
            if let Some(pid) =
                rustix::process::Pid::from_raw(i32::try_from(child.id()).unwrap_or(0))
            {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::CONT);
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Writes `content` to a new file only its owner may read.
fn write_private(path: &Path, content: &str) {
    std::fs::write(path, content).expect("a file in the test etcd's dir");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .expect("chmod 600 in the test etcd's dir");
}

/// A CA, a server certificate for 127.0.0.1 and a client certificate (CN `berth`) it
/// signed, and a second CA that signed nothing, by the `openssl` command.
fn make_certificates(dir: &Path) {
    std::fs::create_dir_all(dir).expect("the test certificates' dir");
    let openssl = |args: &[&str]| {
        let output = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("openssl runs (apt-get install openssl)");
        assert!(
            output.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    };
    let key = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
    ];
    for ca in ["ca", "rogue-ca"] {
        let (key_file, cert_file, subject) = (
            format!("{ca}-key.pem"),
            format!("{ca}.pem"),
            format!("/CN=berth test {ca}"),
        );
        let mut args = vec!["req", "-x509", "-days", "2", "-subj", &subject];
        args.extend(key);
        args.extend(["-keyout", &key_file, "-out", &cert_file]);
        args.extend(["-addext", "basicConstraints=critical,CA:TRUE"]);
        args.extend(["-addext", "keyUsage=critical,keyCertSign,cRLSign"]);
        openssl(&args);
    }
    for (name, subject, usage) in [
        // etcd's own gateway dials etcd with the server's certificate as a client's.
        ("server", "/CN=127.0.0.1", "serverAuth,clientAuth"),
        ("client", "/CN=berth", "clientAuth"),
    ] {
        let (key_file, request, cert_file, extensions) = (
            format!("{name}-key.pem"),
            format!("{name}.csr"),
            format!("{name}.pem"),
            format!("{name}.ext"),
        );
        let mut args = vec![
            "req", "-subj", subject, "-keyout", &key_file, "-out", &request,
        ];
        args.extend(key);
        openssl(&args);
        std::fs::write(
            dir.join(&extensions),
            format!(
                "basicConstraints=CA:FALSE\nsubjectAltName=IP:127.0.0.1\n\
                 extendedKeyUsage={usage}\nkeyUsage=digitalSignature\n"
            ),
        )
        .expect("the certificate's extensions file");
        openssl(&[
            "x509",
            "-req",
            "-in",
            &request,
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca-key.pem",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            &extensions,
            "-out",
            &cert_file,
        ]);
        std::fs::set_permissions(dir.join(&key_file), std::fs::Permissions::from_mode(0o600))
            .expect("chmod 600 on a test key");
    }
}
