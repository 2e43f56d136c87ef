//! Dynamic ports, as Nomad's client hands them out: a group's `network { port "x" {} }`
//! without `static` gets a number from 20000–32000 (Nomad's `min_dynamic_port` and
//! `max_dynamic_port`) that no running alloc of this agent holds and that is free on the
//! host now. Tasks share the host's network, so the number is the task's port and the
//! host's alike. The alloc record keeps the numbers: an alloc restored after a restart
//! has the same ports.

use std::collections::{BTreeMap, BTreeSet};

use berth_jobspec::PortLabel;

/// Nomad's default dynamic port range.
pub const DYNAMIC_PORTS: std::ops::RangeInclusive<u16> = 20000..=32000;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "no free dynamic port for port {label:?}: every port of {}-{} is held by a running alloc or in use on this node",
    DYNAMIC_PORTS.start(),
    DYNAMIC_PORTS.end()
)]
pub struct NoFreePort {
    pub label: String,
}

/// Numbers for the group's dynamic ports, none of them in `in_use` (which gains them).
pub fn allocate(
    ports: &[PortLabel],
    in_use: &mut BTreeSet<u16>,
) -> Result<BTreeMap<String, u16>, NoFreePort> {
    let mut allocated = BTreeMap::new();
    let span = u32::from(DYNAMIC_PORTS.end() - DYNAMIC_PORTS.start()) + 1;
    for port in ports.iter().filter(|p| p.number.is_none()) {
        // From a varying start, so that allocs do not all probe the same ports first.
        let start = rand_start(span);
        let found = (0..span)
            .map(|offset| DYNAMIC_PORTS.start() + ((start + offset) % span) as u16)
            .find(|candidate| !in_use.contains(candidate) && free_on_host(*candidate));
        let Some(number) = found else {
            return Err(NoFreePort {
                label: port.label.clone(),
            });
        };
        in_use.insert(number);
        allocated.insert(port.label.clone(), number);
    }
    Ok(allocated)
}

/// The group's ports with the dynamic ones numbered from `allocated`.
pub fn resolve(ports: &[PortLabel], allocated: &BTreeMap<String, u16>) -> Vec<PortLabel> {
    ports
        .iter()
        .map(|p| PortLabel {
            label: p.label.clone(),
            number: p.number.or_else(|| allocated.get(&p.label).copied()),
            to: p.to,
        })
        .collect()
}

/// Whether nothing on the host listens on `port` (TCP or UDP, any address) now.
pub(super) fn free_on_host(port: u16) -> bool {
    std::net::TcpListener::bind(("0.0.0.0", port)).is_ok()
        && std::net::UdpSocket::bind(("0.0.0.0", port)).is_ok()
}

fn rand_start(span: u32) -> u32 {
    let mut bytes = [0u8; 4];
    let _ = getrandom_fill(&mut bytes);
    u32::from_le_bytes(bytes) % span
}

fn getrandom_fill(bytes: &mut [u8]) -> std::io::Result<()> {
    use std::io::Read as _;
    std::fs::File::open("/dev/urandom")?.read_exact(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dynamic_ports_get_distinct_free_numbers_and_static_ones_stay() {
        let ports = [
            PortLabel {
                label: "http".into(),
                number: None,
                to: None,
            },
            PortLabel {
                label: "admin".into(),
                number: Some(8080),
                to: None,
            },
            PortLabel {
                label: "grpc".into(),
                number: None,
                to: None,
            },
        ];
        let mut in_use = BTreeSet::new();
        let allocated = allocate(&ports, &mut in_use).unwrap();
        assert_eq!(allocated.len(), 2);
        let (http, grpc) = (allocated["http"], allocated["grpc"]);
        assert_ne!(http, grpc);
        assert!(DYNAMIC_PORTS.contains(&http) && DYNAMIC_PORTS.contains(&grpc));
        let resolved = resolve(&ports, &allocated);
        assert_eq!(resolved[1].number, Some(8080));
        assert_eq!(resolved[0].number, Some(http));

        // Every port held: a refusal that names the port.
        let mut all: BTreeSet<u16> = DYNAMIC_PORTS.collect();
        assert_eq!(
            allocate(&ports, &mut all).unwrap_err(),
            NoFreePort {
                label: "http".into()
            }
        );
    }
}
