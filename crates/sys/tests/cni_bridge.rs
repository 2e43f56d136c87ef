//! Nomad's bridge network through the real CNI reference plugins (Debian's
//! `containernetworking-plugins`, which `.ci/test` installs): a named namespace attached
//! by ADD answers on a host port forwarded into it, sees only its own interfaces, and
//! after DEL and its removal nothing of it is left: no name in `ip netns`, no veth on the
//! bridge, no rule naming it in `iptables-save`, no address leased to it. Run as root.

use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use berth_sys::network::cni::{Attachment, Cni, NetworkList, PortMapping, bridge_network};
use berth_sys::network::netns::NetNs;

const CNI_PATH: &str = "/usr/lib/cni";
const NETWORK: &str = "berth-test";
const BRIDGE: &str = "berthtest0";
const SUBNET: &str = "172.26.112.0/24";

fn output(program: &str, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program} is needed: {e}"));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The host's address, or the test bridge's own on a host without a global one.
fn host_address() -> String {
    berth_testkit::net::host_address(&[BRIDGE], "172.26.112.1")
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("0.0.0.0:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn get(address: &str) -> String {
    berth_testkit::net::http_get(address, Duration::from_secs(10))
}

/// The namespace, its attachment and the server in it, undone on drop even when the
/// test fails.
struct Attached {
    cni: Cni,
    list: NetworkList,
    netns: NetNs,
    ports: Vec<PortMapping>,
    added: Option<serde_json::Value>,
    server: Option<Child>,
}

impl Attached {
    fn attachment(&self) -> Attachment<'_> {
        Attachment {
            container_id: self.netns.name(),
            netns: self.netns.path(),
            ifname: "eth0",
            port_mappings: &self.ports,
        }
    }

    fn detach(&mut self) {
        if let Some(mut server) = self.server.take() {
            let _ = server.kill();
            let _ = server.wait();
        }
        let added = self.added.take();
        self.cni
            .del(&self.list, &self.attachment(), added.as_ref())
            .expect("DEL succeeds");
        self.netns.remove().expect("the namespace is removed");
    }
}

impl Drop for Attached {
    fn drop(&mut self) {
        if let Some(mut server) = self.server.take() {
            let _ = server.kill();
            let _ = server.wait();
        }
        let added = self.added.take();
        let _ = self.cni.del(&self.list, &self.attachment(), added.as_ref());
        let _ = self.netns.remove();
    }
}

