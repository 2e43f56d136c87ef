//! A group's `network` block: its mode and port labels, and the reader of a `port`
//! field.

use berth_hcl::Problem;
use berth_hcl::fields::Fields;
use berth_hcl::tree::Value;

use super::ignored::scheduler_level;
use crate::Findings;
use berth_jobspec::fields as schema;
use berth_jobspec::names::{is_host_name, is_name_server, is_resolver_option, is_search_domain};
use berth_jobspec::*;

/// What a group's `network` block says.
#[derive(Debug, Default)]
pub(super) struct NetworkBlock {
    pub mode: NetworkMode,
    pub ports: Vec<PortLabel>,
    pub dns: Option<DnsConfig>,
    pub hostname: Option<String>,
}

/// A group's `network` block: its mode, its ports, its `dns` and `hostname`. In host
/// mode a port is the host's as written and nothing is mapped; in bridge mode a host
/// port is forwarded to `to` in the group's namespace. What has no effect is said.
pub(super) fn network(fields: &mut Fields<'_>, problems: &mut Findings) -> NetworkBlock {
    let Some(block) = fields.single_block("network", problems) else {
        return NetworkBlock::default();
    };
    let path = format!("{}.network", fields.path);
    let mut network = Fields::new(
        &block.body,
        path.clone(),
        block.at,
        &[
            "mode",
            "port",
            "dns",
            "hostname",
            "mbits",
            "reserved_ports",
            "cni",
        ],
    );
    let mode = match network
        .string(schema::network::MODE.hcl, problems)
        .as_deref()
    {
        None | Some("host") => NetworkMode::Host,
        Some("bridge") => NetworkMode::Bridge,
        Some(other) => {
            let at = network.attr("mode").map(|a| a.at).unwrap_or(block.at);
            problems.warnings.push(Problem {
                path: format!("{path}.mode"),
                at: Some(at),
                message: format!(
                    "mode {other:?} has no effect on berth (it has \"host\" and \"bridge\"): tasks get the host's network"
                ),
            });
            NetworkMode::Host
        }
    };
    let mut ports = Vec::new();
    for (label, port) in network.labeled_blocks(schema::network::RESERVED_PORTS.hcl, problems) {
        let mut p = Fields::new(
            &port.body,
            format!("{path}.port.{label}"),
            port.at,
            &["static", "to", "host_network"],
        );
        let number = p
            .number(schema::port::STATIC.hcl, u16::MAX as u64, problems)
            .map(|n| n as u16);
        // Nomad's `to = -1` (and an unset `to`, Go's 0) is the host port's own number.
        let to = match p.attr(schema::port::TO.hcl).map(|a| &a.value) {
            Some(Value::Number(n)) if n.as_i64() == Some(-1) => None,
            _ => p
                .number(schema::port::TO.hcl, u16::MAX as u64, problems)
                .filter(|n| *n != 0)
                .map(|n| n as u16),
        };
        let mut ignored = vec![(
            "host_network",
            "berth forwards ports from every host address",
        )];
        if mode == NetworkMode::Host {
            ignored.push((
                "to",
                "in mode \"host\" a task listens on the host's port itself (only a docker \
                 task's own network forwards it to its to)",
            ));
        }
        scheduler_level(&mut p, &port.body, &ignored, problems);
        p.finish(problems);
        ports.push(PortLabel {
            label,
            number,
            // Kept in host mode too: a docker task's own network forwards to it.
            to,
        });
    }
    let dns = network
        .single_block(schema::network::DNS.hcl, problems)
        .map(|block| dns(&path, block, problems));
    let hostname = network.string(schema::network::HOSTNAME.hcl, problems);
    let hostname = match hostname {
        Some(name) if mode == NetworkMode::Host => {
            let at = network.attr("hostname").map_or(block.at, |a| a.at);
            problems.warnings.push(Problem {
                path: format!("{path}.hostname"),
                at: Some(at),
                message: format!(
                    "hostname {name:?} has no effect in mode \"host\": tasks share the host's network and name"
                ),
            });
            None
        }
        Some(name) if !is_host_name(&name) => {
            network.problem_with(
                problems,
                "hostname",
                format!(
                    "{name:?} is not a host name (labels of letters, digits and '-', at most 63 characters each, 253 in all)"
                ),
            );
            None
        }
        other => other,
    };
    scheduler_level(
        &mut network,
        &block.body,
        &[
            ("mbits", "berth reserves no bandwidth"),
            ("reserved_ports", "berth reserves no ports"),
            ("cni", "berth gives tasks the host's network"),
        ],
        problems,
    );
    if mode == NetworkMode::Bridge && ports.len() > MAX_BRIDGE_PORTS {
        network.problem(
            problems,
            "port",
            block.at,
            format!(
                "{} ports: a group in bridge mode forwards at most {MAX_BRIDGE_PORTS} (each is a firewall rule on the node)",
                ports.len()
            ),
        );
    }
    network.finish(problems);
    NetworkBlock {
        mode,
        ports,
        dns,
        hostname,
    }
}

/// The most entries each list of a `dns` block holds: far past what resolvers read
/// (glibc takes 3 name servers), and each one is a line or a word of `resolv.conf`.
pub const MAX_DNS_ENTRIES: usize = 16;

/// A `dns` block: every value one token of its `resolv.conf` line, so a value with a
/// newline or a space cannot add a line (a `nameserver` of the author's, say).
fn dns(parent: &str, block: &berth_hcl::tree::BlockNode, problems: &mut Findings) -> DnsConfig {
    let mut fields = Fields::new(
        &block.body,
        format!("{parent}.dns"),
        block.at,
        &["servers", "searches", "options"],
    );
    let mut list = |name: &'static str, valid: fn(&str) -> bool, expected: &str| {
        let values = fields.string_list(name, problems);
        if values.len() > MAX_DNS_ENTRIES {
            let message = format!(
                "{} entries: berth writes at most {MAX_DNS_ENTRIES}",
                values.len()
            );
            fields.problem_with(problems, name, message);
            return Vec::new();
        }
        let (good, bad): (Vec<String>, Vec<String>) = values.into_iter().partition(|v| valid(v));
        for value in bad {
            fields.problem_with(problems, name, format!("{value:?} is not {expected}"));
        }
        good
    };
    let config = DnsConfig {
        servers: list(schema::dns::SERVERS.hcl, is_name_server, "an IP address"),
        searches: list(schema::dns::SEARCHES.hcl, is_search_domain, "a domain name"),
        options: list(
            schema::dns::OPTIONS.hcl,
            is_resolver_option,
            "a resolver option (as `ndots:2` or `edns0`)",
        ),
    };
    fields.finish(problems);
    config
}

/// The most ports a bridge-mode group forwards.
pub const MAX_BRIDGE_PORTS: usize = 64;

/// Ports are a label (`"http"`) or a number (`8080`).
pub(super) fn port_value(fields: &mut Fields<'_>, problems: &mut Findings) -> Option<String> {
    let value = fields.attr("port")?;
    match &value.value {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Failed => None,
        other => {
            fields.problem(
                problems,
                "port",
                value.at,
                format!("expected a port label or number, found {}", other.kind()),
            );
            None
        }
    }
}
