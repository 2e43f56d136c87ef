//! `berth volume register|create|status|deregister|delete|snapshot` and `berth plugin
//! status`.

use std::path::Path;
use std::process::ExitCode;

use crate::api::SubmitRequest;
use crate::api::client::{Client, ClientError};
use crate::catalog::{PluginStatus, VolumeStatus, short_id};
use crate::model::csi::SnapshotInfo;

/// Exit code for a spec or request the agent refused.
const REFUSED: u8 = 2;

/// Prints the agent's refusal and turns it into the exit code; other errors pass.
fn refused<T>(result: Result<T, ClientError>) -> anyhow::Result<Result<T, ExitCode>> {
    match result {
        Ok(value) => Ok(Ok(value)),
        Err(ClientError::Api(error, status)) if status.is_client_error() => {
            eprintln!("Error: {}", super::output::text(&error.error));
            for problem in &error.problems {
                eprintln!("  {}", super::output::one_line(problem));
            }
            Ok(Err(ExitCode::from(REFUSED)))
        }
        Err(other) => Err(other.into()),
    }
}

pub(super) async fn register(
    client: &Client,
    path: &Path,
    create: bool,
) -> anyhow::Result<ExitCode> {
    let source = std::fs::read_to_string(path)
        .map_err(|e| anyhow::format_err!("reading {}: {e}", path.display()))?;
    let request = SubmitRequest {
        source_name: path.display().to_string(),
        source,
        variables: Default::default(),
    };
    let endpoint = if create {
        "/v1/berth/volumes/create"
    } else {
        "/v1/berth/volumes/register"
    };
    let status: VolumeStatus = match refused(client.post(endpoint, &request).await)? {
        Ok(status) => status,
        Err(code) => return Ok(code),
    };
    let volume = &status.volume;
    if let Some(before) = status.expanded_from {
        println!(
            "Expanded volume {:?} (plugin {:?}) from {before} to {} bytes",
            volume.id, volume.plugin_id, volume.capacity_bytes
        );
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{} volume {:?} (plugin {:?}, external id {:?})",
        if create { "Created" } else { "Registered" },
        volume.id,
        volume.plugin_id,
        volume.external_id
    );
    Ok(ExitCode::SUCCESS)
}

pub(super) async fn deregister(client: &Client, id: &str) -> anyhow::Result<ExitCode> {
    match refused(
        client
            .delete::<VolumeStatus>(&format!("/v1/berth/volume/{id}"))
            .await,
    )? {
        Ok(status) => {
            println!("Deregistered volume {:?}", status.volume.id);
            Ok(ExitCode::SUCCESS)
        }
        Err(code) => Ok(code),
    }
}

pub(super) async fn delete(client: &Client, id: &str) -> anyhow::Result<ExitCode> {
    match refused(
        client
            .delete::<VolumeStatus>(&format!("/v1/berth/volume/{id}/delete"))
            .await,
    )? {
        Ok(status) => {
            println!("Deleted volume {:?}", status.volume.id);
            Ok(ExitCode::SUCCESS)
        }
        Err(code) => Ok(code),
    }
}

