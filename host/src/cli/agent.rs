//! `berth agent`: runs until interrupted. Tasks keep running when it stops; the next
//! agent on the same data dir recovers them.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use crate::agent::{Agent, AgentOptions, NoticeLevel, StateLocation};
use crate::config::AgentConfig;
use crate::driver_set::DriverSet;
use crate::hook_set::HookSet;

pub(super) async fn run(
    http_addr: SocketAddr,
    drivers: DriverSet,
    hooks: HookSet,
    config: AgentConfig,
    data_dir: PathBuf,
) -> anyhow::Result<ExitCode> {
    if !http_addr.ip().is_loopback() {
        eprintln!(
            "Warning: the HTTP API listens on {http_addr}, beyond loopback, and has no \
             authentication"
        );
    }
    // Bind first: a taken port is reported before anything is restored.
    let listener = crate::api::bind(http_addr)
        .await
        .map_err(|e| anyhow::format_err!("listening on {http_addr}: {e}"))?;
    let agent = Agent::start(AgentOptions {
        data_dir: data_dir.clone(),
        config,
        drivers,
        hooks,
        state: StateLocation::DataDir,
    })
    .await?;
    println!("==> berth agent started");
    println!("    HTTP API:   http://{http_addr}");
    println!("    data dir:   {}", data_dir.display());
    let drivers: Vec<&str> = agent.drivers().iter().map(|d| d.name()).collect();
    println!("    drivers:    {}", drivers.join(", "));
    let hooks: Vec<&str> = agent.hooks().loaded().iter().map(|h| h.name()).collect();
    if !hooks.is_empty() {
        println!("    hooks:      {}", hooks.join(", "));
    }
    for (_, reason) in agent.hooks().refused() {
        println!("    Error: refused a hook: {reason}");
    }
    for notice in agent.notices() {
        let label = match notice.level {
            NoticeLevel::Info => "    ",
            NoticeLevel::Warning => "    Warning: ",
            NoticeLevel::Error => "    Error: ",
        };
        println!("{label}{}", notice.message);
    }
    let mut events = agent.subscribe();
    let printer = tokio::spawn(async move {
        while let Ok(event) = events.recv().await {
            super::output::print_event(&event);
        }
    });
    let serve = crate::api::serve(listener, agent.clone());
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        served = serve => served.map_err(|e| anyhow::format_err!("serving the HTTP API: {e}"))?,
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate.recv() => {}
    }
    printer.abort();
    println!("==> berth agent stopping; tasks keep running and are recovered by the next agent");
    Ok(ExitCode::SUCCESS)
}
