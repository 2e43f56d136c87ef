//! A `service` block (of a group or a task) and its `check` blocks.

use berth_hcl::Location;
use berth_hcl::Problem;
use berth_hcl::fields::{Fields, block_json};
use berth_hcl::tree::BlockNode;

use super::ignored::scheduler_level;
use super::network::port_value;
use crate::Findings;
use berth_jobspec::*;

/// Nomad's floor for a check's interval and timeout.
const MIN_CHECK_PERIOD: std::time::Duration = std::time::Duration::from_secs(1);

/// The most checks a service may have.
const MAX_CHECKS: usize = 16;

pub(super) fn service(
    parent: &str,
    block: &BlockNode,
    ports: &[PortLabel],
    problems: &mut Findings,
) -> Service {
    let mut fields = Fields::new(
        &block.body,
        format!("{parent}.service"),
        block.at,
        &[
            "name",
            "port",
            "tags",
            "enable_tag_override",
            "connect",
            "provider",
            "check",
            "check_restart",
            "address",
            "address_mode",
            "meta",
            "canary_tags",
            "canary_meta",
        ],
    );
    let name = fields.string("name", problems).unwrap_or_default();
    let port = port_value(&mut fields, problems);
    let address_mode = address_mode(&mut fields, block.at, problems);
    let tags = fields.string_list("tags", problems);
    let enable_tag_override = fields
        .bool("enable_tag_override", problems)
        .unwrap_or(false);
    let connect = fields.single_block("connect", problems).map(|block| {
        let path = format!("{}.connect", fields.path);
        let mut c = Fields::new(
            &block.body,
            path.clone(),
            block.at,
            &["sidecar_service", "sidecar_task", "native"],
        );
        let sidecar_service = c.single_block("sidecar_service", problems).map(|block| {
            let mut s = Fields::new(
                &block.body,
                format!("{path}.sidecar_service"),
                block.at,
                &["port", "proxy", "tags"],
            );
            let port = port_value(&mut s, problems);
            s.string_list("tags", problems);
            let mut upstreams = Vec::new();
            if let Some(proxy) = s.single_block("proxy", problems) {
                let mut p = Fields::new(
                    &proxy.body,
                    format!("{path}.sidecar_service.proxy"),
                    proxy.at,
                    &["upstreams", "config", "local_service_port"],
                );
                for up in p.blocks("upstreams") {
                    let mut u = Fields::new(
                        &up.body,
                        format!("{path}.sidecar_service.proxy.upstreams"),
                        up.at,
                        &["destination_name", "local_bind_port", "datacenter"],
                    );
                    let destination_name = u.required_string("destination_name", problems);
                    let local_bind_port = u.number("local_bind_port", u16::MAX as u64, problems);
                    if local_bind_port.is_none() && u.attr("local_bind_port").is_none() {
                        u.problem(problems, "local_bind_port", up.at, "is required".into());
                    }
                    u.string("datacenter", problems);
                    u.finish(problems);
                    if let (Some(destination_name), Some(port)) =
                        (destination_name, local_bind_port)
                    {
                        upstreams.push(Upstream {
                            destination_name,
                            local_bind_port: port as u16,
                        });
                    }
                }
                p.blocks("config");
                p.number("local_service_port", u16::MAX as u64, problems);
                p.finish(problems);
            }
            s.finish(problems);
            SidecarService { port, upstreams }
        });
        let sidecar_task = c
            .single_block("sidecar_task", problems)
            .map(|b| block_json(&b.body));
        c.bool("native", problems);
        c.finish(problems);
        Connect {
            sidecar_service,
            sidecar_task,
        }
    });
    let provider = match fields.string("provider", problems).as_deref() {
        None | Some("consul") => ServiceProvider::Consul,
        Some("nomad") => ServiceProvider::Nomad,
        Some(other) => {
            fields.problem_with(
                problems,
                "provider",
                format!("unknown service provider {other:?} (use \"consul\" or \"nomad\")"),
            );
            ServiceProvider::Consul
        }
    };
    let address = fields.string("address", problems);
    let meta = fields.string_map("meta", problems);
    let path = fields.path.clone();
    let service_restart = fields
        .single_block("check_restart", problems)
        .map(|b| check_restart(&path, b, problems));
    let check_blocks = fields.blocks("check");
    if let Some(extra) = check_blocks.get(MAX_CHECKS) {
        fields.problem(
            problems,
            "check",
            extra.at,
            format!("a service has at most {MAX_CHECKS} checks"),
        );
    }
    let mut checks: Vec<ServiceCheck> = check_blocks
        .into_iter()
        .filter_map(|b| check(&path, b, problems))
        .collect();
    for check in &mut checks {
        if check.check_restart.is_none() {
            check.check_restart = service_restart.clone();
        }
    }
    for (check, block) in checks.iter().zip(fields.blocks("check")) {
        let in_group = !parent.contains(".task.");
        let script = matches!(check.kind, CheckKind::Script { .. });
        let problem = if script && in_group && check.task.is_none() {
            Some("a group service's script check needs task = \"<the task it runs in>\"")
        } else if !in_group && check.task.is_some() {
            Some("task is for a group service's check; this check runs in its own task")
        } else if provider == ServiceProvider::Nomad
            && matches!(&check.kind, CheckKind::Http { protocol, .. } if protocol != "http")
        {
            Some("berth runs a provider \"nomad\" service's http checks over plain http only")
        } else if provider == ServiceProvider::Nomad
            && matches!(&check.kind, CheckKind::Grpc { use_tls: true, .. })
        {
            Some(
                "berth runs a provider \"nomad\" service's grpc checks over plaintext gRPC only \
                 (grpc_use_tls = true needs a Consul service, whose checks Consul runs)",
            )
        } else if provider == ServiceProvider::Nomad
            && matches!(&check.kind, CheckKind::Http { method: Some(m), .. }
                if !m.eq_ignore_ascii_case("GET") && !m.eq_ignore_ascii_case("HEAD"))
        {
            Some("a provider \"nomad\" service's http check may use GET or HEAD only")
        } else if provider == ServiceProvider::Nomad
            && !script
            && check
                .port
                .as_ref()
                .or(port.as_ref())
                .is_none_or(|p| p.parse::<u16>().is_ok())
        {
            // berth (root, on the host's network) reaches only the alloc's own ports.
            Some(
                "a provider \"nomad\" service's http, tcp or grpc check reaches a port label of \
                 the group's network (its own port, or the service's), not a port number",
            )
        } else if provider == ServiceProvider::Nomad && !script && address.is_some() {
            Some(
                "a provider \"nomad\" service with http, tcp or grpc checks has the alloc's \
                 address; berth checks no other address",
            )
        } else {
            None
        };
        // A Consul service's script check is berth's to run (a TTL check in Consul):
        // its check_restart holds; Consul's own checks are Consul's.
        if provider == ServiceProvider::Consul && !script && check.check_restart.is_some() {
            problems.warnings.push(Problem {
                path: format!("{path}.check.check_restart"),
                at: Some(block.at),
                message: "check_restart has no effect on a Consul service's http, tcp or \
                          grpc check: berth restarts tasks on the checks it runs itself (a \
                          provider \"nomad\" service's, and script checks)"
                    .into(),
            });
        }
        if let Some(message) = problem {
            problems.problems.push(Problem {
                path: format!("{path}.check"),
                at: Some(block.at),
                message: message.into(),
            });
        }
    }
    scheduler_level(
        &mut fields,
        &block.body,
        &[
            ("canary_tags", "canaries are deployments across nodes"),
            ("canary_meta", "canaries are deployments across nodes"),
        ],
        problems,
    );
    if !name.contains("${") && !name.is_empty() && !berth_jobspec::names::is_dns_label(&name) {
        fields.problem_with(
            problems,
            "name",
            format!(
                "service name {name:?} is not valid: Consul and Nomad take letters, digits \
                 and dashes, at most 63, not starting or ending with a dash"
            ),
        );
    }
    let port_at = fields.attr("port").map_or(block.at, |a| a.at);
    for (wanted, at) in port
        .iter()
        .map(|p| (p, port_at))
        .chain(checks_ports(&checks, block.at))
    {
        // A warning, not an error: most Nomad jobspecs use dynamic ports, and the task
        // runs all the same; only the service is not registered (an event says so).
        if let Some(why) = unusable_port(wanted, ports) {
            problems.warnings.push(Problem {
                path: format!("{}.port", fields.path),
                at: Some(at),
                message: format!("{why}; the service will not be registered"),
            });
        }
    }
    fields.finish(problems);
    Service {
        name,
        port,
        tags,
        enable_tag_override,
        connect,
        provider,
        address,
        meta,
        checks,
        address_mode,
        at: block.at,
    }
}