pub(super) async fn status(
    client: &Client,
    id: Option<&str>,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let volumes: Vec<VolumeStatus> = match id {
        Some(id) => match refused(client.get(&format!("/v1/berth/volume/{id}")).await)? {
            Ok(volume) => vec![volume],
            Err(code) => return Ok(code),
        },
        None => client.get("/v1/berth/volumes").await?,
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&volumes)?);
        return Ok(ExitCode::SUCCESS);
    }
    if id.is_none() {
        if volumes.is_empty() {
            println!("No CSI volumes");
            return Ok(ExitCode::SUCCESS);
        }
        println!(
            "{:<20} {:<20} {:<16} {:<26} Claims",
            "ID", "Name", "Plugin", "Access Mode"
        );
        for status in &volumes {
            let v = &status.volume;
            let modes: Vec<&str> = v
                .capabilities
                .iter()
                .map(|c| c.access_mode.as_str())
                .collect();
            println!(
                "{:<20} {:<20} {:<16} {:<26} {}",
                v.id,
                v.name,
                v.plugin_id,
                modes.join(","),
                status.claims.len()
            );
        }
        return Ok(ExitCode::SUCCESS);
    }
    let status = &volumes[0];
    let v = &status.volume;
    println!("ID              = {}", v.id);
    println!("Name            = {}", v.name);
    println!("External ID     = {}", v.external_id);
    println!("Plugin ID       = {}", v.plugin_id);
    println!("Origin          = {}", v.origin);
    println!(
        "Capacity        = {}",
        if v.capacity_bytes > 0 {
            format!("{} bytes", v.capacity_bytes)
        } else {
            "unknown".into()
        }
    );
    for capability in &v.capabilities {
        println!(
            "Capability      = {} / {}",
            capability.access_mode, capability.attachment_mode
        );
    }
    println!();
    if status.claims.is_empty() {
        println!("No claims");
    } else {
        println!("Claims");
        println!(
            "{:<10} {:<32} {:<6} {:<26} {:<16} {:<20} State",
            "Alloc", "Name", "Mode", "Access Mode", "Node", "Since"
        );
        for claim in &status.claims {
            let state = status
                .releasing
                .get(&claim.alloc_id)
                .map_or("in use", String::as_str);
            println!(
                "{:<10} {:<32} {:<6} {:<26} {:<16} {:<20} {state}",
                short_id(&claim.alloc_id),
                claim.alloc_name,
                format!("{:?}", claim.mode).to_lowercase(),
                claim.access_mode.as_str(),
                claim.node,
                super::output::date_time(claim.since),
            );
        }
    }
    if status.nodes.is_empty() {
        if let Some(on_node) = &status.on_node {
            print_use("On this node", on_node);
        }
    } else {
        // A cluster: every node's use, as each published it.
        for (node, on_node) in &status.nodes {
            print_use(
                &format!("On node {}", super::output::one_line(node)),
                on_node,
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// How one node stages and publishes a volume.
fn print_use(title: &str, on_node: &crate::catalog::VolumeOnNode) {
    println!();
    println!("{title}");
    println!(
        "Controller      = {}",
        if on_node.controller_published {
            "published to this node"
        } else {
            "not published"
        }
    );
    println!(
        "Staged          = {}",
        on_node.staged.as_deref().unwrap_or("no")
    );
    for publication in &on_node.publications {
        println!(
            "Published       = alloc {} ({})",
            short_id(&publication.alloc_id),
            publication.usage
        );
    }
    if let Some(pending) = &on_node.pending {
        println!("Pending         = {pending}");
    }
}

pub(super) async fn plugin_status(
    client: &Client,
    id: Option<&str>,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let plugins: Vec<PluginStatus> = match id {
        Some(id) => match refused(client.get(&format!("/v1/berth/plugin/{id}")).await)? {
            Ok(plugin) => vec![plugin],
            Err(code) => return Ok(code),
        },
        None => client.get("/v1/berth/plugins").await?,
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&plugins)?);
        return Ok(ExitCode::SUCCESS);
    }
    if id.is_none() {
        if plugins.is_empty() {
            println!("No CSI plugins");
            return Ok(ExitCode::SUCCESS);
        }
        println!(
            "{:<20} {:<22} {:<22} Volumes",
            "ID", "Controllers Healthy", "Nodes Healthy"
        );
        for p in &plugins {
            println!(
                "{:<20} {:<22} {:<22} {}",
                p.id,
                format!("{}/{}", p.controllers_healthy, p.controllers_expected),
                format!("{}/{}", p.nodes_healthy, p.nodes_expected),
                p.volumes.len()
            );
        }
        return Ok(ExitCode::SUCCESS);
    }
    let p = &plugins[0];
    println!("ID                  = {}", p.id);
    println!(
        "Controllers Healthy = {}/{}",
        p.controllers_healthy, p.controllers_expected
    );
    println!(
        "Nodes Healthy       = {}/{}",
        p.nodes_healthy, p.nodes_expected
    );
    println!(
        "Volumes             = {}",
        if p.volumes.is_empty() {
            "none".into()
        } else {
            p.volumes.join(", ")
        }
    );
    println!();
    println!("Providers");
    println!(
        "{:<10} {:<16} {:<11} {:<9} {:<28} Health",
        "Alloc", "Node", "Kind", "Healthy", "Plugin"
    );
    for provider in &p.providers {
        let name = provider
            .fingerprint
            .as_ref()
            .map(|f| {
                if f.name.is_empty() {
                    "not fingerprinted".to_string()
                } else {
                    format!("{} {}", f.name, f.vendor_version)
                }
            })
            .unwrap_or_else(|| "not fingerprinted".into());
        // The fingerprint and the health text are the plugin's own words.
        println!(
            "{:<10} {:<16} {:<11} {:<9} {:<28} {}",
            short_id(&provider.alloc_id),
            super::output::one_line(&provider.node),
            provider.kind.as_str(),
            provider.healthy,
            super::output::one_line(&name),
            super::output::one_line(&provider.health)
        );
    }
    Ok(ExitCode::SUCCESS)
}

pub(super) async fn snapshot_create(
    client: &Client,
    volume: &str,
    name: Option<&str>,
) -> anyhow::Result<ExitCode> {
    let request = crate::api::SnapshotRequest {
        volume_id: volume.to_string(),
        name: name.map(str::to_string),
    };
    let snapshot: SnapshotInfo =
        match refused(client.post("/v1/berth/volumes/snapshot", &request).await)? {
            Ok(snapshot) => snapshot,
            Err(code) => return Ok(code),
        };
    println!(
        "Snapshot {:?} of volume {volume:?} created by plugin {:?} ({} bytes, {})",
        snapshot.snapshot_id,
        snapshot.plugin_id,
        snapshot.size_bytes,
        if snapshot.ready_to_use {
            "ready"
        } else {
            "not ready yet"
        }
    );
    Ok(ExitCode::SUCCESS)
}

pub(super) async fn snapshot_list(
    client: &Client,
    plugin: Option<&str>,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let path = match plugin {
        Some(plugin) => format!(
            "/v1/berth/volumes/snapshot?plugin_id={}",
            super::job::query_escape(plugin)
        ),
        None => "/v1/berth/volumes/snapshot".to_string(),
    };
    let snapshots: Vec<SnapshotInfo> = match refused(client.get(&path).await)? {
        Ok(snapshots) => snapshots,
        Err(code) => return Ok(code),
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&snapshots)?);
        return Ok(ExitCode::SUCCESS);
    }
    if snapshots.is_empty() {
        println!("No snapshots");
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{:<32} {:<16} {:<24} {:>12} {:<20} Ready",
        "Snapshot ID", "Plugin", "External Volume ID", "Size", "Created"
    );
    for s in &snapshots {
        println!(
            "{:<32} {:<16} {:<24} {:>12} {:<20} {}",
            super::output::one_line(&s.snapshot_id),
            s.plugin_id,
            super::output::one_line(&s.source_volume_id),
            s.size_bytes,
            super::output::date_time(u64::try_from(s.created_at).unwrap_or(0)),
            s.ready_to_use
        );
    }
    Ok(ExitCode::SUCCESS)
}

