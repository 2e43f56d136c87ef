//! The CNI protocol, from the runtime's side (the spec's "Execution Protocol"): each
//! plugin of a network configuration list is an executable found by its `type` on the
//! operator's `cni_path`, given the command and the attachment in `CNI_*` variables and
//! its configuration as JSON on stdin, and answering JSON on stdout. It is written here,
//! on serde alone: `rscni` is the plugin's side (its runtime side is planned), and
//! `rust-cni` (0.1.2, three releases) reads its networks from `/etc/cni/net.d` and pulls
//! `nix` and `typetag` in for what is a hundred lines of protocol.
//!
//! - ADD runs the plugins in order, each given the previous one's result
//!   (`prevResult`); the last result is the attachment's.
//! - DEL runs them in reverse, each given the ADD's result, and goes on past a plugin
//!   that fails, so one plugin's error leaves nothing of the others behind.
//! - A plugin whose `capabilities` name `portMappings` gets the port mappings in
//!   `runtimeConfig`.
//!
//! The plugins and their configuration are the operator's (trusted); what they answer
//! is still bounded (size and time), and an error is theirs, told in their words.

use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The most a plugin may write on stdout.
const MAX_OUTPUT: u64 = 1 << 20;

/// How long one plugin call may take.
pub const PLUGIN_TIMEOUT: Duration = Duration::from_secs(60);

/// The spec version berth speaks, which the reference plugins 1.0 on understand.
pub const CNI_VERSION: &str = "1.0.0";

#[derive(Debug, thiserror::Error)]
pub enum CniError {
    #[error("CNI plugin {plugin:?} is not in the CNI path ({path})")]
    NotFound { plugin: String, path: String },
    #[error("CNI plugin type {plugin:?} is not a plain name")]
    BadType { plugin: String },
    #[error("CNI plugin {plugin:?} could not run: {source}")]
    Spawn {
        plugin: String,
        #[source]
        source: std::io::Error,
    },
    #[error("CNI plugin {plugin:?} did not answer {command} within {}s", PLUGIN_TIMEOUT.as_secs())]
    Timeout {
        plugin: String,
        command: &'static str,
    },
    #[error("CNI plugin {plugin:?} failed {command}: {message}")]
    Plugin {
        plugin: String,
        command: &'static str,
        /// The spec's error code (1-99 the spec's, 100 on the plugin's own), when given.
        code: Option<u32>,
        message: String,
    },
    #[error("CNI plugin {plugin:?} answered {command} with what is not a CNI result: {reason}")]
    BadAnswer {
        plugin: String,
        command: &'static str,
        reason: String,
    },
}

/// A network configuration list: the plugins an attachment runs through, in order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NetworkList {
    #[serde(rename = "cniVersion")]
    pub cni_version: String,
    pub name: String,
    pub plugins: Vec<Map<String, Value>>,
}

/// A host port forwarded into the namespace (the `portMappings` capability).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortMapping {
    #[serde(rename = "hostPort")]
    pub host_port: u16,
    #[serde(rename = "containerPort")]
    pub container_port: u16,
    /// `tcp` or `udp`.
    pub protocol: String,
    #[serde(rename = "hostIP", default, skip_serializing_if = "Option::is_none")]
    pub host_ip: Option<String>,
}

/// One namespace's attachment to a network.
#[derive(Debug, Clone)]
pub struct Attachment<'a> {
    /// Unique while the attachment lives: the alloc's id.
    pub container_id: &'a str,
    pub netns: &'a Path,
    /// The interface inside the namespace (`eth0`).
    pub ifname: &'a str,
    pub port_mappings: &'a [PortMapping],
}

