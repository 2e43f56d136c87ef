//! A hostile driver for tests that runs tasks on images (fs-isolation `image`). It pulls
//! the task config's `image`, then what it does wrong is chosen by `behave`:
//!
//! - `other-ports`: spawns `sleep` on the image in the task's own network forwarding
//!   `http`, then spawns again asking for `admin` instead (a driver that would have the
//!   host tear the namespace down and make it again at each spawn); fails the start
//!   with what the host answered, or saying that the host allowed it;
//! - `many-ports`: asks for a network forwarding 65 ports;
//! - `ok`: one spawn forwarding `http`.

use berth_plugin_sdk::host::image::{self, Capabilities, Network, PullRequest, SpawnOptions};
use berth_plugin_sdk::host::process::{Isolation, SpawnRequest};
use berth_plugin_sdk::{
    DriverCapabilities, DriverFingerprint, DriverInfo, FsIsolation, HealthState, MountConfigs,
    ProcessDriver, TaskConfig, TaskHandle, export_driver, process_task,
};

#[derive(serde::Deserialize)]
struct Config {
    image: String,
    behave: String,
}

fn spawn_forwarding(digest: &str, ports: Vec<String>) -> Result<image::ProcessRef, String> {
    let request = SpawnRequest {
        argv: vec!["/bin/sleep".into(), "600".into()],
        env: vec![("PATH".into(), "/bin".into())],
        cwd: Some("/".into()),
        isolation: Isolation::Chroot,
        mounts: Vec::new(),
    };
    let options = SpawnOptions {
        capabilities: Capabilities {
            add: Vec::new(),
            drop: Vec::new(),
        },
        network: Network::Bridge(ports),
    };
    image::spawn_with_options(digest, &request, &options)
}

struct ImageMisbehave;

impl ProcessDriver for ImageMisbehave {
    type Config = Config;

    fn plugin_info() -> DriverInfo {
        DriverInfo {
            name: "image-misbehave".into(),
            version: "0.1.0".into(),
        }
    }

    fn capabilities() -> DriverCapabilities {
        DriverCapabilities {
            send_signals: true,
            exec: false,
            fs_isolation: FsIsolation::Image,
            mount_configs: MountConfigs::All,
        }
    }

    fn fingerprint() -> DriverFingerprint {
        DriverFingerprint {
            health: HealthState::Healthy,
            health_description: "pretending".into(),
            attributes: vec![],
        }
    }

    fn validate_task_config(config: String) -> Result<(), String> {
        serde_json::from_str::<Config>(&config)
            .map(drop)
            .map_err(|e| e.to_string())
    }

    fn start_task(config: TaskConfig) -> Result<TaskHandle, String> {
        let wanted: Config = serde_json::from_str(&config.config).map_err(|e| e.to_string())?;
        let pulled = image::pull(&PullRequest {
            reference: wanted.image,
            credentials: None,
            force: false,
            timeout_millis: None,
        })?;
        let process = match wanted.behave.as_str() {
            "other-ports" => {
                let first = spawn_forwarding(&pulled.digest, vec!["http".into()])?;
                spawn_forwarding(&pulled.digest, vec!["admin".into()])?;
                let _ = first;
                return Err("image-misbehave: the host made the network again".into());
            }
            "many-ports" => {
                spawn_forwarding(&pulled.digest, (0..65).map(|i| format!("p{i}")).collect())?
            }
            _ => spawn_forwarding(&pulled.digest, vec!["http".into()])?,
        };
        Ok(process_task::handle(config.id, process))
    }
}

export_driver!(ImageMisbehave);
