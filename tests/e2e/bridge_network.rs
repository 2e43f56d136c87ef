//! Nomad's bridge network end to end, through the CNI reference plugins: a group in
//! `network { mode = "bridge" }` gets a namespace of its own (its tasks see their own
//! `eth0`, not the host's), its host ports (static and dynamic) answer from the host's
//! address, forwarded to `to`; two allocs of one group with the same `to` both answer;
//! and once the job stops nothing of its allocs is left: no namespace, no veth on the
//! bridge, no rule naming them, no address leased to them. Across a `kill -9` of the
//! agent a running alloc keeps its network, and one that ended meanwhile leaves
//! nothing. A group has its own `resolv.conf` and `hosts`, its loopback is its own (no
//! other group, nor the agent's API, is reached there), and its services register the
//! address its `address_mode` says.

use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

use berth_harness::AgentProcess;

/// The host's address, or on a node without a global one the bridge's own.
pub(crate) fn host_address() -> String {
    berth_testkit::net::host_address(&[" nomad ", "berthtest"], "172.26.64.1")
}

/// The body of an HTTP GET to `address`, once something answers there (up to 20 s).
fn get(address: &str) -> String {
    berth_testkit::net::http_get(address, Duration::from_secs(20))
}

/// A server on `NOMAD_PORT_http` that answers with its alloc's id and the interfaces
/// it sees, and prints its ports' variables first.
const SERVER: &str = r#"
import http.server, os
print(" ".join(f"{k}={v}" for k, v in sorted(os.environ.items()) if "PORT" in k or "ALLOC_IP" in k), flush=True)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        links = [l.split(":")[0].strip() for l in open("/proc/net/dev").read().splitlines()[2:]]
        body = (os.environ["NOMAD_ALLOC_ID"] + " " + ",".join(sorted(links))).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.HTTPServer(("0.0.0.0", int(os.environ["NOMAD_PORT_http"])), H).serve_forever()
"#;

fn job(name: &str, count: u32, ports: &str) -> String {
    let script = SERVER
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n");
    format!(
        r#"job "{name}" {{
  group "web" {{
    count = {count}
    network {{
      mode = "bridge"
{ports}
    }}
    task "server" {{
      driver = "exec"
      config {{
        command = "/usr/bin/python3"
        args    = ["-c", "{script}"]
      }}
    }}
  }}
}}
"#
    )
}

