//! What this node is, in the words of Nomad's fingerprinters: `attr.kernel.name`,
//! `attr.cpu.arch`, `attr.os.cgroups.version`, `attr.unique.network.ip-address`,
//! `node.unique.name`, … Jobspecs use them in run-time interpolation
//! (`${attr.kernel.name}`) and in `constraint` blocks. The machine's are read once, at
//! first use: they do not change while the process runs. Each agent lays its own
//! identity over them (the agent config's `name` and `datacenter`, as in Nomad, and how
//! it limits disks) and keeps the result: two agents in one process (tests, benches)
//! are two nodes.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

/// What the operator calls this node, over what the machine says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Identity {
    pub name: Option<String>,
    pub datacenter: Option<String>,
    /// How the agent limits allocs' disks (`berth_sys::disk::Mechanism::name`), shown as
    /// `attr.storage.ephemeral_disk_limit`.
    pub ephemeral_disk_limit: Option<String>,
}

/// A node's attributes, by their full names (`attr.kernel.name`, `node.unique.name`).
pub type Facts = Arc<BTreeMap<String, String>>;

/// What the machine says, read at first use.
static MACHINE: OnceLock<BTreeMap<String, String>> = OnceLock::new();

/// The attributes of a node with `identity` on this machine.
pub fn facts(identity: &Identity) -> Facts {
    let mut facts = MACHINE.get_or_init(read).clone();
    if let Some(name) = &identity.name {
        facts.insert("node.unique.name".into(), name.clone());
    }
    if let Some(datacenter) = &identity.datacenter {
        facts.insert("node.datacenter".into(), datacenter.clone());
    }
    if let Some(mechanism) = &identity.ephemeral_disk_limit {
        facts.insert(
            "attr.storage.ephemeral_disk_limit".into(),
            mechanism.clone(),
        );
    }
    Arc::new(facts)
}

fn read() -> BTreeMap<String, String> {
    let uname = rustix::system::uname();
    let text = |c: &std::ffi::CStr| c.to_string_lossy().into_owned();
    let hostname = text(uname.nodename());
    let release = text(uname.release());
    let machine = text(uname.machine());
    let os_release = std::fs::read_to_string("/etc/os-release").unwrap_or_default();
    let memory = berth_sys::cgroup::node_memory();
    let mut facts = BTreeMap::new();
    let mut set = |key: &str, value: String| {
        facts.insert(key.to_string(), value);
    };
    set("attr.kernel.name", text(uname.sysname()).to_lowercase());
    set("attr.kernel.version", version_of(&release));
    set("attr.kernel.release", release);
    set("attr.kernel.arch", machine.clone());
    set("attr.cpu.arch", go_arch(&machine).to_string());
    set(
        "attr.cpu.numcores",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
            .to_string(),
    );
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get() as u64);
    let mhz = cpu_mhz_per_core();
    set("attr.cpu.frequency", mhz.to_string());
    set("attr.cpu.totalcompute", (cores * mhz).to_string());
    if let Some(bytes) = memory {
        set("attr.memory.totalbytes", bytes.to_string());
    }
    if let Some(version) = cgroups_version() {
        set("attr.os.cgroups.version", version.to_string());
    }
    set("attr.unique.network.ip-address", default_route_address());
    if let Some(id) = os_field(&os_release, "ID") {
        set("attr.os.name", id);
    }
    if let Some(version) = os_field(&os_release, "VERSION_ID") {
        set("attr.os.version", version);
    }
    set("attr.unique.hostname", hostname.clone());
    set("node.unique.name", hostname);
    if let Ok(id) = std::fs::read_to_string("/etc/machine-id") {
        set("node.unique.id", id.trim().to_string());
    }
    set("node.datacenter", "dc1".into());
    set("node.region", "global".into());
    set("node.class", String::new());
    facts
}

/// The node's address on its default route (found by a UDP `connect`, which sends
/// nothing), or loopback on a node without one: Nomad's `unique.network.ip-address`, and
/// the address services are registered with when the config names none.
pub fn default_route_address() -> String {
    static NODE: OnceLock<String> = OnceLock::new();
    NODE.get_or_init(|| {
        std::net::UdpSocket::bind("0.0.0.0:0")
            .and_then(|socket| {
                socket.connect("192.0.2.1:9")?;
                socket.local_addr()
            })
            .map(|a| a.ip().to_string())
            .unwrap_or_else(|_| "127.0.0.1".into())
    })
    .clone()
}