#[test]
fn a_namespace_on_nomads_bridge_answers_on_its_forwarded_port_and_leaves_nothing_after_del() {
    assert!(
        Path::new(CNI_PATH).join("bridge").is_file(),
        "the CNI reference plugins are needed in {CNI_PATH}: apt-get install containernetworking-plugins iptables"
    );
    let name = format!("berth-cni-test-{}", std::process::id());
    let host_port = free_port();
    let mut attached = Attached {
        cni: Cni::new(CNI_PATH),
        list: bridge_network(NETWORK, BRIDGE, SUBNET, "BERTH-TEST-ADMIN"),
        netns: NetNs::create(&name).expect("the namespace is made"),
        ports: vec![PortMapping {
            host_port,
            container_port: 8080,
            protocol: "tcp".into(),
            host_ip: None,
        }],
        added: None,
        server: None,
    };
    let added = attached
        .cni
        .add(&attached.list, &attached.attachment())
        .expect("ADD succeeds");
    attached.added = Some(added.raw.clone());
    let address = added.address().expect("ADD gave the namespace an address");
    assert!(address.starts_with("172.26.112."), "{added:?}");
    assert_eq!(
        NetNs::existing(&name).as_ref().map(NetNs::path),
        Some(attached.netns.path())
    );
    assert!(output("ip", &["netns", "list"]).contains(&name));

    // Inside: its loopback and its eth0, nothing of the host's.
    let links: Vec<String> = output("ip", &["-netns", &name, "-o", "link", "show"])
        .lines()
        .filter_map(|l| {
            l.split(':')
                .nth(1)
                .map(|n| n.trim().split('@').next().unwrap_or("").to_string())
        })
        .collect();
    assert_eq!(links, ["lo", "eth0"], "links inside the namespace");

    let server = Command::new("nsenter")
        .arg(format!("--net={}", attached.netns.path().display()))
        .args([
            "python3",
            "-c",
            "import http.server\n\
             class H(http.server.BaseHTTPRequestHandler):\n\
             \x20   def do_GET(self):\n\
             \x20       body = b'inside the namespace'\n\
             \x20       self.send_response(200)\n\
             \x20       self.send_header('Content-Length', str(len(body)))\n\
             \x20       self.end_headers()\n\
             \x20       self.wfile.write(body)\n\
             \x20   def log_message(self, *args):\n\
             \x20       pass\n\
             http.server.HTTPServer(('0.0.0.0', 8080), H).serve_forever()\n",
        ])
        .stdin(Stdio::null())
        .spawn()
        .expect("nsenter and python3 run the server");
    attached.server = Some(server);

    // The host's address on the forwarded port, the namespace's own on the inner one.
    let outside = get(&format!("{}:{host_port}", host_address()));
    assert!(outside.ends_with("inside the namespace"), "{outside}");
    let direct = get(&format!("{address}:8080"));
    assert!(direct.ends_with("inside the namespace"), "{direct}");

    attached.detach();
    assert!(!output("ip", &["netns", "list"]).contains(&name));
    assert!(NetNs::existing(&name).is_none());
    assert_eq!(
        output("ip", &["-o", "link", "show", "master", BRIDGE]),
        "",
        "veths left on the bridge"
    );
    let rules: Vec<String> = output("iptables-save", &[])
        .lines()
        .filter(|l| l.contains(&name))
        .map(String::from)
        .collect();
    assert!(
        rules.is_empty(),
        "rules left naming the namespace: {rules:#?}"
    );
    let leases = Path::new("/var/lib/cni/networks").join(NETWORK);
    for lease in std::fs::read_dir(&leases).into_iter().flatten().flatten() {
        let holder = std::fs::read_to_string(lease.path()).unwrap_or_default();
        assert!(
            !holder.contains(&name),
            "{} still leased to {name}",
            lease.path().display()
        );
    }
    // Nothing holds the port any more.
    assert!(
        TcpStream::connect_timeout(
            &format!("{}:{host_port}", host_address()).parse().unwrap(),
            Duration::from_millis(500)
        )
        .is_err()
    );
}

/// A DEL whose ADD's result was never recorded (an agent killed between the two) still
/// removes the firewall plugin's rules for the namespace's address: the address comes
/// from host-local's lease (attack review: they were left in `CNI-FORWARD`).
#[test]
fn a_del_without_the_adds_result_leaves_no_firewall_rule() {
    assert!(
        Path::new(CNI_PATH).join("bridge").is_file(),
        "the CNI reference plugins are needed in {CNI_PATH}: apt-get install containernetworking-plugins iptables"
    );
    let name = format!("berth-cni-unrecorded-{}", std::process::id());
    let mut attached = Attached {
        cni: Cni::new(CNI_PATH),
        list: bridge_network(NETWORK, BRIDGE, SUBNET, "BERTH-TEST-ADMIN"),
        netns: NetNs::create(&name).expect("the namespace is made"),
        ports: Vec::new(),
        added: None,
        server: None,
    };
    let added = attached
        .cni
        .add(&attached.list, &attached.attachment())
        .expect("ADD succeeds");
    let address = added
        .address()
        .and_then(|a| a.split('/').next())
        .expect("ADD gave the namespace an address")
        .to_string();
    let naming = || -> Vec<String> {
        output("iptables-save", &[])
            .lines()
            .filter(|l| l.contains(&format!("{address}/32")))
            .map(String::from)
            .collect()
    };
    assert!(
        !naming().is_empty(),
        "the firewall plugin's rules name the address while attached"
    );
    // The result is not kept: `attached.added` stays `None`, as a killed agent's record.
    attached.detach();
    assert_eq!(naming(), Vec::<String>::new(), "rules left for {address}");
}
