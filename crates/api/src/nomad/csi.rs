//! CSI volumes and plugins in Nomad's shapes (`/v1/volumes`, `/v1/volume/csi/:id`,
//! `/v1/plugins`, `/v1/plugin/csi/:id`), over the agent's own volume operations: a
//! volume registered or created as Nomad's JSON is turned into berth's volume spec and
//! passes the same parser, checks and messages as `berth volume register` and `create`,
//! so a bad one is refused whole and nothing is half-registered.
//!
//! What berth knows fills the fields (ids, plugin and provider, capabilities, capacity,
//! parameters and context, claims as `ReadAllocs`/`WriteAllocs` and `Allocations`,
//! plugin health and counts); what a one-node agent does not have is empty or zero
//! (`Topologies` unless the plugin's CreateVolume gave some, `MountOptions`,
//! `ResourceExhausted`, `SnapshotID`, `CloneID`). Secrets are never shown, as Nomad
//! redacts them.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use hcl::structure::{Attribute, Block, Body};
use serde::Deserialize;
use serde_json::{Map, Value};

use berth_nomad_api::Empty;
use berth_nomad_api::allocs::AllocationListStub;
use berth_nomad_api::csi::{
    CsiControllerInfo, CsiInfo, CsiNodeInfo, CsiPlugin, CsiPluginListStub, CsiTopology, CsiVolume,
    CsiVolumeCapability, CsiVolumeListStub, CsiVolumeWriteResponse,
};

use super::shapes::{NAMESPACE, ThisNode, count};
use super::{Blocking, NomadError, bad_request, with_index};
use berth_client::agent::{Agent, VolumeError};
use berth_model::csi::PluginKind;
use berth_state::catalog::volume_spec::SpecPurpose;
use berth_state::catalog::{ClaimMode, PluginStatus, VolumeStatus};