pub(super) async fn snapshot_delete(
    client: &Client,
    plugin: &str,
    snapshot: &str,
) -> anyhow::Result<ExitCode> {
    let path = format!(
        "/v1/berth/volumes/snapshot?plugin_id={}&snapshot_id={}",
        super::job::query_escape(plugin),
        super::job::query_escape(snapshot)
    );
    let deleted: Result<crate::api::SnapshotQuery, ExitCode> = refused(client.delete(&path).await)?;
    if let Err(code) = deleted {
        return Ok(code);
    }
    println!("Deleted snapshot {snapshot:?} of plugin {plugin:?}");
    Ok(ExitCode::SUCCESS)
}

pub(super) async fn detach(client: &Client, id: &str, force: bool) -> anyhow::Result<ExitCode> {
    let path = format!(
        "/v1/berth/volume/{}/detach{}",
        super::job::query_escape(id),
        if force { "?force=true" } else { "" }
    );
    let detached: crate::agent::Detached = match refused(client.delete(&path).await)? {
        Ok(detached) => detached,
        Err(code) => return Ok(code),
    };
    if detached.released.is_empty() && detached.unmounted.is_empty() {
        println!("Volume {id:?} is not attached here");
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "Detached volume {id:?} without its plugin: released the claims of alloc(s) {}",
        detached
            .released
            .iter()
            .map(|a| short_id(a))
            .collect::<Vec<_>>()
            .join(", ")
    );
    for path in &detached.unmounted {
        println!("    unmounted {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}