/// A service's or check's `address_mode`. Nomad's `driver` is the address of a driver's
/// own network (docker's), which berth's drivers do not have: registered as `host`,
/// with a warning (a job stored before berth read the field keeps reading).
fn address_mode(
    fields: &mut Fields<'_>,
    block_at: Location,
    problems: &mut Findings,
) -> AddressMode {
    let written = fields.string("address_mode", problems);
    if written.as_deref() == Some("driver") {
        let at = fields.attr("address_mode").map_or(block_at, |a| a.at);
        problems.warnings.push(Problem {
            path: format!("{}.address_mode", fields.path),
            at: Some(at),
            message: "address_mode \"driver\" is a driver's own network (docker's), which berth's drivers do not have: registered as \"host\" (\"alloc\" is the group's bridge address and the port inside)".into(),
        });
        return AddressMode::Host;
    }
    fields
        .choose(
            written,
            "address_mode",
            &[
                ("auto", AddressMode::Auto),
                ("host", AddressMode::Host),
                ("alloc", AddressMode::Alloc),
            ],
            problems,
            |other| {
                format!(
                    "address_mode {other:?} is not one of \"auto\", \"host\", \"alloc\" or \"driver\""
                )
            },
        )
        .unwrap_or_default()
}

/// A service's `check` block; `None` when it cannot be run (a problem says why).
pub(super) fn check(
    parent: &str,
    block: &BlockNode,
    problems: &mut Findings,
) -> Option<ServiceCheck> {
    let mut fields = Fields::new(
        &block.body,
        format!("{parent}.check"),
        block.at,
        &[
            "type",
            "name",
            "path",
            "protocol",
            "method",
            "interval",
            "timeout",
            "port",
            "command",
            "args",
            "header",
            "check_restart",
            "initial_status",
            "tls_skip_verify",
            "address_mode",
            "task",
            "on_update",
            "success_before_passing",
            "failures_before_critical",
            "expose",
            "grpc_service",
            "grpc_use_tls",
        ],
    );
    let grpc_service = fields.string("grpc_service", problems);
    let grpc_use_tls = fields.bool("grpc_use_tls", problems);
    let kind_name = fields.required_string("type", problems);
    let name = fields.string("name", problems);
    let path = fields.string("path", problems);
    let protocol = fields.string("protocol", problems);
    let method = fields.string("method", problems);
    let interval = fields.duration("interval", problems);
    let timeout = fields.duration("timeout", problems);
    let port = port_value(&mut fields, problems);
    let address_mode = address_mode(&mut fields, block.at, problems);
    let command = fields.string("command", problems);
    let args = fields.string_list("args", problems);
    let task = fields.string("task", problems);
    let restart = fields
        .single_block("check_restart", problems)
        .map(|b| check_restart(&fields.path.clone(), b, problems));
    for (required, value) in [("interval", interval), ("timeout", timeout)] {
        if value.is_none() && fields.attr(required).is_none() {
            fields.problem(problems, required, block.at, "is required".into());
        }
        // Nomad's floor: a check more often than each second is a load, not a check.
        if value.is_some_and(|v| v < MIN_CHECK_PERIOD) {
            fields.problem_with(
                problems,
                required,
                format!("must be at least {MIN_CHECK_PERIOD:?}"),
            );
        }
    }
    if let Some(path) = &path
        && (!path.starts_with('/') || path.contains(['@', ' ', '#', '\\']))
    {
        fields.problem_with(
            problems,
            "path",
            format!("path {path:?} must be an absolute URL path (\"/health\"), with no @"),
        );
    }
    scheduler_level(
        &mut fields,
        &block.body,
        &[
            ("header", "berth does not pass check headers to Consul yet"),
            ("tls_skip_verify", "berth does not pass it to Consul yet"),
            ("initial_status", "berth does not pass it to Consul yet"),
            (
                "success_before_passing",
                "berth does not pass it to Consul yet",
            ),
            (
                "failures_before_critical",
                "berth does not pass it to Consul yet",
            ),
            ("on_update", "it concerns Nomad's deployments"),
            ("expose", "berth gives tasks the host's network"),
        ],
        problems,
    );
    let kind = match kind_name.as_deref() {
        Some("http") => {
            let Some(path) = path else {
                fields.problem(
                    problems,
                    "path",
                    block.at,
                    "is required for an http check".into(),
                );
                fields.finish(problems);
                return None;
            };
            CheckKind::Http {
                path,
                protocol: protocol.unwrap_or_else(|| "http".into()),
                method,
            }
        }
        Some("tcp") => CheckKind::Tcp,
        Some("grpc") => CheckKind::Grpc {
            service: grpc_service.unwrap_or_default(),
            use_tls: grpc_use_tls.unwrap_or(false),
        },
        Some("script") => {
            let Some(command) = command else {
                fields.problem(
                    problems,
                    "command",
                    block.at,
                    "is required for a script check".into(),
                );
                fields.finish(problems);
                return None;
            };
            CheckKind::Script { command, args }
        }
        Some(other) => {
            fields.problem_with(
                problems,
                "type",
                format!(
                    "check type {other:?} is not supported: berth's checks are of type \
                     \"http\", \"tcp\", \"grpc\" or \"script\""
                ),
            );
            fields.finish(problems);
            return None;
        }
        None => {
            fields.finish(problems);
            return None;
        }
    };
    fields.finish(problems);
    Some(ServiceCheck {
        name: name.unwrap_or_default(),
        kind,
        interval: interval?,
        timeout: timeout?,
        port,
        address_mode,
        check_restart: restart,
        task,
    })
}

