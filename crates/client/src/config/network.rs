//! The agent config's keys for Nomad's bridge network (Nomad's `client` block has them):
//! where the CNI plugins are, and the bridge's name and subnet.

use berth_hcl::Problem;
use berth_hcl::fields::Fields;

/// Nomad's defaults, so a node beside a Nomad client shares its bridge and leases.
pub const DEFAULT_BRIDGE_NAME: &str = "nomad";
pub const DEFAULT_BRIDGE_SUBNET: &str = "172.26.64.0/20";
/// Nomad's `cni_path`, then where Debian's `containernetworking-plugins` installs them.
pub const DEFAULT_CNI_PATH: &str = "/opt/cni/bin:/usr/lib/cni";
pub const DEFAULT_CNI_CONFIG_DIR: &str = "/opt/cni/config";

/// The node's bridge network, for groups in `network { mode = "bridge" }`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BridgeSettings {
    /// Directories of CNI plugins, `:`-separated.
    pub cni_path: String,
    /// Where `cni/<name>` networks are configured (read by no mode berth has yet).
    pub cni_config_dir: String,
    /// The bridge's interface, and the CNI network's name.
    pub name: String,
    /// IPv4, with its prefix.
    pub subnet: String,
}

impl Default for BridgeSettings {
    fn default() -> Self {
        BridgeSettings {
            cni_path: DEFAULT_CNI_PATH.into(),
            cni_config_dir: DEFAULT_CNI_CONFIG_DIR.into(),
            name: DEFAULT_BRIDGE_NAME.into(),
            subnet: DEFAULT_BRIDGE_SUBNET.into(),
        }
    }
}

/// The top-level keys: `cni_path`, `cni_config_dir`, `bridge_network_name`,
/// `bridge_network_subnet`.
pub(super) fn bridge_settings(
    fields: &mut Fields<'_>,
    problems: &mut Vec<Problem>,
) -> BridgeSettings {
    let defaults = BridgeSettings::default();
    let cni_path = fields
        .string("cni_path", problems)
        .unwrap_or(defaults.cni_path);
    if cni_path
        .split(':')
        .any(|dir| !dir.is_empty() && !dir.starts_with('/'))
    {
        fields.problem_with(
            problems,
            "cni_path",
            format!("{cni_path:?} must be absolute directories, separated by ':'"),
        );
    }
    let cni_config_dir = fields
        .string("cni_config_dir", problems)
        .unwrap_or(defaults.cni_config_dir);
    let name = fields
        .string("bridge_network_name", problems)
        .unwrap_or(defaults.name);
    // An interface name: at most 15 bytes (IFNAMSIZ less its NUL), nothing a shell or
    // iptables comment would read twice.
    let name_ok = !name.is_empty()
        && name.len() <= 15
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_'));
    if !name_ok {
        fields.problem_with(
            problems,
            "bridge_network_name",
            format!("{name:?} cannot name a bridge: 1 to 15 letters, digits, '-' or '_'"),
        );
    }
    let subnet = fields
        .string("bridge_network_subnet", problems)
        .unwrap_or(defaults.subnet);
    if !is_ipv4_subnet(&subnet) {
        fields.problem_with(
            problems,
            "bridge_network_subnet",
            format!(
                "{subnet:?} is not an IPv4 subnet: expected an address and a prefix of 8 to 30, as \"172.26.64.0/20\""
            ),
        );
    }
    BridgeSettings {
        cni_path,
        cni_config_dir,
        name,
        subnet,
    }
}

fn is_ipv4_subnet(text: &str) -> bool {
    let Some((address, prefix)) = text.split_once('/') else {
        return false;
    };
    address.parse::<std::net::Ipv4Addr>().is_ok()
        && prefix.parse::<u8>().is_ok_and(|p| (8..=30).contains(&p))
}

#[cfg(test)]
mod tests {
    use crate::config::AgentConfig;

    #[test]
    fn the_bridge_keys_default_to_nomads_and_bad_ones_are_named() {
        let config = AgentConfig::parse("agent.hcl", "").unwrap();
        assert_eq!(config.bridge, super::BridgeSettings::default());
        let config = AgentConfig::parse(
            "agent.hcl",
            "cni_path = \"/usr/lib/cni\"\nbridge_network_name = \"berth0\"\nbridge_network_subnet = \"10.9.0.0/24\"\n",
        )
        .unwrap();
        assert_eq!(config.bridge.cni_path, "/usr/lib/cni");
        assert_eq!(config.bridge.name, "berth0");
        assert_eq!(config.bridge.subnet, "10.9.0.0/24");
        let error = AgentConfig::parse(
            "agent.hcl",
            "cni_path = \"cni\"\nbridge_network_name = \"a bridge; rm\"\nbridge_network_subnet = \"10.9.0.0\"\n",
        )
        .unwrap_err()
        .to_string();
        for part in [
            "\"cni\" must be absolute directories, separated by ':'",
            "\"a bridge; rm\" cannot name a bridge: 1 to 15 letters, digits, '-' or '_'",
            "\"10.9.0.0\" is not an IPv4 subnet",
        ] {
            assert!(error.contains(part), "{error}");
        }
    }
}