impl From<VolumeError> for NomadError {
    fn from(error: VolumeError) -> Self {
        let status = match &error {
            VolumeError::Invalid(_) | VolumeError::Refused(_) => StatusCode::BAD_REQUEST,
            VolumeError::NotFound(_) => StatusCode::NOT_FOUND,
            VolumeError::Store(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        NomadError(status, error.to_string())
    }
}

/// `?type=` (and the filters) of the list endpoints.
#[derive(Debug, Default, Deserialize)]
pub struct ListQuery {
    #[serde(rename = "type")]
    kind: Option<String>,
    plugin_id: Option<String>,
    prefix: Option<String>,
    #[serde(flatten)]
    blocking: Blocking,
}

/// Which list `?type=` asks for: CSI's, none (Nomad answers an empty list when `type`
/// is left out; berth has no dynamic host volumes), or one that does not exist.
fn csi_asked(kind: Option<&str>, what: &str) -> Result<bool, NomadError> {
    match kind.unwrap_or("") {
        "csi" => Ok(true),
        "" => Ok(false),
        "host" if what == "volumes" => Ok(false),
        other => Err(bad_request(format!(
            "unsupported {what} type {:?}: berth serves type=csi",
            berth_model::text::one_line(other)
        ))),
    }
}

/// `GET /v1/volumes?type=csi[&plugin_id=&prefix=]`.
pub async fn list_volumes(
    State(agent): State<Arc<Agent>>,
    Query(query): Query<ListQuery>,
) -> Response {
    query
        .blocking
        .answer(&agent, || {
            if !csi_asked(query.kind.as_deref(), "volumes")? {
                return Ok(Vec::new());
            }
            let plugins = plugins_by_id(&agent)?;
            let plugin_prefix = query.plugin_id.as_deref().unwrap_or("");
            let prefix = query.prefix.as_deref().unwrap_or("");
            Ok(agent
                .volumes()?
                .iter()
                .filter(|s| {
                    s.volume.id.starts_with(prefix) && s.volume.plugin_id.starts_with(plugin_prefix)
                })
                .map(|s| volume_stub(s, plugins.get(&s.volume.plugin_id)))
                .collect())
        })
        .await
}

/// `GET /v1/volume/csi/:id`.
pub async fn read_volume(
    State(agent): State<Arc<Agent>>,
    Path(id): Path<String>,
    Query(blocking): Query<Blocking>,
) -> Response {
    blocking
        .answer(&agent, || {
            let status = agent.volume(&id).map_err(not_found_as_nomad)?;
            let plugins = plugins_by_id(&agent)?;
            Ok(volume(
                &agent,
                &status,
                plugins.get(&status.volume.plugin_id),
            ))
        })
        .await
}

/// Nomad's 404 text for a volume it does not have.
fn not_found_as_nomad(error: VolumeError) -> NomadError {
    match error {
        VolumeError::NotFound(_) => NomadError(StatusCode::NOT_FOUND, "volume not found".into()),
        other => other.into(),
    }
}

/// `PUT /v1/volume/csi/:id` (register an existing volume, `{"Volumes": [{...}]}`).
pub async fn register_volume(
    State(agent): State<Arc<Agent>>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, NomadError> {
    let spec = volume_spec(&id, &body, SpecPurpose::Register)?;
    let status = agent.register_volume(&format!("{id}.json"), &spec)?;
    agent.change_index().bump();
    Ok(written(&agent, &status))
}

/// `PUT /v1/volume/csi/:id/create` (create through the plugin's controller, then
/// register).
pub async fn create_volume(
    State(agent): State<Arc<Agent>>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, NomadError> {
    let spec = volume_spec(&id, &body, SpecPurpose::Create)?;
    let status = agent.create_volume(&format!("{id}.json"), &spec).await?;
    agent.change_index().bump();
    Ok(written(&agent, &status))
}

/// The answer to a register or create: the volume as now recorded.
fn written(agent: &Agent, status: &VolumeStatus) -> Response {
    let plugins = plugins_by_id(agent).unwrap_or_default();
    let index = agent.change_index().current();
    with_index(
        axum::Json(CsiVolumeWriteResponse {
            volumes: vec![volume(agent, status, plugins.get(&status.volume.plugin_id))],
            warnings: String::new(),
            index,
        })
        .into_response(),
        index,
    )
}

#[derive(Debug, Default, Deserialize)]
pub struct DeregisterQuery {
    force: Option<String>,
}

/// `DELETE /v1/volume/csi/:id[?force=true]`. A volume a running alloc claims is never
/// deregistered; with `force`, claims of finished allocs still giving it back are
/// dropped first (the volume is unmounted here without the plugin, as `berth volume
/// detach -force` does).
pub async fn deregister_volume(
    State(agent): State<Arc<Agent>>,
    Path(id): Path<String>,
    Query(query): Query<DeregisterQuery>,
) -> Result<Response, NomadError> {
    agent.volume(&id).map_err(not_found_as_nomad)?;
    if super::flag(query.force.as_deref()) {
        agent.detach_volume(&id, true).await?;
    }
    agent.deregister_volume(&id)?;
    agent.change_index().bump();
    let index = agent.change_index().current();
    Ok(with_index(axum::Json(Empty {}).into_response(), index))
}

/// `GET /v1/plugins?type=csi`.
pub async fn list_plugins(
    State(agent): State<Arc<Agent>>,
    Query(query): Query<ListQuery>,
) -> Response {
    query
        .blocking
        .answer(&agent, || {
            if !csi_asked(query.kind.as_deref(), "plugins")? {
                return Ok(Vec::new());
            }
            let prefix = query.prefix.as_deref().unwrap_or("");
            Ok(agent
                .plugins()?
                .iter()
                .filter(|p| p.id.starts_with(prefix))
                .map(plugin_stub)
                .collect())
        })
        .await
}

/// `GET /v1/plugin/csi/:id`.
pub async fn read_plugin(
    State(agent): State<Arc<Agent>>,
    Path(id): Path<String>,
    Query(blocking): Query<Blocking>,
) -> Response {
    blocking
        .answer(&agent, || {
            let plugin = agent.plugin(&id).map_err(|error| match error {
                VolumeError::NotFound(_) => {
                    NomadError(StatusCode::NOT_FOUND, "plugin not found".into())
                }
                other => other.into(),
            })?;
            Ok(plugin_value(&agent, &plugin))
        })
        .await
}

fn plugins_by_id(agent: &Agent) -> Result<BTreeMap<String, PluginStatus>, NomadError> {
    Ok(agent
        .plugins()?
        .into_iter()
        .map(|p| (p.id.clone(), p))
        .collect())
}

/// The plugin's provider (its GetPluginInfo name) and version, once fingerprinted.
fn provider(plugin: Option<&PluginStatus>) -> (String, String) {
    plugin
        .into_iter()
        .flat_map(|p| &p.providers)
        .find_map(|p| p.fingerprint.as_ref())
        .map(|f| (f.name.clone(), f.vendor_version.clone()))
        .unwrap_or_default()
}

/// Whether volumes of the plugin must be published by its controller first.
fn controller_required(plugin: Option<&PluginStatus>) -> bool {
    plugin
        .into_iter()
        .flat_map(|p| &p.providers)
        .filter_map(|p| p.fingerprint.as_ref())
        .any(|f| f.capabilities.controller_publish)
}

fn counts(plugin: Option<&PluginStatus>) -> [u64; 4] {
    plugin.map_or([0; 4], |p| {
        [
            p.controllers_healthy,
            p.controllers_expected,
            p.nodes_healthy,
            p.nodes_expected,
        ]
        .map(count)
    })
}

/// `CSIVolListStub`.
fn volume_stub(status: &VolumeStatus, plugin: Option<&PluginStatus>) -> CsiVolumeListStub {
    let volume = &status.volume;
    let (provider, _) = provider(plugin);
    let [
        controllers_healthy,
        controllers_expected,
        nodes_healthy,
        nodes_expected,
    ] = counts(plugin);
    let claim = status.claims.first();
    let claims = |mode: ClaimMode| count(status.claims.iter().filter(|c| c.mode == mode).count());
    CsiVolumeListStub {
        id: volume.id.clone(),
        namespace: NAMESPACE.into(),
        name: volume.name.clone(),
        external_id: volume.external_id.clone(),
        topologies: volume
            .accessible_topology
            .iter()
            .map(|segments| CsiTopology {
                segments: segments.clone(),
            })
            .collect(),
        access_mode: claim.map(|c| c.access_mode.as_str()).unwrap_or("").into(),
        attachment_mode: claim.map(|_| attachment_mode(volume)).unwrap_or("").into(),
        current_readers: claims(ClaimMode::Read),
        current_writers: claims(ClaimMode::Write),
        schedulable: nodes_healthy > 0,
        plugin_id: volume.plugin_id.clone(),
        provider,
        controller_required: controller_required(plugin),
        controllers_healthy,
        controllers_expected,
        nodes_healthy,
        nodes_expected,
        resource_exhausted: None,
        create_index: 1,
        modify_index: 1,
    }
}

/// The attachment mode the volume's claims use: berth mounts file systems only.
fn attachment_mode(volume: &berth_state::catalog::Volume) -> &'static str {
    volume
        .capabilities
        .first()
        .map_or("file-system", |c| c.attachment_mode.as_str())
}

/// The allocs of this node among `ids`, as Nomad's `AllocListStub`s.
fn alloc_stubs<'a>(agent: &Agent, ids: impl Iterator<Item = &'a str>) -> Vec<AllocationListStub> {
    let node = ThisNode::of(agent);
    ids.filter_map(|id| {
        let alloc = agent.alloc(id).ok()?;
        let (_, job) = agent.job_of_alloc(&alloc).ok()?;
        Some(super::shapes::alloc_stub(&alloc, job.job_type, &node))
    })
    .collect()
}

/// `CSIVolume`.
fn volume(agent: &Agent, status: &VolumeStatus, plugin: Option<&PluginStatus>) -> CsiVolume {
    let volume = &status.volume;
    let (_, provider_version) = provider(plugin);
    let allocs = |mode: ClaimMode| {
        status
            .claims
            .iter()
            .filter(|c| c.mode == mode)
            .map(|c| (c.alloc_id.clone(), None))
            .collect()
    };
    CsiVolume {
        stub: volume_stub(status, plugin),
        provider_version,
        requested_capabilities: volume
            .capabilities
            .iter()
            .map(|c| CsiVolumeCapability {
                access_mode: c.access_mode.as_str().into(),
                attachment_mode: c.attachment_mode.as_str().into(),
            })
            .collect(),
        capacity: volume.capacity_bytes,
        requested_capacity_min: 0,
        requested_capacity_max: 0,
        parameters: volume.parameters.clone().into_iter().collect(),
        context: volume.context.clone().into_iter().collect(),
        secrets: BTreeMap::new(),
        mount_options: None,
        snapshot_id: String::new(),
        clone_id: String::new(),
        read_allocs: allocs(ClaimMode::Read),
        write_allocs: allocs(ClaimMode::Write),
        allocations: alloc_stubs(agent, status.claims.iter().map(|c| c.alloc_id.as_str())),
    }
}

/// `CSIPluginListStub`.
fn plugin_stub(plugin: &PluginStatus) -> CsiPluginListStub {
    let (provider, _) = provider(Some(plugin));
    let [
        controllers_healthy,
        controllers_expected,
        nodes_healthy,
        nodes_expected,
    ] = counts(Some(plugin));
    CsiPluginListStub {
        id: plugin.id.clone(),
        provider,
        controller_required: controller_required(Some(plugin)),
        controllers_healthy,
        controllers_expected,
        nodes_healthy,
        nodes_expected,
        create_index: 1,
        modify_index: 1,
    }
}

/// `CSIPlugin`: the stub's fields, each provider as Nomad's `CSIInfo` keyed by node id,
/// and the allocs that run it.
fn plugin_value(agent: &Agent, plugin: &PluginStatus) -> CsiPlugin {
    let node = ThisNode::of(agent);
    let (_, version) = provider(Some(plugin));
    let info = |kind: PluginKind| -> BTreeMap<String, CsiInfo> {
        plugin
            .providers
            .iter()
            .filter(|p| p.kind == kind)
            .map(|p| {
                let fingerprint = p.fingerprint.as_ref();
                let has = |capability: fn(&berth_model::csi::Capabilities) -> bool| {
                    fingerprint.is_some_and(|f| capability(&f.capabilities))
                };
                let mut info = CsiInfo {
                    plugin_id: p.plugin_id.clone(),
                    alloc_id: p.alloc_id.clone(),
                    healthy: p.healthy,
                    health_description: p.health.clone(),
                    requires_controller_plugin: has(|c| c.controller_publish),
                    requires_topologies: false,
                    controller_info: None,
                    node_info: None,
                };
                match kind {
                    PluginKind::Controller => {
                        info.controller_info = Some(CsiControllerInfo {
                            supports_create_delete: has(|c| c.create_delete),
                            supports_attach_detach: has(|c| c.controller_publish),
                            supports_create_delete_snapshot: has(|c| c.snapshots),
                            supports_list_snapshots: has(|c| c.list_snapshots),
                            supports_expand: has(|c| c.controller_expand),
                        });
                    }
                    PluginKind::Node => {
                        info.node_info = Some(CsiNodeInfo {
                            id: fingerprint
                                .and_then(|f| f.node_id.clone())
                                .unwrap_or_default(),
                            max_volumes: 0,
                            accessible_topology: fingerprint
                                .filter(|f| !f.topology.is_empty())
                                .map(|f| CsiTopology {
                                    segments: f.topology.clone(),
                                }),
                            requires_node_stage_volume: has(|c| c.stage_unstage),
                        });
                    }
                }
                (node.id.clone(), info)
            })
            .collect()
    };
    let mut alloc_ids: Vec<&str> = plugin
        .providers
        .iter()
        .map(|p| p.alloc_id.as_str())
        .collect();
    alloc_ids.sort();
    alloc_ids.dedup();
    CsiPlugin {
        stub: plugin_stub(plugin),
        version,
        controllers: info(PluginKind::Controller),
        nodes: info(PluginKind::Node),
        allocations: alloc_stubs(agent, alloc_ids.into_iter()),
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum VolumeJsonError {
    #[error("Failed to decode request: {0}")]
    NotJson(String),
    #[error("the body has no \"Volumes\" list with one volume in it")]
    NoVolumes,
    #[error("the body holds {0} volumes: berth registers one per request, the one its path names")]
    Several(usize),
    #[error("{path} must be {expected}")]
    WrongType {
        path: String,
        expected: &'static str,
    },
    #[error("the volume's ID {found:?} is not the path's {path:?}")]
    IdMismatch { found: String, path: String },
    #[error("{path} has a key {key:?}, which is not a name (letters, digits, _ and -)")]
    BadKey { path: String, key: String },
}

impl From<VolumeJsonError> for NomadError {
    fn from(error: VolumeJsonError) -> Self {
        bad_request(error.to_string())
    }
}

/// The fields of one JSON object, read by name with their types checked.
struct Fields<'a> {
    path: String,
    object: &'a Map<String, Value>,
}

impl<'a> Fields<'a> {
    fn string(&self, name: &str) -> Result<Option<&'a str>, VolumeJsonError> {
        match self.object.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(text)) => Ok(Some(text).filter(|t| !t.is_empty()).map(|t| &**t)),
            Some(_) => Err(self.wrong(name, "a string")),
        }
    }