/// What an ADD made, as the spec's result has it (the fields berth reads; the whole
/// answer is kept in `raw` for the DEL).
#[derive(Debug, Clone, PartialEq)]
pub struct AddResult {
    pub interfaces: Vec<Interface>,
    pub ips: Vec<IpConfig>,
    pub raw: Value,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Interface {
    pub name: String,
    #[serde(default)]
    pub mac: String,
    /// The namespace path for an interface inside it; empty for one on the host.
    #[serde(default)]
    pub sandbox: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct IpConfig {
    /// With its prefix: `172.26.64.2/20`.
    pub address: String,
    #[serde(default)]
    pub gateway: Option<String>,
    #[serde(default)]
    pub interface: Option<usize>,
}

impl AddResult {
    /// The first address inside the namespace, without its prefix.
    pub fn address(&self) -> Option<&str> {
        self.ips
            .iter()
            .find(|ip| {
                ip.interface
                    .and_then(|i| self.interfaces.get(i))
                    .is_none_or(|interface| !interface.sandbox.is_empty())
            })
            .and_then(|ip| ip.address.split('/').next())
    }
}

/// The plugins on the operator's CNI path.
#[derive(Debug, Clone)]
pub struct Cni {
    path: Vec<PathBuf>,
}

impl Cni {
    /// `cni_path`: directories, `:`-separated, as Nomad's `cni_path`.
    pub fn new(cni_path: &str) -> Cni {
        Cni {
            path: cni_path
                .split(':')
                .filter(|d| !d.is_empty())
                .map(PathBuf::from)
                .collect(),
        }
    }

    /// Whether every plugin of `list` is in the CNI path: the first that is not.
    pub fn check(&self, list: &NetworkList) -> Result<(), CniError> {
        for plugin in &list.plugins {
            let kind = plugin
                .get("type")
                .and_then(Value::as_str)
                .unwrap_or_default();
            self.find(kind)?;
        }
        Ok(())
    }

    /// Attaches the namespace: ADD through every plugin of `list`, in order.
    pub fn add(&self, list: &NetworkList, attachment: &Attachment) -> Result<AddResult, CniError> {
        let mut previous: Option<Value> = None;
        for plugin in &list.plugins {
            let answer = self.call("ADD", list, plugin, attachment, previous.as_ref())?;
            previous = Some(answer);
        }
        let raw = previous.unwrap_or_else(|| serde_json::json!({ "cniVersion": list.cni_version }));
        let interfaces = field(&raw, "interfaces")?;
        let ips = field(&raw, "ips")?;
        Ok(AddResult {
            interfaces,
            ips,
            raw,
        })
    }

    /// Detaches the namespace: DEL through every plugin of `list`, in reverse, each given
    /// `added` (the ADD's result, when it is known; else what host-local's lease says,
    /// [`leased_result`]). Every plugin is called; the first error is returned.
    pub fn del(
        &self,
        list: &NetworkList,
        attachment: &Attachment,
        added: Option<&Value>,
    ) -> Result<(), CniError> {
        // No recorded ADD result: the one its lease still says (attack review).
        let leased = added
            .is_none()
            .then(|| leased_result(list, attachment))
            .flatten();
        let added = added.or(leased.as_ref());
        let mut first_error = None;
        for plugin in list.plugins.iter().rev() {
            if let Err(error) = self.call("DEL", list, plugin, attachment, added) {
                tracing::warn!(%error, "CNI DEL");
                first_error.get_or_insert(error);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    fn find(&self, plugin: &str) -> Result<PathBuf, CniError> {
        if plugin.is_empty() || plugin.contains('/') || plugin.starts_with('.') {
            return Err(CniError::BadType {
                plugin: plugin.to_string(),
            });
        }
        self.path
            .iter()
            .map(|dir| dir.join(plugin))
            .find(|candidate| candidate.is_file())
            .ok_or_else(|| CniError::NotFound {
                plugin: plugin.to_string(),
                path: self
                    .path
                    .iter()
                    .map(|d| d.display().to_string())
                    .collect::<Vec<_>>()
                    .join(":"),
            })
    }

    fn call(
        &self,
        command: &'static str,
        list: &NetworkList,
        plugin: &Map<String, Value>,
        attachment: &Attachment,
        previous: Option<&Value>,
    ) -> Result<Value, CniError> {
        let kind = plugin
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let executable = self.find(&kind)?;
        let config = plugin_config(list, plugin, attachment, previous);
        let cni_path = std::env::join_paths(&self.path).map_err(|e| CniError::Spawn {
            plugin: kind.clone(),
            source: std::io::Error::other(e),
        })?;
        let mut child = Command::new(&executable)
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env("CNI_COMMAND", command)
            .env("CNI_CONTAINERID", attachment.container_id)
            .env("CNI_NETNS", attachment.netns)
            .env("CNI_IFNAME", attachment.ifname)
            .env("CNI_PATH", cni_path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|source| CniError::Spawn {
                plugin: kind.clone(),
                source,
            })?;
        // The configuration is small; the plugin reads it whole before it answers.
        if let Some(mut stdin) = child.stdin.take() {
            let _ = stdin.write_all(config.to_string().as_bytes());
        }
        let stdout = child.stdout.take();
        let stderr = child.stderr.take();
        let reader = std::thread::spawn(move || {
            let mut out = Vec::new();
            if let Some(stdout) = stdout {
                let _ = stdout.take(MAX_OUTPUT).read_to_end(&mut out);
            }
            let mut err = Vec::new();
            if let Some(stderr) = stderr {
                let _ = stderr.take(MAX_OUTPUT).read_to_end(&mut err);
            }
            (out, err)
        });
        let started = Instant::now();
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if started.elapsed() < PLUGIN_TIMEOUT => {
                    std::thread::sleep(Duration::from_millis(5))
                }
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(CniError::Timeout {
                        plugin: kind,
                        command,
                    });
                }
            }
        };
        let (out, err) = reader.join().unwrap_or_default();
        let answer: Option<Value> = serde_json::from_slice(&out).ok();
        if !status.success() {
            let (code, message) = match &answer {
                Some(error) => (
                    error.get("code").and_then(Value::as_u64).map(|c| c as u32),
                    [error.get("msg"), error.get("details")]
                        .into_iter()
                        .flatten()
                        .filter_map(Value::as_str)
                        .filter(|s| !s.is_empty())
                        .collect::<Vec<_>>()
                        .join(": "),
                ),
                None => (None, String::from_utf8_lossy(&err).trim().to_string()),
            };
            return Err(CniError::Plugin {
                plugin: kind,
                command,
                code,
                message: if message.is_empty() {
                    format!("it exited with {status}")
                } else {
                    message.chars().take(2048).collect()
                },
            });
        }
        match (command, answer) {
            ("DEL", _) => Ok(Value::Null),
            (_, Some(answer @ Value::Object(_))) => Ok(answer),
            (_, _) => Err(CniError::BadAnswer {
                plugin: kind,
                command,
                reason: "not a JSON object".into(),
            }),
        }
    }
}

/// What one plugin reads on stdin: its own object, with the list's name and version,
/// the previous result, and the runtime's values for the capabilities it names.
fn plugin_config(
    list: &NetworkList,
    plugin: &Map<String, Value>,
    attachment: &Attachment,
    previous: Option<&Value>,
) -> Value {
    let mut config = plugin.clone();
    config.insert("name".into(), Value::String(list.name.clone()));
    config.insert("cniVersion".into(), Value::String(list.cni_version.clone()));
    if let Some(previous) = previous {
        config.insert("prevResult".into(), previous.clone());
    }
    let wants_ports = plugin
        .get("capabilities")
        .and_then(|c| c.get("portMappings"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    if wants_ports {
        config.insert(
            "runtimeConfig".into(),
            serde_json::json!({ "portMappings": attachment.port_mappings }),
        );
    }
    Value::Object(config)
}

fn field<T: serde::de::DeserializeOwned>(result: &Value, name: &str) -> Result<Vec<T>, CniError> {
    match result.get(name) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(value) => serde_json::from_value(value.clone()).map_err(|e| CniError::BadAnswer {
            plugin: "(the last plugin)".into(),
            command: "ADD",
            reason: format!("{name}: {e}"),
        }),
    }
}

/// Nomad's bridge network (its `bridge` mode), as a Nomad client writes it: loopback;
/// a bridge that is the namespaces' gateway, masquerades their traffic out and lets a
/// namespace reach itself through a forwarded port (hairpin), with addresses from
/// `subnet`; the firewall plugin's forwarding rules (under `admin_chain`); and host ports
/// forwarded in, with SNAT so a connection from the host itself is answered.
///
/// Unlike Nomad's, the forwards never apply to `127.0.0.0/8`: a forward is a DNAT that
/// comes before any listener, and on loopback it would hand a job the node's own
/// connections to a local service (Consul's `127.0.0.1:8500`, with the agent's token)
/// whenever that service was not listening at the alloc's start.
pub fn bridge_network(name: &str, bridge: &str, subnet: &str, admin_chain: &str) -> NetworkList {
    let plugin = |value: Value| match value {
        Value::Object(map) => map,
        _ => Map::new(),
    };
    NetworkList {
        cni_version: CNI_VERSION.into(),
        name: name.into(),
        plugins: vec![
            plugin(serde_json::json!({ "type": "loopback" })),
            plugin(serde_json::json!({
                "type": "bridge",
                "bridge": bridge,
                "ipMasq": true,
                "isGateway": true,
                "forceAddress": true,
                "hairpinMode": true,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{ "subnet": subnet }]],
                    "routes": [{ "dst": "0.0.0.0/0" }],
                },
            })),
            plugin(serde_json::json!({
                "type": "firewall",
                "backend": "iptables",
                "iptablesAdminChainName": admin_chain,
            })),
            plugin(serde_json::json!({
                "type": "portmap",
                "capabilities": { "portMappings": true },
                "snat": true,
                "conditionsV4": ["!", "-d", "127.0.0.0/8"],
            })),
        ],
    }
}

