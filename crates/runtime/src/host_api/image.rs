//! `berth:host/image`: a driver that declared `fs-isolation: image` pulls an image
//! through the agent's store and spawns its task on it. The reference and credentials
//! are bounded; a pull is made only while a task starts, and its time is the host's,
//! not the guest's, within a cap that leaves start-task room to finish. A spawn names
//! an image pulled during the same call; everything else about it is checked as
//! `process.spawn` checks it, and the task's root becomes the image's layers under an
//! overlay whose upper directory is in the task's own directory.

use std::path::Path;
use std::time::Duration;

use crate::bindings::host::image::{
    Capabilities, Host, ImageConfig, Network, PullRequest, SpawnOptions,
};
use crate::bindings::host::process::{Isolation as WitIsolation, ProcessRef, SpawnRequest};
use crate::images::{ImagePull, PulledImage};
use crate::sandbox::PluginCtx;
use berth_model::driver::FsIsolation;
use berth_sys::process::Isolation;
use berth_sys::process::confine::{
    IMAGE_TASK_CAPABILITIES, MOUNTING_PLUGIN_CAPABILITIES, TASK_CAPABILITIES, capability_by_name,
};
use berth_sys::process::isolation::{IMAGE_ETC_FILES, ImageRoot};
use berth_sys::process::user_namespace::UserNamespace;
use rustix::thread::CapabilitySet;

/// The longest a pull may take: start-task's own wall budget is 5 minutes.
pub const MAX_PULL: Duration = Duration::from_secs(240);
const MAX_REFERENCE: usize = 512;
const MAX_CREDENTIAL: usize = 4096;

#[derive(Debug, thiserror::Error)]
enum ImageRefusal {
    #[error("driver {driver:?} may only pull or spawn images while starting a task")]
    OutsideTaskStart { driver: String },
    #[error(
        "driver {driver:?} uses images but declared fs-isolation {declared:?}: a driver that \
         runs tasks on images declares fs-isolation \"image\""
    )]
    NotDeclared {
        driver: String,
        declared: FsIsolation,
    },
    #[error("this agent has no image store")]
    NoStore,
    #[error(
        "the image reference or its credentials are longer than berth reads ({MAX_REFERENCE} and {MAX_CREDENTIAL} bytes)"
    )]
    TooLong,
    #[error(
        "driver {driver:?} asked to spawn on image {digest:?}, which it did not pull while starting this task"
    )]
    NotPulled { driver: String, digest: String },
    #[error("driver {driver:?} asked to spawn on an image without isolation \"chroot\"")]
    NotIsolated { driver: String },
    #[error(
        "driver {driver:?} asked for a network forwarding more than {MAX_FORWARDED_PORTS} ports, or a port label longer than {MAX_PORT_LABEL} bytes"
    )]
    TooManyPorts { driver: String },
    #[error(
        "driver {driver:?} asked for its task's network again with other ports: a task has one network, with the ports its first spawn named"
    )]
    OtherPorts { driver: String },
}

impl PluginCtx {
    fn image_refusal(&self) -> Option<ImageRefusal> {
        let driver = self.plugin.name.to_string();
        if self.task.is_none() {
            Some(ImageRefusal::OutsideTaskStart { driver })
        } else if self.plugin.isolation != FsIsolation::Image {
            Some(ImageRefusal::NotDeclared {
                driver,
                declared: self.plugin.isolation,
            })
        } else {
            None
        }
    }

    fn refuse(&mut self, refusal: ImageRefusal) -> String {
        let refusal = refusal.to_string();
        self.violations.push(refusal.clone());
        refusal
    }
}

impl PluginCtx {
    /// The task's own user namespace, when the host gave it one: its user is the job's
    /// `user` or else the image's, found in the image's own files.
    fn image_user_namespace(
        &self,
        image: &PulledImage,
    ) -> Result<Option<UserNamespace>, ImageSpawnError> {
        let Some(task) = &self.task else {
            return Ok(None);
        };
        if task.user.is_none() && !task.privileged {
            // The host gives every image task a user of its own; without one it would run
            // as the agent's (root).
            return Err(ImageSpawnError::NoUser {
                task: task.task_id.clone(),
            });
        }
        let (Some(decided), Some(host)) = (&task.image_user_namespace, task.user) else {
            return Ok(None);
        };
        let (spec, whose) = match &decided.user {
            Some(user) => (user.as_str(), "the task's user"),
            None => (image.user.as_str(), "the image's User"),
        };
        let user = |source| ImageSpawnError::User {
            whose,
            spec: spec.to_string(),
            source,
        };
        let inside = berth_sys::process::image_user::resolve(&image.lower, spec)
            .map_err(|e| user(UserProblem::NotInImage(e)))?;
        UserNamespace::for_image_task(host, decided.subordinate, inside)
            .map(Some)
            .map_err(|e| user(UserProblem::Namespace(e)))
    }
}