    fn bytes(&self, name: &str) -> Result<Option<u64>, VolumeJsonError> {
        match self.object.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Number(n)) => match n.as_u64() {
                Some(0) => Ok(None),
                Some(bytes) if bytes <= i64::MAX as u64 => Ok(Some(bytes)),
                _ => Err(self.wrong(name, "a whole number of bytes")),
            },
            Some(_) => Err(self.wrong(name, "a whole number of bytes")),
        }
    }

    fn map(&self, name: &str) -> Result<Vec<(&'a str, &'a str)>, VolumeJsonError> {
        let path = format!("{}.{name}", self.path);
        match self.object.get(name) {
            None | Some(Value::Null) => Ok(Vec::new()),
            Some(Value::Object(entries)) => entries
                .iter()
                .map(|(key, value)| {
                    let name_like = key
                        .chars()
                        .next()
                        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                        && key
                            .chars()
                            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
                    if !name_like {
                        return Err(VolumeJsonError::BadKey {
                            path: path.clone(),
                            key: berth_model::text::one_line(key).into_owned(),
                        });
                    }
                    match value {
                        Value::String(text) => Ok((key.as_str(), text.as_str())),
                        _ => Err(VolumeJsonError::WrongType {
                            path: format!("{path}.{key}"),
                            expected: "a string",
                        }),
                    }
                })
                .collect(),
            Some(_) => Err(self.wrong(name, "an object of strings")),
        }
    }

    fn wrong(&self, name: &str, expected: &'static str) -> VolumeJsonError {
        VolumeJsonError::WrongType {
            path: format!("{}.{name}", self.path),
            expected,
        }
    }
}

