//! `berth volume register|create|status|deregister|delete|snapshot` and `berth plugin
//! status`.

use std::path::Path;
use std::process::ExitCode;

use super::output::print_line;
use berth_api::SubmitRequest;
use berth_api::client::{Client, ClientError};
use berth_model::csi::SnapshotInfo;
use berth_state::catalog::{PluginStatus, VolumeStatus, short_id};

/// Exit code for a spec or request the agent refused.
const REFUSED: u8 = 2;

/// Prints the agent's refusal and turns it into the exit code; other errors pass.
fn refused<T>(result: Result<T, ClientError>) -> anyhow::Result<Result<T, ExitCode>> {
    match result {
        Ok(value) => Ok(Ok(value)),
        Err(ClientError::Api(error, status)) if status.is_client_error() => {
            super::output::print_refusal("Error: ", &error);
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
        print_line!(
            "Expanded volume {:?} (plugin {:?}) from {} to {} bytes",
            volume.id,
            volume.plugin_id,
            before,
            volume.capacity_bytes
        );
        return Ok(ExitCode::SUCCESS);
    }
    print_line!(
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
            print_line!("Deregistered volume {:?}", status.volume.id);
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
            print_line!("Deleted volume {:?}", status.volume.id);
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
        super::output::print_json(&volumes)?;
        return Ok(ExitCode::SUCCESS);
    }
    if id.is_none() {
        if volumes.is_empty() {
            print_line!("No CSI volumes");
            return Ok(ExitCode::SUCCESS);
        }
        print_line!(
            "{:<20} {:<20} {:<16} {:<26} Claims",
            "ID",
            "Name",
            "Plugin",
            "Access Mode"
        );
        for status in &volumes {
            let v = &status.volume;
            let modes: Vec<&str> = v
                .capabilities
                .iter()
                .map(|c| c.access_mode.as_str())
                .collect();
            print_line!(
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
    print_line!("ID              = {}", v.id);
    print_line!("Name            = {}", v.name);
    print_line!("External ID     = {}", v.external_id);
    print_line!("Plugin ID       = {}", v.plugin_id);
    print_line!("Origin          = {}", v.origin);
    print_line!(
        "Capacity        = {}",
        if v.capacity_bytes > 0 {
            format!("{} bytes", v.capacity_bytes)
        } else {
            "unknown".into()
        }
    );
    for capability in &v.capabilities {
        print_line!(
            "Capability      = {} / {}",
            capability.access_mode,
            capability.attachment_mode
        );
    }
    print_line!();
    if status.claims.is_empty() {
        print_line!("No claims");
    } else {
        print_line!("Claims");
        print_line!(
            "{:<10} {:<32} {:<6} {:<26} {:<16} {:<20} State",
            "Alloc",
            "Name",
            "Mode",
            "Access Mode",
            "Node",
            "Since"
        );
        for claim in &status.claims {
            let state = status
                .releasing
                .get(&claim.alloc_id)
                .map_or("in use", String::as_str);
            print_line!(
                "{:<10} {:<32} {:<6} {:<26} {:<16} {:<20} {}",
                short_id(&claim.alloc_id),
                claim.alloc_name,
                format!("{:?}", claim.mode).to_lowercase(),
                claim.access_mode.as_str(),
                claim.node,
                super::output::date_time(claim.since),
                state
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
fn print_use(title: &str, on_node: &berth_state::catalog::VolumeOnNode) {
    print_line!();
    print_line!("{}", title);
    print_line!(
        "Controller      = {}",
        if on_node.controller_published {
            "published to this node"
        } else {
            "not published"
        }
    );
    print_line!(
        "Staged          = {}",
        on_node.staged.as_deref().unwrap_or("no")
    );
    for publication in &on_node.publications {
        print_line!(
            "Published       = alloc {} ({})",
            short_id(&publication.alloc_id),
            publication.usage
        );
    }
    if let Some(pending) = &on_node.pending {
        print_line!("Pending         = {}", pending);
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
        super::output::print_json(&plugins)?;
        return Ok(ExitCode::SUCCESS);
    }
    if id.is_none() {
        if plugins.is_empty() {
            print_line!("No CSI plugins");
            return Ok(ExitCode::SUCCESS);
        }
        print_line!(
            "{:<20} {:<22} {:<22} Volumes",
            "ID",
            "Controllers Healthy",
            "Nodes Healthy"
        );
        for p in &plugins {
            print_line!(
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
    print_line!("ID                  = {}", p.id);
    print_line!(
        "Controllers Healthy = {}/{}",
        p.controllers_healthy,
        p.controllers_expected
    );
    print_line!(
        "Nodes Healthy       = {}/{}",
        p.nodes_healthy,
        p.nodes_expected
    );
    print_line!(
        "Volumes             = {}",
        if p.volumes.is_empty() {
            "none".into()
        } else {
            p.volumes.join(", ")
        }
    );
    print_line!();
    print_line!("Providers");
    print_line!(
        "{:<10} {:<16} {:<11} {:<9} {:<28} Health",
        "Alloc",
        "Node",
        "Kind",
        "Healthy",
        "Plugin"
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
        print_line!(
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
    let request = berth_api::SnapshotRequest {
        volume_id: volume.to_string(),
        name: name.map(str::to_string),
    };
    let snapshot: SnapshotInfo =
        match refused(client.post("/v1/berth/volumes/snapshot", &request).await)? {
            Ok(snapshot) => snapshot,
            Err(code) => return Ok(code),
        };
    print_line!(
        "Snapshot {:?} of volume {:?} created by plugin {:?} ({} bytes, {})",
        snapshot.snapshot_id,
        volume,
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
        super::output::print_json(&snapshots)?;
        return Ok(ExitCode::SUCCESS);
    }
    if snapshots.is_empty() {
        print_line!("No snapshots");
        return Ok(ExitCode::SUCCESS);
    }
    print_line!(
        "{:<32} {:<16} {:<24} {:>12} {:<20} Ready",
        "Snapshot ID",
        "Plugin",
        "External Volume ID",
        "Size",
        "Created"
    );
    for s in &snapshots {
        print_line!(
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
    let deleted: Result<berth_api::SnapshotQuery, ExitCode> = refused(client.delete(&path).await)?;
    if let Err(code) = deleted {
        return Ok(code);
    }
    print_line!("Deleted snapshot {:?} of plugin {:?}", snapshot, plugin);
    Ok(ExitCode::SUCCESS)
}

pub(super) async fn detach(client: &Client, id: &str, force: bool) -> anyhow::Result<ExitCode> {
    let path = format!(
        "/v1/berth/volume/{}/detach{}",
        super::job::query_escape(id),
        if force { "?force=true" } else { "" }
    );
    let detached: berth_client::agent::Detached = match refused(client.delete(&path).await)? {
        Ok(detached) => detached,
        Err(code) => return Ok(code),
    };
    if detached.released.is_empty() && detached.unmounted.is_empty() {
        print_line!("Volume {:?} is not attached here", id);
        return Ok(ExitCode::SUCCESS);
    }
    print_line!(
        "Detached volume {:?} without its plugin: released the claims of alloc(s) {}",
        id,
        detached
            .released
            .iter()
            .map(|a| short_id(a))
            .collect::<Vec<_>>()
            .join(", ")
    );
    for path in &detached.unmounted {
        print_line!("    unmounted {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}
