//! A real etcd for tests and benches (the agent never uses this): the `etcd` binary (Debian's `etcd-server`) in a temp dir on
//! free loopback ports, stopped and its dir removed when dropped. It can be stopped and
//! started again on the same ports and data (an outage).

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct EtcdServer {
    dir: tempfile::TempDir,
    client_port: u16,
    peer_port: u16,
    child: Option<Child>,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

impl EtcdServer {
    pub fn start() -> EtcdServer {
        let mut server = EtcdServer {
            dir: tempfile::Builder::new()
                .prefix("berth-etcd")
                .tempdir()
                .expect("a temp dir for etcd"),
            client_port: free_port(),
            peer_port: free_port(),
            child: None,
        };
        server.resume();
        server
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    /// Starts etcd (again) and waits until it answers.
    pub fn resume(&mut self) {
        let url = self.endpoint();
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let child = Command::new("etcd")
            .arg("--data-dir")
            .arg(self.dir.path().join("data"))
            .args(["--name", "test", "--listen-client-urls", &url])
            .args(["--advertise-client-urls", &url, "--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("test={peer}")])
            .args(["--heartbeat-interval", "10", "--election-timeout", "50"])
            .args(["--log-level", "error"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("etcd runs (apt-get install etcd-server)");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if std::net::TcpStream::connect(("127.0.0.1", self.client_port)).is_ok() {
                // Listening is not serving: wait until a read answers.
                if let Ok(etcd) =
                    super::etcd::Etcd::connect(std::slice::from_ref(&url), Duration::from_secs(1))
                {
                    drop(etcd);
                    return;
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("etcd did not answer on {url} within 10 s");
    }

    /// Stops etcd (SIGKILL: an outage, not a goodbye).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
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