fn object<'a>(path: String, value: &'a Value) -> Result<Fields<'a>, VolumeJsonError> {
    match value {
        Value::Object(object) => Ok(Fields { path, object }),
        _ => Err(VolumeJsonError::WrongType {
            path,
            expected: "an object",
        }),
    }
}

/// Nomad's volume JSON (`{"Volumes": [{...}]}`) as berth's volume spec, for the volume
/// the path names. Fields a one-node agent has no use for (`Namespace`, `Topologies`,
/// `MountOptions`, …) are ignored, as Nomad ignores what it does not know.
pub fn volume_spec(
    path_id: &str,
    body: &[u8],
    purpose: SpecPurpose,
) -> Result<String, VolumeJsonError> {
    let body: Value =
        serde_json::from_slice(body).map_err(|e| VolumeJsonError::NotJson(e.to_string()))?;
    let volumes = match body.get("Volumes") {
        Some(Value::Array(volumes)) => volumes,
        Some(_) => {
            return Err(VolumeJsonError::WrongType {
                path: "Volumes".into(),
                expected: "a list of volumes",
            });
        }
        None => return Err(VolumeJsonError::NoVolumes),
    };
    let volume = match volumes.as_slice() {
        [] => return Err(VolumeJsonError::NoVolumes),
        [one] => object("Volumes[0]".into(), one)?,
        several => return Err(VolumeJsonError::Several(several.len())),
    };
    let id = volume.string("ID")?.unwrap_or(path_id);
    if id != path_id {
        return Err(VolumeJsonError::IdMismatch {
            found: berth_model::text::one_line(id).into_owned(),
            path: path_id.to_string(),
        });
    }
    let text = super::register::text;
    let mut body = Body::builder()
        .add_attribute(Attribute::new("id", text(id)))
        .add_attribute(Attribute::new("type", text("csi")));
    for (json, hcl) in [
        ("Name", "name"),
        ("PluginID", "plugin_id"),
        ("ExternalID", "external_id"),
    ] {
        if let Some(value) = volume.string(json)? {
            body = body.add_attribute(Attribute::new(hcl, text(value)));
        }
    }
    if purpose == SpecPurpose::Create {
        for (json, hcl) in [
            ("RequestedCapacityMin", "capacity_min"),
            ("RequestedCapacityMax", "capacity_max"),
        ] {
            if let Some(bytes) = volume.bytes(json)? {
                body = body.add_attribute(Attribute::new(hcl, text(&bytes.to_string())));
            }
        }
    }
    let mut capabilities = Vec::new();
    match volume.object.get("RequestedCapabilities") {
        None | Some(Value::Null) => {}
        Some(Value::Array(list)) => {
            for (i, capability) in list.iter().enumerate() {
                capabilities.push(object(
                    format!("{}.RequestedCapabilities[{i}]", volume.path),
                    capability,
                )?);
            }
        }
        Some(_) => {
            return Err(volume.wrong("RequestedCapabilities", "a list of capabilities"));
        }
    }
    // Older clients send one mode pair on the volume itself.
    if capabilities.is_empty() && volume.object.contains_key("AccessMode") {
        capabilities.push(Fields {
            path: volume.path.clone(),
            object: volume.object,
        });
    }
    for capability in &capabilities {
        let mut block = Block::builder("capability");
        for (json, hcl) in [
            ("AccessMode", "access_mode"),
            ("AttachmentMode", "attachment_mode"),
        ] {
            if let Some(value) = capability.string(json)? {
                block = block.add_attribute(Attribute::new(hcl, text(value)));
            }
        }
        body = body.add_block(block.build());
    }
    for (json, hcl) in [
        ("Parameters", "parameters"),
        ("Context", "context"),
        ("Secrets", "secrets"),
    ] {
        let entries = volume.map(json)?;
        if !entries.is_empty() {
            let mut block = Block::builder(hcl);
            for (key, value) in entries {
                block = block.add_attribute(Attribute::new(key, text(value)));
            }
            body = body.add_block(block.build());
        }
    }
    hcl::to_string(&body.build()).map_err(|e| VolumeJsonError::NotJson(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(body: Value, purpose: SpecPurpose) -> Result<String, VolumeJsonError> {
        volume_spec("data", body.to_string().as_bytes(), purpose)
    }

    /// Nomad's sample payload becomes a spec berth's parser takes, with its secrets, and
    /// a `${...}` in a value stays text.
    #[test]
    fn nomads_volume_json_becomes_a_volume_spec() {
        let hcl = spec(
            json!({"Volumes": [{
                "ID": "data", "Name": "data", "Namespace": "default", "PluginID": "hostpath",
                "ExternalID": "vol-1",
                "RequestedCapabilities": [{"AccessMode": "single-node-writer", "AttachmentMode": "file-system"}],
                "Secrets": {"password": "${xyzzy}"},
                "Context": {"a-b": "c"},
                "Topologies": [{"foo": "bar"}],
            }]}),
            SpecPurpose::Register,
        )
        .unwrap();
        let parsed =
            berth_state::catalog::volume_spec::parse("data.json", &hcl, SpecPurpose::Register)
                .unwrap();
        assert_eq!(parsed.volume.external_id, "vol-1");
        assert_eq!(parsed.volume.secrets["password"], "${xyzzy}");
        assert_eq!(parsed.volume.context["a-b"], "c");
        assert_eq!(parsed.volume.capabilities.len(), 1);

        let hcl = spec(
            json!({"Volumes": [{"PluginID": "hostpath", "RequestedCapacityMin": 1048576,
                "AccessMode": "single-node-writer", "AttachmentMode": "file-system"}]}),
            SpecPurpose::Create,
        )
        .unwrap();
        let parsed =
            berth_state::catalog::volume_spec::parse("data.json", &hcl, SpecPurpose::Create)
                .unwrap();
        assert_eq!(
            (parsed.volume.id.as_str(), parsed.capacity.0),
            ("data", 1 << 20)
        );
    }

    #[test]
    fn wrong_types_and_shapes_are_named() {
        let cases = [
            (json!({}), "the body has no \"Volumes\" list"),
            (json!({"Volumes": {}}), "Volumes must be a list of volumes"),
            (json!({"Volumes": [1]}), "Volumes[0] must be an object"),
            (json!({"Volumes": [{}, {}]}), "the body holds 2 volumes"),
            (
                json!({"Volumes": [{"ID": "other"}]}),
                "is not the path's \"data\"",
            ),
            (
                json!({"Volumes": [{"PluginID": 7}]}),
                "Volumes[0].PluginID must be a string",
            ),
            (
                json!({"Volumes": [{"Secrets": {"k": 1}}]}),
                "Volumes[0].Secrets.k must be a string",
            ),
            (
                json!({"Volumes": [{"Context": {"a b": "c"}}]}),
                "has a key \"a b\", which is not a name",
            ),
            (
                json!({"Volumes": [{"RequestedCapacityMin": -1}]}),
                "RequestedCapacityMin must be a whole number of bytes",
            ),
        ];
        for (body, expected) in cases {
            let error = spec(body.clone(), SpecPurpose::Create)
                .unwrap_err()
                .to_string();
            assert!(error.contains(expected), "{body}: {error}");
        }
    }
}
