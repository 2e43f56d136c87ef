//! From a jobspec's `service` blocks to Consul registrations: berth's IDs, the port's
//! number, the address, run-time names in the name and tags, and the checks.

use std::time::Duration;

use sha2::{Digest as _, Sha256};

use super::api::{
    CheckRegistration, ConnectRegistration, ProxyRegistration, ServiceRegistration,
    SidecarRegistration, UpstreamRegistration,
};
use berth_jobspec::names::is_dns_label;
use berth_jobspec::{CheckKind, PortLabel, Service, ServiceProvider};

/// Where the services come from.
pub struct ServiceSource<'a> {
    pub alloc_id: &'a str,
    /// The task whose services these are; `None`: the group's.
    pub task: Option<&'a str>,
    pub group: &'a str,
    pub ports: &'a [PortLabel],
    /// The address when a service names none.
    pub address: &'a str,
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
        Some(label) => {
            port_number(label, source.ports).ok_or_else(|| BuildError::NoPortNumber {
                name: name.clone(),
                port: label.clone(),
            })?
        }
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
        .unwrap_or_else(|| source.address.to_string());
    let mut checks = Vec::new();
    for (index, check) in service.checks.iter().enumerate() {
        let check_port = match &check.port {
            None => port,
            Some(label) => {
                port_number(label, source.ports).ok_or_else(|| BuildError::NoPortNumber {
                    name: name.clone(),
                    port: label.clone(),
                })?
            }
        };
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
                    .and_then(|p| port_number(p, source.ports)),
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

fn port_number(label: &str, ports: &[PortLabel]) -> Option<u16> {
    label.parse().ok().or_else(|| {
        ports
            .iter()
            .find(|p| p.label == label)
            .and_then(|p| p.number)
    })
}

/// A duration as Go writes it, which Consul parses: "10s", "1500ms".
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
            }],
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
            address: "10.0.0.5",
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
}
