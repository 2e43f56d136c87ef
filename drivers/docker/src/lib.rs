//! The `docker` driver: Nomad's docker jobs on OCI images, with no daemon. The image is
//! pulled through the host's store (`berth:host/image`) and the task runs on it as its
//! root, confined as an `exec` task is (its own mount, pid, ipc and uts namespaces,
//! cgroup, seccomp filter and user), with the task's `local/`, `secrets/` and the
//! alloc's dir at `/local`, `/secrets` and `/alloc`.
//!
//! The image's Entrypoint, Cmd, Env and WorkingDir are the defaults, as in Docker:
//! `entrypoint` replaces the image's (and drops its Cmd), `command` (with `args`)
//! replaces its Cmd, and `args` alone replace its Cmd. The task's env wins over the
//! image's, except `PATH`, which the image sets when it has one.
//!
//! `cap_drop` and `cap_add` change the task's capabilities as Docker's do (the host
//! checks `cap_add` against the operator's `allow_caps` and refuses what a task in its
//! own user namespace could not use).
//!
//! The network is Docker's: by default (`network_mode` unset, `bridge` or `default`) a
//! task in a host-mode group gets a network namespace of its own on the node's bridge,
//! with the group ports `ports` names forwarded from their host port to their `to`;
//! `network_mode = "host"` keeps it on its group's network. In a bridge-mode group
//! every task is on the group's namespace, whose ports the group forwards.
//!
//! Fields of Nomad's docker config that change nothing here are accepted: `labels`
//! (no daemon keeps them), `hostname` (the task's uts namespace keeps the host's name),
//! `logging` (berth keeps the task's logs itself), `auth_soft_fail` and
//! `auth.server_address`/`auth.email`. `privileged` is refused by name; so are Docker's
//! own ways to reach the host (`volumes`, `mount`, `devices`, …), each saying what to
//! use instead, and every field berth does not know.