/// The value of `NOMAD_<name>` the task printed.
fn printed(agent: &AgentProcess, alloc: &str, name: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = agent.task_stdout(alloc, "server");
        if let Some(value) = out
            .split_whitespace()
            .find_map(|pair| pair.strip_prefix(&format!("NOMAD_{name}=")))
        {
            return value.to_string();
        }
        assert!(
            Instant::now() < deadline,
            "the task never printed NOMAD_{name}: {out:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The iptables chains the CNI plugins make for one alloc on the `nomad` network, named
/// as they name them (`utils.MustFormatChainNameWithPrefix`: `CNI-`, a prefix, then the
/// hex of sha512(network + id), 28 characters in all): the bridge plugin's masquerade
/// chain and portmap's DNAT chain.
pub(crate) fn cni_chains(alloc: &str) -> [String; 2] {
    use sha2::Digest as _;
    let digest: String = sha2::Sha512::digest(format!("nomad{alloc}"))
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    ["", "DN-"].map(|prefix| format!("CNI-{prefix}{digest}")[..28].to_string())
}

/// What is left on the host of `allocs` (with their addresses `ips`): their namespaces,
/// veths linked to them, their CNI chains, NAT rules naming them, firewall rules naming
/// their addresses, leased addresses.
pub(crate) fn leftovers(allocs: &[String], ips: &[String]) -> Vec<String> {
    let run = |program: &str, args: &[&str]| {
        let out = std::process::Command::new(program)
            .args(args)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let mut left = Vec::new();
    let namespaces = run("ip", &["netns", "list"]);
    let links = run("ip", &["-o", "link"]);
    let rules = run("iptables-save", &[]);
    for alloc in allocs {
        if namespaces.contains(alloc.as_str()) {
            left.push(format!("namespace {alloc}"));
        }
        left.extend(
            links
                .lines()
                .filter(|l| l.contains(alloc.as_str()))
                .map(|l| format!("link {l}")),
        );
        for chain in cni_chains(alloc) {
            left.extend(
                rules
                    .lines()
                    .filter(|l| l.contains(&chain))
                    .map(String::from),
            );
        }
        left.extend(
            rules
                .lines()
                .filter(|l| l.contains(alloc.as_str()))
                .map(String::from),
        );
        for ip in ips {
            let address = format!("{ip}/32");
            left.extend(
                rules
                    .lines()
                    .filter(|l| l.contains(&address))
                    .map(String::from),
            );
        }
        let leases = Path::new("/var/lib/cni/networks/nomad");
        for lease in std::fs::read_dir(leases).into_iter().flatten().flatten() {
            if std::fs::read_to_string(lease.path()).is_ok_and(|t| t.contains(alloc.as_str())) {
                left.push(format!("lease {}", lease.path().display()));
            }
        }
    }
    left
}

#[tokio::test(flavor = "multi_thread")]
async fn a_bridge_group_answers_on_its_host_ports_from_its_own_namespace_and_leaves_nothing() {
    assert!(
        Path::new("/usr/lib/cni/bridge").is_file(),
        "the CNI reference plugins are needed: apt-get install containernetworking-plugins iptables"
    );
    let mut agent = AgentProcess::new();
    agent.start().await;
    let host = host_address();
    let static_port = berth_testkit::etcd::free_port();

    // One alloc: a static host port and a dynamic one, both forwarded to 8080.
    let ports = format!(
        "      port \"http\" {{\n        static = {static_port}\n        to     = 8080\n      }}\n      port \"alt\" {{\n        to = 8080\n      }}"
    );
    let single = agent.run_job("single.hcl", &job("single", 1, &ports)).await;
    assert_eq!(printed(&agent, &single, "PORT_http"), "8080");
    assert_eq!(
        printed(&agent, &single, "HOST_PORT_http"),
        static_port.to_string()
    );
    let dynamic: u16 = printed(&agent, &single, "HOST_PORT_alt").parse().unwrap();
    assert!((20000..=32000).contains(&dynamic), "{dynamic}");
    let alloc_ip = printed(&agent, &single, "ALLOC_IP_http");
    assert!(alloc_ip.starts_with("172.26."), "{alloc_ip}");
    // While it runs, its chains and its veth are there (what `leftovers` looks for
    // once it stops is named right).
    let running = leftovers(std::slice::from_ref(&single), &[]);
    for chain in cni_chains(&single) {
        assert!(
            running.iter().any(|l| l.contains(&format!(":{chain} "))),
            "{chain} not in {running:#?}"
        );
    }
    assert!(
        running.iter().any(|l| l.starts_with("link ")),
        "{running:#?}"
    );
    for port in [static_port, dynamic] {
        let body = get(&format!("{host}:{port}"));
        // Its own namespace: its loopback and its eth0, none of the host's links.
        assert_eq!(body, format!("{single} eth0,lo"), "on host port {port}");
    }
    // Never on the node's loopback, where a forward would take the node's own
    // connections to a local service that was down when the alloc started.
    assert!(
        TcpStream::connect_timeout(
            &format!("127.0.0.1:{static_port}").parse().unwrap(),
            Duration::from_millis(500)
        )
        .is_err(),
        "a forward on 127.0.0.1"
    );

    // Two allocs of one group, the same `to`, each on its own dynamic host port.
    let pair_ports = "      port \"http\" {\n        to = 8080\n      }";
    let submitted = agent
        .submit("pair.hcl", &job("pair", 2, pair_ports))
        .await
        .unwrap();
    assert_eq!(submitted.alloc_ids.len(), 2);
    let mut ips = vec![alloc_ip.clone()];
    for alloc in &submitted.alloc_ids {
        ips.push(printed(&agent, alloc, "ALLOC_IP_http"));
        let port = printed(&agent, alloc, "HOST_PORT_http");
        assert_eq!(get(&format!("{host}:{port}")), format!("{alloc} eth0,lo"));
    }

    // A kill -9 of the agent: the running allocs keep their namespaces and ports.
    agent.kill9();
    agent.start().await;
    assert_eq!(
        get(&format!("{host}:{static_port}")),
        format!("{single} eth0,lo"),
        "after the agent's restart"
    );

    let mut allocs = submitted.alloc_ids.clone();
    allocs.push(single.clone());
    for job in ["single", "pair"] {
        let (code, out, err) = agent.cli(&["job", "stop", job]);
        assert_eq!(code, 0, "{out}{err}");
    }
    for alloc in &allocs {
        agent.finished(alloc).await;
    }
    // The network goes after the tasks, as the alloc finishes.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let left = leftovers(&allocs, &ips);
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "left on the host: {left:#?}\n{}",
            agent.output()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        TcpStream::connect_timeout(
            &format!("{host}:{static_port}").parse().unwrap(),
            Duration::from_millis(500)
        )
        .is_err(),
        "the static port still answers"
    );
}

/// The failure of the alloc's tasks, as its events say.
fn failure(status: &berth_client::alloc_runner::AllocStatus) -> String {
    status.tasks["server"]
        .events
        .iter()
        .map(|e| e.message.clone())
        .find(|m| m.contains("network"))
        .unwrap_or_else(|| panic!("no network failure: {status:#?}"))
}

/// A job author cannot take a port the host listens on (the agent's own API here, sshd
/// on a real node) nor one forwarded to another alloc: the forward would silently take
/// its traffic, from other hosts and from the node itself. The alloc fails saying so,
/// and what listened there still answers; a second job on a forwarded port is not
/// placed.
#[tokio::test(flavor = "multi_thread")]
async fn a_bridge_port_the_host_listens_on_or_another_alloc_holds_is_refused() {
    let mut agent = AgentProcess::new();
    agent.start().await;
    let api_port = agent.port();
    let taken = format!(
        "      port \"http\" {{\n        static = {api_port}\n        to     = 8080\n      }}"
    );
    let hijack = agent.run_job("hijack.hcl", &job("hijack", 1, &taken)).await;
    let status = agent.finished(&hijack).await;
    assert!(
        failure(&status).contains(&format!(
            "network: host port {api_port} is in use on this node: forwarding it would take the traffic of what listens there"
        )),
        "{status:#?}"
    );
    // The API still answers on its own port (a forward would take the node's own
    // connections to it too).
    let host = host_address();
    let answer = std::process::Command::new("curl")
        .args(["-s", "-o", "/dev/null", "-w", "%{http_code}"])
        .arg(format!("http://127.0.0.1:{api_port}/v1/agent/self"))
        .output()
        .unwrap();
    assert_ne!(
        String::from_utf8_lossy(&answer.stdout),
        "000",
        "the API is unreachable"
    );
    assert!(leftovers(std::slice::from_ref(&hijack), &[]).is_empty());

    // One host port, one alloc.
    let port = berth_testkit::etcd::free_port();
    let ports =
        format!("      port \"http\" {{\n        static = {port}\n        to     = 8080\n      }}");
    let first = agent.run_job("first.hcl", &job("first", 1, &ports)).await;
    assert_eq!(printed(&agent, &first, "HOST_PORT_http"), port.to_string());
    // The node's scheduler knows the port is taken: the second job places nothing.
    let second = agent
        .submit("second.hcl", &job("second", 1, &ports))
        .await
        .unwrap();
    assert!(second.alloc_ids.is_empty(), "{second:?}");
    assert!(get(&format!("{host}:{port}")).starts_with(&first));
    let (code, out, err) = agent.cli(&["job", "stop", "first"]);
    assert_eq!(code, 0, "{out}{err}");
    agent.finished(&first).await;
}

/// The same on the cluster's plane: a bridge job submitted to one member of an etcd
/// cluster runs on both nodes, each alloc in its own namespace answering on its host
/// port, and leaves nothing on either node once stopped.
#[tokio::test(flavor = "multi_thread")]
async fn a_bridge_job_on_a_cluster_answers_from_each_node_and_leaves_nothing() {
    let etcd = berth_testkit::etcd::EtcdServer::start();
    let mut nodes = [
        crate::cluster::member(&etcd, "bridge-a"),
        crate::cluster::member(&etcd, "bridge-b"),
    ];
    for node in &mut nodes {
        node.start().await;
    }
    let host = host_address();
    let ports = "      port \"http\" {\n        to = 8080\n      }";
    let source = job("spread", 2, ports).replace(
        "    count = 2\n",
        "    count = 2\n    spread {\n      attribute = \"${node.unique.name}\"\n    }\n",
    );
    nodes[0].submit("spread.hcl", &source).await.unwrap();
    crate::cluster::wait_allocs(
        &nodes[0],
        "spread",
        "two running allocs",
        Duration::from_secs(60),
        |allocs| allocs.iter().filter(|a| a.3 == "running").count() == 2,
    )
    .await;
    let allocs = crate::cluster::allocs(&nodes[0], "spread").await;
    let on: std::collections::BTreeSet<&str> = allocs.iter().map(|a| a.2.as_str()).collect();
    assert_eq!(on.len(), 2, "both nodes run one: {allocs:?}");
    let mut ids = Vec::new();
    let mut ips = Vec::new();
    for (id, _, node, _) in &allocs {
        let runner = match node.as_str() {
            "bridge-a" => &nodes[0],
            "bridge-b" => &nodes[1],
            other => panic!("an alloc on {other}"),
        };
        let port = printed(runner, id, "HOST_PORT_http");
        ips.push(printed(runner, id, "ALLOC_IP_http"));
        assert_eq!(get(&format!("{host}:{port}")), format!("{id} eth0,lo"));
        ids.push(id.clone());
    }
    let (code, out, err) = nodes[0].cli(&["job", "stop", "spread"]);
    assert_eq!(code, 0, "{out}{err}");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left = leftovers(&ids, &ips);
        if left.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "left on the host: {left:#?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A task that prints its `/etc/resolv.conf` and `/etc/hosts`, what its alloc's name
/// resolves to, whether it may write `/etc/hosts`, then listens on its loopback only
/// (port `PROBE_PORT`) and tries to reach `PROBE_PORT` on its own loopback and at
/// `TARGET`, the address of another group's alloc.
const ISOLATION: &str = r#"
import os, socket, time
port = int(os.environ["PROBE_PORT"])
print("RESOLV=" + open("/etc/resolv.conf").read().replace("\n", "|"), flush=True)
print("HOSTS=" + open("/etc/hosts").read().replace("\n", "|"), flush=True)
name = os.environ.get("HOST_NAME")
if name:
    print("RESOLVED=" + socket.gethostbyname(name), flush=True)
try:
    open("/etc/hosts", "a").write("6.6.6.6 evil\n")
    print("HOSTS_WRITE=written", flush=True)
except OSError as e:
    print("HOSTS_WRITE=refused", flush=True)
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("127.0.0.1", port))
server.listen()
def reach(host, to=port):
    try:
        socket.create_connection((host, to), timeout=2).close()
        return "reached"
    except OSError:
        return "refused"
print("OWN_LOOPBACK=" + reach("127.0.0.1"), flush=True)
target = os.environ.get("TARGET")
if target:
    print("TARGET=" + reach(target), flush=True)
agent = os.environ.get("AGENT_PORT")
if agent:
    gateway = os.environ["NOMAD_ALLOC_IP_probe"].rsplit(".", 1)[0] + ".1"
    print("AGENT_LOOPBACK=" + reach("127.0.0.1", int(agent)), flush=True)
    print("AGENT_GATEWAY=" + reach(gateway, int(agent)), flush=True)
    unix = socket.socket(socket.AF_UNIX)
    try:
        unix.connect(os.environ["AGENT_SOCKET"])
        print("AGENT_SOCKET=reached", flush=True)
    except OSError:
        print("AGENT_SOCKET=refused", flush=True)
while True:
    conn, _ = server.accept()
    conn.close()
"#;

fn isolation_job(name: &str, mode: &str, network_extra: &str, env: &str) -> String {
    let script = ISOLATION
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n");
    format!(
        r#"job "{name}" {{
  group "probe" {{
    network {{
      mode = "{mode}"
{network_extra}
    }}
    task "server" {{
      driver = "exec"
      env {{
{env}
      }}
      config {{
        command = "/usr/bin/python3"
        args    = ["-c", "{script}"]
      }}
    }}
  }}
}}
"#
    )
}