/// Why a task could not be spawned on its image.
#[derive(Debug, thiserror::Error)]
enum ImageSpawnError {
    /// Refused as a violation of what the driver was handed (recorded as such).
    #[error("{0}")]
    Refused(String),
    #[error("task {task} has no user of its own to run its image as")]
    NoUser { task: String },
    #[error("{whose} {spec:?}: {source}")]
    User {
        whose: &'static str,
        spec: String,
        source: UserProblem,
    },
    #[error(transparent)]
    Spawn(#[from] berth_sys::process::ProcessError),
    #[error(transparent)]
    Capabilities(#[from] CapabilityRefusal),
    #[error("the task's own network: {0}")]
    Network(#[from] berth_model::driver::TaskNetworkRefusal),
}

/// The most group ports a task's own network forwards, and the longest label read.
const MAX_FORWARDED_PORTS: usize = 64;
const MAX_PORT_LABEL: usize = 128;

/// What is wrong with the user an image task would run as.
#[derive(Debug, thiserror::Error)]
enum UserProblem {
    #[error(transparent)]
    NotInImage(berth_sys::process::image_user::ImageUserError),
    #[error(transparent)]
    Namespace(berth_sys::process::user_namespace::NamespaceError),
}

impl Host for PluginCtx {
    async fn pull(
        &mut self,
        request: PullRequest,
    ) -> wasmtime::Result<Result<ImageConfig, String>> {
        if let Some(refusal) = self.image_refusal() {
            return Ok(Err(self.refuse(refusal)));
        }
        let too_long = request.reference.len() > MAX_REFERENCE
            || request.credentials.as_ref().is_some_and(|c| {
                c.username.len() > MAX_CREDENTIAL || c.password.len() > MAX_CREDENTIAL
            });
        if too_long {
            return Ok(Err(self.refuse(ImageRefusal::TooLong)));
        }
        let Some(images) = self.images.clone() else {
            return Ok(Err(ImageRefusal::NoStore.to_string()));
        };
        let timeout = request
            .timeout_millis
            .map(Duration::from_millis)
            .unwrap_or(MAX_PULL)
            .min(MAX_PULL);
        let pull = ImagePull {
            reference: request.reference,
            credentials: request.credentials.map(|c| (c.username, c.password)),
            force: request.force,
            timeout,
            task_id: self
                .task
                .as_ref()
                .map(|t| t.task_id.clone())
                .unwrap_or_default(),
            progress: self.task.as_ref().and_then(|t| t.progress.clone()),
        };
        let pulled = self.clock.exempt(images.pull(pull)).await;
        Ok(pulled.map_err(|e| e.0).map(|image| {
            let config = ImageConfig {
                digest: image.digest.clone(),
                entrypoint: image.entrypoint.clone(),
                cmd: image.cmd.clone(),
                env: image.env.clone(),
                working_dir: image.working_dir.clone(),
                user: image.user.clone(),
            };
            self.pulled.push(image);
            config
        }))
    }

    async fn spawn(
        &mut self,
        digest: String,
        request: SpawnRequest,
    ) -> wasmtime::Result<Result<ProcessRef, String>> {
        Ok(self
            .spawn_on_image(digest, request, None, None)
            .map_err(|e| e.to_string()))
    }

    async fn spawn_with_options(
        &mut self,
        digest: String,
        request: SpawnRequest,
        options: SpawnOptions,
    ) -> wasmtime::Result<Result<ProcessRef, String>> {
        let changed = !options.capabilities.add.is_empty() || !options.capabilities.drop.is_empty();
        let capabilities = changed.then_some(&options.capabilities);
        let ports = match &options.network {
            Network::Group => None,
            Network::Bridge(ports) => Some(ports.as_slice()),
        };
        Ok(self
            .spawn_on_image(digest, request, capabilities, ports)
            .map_err(|e| e.to_string()))
    }
}

/// Why a job's `cap_add` or `cap_drop` cannot be.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
enum CapabilityRefusal {
    #[error("{0:?} is not a Linux capability")]
    Unknown(String),
    #[error(
        "{0} (cap_add) is not among the capabilities the operator lets jobs add (the agent's \
         image {{ allow_caps }})"
    )]
    NotAllowed(String),
    #[error(
        "{0} (cap_add) would give the task nothing: its network, mount and other namespaces \
         are the host's, not its user namespace's; berth adds only Docker's default \
         capabilities"
    )]
    NoEffect(String),
    #[error("more than {MAX_CAPABILITY_NAMES} capability names")]
    TooMany,
    #[error(
        "cap_add needs the task's own user namespace (the agent's image {{ userns = \"private\" \
         }}), and this task has none: what it added would be the host's"
    )]
    NoNamespace,
}

