//! From a jobspec's `service` blocks to Consul registrations: berth's IDs, the port's
//! number, the address, run-time names in the name and tags, and the checks.

use std::time::Duration;

use sha2::{Digest as _, Sha256};

use super::api::{
    CheckRegistration, ConnectRegistration, ProxyRegistration, ServiceRegistration,
    SidecarRegistration, UpstreamRegistration,
};
use berth_jobspec::names::is_dns_label;
use berth_jobspec::{AddressMode, CheckKind, NetworkMode, PortLabel, Service, ServiceProvider};

/// Where the services come from.
pub struct ServiceSource<'a> {
    pub alloc_id: &'a str,
    /// The task whose services these are; `None`: the group's.
    pub task: Option<&'a str>,
    pub group: &'a str,
    pub ports: &'a [PortLabel],
    /// The group's network mode: where a port's number inside is (`to` in bridge mode).
    pub network_mode: NetworkMode,
    /// The address when a service names none.
    pub address: &'a str,
    /// The alloc's own address (bridge mode): what `address_mode = "alloc"` registers.
    /// `None`: the node's, as in host mode.
    pub alloc_address: Option<&'a str>,
    /// Run-time names (`${NOMAD_JOB_NAME}`, `${meta.x}`, …) in names and tags.
    pub lookup: &'a dyn Fn(&str) -> Option<String>,
}

/// A service that cannot be registered, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BuildError {
    #[error(
        "service {name:?}: port {port:?} has no number (a static port of the group's network, or a number)"
    )]
    NoPortNumber { name: String, port: String },
    #[error(
        "service name {name:?} is not valid: Consul takes letters, digits and dashes, at most 63, not starting or ending with a dash"
    )]
    BadName { name: String },
}

/// The registrations of `services`, each with where it goes (Consul, or berth's own
/// list for provider "nomad").
pub fn registrations(
    services: &[Service],
    source: &ServiceSource<'_>,
) -> Result<Vec<(ServiceProvider, ServiceRegistration)>, BuildError> {
    services
        .iter()
        .map(|service| Ok((service.provider, registration(service, source)?)))
        .collect()
}

fn registration(
    service: &Service,
    source: &ServiceSource<'_>,
) -> Result<ServiceRegistration, BuildError> {
    let interpolate = |text: &str| berth_jobspec::interpolate::interpolate(text, source.lookup);
    let name = interpolate(&service.name);
    if !is_dns_label(&name) {
        return Err(BuildError::BadName { name });
    }
    let port = match &service.port {
        None => 0,
        Some(label) => port_number(label, service.address_mode, source).ok_or_else(|| {
            BuildError::NoPortNumber {
                name: name.clone(),
                port: label.clone(),
            }
        })?,
    };
    let owner = match source.task {
        Some(task) => task.to_string(),
        None => format!("group-{}", source.group),
    };
    let id = format!(
        "{}task-{}-{owner}-{name}-{}",
        super::ID_PREFIX,
        source.alloc_id,
        service.port.as_deref().unwrap_or_default()
    );
    let address = service
        .address
        .as_deref()
        .map(interpolate)
        .unwrap_or_else(|| mode_address(service.address_mode, source).to_string());
    let mut checks = Vec::new();
    for (index, check) in service.checks.iter().enumerate() {
        // A check's mode is its own (Nomad's default, "host", whatever the service's):
        // Consul, on the node, reaches the host port or the alloc's address.
        let check_port = match (&check.port, &service.port) {
            (None, None) => 0,
            (Some(label), _) | (None, Some(label)) => {
                port_number(label, check.address_mode, source).ok_or_else(|| {
                    BuildError::NoPortNumber {
                        name: name.clone(),
                        port: label.clone(),
                    }
                })?
            }
        };
        let check_address = match &service.address {
            Some(address) if check.address_mode != AddressMode::Alloc => interpolate(address),
            _ => mode_address(check.address_mode, source).to_string(),
        };
        // An IPv6 address in a URL or host:port is bracketed.
        let address = &if check_address.contains(':') && !check_address.starts_with('[') {
            format!("[{check_address}]")
        } else {
            check_address
        };
        let (mut grpc, mut grpc_use_tls, mut ttl) = (None, false, None);
        let (http, method, tcp) = match &check.kind {
            CheckKind::Http {
                path,
                protocol,
                method,
            } => (
                Some(format!("{protocol}://{address}:{check_port}{path}")),
                method.clone(),
                None,
            ),
            CheckKind::Tcp => (None, None, Some(format!("{address}:{check_port}"))),
            // Consul's form: host:port, then /service when one is named.
            CheckKind::Grpc { service, use_tls } => {
                let service = interpolate(service);
                grpc = Some(match service.is_empty() {
                    true => format!("{address}:{check_port}"),
                    false => format!("{address}:{check_port}/{service}"),
                });
                grpc_use_tls = *use_tls;
                (None, None, None)
            }
            // Run by berth inside its task; a Consul service's is a TTL check there,
            // which berth updates after each run (Nomad's `ttlCheckBuffer` on top of
            // the interval).
            CheckKind::Script { .. } => {
                ttl = Some(go_duration(check.interval + SCRIPT_TTL_BUFFER));
                (None, None, None)
            }
        };
        let mut registration = CheckRegistration {
            check_id: String::new(),
            name: if check.name.is_empty() {
                format!("service: {name:?} check {}", index + 1)
            } else {
                interpolate(&check.name)
            },
            interval: go_duration(check.interval),
            timeout: go_duration(check.timeout),
            http,
            method,
            tcp,
            grpc,
            grpc_use_tls,
            ttl,
        };
        // The ID changes with the definition, so a changed check is a missing one.
        let digest = Sha256::digest(serde_json::to_vec(&(&id, &registration)).unwrap_or_default());
        registration.check_id = format!("{}check-{}", super::ID_PREFIX, hex(&digest[..8]));
        checks.push(registration);
    }
    let connect = service
        .connect
        .as_ref()
        .and_then(|c| c.sidecar_service.as_ref())
        .map(|sidecar| ConnectRegistration {
            sidecar_service: SidecarRegistration {
                port: sidecar
                    .port
                    .as_deref()
                    .and_then(|p| port_number(p, AddressMode::Host, source)),
                proxy: ProxyRegistration {
                    upstreams: sidecar
                        .upstreams
                        .iter()
                        .map(|u| UpstreamRegistration {
                            destination_name: u.destination_name.clone(),
                            local_bind_port: u.local_bind_port,
                        })
                        .collect(),
                },
            },
        });
    Ok(ServiceRegistration {
        connect,
        id,
        name,
        tags: service.tags.iter().map(|t| interpolate(t)).collect(),
        address,
        port,
        meta: service
            .meta
            .iter()
            .map(|(k, v)| (k.clone(), interpolate(v)))
            .collect(),
        enable_tag_override: service.enable_tag_override,
        checks,
    })
}