/// A value the task printed as `NAME=value` (the whole line's rest).
fn line_value(agent: &AgentProcess, alloc: &str, name: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = agent.task_stdout(alloc, "server");
        if let Some(value) = out
            .lines()
            .find_map(|line| line.strip_prefix(&format!("{name}=")))
        {
            return value.to_string();
        }
        assert!(
            Instant::now() < deadline,
            "the task never printed {name}: {out:?}\n{:#?}",
            agent.output()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A bridge group's tasks see the group's own `resolv.conf` (its `dns` block) and
/// `hosts` (its alloc's address under its `hostname`), read-only, over the host's; a
/// `dns` block in host mode gives its resolver too. Two groups of different jobs
/// cannot reach each other's loopback: a listener on one's `127.0.0.1` is refused to
/// the other, on its own loopback and at the first alloc's address; nor can a bridge
/// task reach the agent's API (on the node's loopback, at the bridge's gateway, or by
/// its Unix socket).
#[tokio::test(flavor = "multi_thread")]
async fn a_bridge_group_has_its_own_resolver_and_hosts_and_no_other_group_reaches_its_loopback() {
    let mut agent = AgentProcess::new();
    agent.start().await;
    let probe_port = berth_testkit::etcd::free_port();
    let dns = "      hostname = \"web-1\"\n      dns {\n        servers  = [\"192.0.2.53\"]\n        searches = [\"svc.example\"]\n        options  = [\"ndots:2\"]\n      }";
    let first = agent
        .run_job(
            "first.hcl",
            &isolation_job(
                "first",
                "bridge",
                dns,
                &format!("        PROBE_PORT = \"{probe_port}\"\n        HOST_NAME = \"web-1\""),
            ),
        )
        .await;
    assert_eq!(
        line_value(&agent, &first, "RESOLV"),
        "# written by berth from the group's network { dns } block|nameserver 192.0.2.53|search svc.example|options ndots:2|"
    );
    let address = line_value(&agent, &first, "RESOLVED");
    assert!(address.starts_with("172.26."), "{address}");
    let hosts = line_value(&agent, &first, "HOSTS");
    assert!(hosts.contains(&format!("|{address} web-1|")), "{hosts}");
    assert!(hosts.contains("|127.0.0.1 localhost|"), "{hosts}");
    assert_eq!(line_value(&agent, &first, "HOSTS_WRITE"), "refused");
    // Its own loopback listener is there for it.
    assert_eq!(line_value(&agent, &first, "OWN_LOOPBACK"), "reached");

    // Another job's bridge group, on the same port: its loopback is its own, and the
    // first's loopback listener is not reachable at the first's address either.
    let second = agent
        .run_job(
            "second.hcl",
            &isolation_job(
                "second",
                "bridge",
                "      port \"probe\" {}",
                &format!(
                    "        PROBE_PORT = \"{probe_port}\"\n        TARGET = \"{address}\"\n        AGENT_PORT = \"{}\"\n        AGENT_SOCKET = \"{}\"",
                    agent.port(),
                    agent.socket().display()
                ),
            ),
        )
        .await;
    assert_eq!(line_value(&agent, &second, "OWN_LOOPBACK"), "reached");
    assert_eq!(line_value(&agent, &second, "TARGET"), "refused");
    // Nor the agent's API: its loopback listener, the node at the bridge's gateway, its
    // Unix socket (outside the task's root).
    for what in ["AGENT_LOOPBACK", "AGENT_GATEWAY", "AGENT_SOCKET"] {
        assert_eq!(line_value(&agent, &second, what), "refused", "{what}");
    }
    // Without a dns block it has the host's resolver (a regular file here), and a
    // hosts file naming its alloc by the id's first 8 characters.
    let second_hosts = line_value(&agent, &second, "HOSTS");
    assert!(
        second_hosts.ends_with(&format!(" {}|", &second[..8])),
        "{second_hosts}"
    );
    // Nor does the host reach it there.
    assert!(
        TcpStream::connect_timeout(
            &format!("{address}:{probe_port}").parse().unwrap(),
            Duration::from_millis(500)
        )
        .is_err(),
        "the first group's loopback listener answers on its bridge address"
    );

    // A dns block in host mode: the group's resolver, and the host's hosts file.
    let host_mode = agent
        .run_job(
            "third.hcl",
            &isolation_job(
                "third",
                "host",
                "      dns {\n        servers = [\"192.0.2.54\"]\n      }",
                &format!(
                    "        PROBE_PORT = \"{}\"",
                    berth_testkit::etcd::free_port()
                ),
            ),
        )
        .await;
    assert_eq!(
        line_value(&agent, &host_mode, "RESOLV"),
        "# written by berth from the group's network { dns } block|nameserver 192.0.2.54|"
    );
    assert_eq!(
        line_value(&agent, &host_mode, "HOSTS"),
        std::fs::read_to_string("/etc/hosts")
            .unwrap()
            .replace('\n', "|")
    );
    for job in ["first", "second", "third"] {
        let (code, out, err) = agent.cli(&["job", "stop", job]);
        assert_eq!(code, 0, "{out}{err}");
    }
    for alloc in [&first, &second, &host_mode] {
        agent.finished(alloc).await;
    }
}

/// An alloc whose task ends while the agent is down (`kill -9`): the restarted agent
/// finds it ended and leaves nothing of its network: no namespace, no rule, no lease.
#[tokio::test(flavor = "multi_thread")]
async fn a_bridge_alloc_that_ends_while_the_agent_is_down_leaves_nothing_after_its_restart() {
    let mut agent = AgentProcess::new();
    agent.start().await;
    let source = r#"job "brief" {
  type = "batch"
  group "web" {
    network {
      mode = "bridge"
      port "http" {
        to = 8080
      }
    }
    task "server" {
      driver = "exec"
      config {
        command = "/bin/sh"
        args    = ["-c", "echo NOMAD_ALLOC_IP_http=$NOMAD_ALLOC_IP_http; sleep 2"]
      }
    }
  }
}
"#;
    let alloc = agent.run_job("brief.hcl", source).await;
    let ip = printed(&agent, &alloc, "ALLOC_IP_http");
    agent.kill9();
    // The task ends meanwhile; its network is still there for the agent to find.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let namespaces = std::process::Command::new("ip")
        .args(["netns", "list"])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&namespaces.stdout).contains(&alloc),
        "the namespace went with the agent's kill -9: nothing left to test"
    );
    agent.start().await;
    let status = agent.finished(&alloc).await;
    assert_eq!(
        status.client_status,
        berth_model::status::ClientStatus::Complete,
        "{status:#?}"
    );
    let allocs = [alloc];
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let left = leftovers(&allocs, std::slice::from_ref(&ip));
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "left on the host: {left:#?}\n{}",
            agent.output()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A bridge group's services, as Nomad registers them: by default (and with `host`) the