const MAX_CAPABILITY_NAMES: usize = 64;

/// A capability by Docker's name (`net_raw`, `CAP_NET_RAW`, any case).
fn capability(name: &str) -> Result<CapabilitySet, CapabilityRefusal> {
    capability_by_name(name)
        .ok_or_else(|| CapabilityRefusal::Unknown(name.chars().take(64).collect()))
}

/// The task's capabilities: `base` (its confinement's), less `drop` (`all`: every one),
/// plus `add`, each within `allowed` (the operator's) and what a task in its own user
/// namespace can use ([`IMAGE_TASK_CAPABILITIES`]); with no namespace of its own
/// (`in_namespace` false), nothing is added (attack review: a privileged plugin's
/// `cap_add = ["mknod"]` was the host's).
fn task_capabilities(
    asked: &Capabilities,
    base: CapabilitySet,
    allowed: CapabilitySet,
    in_namespace: bool,
) -> Result<CapabilitySet, CapabilityRefusal> {
    if asked.add.len() + asked.drop.len() > MAX_CAPABILITY_NAMES {
        return Err(CapabilityRefusal::TooMany);
    }
    if !asked.add.is_empty() && !in_namespace {
        return Err(CapabilityRefusal::NoNamespace);
    }
    let mut kept = base;
    for name in &asked.drop {
        if name.trim().eq_ignore_ascii_case("all") {
            kept = CapabilitySet::empty();
        } else {
            kept.remove(capability(name)?);
        }
    }
    for name in &asked.add {
        let cap = capability(name)?;
        let shown = format!(
            "CAP_{}",
            name.trim().to_ascii_uppercase().trim_start_matches("CAP_")
        );
        if !IMAGE_TASK_CAPABILITIES.contains(cap) {
            return Err(CapabilityRefusal::NoEffect(shown));
        }
        if !allowed.contains(cap) {
            return Err(CapabilityRefusal::NotAllowed(shown));
        }
        kept.insert(cap);
    }
    Ok(kept)
}

impl PluginCtx {
    /// `image.spawn`, with the task's capabilities when the job changed them, and in a
    /// network of its own (Docker's default) forwarding `own_network`'s ports when the
    /// driver asked for one and the group has none.
    fn spawn_on_image(
        &mut self,
        digest: String,
        request: SpawnRequest,
        capabilities: Option<&Capabilities>,
        own_network: Option<&[String]>,
    ) -> Result<ProcessRef, ImageSpawnError> {
        if let Some(refusal) = self.image_refusal() {
            return Err(ImageSpawnError::Refused(self.refuse(refusal)));
        }
        let driver = self.plugin.name.to_string();
        let Some(image) = self.pulled.iter().find(|i| i.digest == digest).cloned() else {
            return Err(ImageSpawnError::Refused(
                self.refuse(ImageRefusal::NotPulled { driver, digest }),
            ));
        };
        if request.isolation != WitIsolation::Chroot {
            return Err(ImageSpawnError::Refused(
                self.refuse(ImageRefusal::NotIsolated { driver }),
            ));
        }
        let mut spec = match self.check_spawn(request) {
            Ok(spec) => spec,
            Err(refusal) => {
                let refusal = refusal.to_string();
                self.violations.push(refusal.clone());
                return Err(ImageSpawnError::Refused(refusal));
            }
        };
        let user_namespace = self.image_user_namespace(&image)?;
        let owner = user_namespace
            .as_ref()
            .and_then(UserNamespace::root_on_host);
        if let Some(asked) = capabilities {
            let base = match spec.isolation {
                Isolation::Chroot(ref chroot) if chroot.privileged => MOUNTING_PLUGIN_CAPABILITIES,
                _ => TASK_CAPABILITIES,
            };
            let allowed = self.images.as_ref().map_or(0, |i| i.allowed_capabilities());
            let allowed = CapabilitySet::from_bits_retain(allowed);
            let kept = task_capabilities(asked, base, allowed, user_namespace.is_some())?;
            spec.capabilities = Some(kept.bits());
        }
        spec.user_namespace = user_namespace;
        let own_network = match own_network {
            Some(ports) if spec.network_namespace.is_none() => Some(self.own_network(ports)?),
            // In a bridge-mode group, the group's namespace is Docker's bridge.
            _ => None,
        };
        if let Some(network) = &own_network {
            spec.network_namespace = Some(network.path.clone());
            for (label, inside) in &network.ports {
                let name = format!("NOMAD_PORT_{label}");
                spec.env.retain(|(key, _)| *key != name);
                spec.env.push((name, inside.to_string()));
            }
        }
        if let Isolation::Chroot(chroot) = &mut spec.isolation {
            let dir = chroot.root.join("image");
            chroot.root = dir.join("root");
            chroot.image = Some(ImageRoot {
                lower: image.lower,
                upper: dir.join("upper"),
                work: dir.join("work"),
                owner,
            });
            // On the host's network an image gets the host's resolver and hosts, as
            // Docker gives them; in a group's network, the group's; in its own, its own.
            if let Some(network) = &own_network {
                chroot.etc_files = network.etc_files.clone();
            } else if chroot.etc_files.is_empty() {
                chroot.etc_files = IMAGE_ETC_FILES
                    .iter()
                    .map(|name| Path::new("/etc").join(name))
                    .collect();
            }
        }
        Ok(self.spawn_checked(spec)?)
    }