/// A port label's (or a number's) port in `mode`: the host's, or the one inside the
/// alloc's network (`to`, in bridge mode) for `alloc`.
fn port_number(label: &str, mode: AddressMode, source: &ServiceSource<'_>) -> Option<u16> {
    label.parse().ok().or_else(|| {
        let port = source.ports.iter().find(|p| p.label == label)?;
        match mode {
            AddressMode::Auto | AddressMode::Host => port.number,
            AddressMode::Alloc => port.inside(source.network_mode),
        }
    })
}

/// The address registered in `mode` when the service names none.
fn mode_address<'a>(mode: AddressMode, source: &ServiceSource<'a>) -> &'a str {
    match mode {
        AddressMode::Auto | AddressMode::Host => source.address,
        AddressMode::Alloc => source.alloc_address.unwrap_or(source.address),
    }
}

/// A duration as Go writes it, which Consul parses: "10s", "1500ms".
/// What a script check's TTL in Consul adds to its interval (Nomad's 31s): a run that
/// takes up to its timeout still lands before the TTL turns the check critical.
const SCRIPT_TTL_BUFFER: Duration = Duration::from_secs(31);

fn go_duration(duration: Duration) -> String {
    if duration.subsec_millis() == 0 {
        format!("{}s", duration.as_secs())
    } else {
        format!("{}ms", duration.as_millis())
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn web(port: Option<&str>) -> Service {
        Service {
            name: "${NOMAD_JOB_NAME}-web".into(),
            port: port.map(String::from),
            tags: vec!["v1".into(), "${meta.zone}".into()],
            enable_tag_override: true,
            connect: None,
            provider: ServiceProvider::Consul,
            address: None,
            meta: vec![("owner".into(), "team-${meta.zone}".into())],
            checks: vec![berth_jobspec::ServiceCheck {
                name: String::new(),
                kind: CheckKind::Http {
                    path: "/health".into(),
                    protocol: "http".into(),
                    method: None,
                },
                interval: Duration::from_secs(10),
                timeout: Duration::from_millis(1500),
                port: None,
                address_mode: AddressMode::Auto,
                check_restart: None,
                task: None,
            }],
            address_mode: AddressMode::Auto,
            at: Default::default(),
        }
    }

    #[test]
    fn a_service_is_registered_with_berths_id_its_static_port_and_run_time_names() {
        let ports = [PortLabel {
            label: "http".into(),
            number: Some(8080),
            to: None,
        }];
        let lookup = |name: &str| match name {
            "NOMAD_JOB_NAME" => Some("shop".to_string()),
            "meta.zone" => Some("eu".to_string()),
            _ => None,
        };
        let source = ServiceSource {
            alloc_id: "a1",
            task: Some("server"),
            group: "g",
            ports: &ports,
            network_mode: NetworkMode::Host,
            address: "10.0.0.5",
            alloc_address: None,
            lookup: &lookup,
        };
        let [(provider, registration)] = registrations(&[web(Some("http"))], &source)
            .unwrap()
            .try_into()
            .unwrap();
        assert_eq!(provider, ServiceProvider::Consul);
        assert_eq!(registration.id, "_berth-task-a1-server-shop-web-http");
        assert_eq!(registration.name, "shop-web");
        assert_eq!(registration.tags, ["v1", "eu"]);
        assert_eq!(registration.port, 8080);
        assert_eq!(registration.address, "10.0.0.5");
        assert_eq!(registration.meta["owner"], "team-eu");
        let check = &registration.checks[0];
        assert_eq!(check.http.as_deref(), Some("http://10.0.0.5:8080/health"));
        assert_eq!(
            (check.interval.as_str(), check.timeout.as_str()),
            ("10s", "1500ms")
        );
        assert!(check.check_id.starts_with("_berth-check-"));

        // A dynamic port has no number: refused by name.
        let dynamic = [PortLabel {
            label: "http".into(),
            number: None,
            to: None,
        }];
        let source = ServiceSource {
            ports: &dynamic,
            ..source
        };
        assert_eq!(
            registrations(&[web(Some("http"))], &source).unwrap_err(),
            BuildError::NoPortNumber {
                name: "shop-web".into(),
                port: "http".into()
            }
        );
        // A name that interpolates into something Consul refuses.
        let mut bad = web(None);
        bad.name = "${meta.zone}_web".into();
        assert!(matches!(
            registrations(&[bad], &source),
            Err(BuildError::BadName { .. })
        ));
    }

    /// In bridge mode, `address_mode = "alloc"` registers the alloc's own address and the
    /// port inside (`to`), as Nomad does; `host` (and `auto`) the node's and the host
    /// port. A check's mode is its own.
    #[test]
    fn address_mode_alloc_registers_the_alloc_address_and_the_port_inside() {
        let ports = [PortLabel {
            label: "http".into(),
            number: Some(24001),
            to: Some(8080),
        }];
        let lookup = |name: &str| (name == "NOMAD_JOB_NAME").then(|| "shop".to_string());
        let source = ServiceSource {
            alloc_id: "a1",
            task: None,
            group: "g",
            ports: &ports,
            network_mode: NetworkMode::Bridge,
            address: "10.0.0.5",
            alloc_address: Some("172.26.64.7"),
            lookup: &lookup,
        };
        let registered = |service: Service| {
            let [(_, registration)] = registrations(&[service], &source)
                .unwrap()
                .try_into()
                .unwrap();
            registration
        };
        let host = registered(web(Some("http")));
        assert_eq!((host.address.as_str(), host.port), ("10.0.0.5", 24001));
        assert_eq!(
            host.checks[0].http.as_deref(),
            Some("http://10.0.0.5:24001/health")
        );

        let mut alloc = web(Some("http"));
        alloc.address_mode = AddressMode::Alloc;
        let alloc_registered = registered(alloc.clone());
        assert_eq!(
            (alloc_registered.address.as_str(), alloc_registered.port),
            ("172.26.64.7", 8080)
        );
        // Its check stays on the host's address and port (Nomad's default for checks)...
        assert_eq!(
            alloc_registered.checks[0].http.as_deref(),
            Some("http://10.0.0.5:24001/health")
        );
        // ...unless it says "alloc" too.
        alloc.checks[0].address_mode = AddressMode::Alloc;
        assert_eq!(
            registered(alloc).checks[0].http.as_deref(),
            Some("http://172.26.64.7:8080/health")
        );
        // An IPv6 address is bracketed where a port follows it.
        let v6 = ServiceSource {
            alloc_address: Some("fd00::7"),
            ..source
        };
        let mut checked = web(Some("http"));
        checked.checks[0].address_mode = AddressMode::Alloc;
        let [(_, registration)] = registrations(&[checked], &v6).unwrap().try_into().unwrap();
        assert_eq!(
            registration.checks[0].http.as_deref(),
            Some("http://[fd00::7]:8080/health")
        );
        // In host mode the alloc's address is the node's and the port is the host's.
        let host_mode = ServiceSource {
            network_mode: NetworkMode::Host,
            alloc_address: None,
            ..source
        };
        let mut alloc = web(Some("http"));
        alloc.address_mode = AddressMode::Alloc;
        let [(_, registration)] = registrations(&[alloc], &host_mode)
            .unwrap()
            .try_into()
            .unwrap();
        assert_eq!(
            (registration.address.as_str(), registration.port),
            ("10.0.0.5", 24001)
        );
    }
}