/// Where host-local keeps its leases (its default `dataDir`): a file per address, named
/// by it, whose first line is the container id holding it.
const HOST_LOCAL_LEASES: &str = "/var/lib/cni/networks";

/// The ADD result a DEL is given, rebuilt from host-local's lease of the attachment's
/// container on `list` (its address, with the subnet's prefix), for a DEL whose ADD's
/// own result was never recorded (an agent killed between the two): without one, the
/// firewall plugin's DEL finds no address and leaves the container's accept rules.
/// `None`: no lease (nothing was leased, or it is gone).
pub fn leased_result(list: &NetworkList, attachment: &Attachment) -> Option<Value> {
    let prefix = list
        .plugins
        .iter()
        .find_map(|p| {
            p.get("ipam")?
                .get("ranges")?
                .get(0)?
                .get(0)?
                .get("subnet")?
                .as_str()
        })
        .and_then(|subnet| subnet.split_once('/'))
        .map(|(_, prefix)| prefix.to_string())?;
    let leases = Path::new(HOST_LOCAL_LEASES).join(&list.name);
    let address = std::fs::read_dir(leases)
        .ok()?
        .flatten()
        .find_map(|lease| {
            let mut holder = String::new();
            std::fs::File::open(lease.path())
                .ok()?
                .take(4096)
                .read_to_string(&mut holder)
                .ok()?;
            let name = lease.file_name().to_string_lossy().into_owned();
            (holder.lines().next()?.trim() == attachment.container_id
                && name.parse::<std::net::IpAddr>().is_ok())
            .then_some(name)
        })?;
    Some(serde_json::json!({
        "cniVersion": list.cni_version,
        "interfaces": [{ "name": attachment.ifname, "sandbox": attachment.netns }],
        "ips": [{ "address": format!("{address}/{prefix}"), "interface": 0 }],
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attachment<'a>(ports: &'a [PortMapping]) -> Attachment<'a> {
        Attachment {
            container_id: "alloc-1",
            netns: Path::new("/run/netns/alloc-1"),
            ifname: "eth0",
            port_mappings: ports,
        }
    }

    #[test]
    fn a_plugin_gets_the_lists_name_and_version_its_previous_result_and_only_the_capabilities_it_names()
     {
        let list = bridge_network("nomad", "nomad", "172.26.64.0/20", "NOMAD-ADMIN");
        let ports = [PortMapping {
            host_port: 20000,
            container_port: 8080,
            protocol: "tcp".into(),
            host_ip: None,
        }];
        let previous = serde_json::json!({ "cniVersion": "1.0.0", "ips": [] });
        let bridge = plugin_config(
            &list,
            &list.plugins[1],
            &attachment(&ports),
            Some(&previous),
        );
        assert_eq!(bridge["name"], "nomad");
        assert_eq!(bridge["cniVersion"], CNI_VERSION);
        assert_eq!(bridge["prevResult"], previous);
        assert!(bridge.get("runtimeConfig").is_none(), "{bridge}");
        let portmap = plugin_config(&list, &list.plugins[3], &attachment(&ports), None);
        assert_eq!(
            portmap["runtimeConfig"]["portMappings"],
            serde_json::json!([{ "hostPort": 20000, "containerPort": 8080, "protocol": "tcp" }])
        );
        assert!(portmap.get("prevResult").is_none());
    }

    #[test]
    fn a_plugin_type_is_a_plain_name_found_on_the_path() {
        let cni = Cni::new("/nonexistent-a:/nonexistent-b");
        for bad in ["", "../bin/sh", "/bin/sh", ".hidden"] {
            assert!(
                matches!(cni.find(bad), Err(CniError::BadType { .. })),
                "{bad:?}"
            );
        }
        let error = cni.find("bridge").unwrap_err().to_string();
        assert_eq!(
            error,
            "CNI plugin \"bridge\" is not in the CNI path (/nonexistent-a:/nonexistent-b)"
        );
    }

    #[test]
    fn the_address_is_the_first_inside_the_namespace() {
        let raw = serde_json::json!({
            "interfaces": [
                { "name": "nomad", "mac": "aa" },
                { "name": "veth1", "mac": "bb" },
                { "name": "eth0", "mac": "cc", "sandbox": "/run/netns/x" }
            ],
            "ips": [{ "address": "172.26.64.2/20", "gateway": "172.26.64.1", "interface": 2 }]
        });
        let result = AddResult {
            interfaces: field(&raw, "interfaces").unwrap(),
            ips: field(&raw, "ips").unwrap(),
            raw,
        };
        assert_eq!(result.address(), Some("172.26.64.2"));
    }
}