/// node's address and the host port; with `address_mode = "alloc"` the alloc's bridge
/// address and the port inside (`to`).
#[tokio::test(flavor = "multi_thread")]
async fn a_bridge_groups_services_register_the_host_port_or_with_alloc_the_address_inside() {
    let mut agent = AgentProcess::new();
    agent.start().await;
    let source = r#"job "svc" {
  group "web" {
    network {
      mode = "bridge"
      port "http" {
        to = 8080
      }
    }
    service {
      name         = "web-alloc"
      port         = "http"
      provider     = "nomad"
      address_mode = "alloc"
    }
    service {
      name     = "web-host"
      port     = "http"
      provider = "nomad"
    }
    task "server" {
      driver = "exec"
      config {
        command = "/bin/sh"
        args    = ["-c", "echo NOMAD_ALLOC_IP_http=$NOMAD_ALLOC_IP_http NOMAD_HOST_PORT_http=$NOMAD_HOST_PORT_http; sleep 300"]
      }
    }
  }
}
"#;
    let alloc = agent.run_job("svc.hcl", source).await;
    let ip = printed(&agent, &alloc, "ALLOC_IP_http");
    let host_port = printed(&agent, &alloc, "HOST_PORT_http");
    let deadline = Instant::now() + Duration::from_secs(20);
    let listed = loop {
        let (_, out, _) = agent.cli(&["service", "list"]);
        if out.contains("web-alloc") && out.contains("web-host") {
            break out;
        }
        assert!(Instant::now() < deadline, "{out}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let address_of = |name: &str| {
        listed
            .lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .and_then(|l| l.split_whitespace().find(|w| w.contains(':')))
            .unwrap_or_else(|| panic!("{name} in {listed}"))
            .to_string()
    };
    assert_eq!(address_of("web-alloc"), format!("{ip}:8080"), "{listed}");
    let host = address_of("web-host");
    assert!(host.ends_with(&format!(":{host_port}")), "{listed}");
    assert!(!host.starts_with(&ip), "{listed}");
    let (code, out, err) = agent.cli(&["job", "stop", "svc"]);
    assert_eq!(code, 0, "{out}{err}");
    agent.finished(&alloc).await;
}