/// A core's clock in MHz, from `/proc/cpuinfo` (1000 where it says none, as in some
/// virtual machines): what Nomad's `cpu` resources count in.
pub fn cpu_mhz_per_core() -> u64 {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find(|l| l.starts_with("cpu MHz"))
                .and_then(|l| l.split(':').nth(1))
                .and_then(|v| v.trim().parse::<f64>().ok())
        })
        .map_or(1000, |mhz| mhz as u64)
}

/// Nomad's `os.cgroups.version`: 2 when `/sys/fs/cgroup` is the unified hierarchy
/// (cgroup2's filesystem), 1 otherwise (v1 or hybrid, as Nomad reads them); `None`
/// without cgroups.
fn cgroups_version() -> Option<u8> {
    const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;
    let stat = rustix::fs::statfs("/sys/fs/cgroup").ok()?;
    Some(if stat.f_type as i64 == CGROUP2_SUPER_MAGIC {
        2
    } else {
        1
    })
}

/// `6.18.44` of `6.18.44-fc-v669`: what Nomad's `version` constraints compare.
fn version_of(release: &str) -> String {
    release
        .split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .next()
        .unwrap_or("")
        .trim_end_matches('.')
        .to_string()
}

/// Go's name for the architecture, as Nomad reports it.
fn go_arch(machine: &str) -> &str {
    match machine {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "i686" | "i386" => "386",
        other => other,
    }
}

fn os_field(os_release: &str, key: &str) -> Option<String> {
    os_release.lines().find_map(|line| {
        let value = line.strip_prefix(key)?.strip_prefix('=')?;
        Some(value.trim_matches('"').to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_node_has_nomads_basic_attributes() {
        let facts = facts(&Identity::default());
        assert_eq!(facts["attr.kernel.name"], "linux");
        assert!(
            facts["attr.kernel.version"]
                .split('.')
                .all(|p| p.parse::<u32>().is_ok()),
            "{facts:?}"
        );
        assert!(facts["attr.cpu.numcores"].parse::<u32>().unwrap() >= 1);
        // As this machine's cgroups are (v1 here; a v2 node says 2).
        let unified = std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .lines()
            .any(|l| l.contains(" /sys/fs/cgroup ") && l.contains(" - cgroup2 "));
        assert_eq!(
            facts["attr.os.cgroups.version"],
            if unified { "2" } else { "1" }
        );
        assert!(
            facts["attr.unique.network.ip-address"]
                .parse::<std::net::IpAddr>()
                .is_ok(),
            "{facts:?}"
        );
        let total: u64 = facts["attr.cpu.totalcompute"].parse().unwrap();
        let each: u64 = facts["attr.cpu.frequency"].parse().unwrap();
        assert_eq!(
            total,
            each * facts["attr.cpu.numcores"].parse::<u64>().unwrap()
        );
        assert!(!facts["node.unique.name"].is_empty());
    }

    /// Two agents in one process are two nodes: each keeps its own name, datacenter
    /// and disk mechanism over the machine's attributes.
    #[test]
    fn each_identity_keeps_its_own_attributes() {
        let a = facts(&Identity {
            name: Some("a".into()),
            datacenter: Some("east".into()),
            ephemeral_disk_limit: Some("image".into()),
        });
        let b = facts(&Identity {
            name: Some("b".into()),
            ..Identity::default()
        });
        assert_eq!(a["node.unique.name"], "a");
        assert_eq!(a["node.datacenter"], "east");
        assert_eq!(a["attr.storage.ephemeral_disk_limit"], "image");
        assert_eq!(b["node.unique.name"], "b");
        assert_eq!(b["node.datacenter"], "dc1");
        assert!(!b.contains_key("attr.storage.ephemeral_disk_limit"));
        assert_eq!(a["attr.kernel.release"], b["attr.kernel.release"]);
    }

    #[test]
    fn versions_and_arches_in_nomads_words() {
        assert_eq!(version_of("6.18.44-fc-v669"), "6.18.44");
        assert_eq!(version_of("5.10.0"), "5.10.0");
        assert_eq!(go_arch("x86_64"), "amd64");
        assert_eq!(
            os_field(
                "NAME=\"Debian\"\nID=debian\nVERSION_ID=\"12\"\n",
                "VERSION_ID"
            ),
            Some("12".into())
        );
    }
}
