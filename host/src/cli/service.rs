//! `berth service list`: the services of running tasks and groups, where they are
//! registered, and whether Consul holds them as berth wants.

use std::process::ExitCode;

use super::output::print_line;
use berth_api::client::Client;
use berth_client::consul::ServicesStatus;

pub(super) async fn list(client: &Client, json: bool) -> anyhow::Result<ExitCode> {
    let status: ServicesStatus = client.get("/v1/berth/services").await?;
    if json {
        super::output::print_json(&status)?;
        return Ok(ExitCode::SUCCESS);
    }
    match &status.consul {
        None => print_line!("Consul: none (no consul block in the agent config)"),
        Some(address) => {
            let synced = status.last_sync.map_or("never".to_string(), |at| {
                let seconds = at
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs());
                super::output::date_time(seconds)
            });
            print_line!("Consul: {} (last sync: {})", address, synced);
            if let Some(error) = &status.last_error {
                print_line!(
                    "  failing ({} in a row, retrying): {}",
                    status.failures,
                    super::output::one_line(error)
                );
            }
        }
    }
    if status.services.is_empty() {
        print_line!("No services");
        return Ok(ExitCode::SUCCESS);
    }
    print_line!(
        "{:<20} {:<8} {:<10} {:<22} {:<10} {:<12} {:<20} Tags",
        "Name",
        "Provider",
        "State",
        "Address",
        "Alloc",
        "Task",
        "Checks"
    );
    for service in &status.services {
        print_line!(
            "{:<20} {:<8} {:<10} {:<22} {:<10} {:<12} {:<20} {}",
            super::output::one_line(&service.name),
            service.provider,
            service.state,
            format!("{}:{}", service.address, service.port),
            service.alloc.get(..8).unwrap_or(&service.alloc),
            service.task.as_deref().unwrap_or("(group)"),
            // Berth's own checks; a Consul service's are Consul's to show.
            super::output::one_line(service.checks.as_deref().unwrap_or("-")),
            super::output::one_line(&service.tags.join(","))
        );
    }
    Ok(ExitCode::SUCCESS)
}