use berth_plugin_sdk::host::image::{self, Credentials, PullRequest};
use berth_plugin_sdk::host::process::{Isolation, SpawnRequest};
use berth_plugin_sdk::{
    DriverCapabilities, DriverFingerprint, DriverInfo, FsIsolation, HealthState, MountConfigs,
    ProcessDriver, TaskConfig, TaskHandle, export_driver, process_task,
};
use serde::Deserialize;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Auth {
    #[serde(default)]
    username: String,
    #[serde(default)]
    password: String,
    #[serde(default)]
    #[allow(dead_code)]
    server_address: Option<String>,
    #[serde(default)]
    #[allow(dead_code)]
    email: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DockerConfig {
    image: String,
    command: Option<String>,
    #[serde(default)]
    args: Vec<String>,
    entrypoint: Option<Vec<String>>,
    work_dir: Option<String>,
    auth: Option<Auth>,
    #[serde(default)]
    force_pull: bool,
    image_pull_timeout: Option<String>,
    network_mode: Option<String>,
    privileged: Option<bool>,
    #[serde(default)]
    cap_add: Vec<String>,
    #[serde(default)]
    cap_drop: Vec<String>,
    // Accepted, and change nothing here (see the module's docs).
    #[serde(default)]
    #[allow(dead_code)]
    labels: Option<serde_json::Value>,
    /// The group ports forwarded to the task's own network (Docker's `ports`).
    #[serde(default)]
    ports: Option<Vec<String>>,
    #[serde(default)]
    #[allow(dead_code)]
    hostname: Option<String>,
    #[serde(default)]
    #[allow(dead_code)]
    logging: Option<serde_json::Value>,
    #[serde(default)]
    #[allow(dead_code)]
    auth_soft_fail: Option<bool>,
}

/// Docker's default capabilities: all `cap_add` may name here (the host also checks
/// the operator's `allow_caps`).
const DOCKER_DEFAULT_CAPABILITIES: &[&str] = &[
    "audit_write",
    "chown",
    "dac_override",
    "fowner",
    "fsetid",
    "kill",
    "mknod",
    "net_bind_service",
    "setfcap",
    "setgid",
    "setpcap",
    "setuid",
    "sys_chroot",
];

/// Fields of Nomad's docker driver berth's refuses, and why (or what to use instead).
const REFUSED: &[(&str, &str)] = &[
    (
        "volumes",
        "a task reaches host directories through the group's volume (a host_volume the \
         operator configured) and the task's volume_mount",
    ),
    (
        "mount",
        "a task reaches host directories through the group's volume and volume_mount",
    ),
    (
        "mounts",
        "a task reaches host directories through the group's volume and volume_mount",
    ),
    ("devices", "berth gives tasks no host devices"),
    (
        "security_opt",
        "every task runs under berth's own seccomp filter",
    ),
    ("pid_mode", "every task has its own pid namespace"),
    ("ipc_mode", "every task has its own ipc namespace"),
    (
        "userns_mode",
        "the task's user is berth's choice, not the job's",
    ),
    ("sysctl", "berth sets no sysctls for a task"),
    ("runtime", "berth runs images itself, with no OCI runtime"),
];

fn parse_config(json: &str) -> Result<DockerConfig, String> {
    let fields: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(json).map_err(|e| format!("invalid docker config: {e}"))?;
    if let Some((field, why)) = REFUSED.iter().find(|(f, _)| fields.contains_key(*f)) {
        return Err(format!(
            "docker config: {field} is not supported by berth's docker driver: {why}"
        ));
    }
    let config: DockerConfig =
        berth_plugin_sdk::config::parse(json).map_err(|e| format!("invalid docker config: {e}"))?;
    if config.image.trim().is_empty() {
        return Err("invalid docker config: image is empty".into());
    }
    if config.privileged == Some(true) {
        return Err(
            "docker config: privileged = true is not allowed: berth runs no task with the \
             host's devices and every capability (cap_add names the ones a task needs)"
                .into(),
        );
    }
    if let Some(name) = config.cap_add.iter().find(|name| {
        let upper = name.trim().to_ascii_uppercase();
        let bare = upper
            .strip_prefix("CAP_")
            .unwrap_or(&upper)
            .to_ascii_lowercase();
        !DOCKER_DEFAULT_CAPABILITIES.contains(&bare.as_str())
    }) {
        return Err(format!(
            "docker config: cap_add {name:?} is not one berth gives: a docker task's network, \
             mount and other namespaces are the host's, not its user namespace's, so only \
             Docker's default capabilities ({}) would do anything",
            DOCKER_DEFAULT_CAPABILITIES.join(", ")
        ));
    }
    match config.network_mode.as_deref() {
        None | Some("") | Some("bridge") | Some("default") | Some("host") => {}
        Some(mode) => {
            return Err(format!(
                "docker config: network_mode {mode:?} is not supported: a docker task has \
                 a network of its own on the node's bridge (\"bridge\", the default) or, \
                 with \"host\", its group's (the host's, or in a group with network {{ mode \
                 = \"bridge\" }} the group's)"
            ));
        }
    }
    if let Some(ports) = &config.ports {
        // The host's own bounds, said at submit rather than at the task's start.
        if ports.len() > 64 {
            return Err(format!(
                "docker config: ports names {} ports; a task forwards at most 64",
                ports.len()
            ));
        }
        if let Some(label) = ports.iter().find(|l| l.is_empty() || l.len() > 128) {
            return Err(format!(
                "docker config: ports names {label:?}, which is no port label (1 to 128 bytes)"
            ));
        }
    }
    if let Some(timeout) = &config.image_pull_timeout {
        duration_millis(timeout)?;
    }
    if let Some(dir) = &config.work_dir
        && !dir.starts_with('/')
    {
        return Err(format!(
            "docker config: work_dir {dir:?} must be an absolute path in the image"
        ));
    }
    Ok(config)
}

/// A Go duration as Nomad writes them (`"5m"`, `"1m30s"`, `"1.5s"`, `"300ms"`), in
/// milliseconds (rounded up).
fn duration_millis(text: &str) -> Result<u64, String> {
    let bad = || format!("docker config: image_pull_timeout {text:?} is not a duration (\"5m\")");
    let mut total = 0f64;
    let mut rest = text.trim();
    if rest.is_empty() {
        return Err(bad());
    }
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .ok_or_else(bad)?;
        let number: f64 = rest[..number_len].parse().map_err(|_| bad())?;
        rest = &rest[number_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let millis_per_unit = match &rest[..unit_len] {
            "ns" => 1e-6,
            "us" | "µs" => 1e-3,
            "ms" => 1.0,
            "s" => 1e3,
            "m" => 60e3,
            "h" => 3_600e3,
            _ => return Err(bad()),
        };
        total += number * millis_per_unit;
        rest = &rest[unit_len..];
    }
    if !total.is_finite() || total >= u64::MAX as f64 {
        return Err(bad());
    }
    Ok(total.ceil() as u64)
}

/// The container's argv, as Docker makes it from the image and the task's config.
fn argv(config: &DockerConfig, image: &image::ImageConfig) -> Result<Vec<String>, String> {
    let entrypoint = config
        .entrypoint
        .clone()
        .unwrap_or_else(|| image.entrypoint.clone());
    let cmd = match (&config.command, config.args.is_empty()) {
        (Some(command), _) => std::iter::once(command.clone())
            .chain(config.args.iter().cloned())
            .collect(),
        (None, false) => config.args.clone(),
        // A new entrypoint drops the image's Cmd, as `docker run --entrypoint` does.
        (None, true) if config.entrypoint.is_some() => Vec::new(),
        (None, true) => image.cmd.clone(),
    };
    let argv: Vec<String> = entrypoint.into_iter().chain(cmd).collect();
    if argv.is_empty() {
        return Err(format!(
            "image {:?} has no Entrypoint or Cmd, and the task gives no command",
            config.image
        ));
    }
    Ok(argv)
}

/// The image's env, then the task's over it (except `PATH`, when the image has one).
fn environment(image: &image::ImageConfig, task: &[(String, String)]) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = image
        .env
        .iter()
        .filter_map(|pair| pair.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let image_has_path = env.iter().any(|(k, _)| k == "PATH");
    for (key, value) in task {
        if key == "PATH" && image_has_path {
            continue;
        }
        match env.iter_mut().find(|(k, _)| k == key) {
            Some(existing) => existing.1 = value.clone(),
            None => env.push((key.clone(), value.clone())),
        }
    }
    env
}

struct Docker;

impl ProcessDriver for Docker {
    type Config = DockerConfig;

    fn plugin_info() -> DriverInfo {
        DriverInfo {
            name: "docker".into(),
            version: env!("CARGO_PKG_VERSION").into(),
        }
    }

    fn capabilities() -> DriverCapabilities {
        DriverCapabilities {
            send_signals: true,
            // `alloc exec` and change scripts enter the task the host spawned.
            exec: true,
            fs_isolation: FsIsolation::Image,
            mount_configs: MountConfigs::All,
        }
    }

    fn fingerprint() -> DriverFingerprint {
        DriverFingerprint {
            health: HealthState::Healthy,
            health_description: "healthy".into(),
            attributes: vec![("driver.docker".into(), "1".into())],
        }
    }

    fn validate_task_config(config: String) -> Result<(), String> {
        parse_config(&config).map(|_| ())
    }

    fn start_task(config: TaskConfig) -> Result<TaskHandle, String> {
        let docker = parse_config(&config.config)?;
        let pulled = image::pull(&PullRequest {
            reference: docker.image.clone(),
            credentials: docker.auth.as_ref().map(|auth| Credentials {
                username: auth.username.clone(),
                password: auth.password.clone(),
            }),
            force: docker.force_pull,
            timeout_millis: match &docker.image_pull_timeout {
                Some(text) => Some(duration_millis(text)?),
                None => None,
            },
        })?;
        let argv = argv(&docker, &pulled)?;
        let cwd = docker
            .work_dir
            .clone()
            .or_else(|| Some(pulled.working_dir.clone()).filter(|d| d.starts_with('/')))
            .unwrap_or_else(|| "/".into());
        let mounts = process_task::bind_mounts(&config.mounts);
        let request = SpawnRequest {
            argv,
            env: environment(&pulled, &config.env),
            cwd: Some(cwd),
            isolation: Isolation::Chroot,
            mounts,
        };
        let options = image::SpawnOptions {
            capabilities: image::Capabilities {
                add: docker.cap_add.clone(),
                drop: docker.cap_drop.clone(),
            },
            network: match docker.network_mode.as_deref() {
                Some("host") => image::Network::Group,
                // Docker's default: `bridge` (or its other name, `default`).
                _ => image::Network::Bridge(docker.ports.clone().unwrap_or_default()),
            },
        };
        let process = image::spawn_with_options(&pulled.digest, &request, &options)?;
        Ok(process_task::handle(config.id, process))
    }
}

export_driver!(Docker);