/// A `check_restart` block (of a check or of its service).
fn check_restart(parent: &str, block: &BlockNode, problems: &mut Findings) -> CheckRestart {
    let mut fields = Fields::new(
        &block.body,
        format!("{parent}.check_restart"),
        block.at,
        &["limit", "grace", "ignore_warnings"],
    );
    let restart = CheckRestart {
        limit: fields.number("limit", 1_000, problems).unwrap_or(0) as u32,
        grace: fields.duration("grace", problems).unwrap_or_default(),
        ignore_warnings: fields.bool("ignore_warnings", problems).unwrap_or(false),
    };
    fields.finish(problems);
    restart
}

/// The ports the checks name, with where (the service block's line: a check's own
/// port attribute is not kept).
pub(super) fn checks_ports(
    checks: &[ServiceCheck],
    at: Location,
) -> impl Iterator<Item = (&String, Location)> {
    checks
        .iter()
        .filter_map(move |c| Some((c.port.as_ref()?, at)))
}

/// Why a service cannot register on `port`: it must be a number, or a label of the
/// group's network (static, or dynamic: numbered when the alloc is placed).
pub(super) fn unusable_port(port: &str, ports: &[PortLabel]) -> Option<String> {
    if port.parse::<u16>().is_ok() {
        return None;
    }
    match ports.iter().find(|p| p.label == port) {
        Some(_) => None,
        None => Some(format!(
            "port {port:?} is not a port of the group's network block (its ports: {})",
            if ports.is_empty() {
                "none".to_string()
            } else {
                ports
                    .iter()
                    .map(|p| p.label.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        )),
    }
}
