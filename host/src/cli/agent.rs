//! `berth agent`: runs until interrupted. Tasks keep running when it stops; the next
//! agent on the same data dir recovers them.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use super::output::{eprint_line, print_line};
use berth_api::Listeners;
use berth_api::access::{AccessError, AccessPolicy, SOCKET_NAME, bind_socket, tcp_tokens};
use berth_client::agent::{Agent, AgentOptions, NoticeLevel, StateLocation};
use berth_client::config::AgentConfig;
use berth_client::driver_set::DriverSet;
use berth_client::hook_set::HookSet;

/// Where a dev agent listens on TCP unless told otherwise (Nomad's port).
const DEV_ADDRESS: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 4646);

pub(super) async fn run(
    http_addr: Option<SocketAddr>,
    dev: bool,
    drivers: DriverSet,
    hooks: HookSet,
    config: AgentConfig,
    data_dir: PathBuf,
) -> anyhow::Result<ExitCode> {
    // An unreadable Consul token file stops the agent here, with its path.
    if let Some(consul) = &config.consul {
        consul.token().map_err(|e| anyhow::format_err!("{e}"))?;
    }
    // A dev agent's open listener would let anyone on this machine place jobs on every
    // node of a cluster.
    if dev && config.cluster.uses_etcd() {
        anyhow::bail!(
            "-dev and a cluster block do not go together: a dev agent listens without a \
             token, and in a cluster whoever submits to it places jobs on every node; run \
             the agent without -dev (its Unix socket, or `http` with tokens)"
        );
    }
    // The TCP listener first: a taken port or a missing token is reported before anything
    // is restored.
    let tcp = match (http_addr, dev) {
        (None, false) => None,
        (address, dev) => {
            let address = address.unwrap_or(DEV_ADDRESS);
            let tokens = match tcp_tokens(&config.http, address) {
                Ok(tokens) => tokens,
                // Dev mode may listen without a token on loopback; it says so below.
                Err(AccessError::TcpWithoutToken(_)) if dev && address.ip().is_loopback() => {
                    Vec::new()
                }
                Err(AccessError::TcpWithoutToken(_)) if dev => {
                    return Err(AccessError::DevOffLoopback(address).into());
                }
                Err(error) => return Err(error.into()),
            };
            let open = tokens.is_empty();
            let listener = berth_api::bind_tcp(address)
                .await
                .map_err(|e| anyhow::format_err!("listening on {address}: {e}"))?;
            Some((
                listener,
                address,
                open,
                AccessPolicy::tcp(address, tokens, open),
            ))
        }
    };
    let agent = Agent::start(AgentOptions {
        data_dir: data_dir.clone(),
        config: config.clone(),
        drivers,
        hooks,
        state: StateLocation::DataDir,
    })
    .await?;
    let socket = bind_socket(&data_dir, config.http.socket_group.as_deref())?;
    print_line!("==> berth agent started");
    let socket_mode = match &config.http.socket_group {
        Some(group) => format!("mode 0660, group {group:?}"),
        None => "mode 0600".to_string(),
    };
    print_line!(
        "    HTTP API:   unix://{} ({})",
        data_dir.join(SOCKET_NAME).display(),
        socket_mode
    );
    if let Some((_, address, open, _)) = &tcp {
        if *open {
            print_line!(
                "    HTTP API:   http://{} (OPEN: no token needed, dev mode)",
                address
            );
            eprint_line!(
                "Warning: dev mode: the HTTP API on {} takes requests from any local \
                 user without a token (jobs, run as any user the deny-list allows; CSI plugin \
                 jobs only through the Unix socket). Do not run a dev agent on a shared \
                 machine.",
                address
            );
        } else {
            print_line!("    HTTP API:   http://{} (token required)", address);
        }
    }
    print_line!("    data dir:   {}", data_dir.display());
    let drivers: Vec<&str> = agent.drivers().iter().map(|d| d.name()).collect();
    print_line!("    drivers:    {}", drivers.join(", "));
    let hooks: Vec<&str> = agent.hooks().loaded().iter().map(|h| h.name()).collect();
    if !hooks.is_empty() {
        print_line!("    hooks:      {}", hooks.join(", "));
    }
    for (_, reason) in agent.hooks().refused() {
        print_line!("    Error: refused a hook: {}", reason);
    }
    for notice in agent.notices() {
        let label = match notice.level {
            NoticeLevel::Info => "    ",
            NoticeLevel::Warning => "    Warning: ",
            NoticeLevel::Error => "    Error: ",
        };
        print_line!("{}{}", label, notice.message);
    }
    let mut events = agent.subscribe();
    let printer = tokio::spawn(async move {
        while let Ok(event) = events.recv().await {
            super::output::print_event(&event);
        }
    });
    let listeners = Listeners {
        socket,
        socket_limits: config.http.socket_limits,
        tcp: tcp.map(|(listener, _, _, policy)| (listener, policy)),
        tcp_limits: config.http.tcp_limits,
    };
    let serve = berth_api::serve(listeners, agent.clone());
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        served = serve => served.map_err(|e| anyhow::format_err!("serving the HTTP API: {e}"))?,
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate.recv() => {}
    }
    printer.abort();
    // Streams (log follows, event streams) end now, not when the process is torn down.
    agent.shut_down();
    print_line!("==> berth agent stopping; tasks keep running and are recovered by the next agent");
    Ok(ExitCode::SUCCESS)
}
