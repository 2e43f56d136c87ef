//! The agent config's `image` block: where the docker driver's images may be pulled
//! from, and the limits on what a layer may hold.
//!
//! ```hcl
//! image {
//!   insecure_registries = ["registry.internal:5000"]  # plain HTTP (loopback always is)
//!   denied_networks     = ["169.254.0.0/16"]          # no pull connects there
//!   max_layer_size      = "8GiB"                      # a layer's blob, compressed
//!   max_unpacked_size   = "16GiB"                     # a layer, unpacked
//!   max_layer_entries   = 1048576                     # files in a layer
//!   gc                  = true   # Nomad's docker gc { image, image_delay }: an image
//!   image_delay         = "3m"   # no task on the node used for this long is removed
//!   userns              = "private"  # root in an image is not root on the host; "host": it is
//!   auth_config         = "/root/.docker/config.json"  # credentials for jobs with no auth
//!   allow_caps          = ["audit_write", "chown", ...]  # what a job's cap_add may name
//! }
//! ```

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use berth_artifact::networks::Network;
use berth_hcl::Problem;
use berth_hcl::fields::Fields;
use berth_hcl::tree::BlockNode;
use berth_image::{LayerLimits, StoreConfig};

/// The operator's word on images; the store's root is the data dir's `images/`.
#[derive(Debug, Clone, PartialEq)]
pub struct ImageSettings {
    pub insecure_registries: Vec<String>,
    pub denied_networks: Arc<[Network]>,
    pub max_layer_bytes: u64,
    pub layer_limits: LayerLimits,
    /// Whether images no task uses are removed, and after how long unused.
    pub gc: bool,
    pub image_delay: Duration,
    /// `userns = "private"` (the default): each task on an image runs in a user
    /// namespace of its own, root in it being the task's dynamic uid and every other
    /// id one of its subordinate ids (`user { subordinate_base }`). `"host"`: tasks run
    /// as their dynamic uid in the host's, and an image's `User` is not used.
    pub private_user_namespaces: bool,
    /// `auth_config`: Docker's `config.json` (Nomad's docker plugin `auth { config }`),
    /// whose `auths` give the credentials for a pull whose job has no `auth`. Read at
    /// each such pull.
    pub auth_config: Option<PathBuf>,
    /// `allow_caps` (Nomad's docker plugin option): the capabilities a job's `cap_add`
    /// may name, as `CapabilitySet` bits. Nomad's default: Docker's default set.
    pub allow_caps: u64,
}

/// A name in `allow_caps` that names no capability.
#[derive(Debug, thiserror::Error)]
#[error("{0:?} is not a Linux capability")]
struct UnknownCapability(String);

fn capability_bits(names: &[impl AsRef<str>]) -> Result<u64, UnknownCapability> {
    names.iter().try_fold(0, |bits, name| {
        let name = name.as_ref();
        if name.trim().eq_ignore_ascii_case("all") {
            return Ok(u64::MAX);
        }
        berth_sys::process::confine::capability_by_name(name)
            .map(|cap| bits | cap.bits())
            .ok_or_else(|| UnknownCapability(name.to_string()))
    })
}

/// Nomad's docker driver's `image_delay`.
pub const DEFAULT_IMAGE_DELAY: Duration = Duration::from_secs(180);

impl Default for ImageSettings {
    fn default() -> Self {
        let defaults = StoreConfig::new(PathBuf::new());
        ImageSettings {
            insecure_registries: defaults.insecure_registries,
            denied_networks: defaults.denied_networks,
            max_layer_bytes: defaults.max_layer_bytes,
            layer_limits: defaults.layer_limits,
            gc: true,
            image_delay: DEFAULT_IMAGE_DELAY,
            private_user_namespaces: true,
            auth_config: None,
            // Nomad's default: Docker's default set.
            allow_caps: berth_sys::process::confine::IMAGE_TASK_CAPABILITIES.bits(),
        }
    }
}

impl ImageSettings {
    /// The store at `root` (`<data_dir>/images`) under these settings.
    pub fn store_config(&self, root: PathBuf) -> StoreConfig {
        StoreConfig {
            root,
            insecure_registries: self.insecure_registries.clone(),
            denied_networks: self.denied_networks.clone(),
            max_layer_bytes: self.max_layer_bytes,
            layer_limits: self.layer_limits,
        }
    }
}

pub(super) fn settings(block: &BlockNode, problems: &mut Vec<Problem>) -> ImageSettings {
    let mut fields = Fields::new(
        &block.body,
        "config.image".into(),
        block.at,
        &[
            "insecure_registries",
            "denied_networks",
            "max_layer_size",
            "max_unpacked_size",
            "max_layer_entries",
            "gc",
            "image_delay",
            "userns",
            "auth_config",
            "allow_caps",
        ],
    );
    let defaults = ImageSettings::default();
    let insecure_registries = fields.string_list("insecure_registries", problems);
    let settings = ImageSettings {
        insecure_registries,
        denied_networks: super::artifact::denied_networks(
            &mut fields,
            defaults.denied_networks.clone(),
            problems,
        ),
        max_layer_bytes: fields
            .size("max_layer_size", problems)
            .unwrap_or(defaults.max_layer_bytes),
        layer_limits: LayerLimits {
            max_unpacked: fields
                .size("max_unpacked_size", problems)
                .unwrap_or(defaults.layer_limits.max_unpacked),
            max_entries: fields
                .number("max_layer_entries", u64::MAX, problems)
                .unwrap_or(defaults.layer_limits.max_entries),
        },
        gc: fields.bool("gc", problems).unwrap_or(defaults.gc),
        image_delay: fields
            .duration("image_delay", problems)
            .unwrap_or(defaults.image_delay),
        private_user_namespaces: true,
        auth_config: None,
        allow_caps: defaults.allow_caps,
    };
    let private_user_namespaces = match fields.string("userns", problems).as_deref() {
        None | Some("private") => true,
        Some("host") => false,
        Some(other) => {
            fields.problem_with(
                problems,
                "userns",
                format!("{other:?} is no user namespace mode: \"private\" or \"host\""),
            );
            true
        }
    };
    let allow_caps = if fields.attr("allow_caps").is_some() {
        let names = fields.string_list("allow_caps", problems);
        match capability_bits(&names) {
            Ok(bits) => bits,
            Err(why) => {
                fields.problem_with(problems, "allow_caps", why.to_string());
                defaults.allow_caps
            }
        }
    } else {
        defaults.allow_caps
    };
    let settings = ImageSettings {
        private_user_namespaces,
        auth_config: fields.string("auth_config", problems).map(PathBuf::from),
        allow_caps,
        ..settings
    };
    if settings.image_delay < Duration::from_secs(1) {
        fields.problem_with(problems, "image_delay", "must be at least 1s".into());
    }
    fields.finish(problems);
    settings
}
