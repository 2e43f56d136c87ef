//! A group's `network` block: its mode and port labels, and the reader of a `port`
//! field.

use berth_hcl::Problem;
use berth_hcl::fields::Fields;
use berth_hcl::tree::Value;

use super::ignored::scheduler_level;
use crate::spec::*;

/// A group's `network` block: its mode and its ports. In host mode a port is the
/// host's as written and nothing is mapped; in bridge mode a host port is forwarded to
/// `to` in the group's namespace. What has no effect is said.
pub(super) fn network(
    fields: &mut Fields<'_>,
    problems: &mut Findings,
) -> (NetworkMode, Vec<PortLabel>) {
    let Some(block) = fields.single_block("network", problems) else {
        return (NetworkMode::Host, Vec::new());
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
    let mode = match network.string("mode", problems).as_deref() {
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
    for (label, port) in network.labeled_blocks("port", problems) {
        let mut p = Fields::new(
            &port.body,
            format!("{path}.port.{label}"),
            port.at,
            &["static", "to", "host_network"],
        );
        let number = p
            .number("static", u16::MAX as u64, problems)
            .map(|n| n as u16);
        // Nomad's `to = -1` (and an unset `to`, Go's 0) is the host port's own number.
        let to = match p.attr("to").map(|a| &a.value) {
            Some(Value::Number(n)) if n.as_i64() == Some(-1) => None,
            _ => p
                .number("to", u16::MAX as u64, problems)
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
                "in mode \"host\" a task listens on the host's port itself",
            ));
        }
        scheduler_level(&mut p, &port.body, &ignored, problems);
        p.finish(problems);
        ports.push(PortLabel {
            label,
            number,
            to: to.filter(|_| mode == NetworkMode::Bridge),
        });
    }
    scheduler_level(
        &mut network,
        &block.body,
        &[
            ("dns", "berth gives tasks the host's network and resolver"),
            ("hostname", "berth gives tasks the host's network"),
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
    (mode, ports)
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