    /// The task's own network namespace, made by the host (or found again on a
    /// restart) with the group ports `ports` names forwarded to it.
    fn own_network(
        &mut self,
        ports: &[String],
    ) -> Result<berth_model::driver::TaskNetwork, ImageSpawnError> {
        let driver = self.plugin.name.to_string();
        if ports.len() > MAX_FORWARDED_PORTS || ports.iter().any(|p| p.len() > MAX_PORT_LABEL) {
            return Err(ImageSpawnError::Refused(
                self.refuse(ImageRefusal::TooManyPorts { driver }),
            ));
        }
        let mut asked: Vec<String> = ports.to_vec();
        asked.sort();
        asked.dedup();
        // Made once a call: a driver alternating its ports would have the host tear
        // the namespace down and make it again, for as long as its start may take.
        if let Some((given, network)) = &self.own_network {
            if *given == asked {
                return Ok(network.clone());
            }
            return Err(ImageSpawnError::Refused(
                self.refuse(ImageRefusal::OtherPorts { driver }),
            ));
        }
        let Some(maker) = self.task.as_ref().and_then(|t| t.own_network.clone()) else {
            return Err(ImageSpawnError::Network(
                berth_model::driver::TaskNetworkRefusal(
                    "this agent gives no task a network of its own".into(),
                ),
            ));
        };
        // The host's work (namespace, CNI plugins, state writes), not the guest's.
        let network = self
            .clock
            .exempt_work(|| berth_sys::blocking::run(|| (maker.0)(&asked)))?;
        self.own_network = Some((asked, network.clone()));
        Ok(network)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn asked(add: &[&str], drop: &[&str]) -> Capabilities {
        Capabilities {
            add: add.iter().map(|s| s.to_string()).collect(),
            drop: drop.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn a_jobs_capabilities_are_the_default_less_what_it_drops_plus_what_it_may_add() {
        let all = IMAGE_TASK_CAPABILITIES;
        let caps = |asked: &Capabilities, allowed| {
            task_capabilities(asked, TASK_CAPABILITIES, allowed, true)
        };
        assert_eq!(caps(&asked(&[], &[]), all), Ok(TASK_CAPABILITIES));
        assert_eq!(caps(&asked(&[], &["ALL"]), all), Ok(CapabilitySet::empty()));
        assert_eq!(
            caps(&asked(&["CAP_MKNOD"], &["all"]), all),
            Ok(CapabilitySet::MKNOD),
            "a drop of all, then an add, as Docker reads them"
        );
        let mut expected = TASK_CAPABILITIES;
        expected.remove(CapabilitySet::KILL);
        assert_eq!(caps(&asked(&[], &["kill"]), all), Ok(expected));
        assert_eq!(
            caps(&asked(&["sys_admin"], &[]), all),
            Err(CapabilityRefusal::NoEffect("CAP_SYS_ADMIN".into()))
        );
        assert_eq!(
            caps(&asked(&["setfcap"], &[]), CapabilitySet::CHOWN),
            Err(CapabilityRefusal::NotAllowed("CAP_SETFCAP".into()))
        );
        assert_eq!(
            caps(&asked(&[], &["cap_nonsense"]), all),
            Err(CapabilityRefusal::Unknown("cap_nonsense".into()))
        );
        let many: Vec<&str> = std::iter::repeat_n("chown", 65).collect();
        assert_eq!(
            caps(&asked(&many, &[]), all),
            Err(CapabilityRefusal::TooMany)
        );
        // Without a namespace of its own (a plugin keeping root): nothing is added, and
        // a drop is from its own set.
        let plugin = MOUNTING_PLUGIN_CAPABILITIES;
        assert_eq!(
            task_capabilities(&asked(&["mknod"], &[]), plugin, all, false),
            Err(CapabilityRefusal::NoNamespace)
        );
        let mut dropped = plugin;
        dropped.remove(CapabilitySet::CHOWN);
        assert_eq!(
            task_capabilities(&asked(&[], &["chown"]), plugin, all, false),
            Ok(dropped)
        );
    }
}
