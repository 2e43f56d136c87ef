//! The agent config's `keyring` block: how often the cluster's key for workload
//! identities rotates (`root_key_rotation_threshold`, Nomad's server name and default,
//! 720h). Every agent of a cluster should say the same.

use std::time::Duration;

use berth_hcl::Problem;
use berth_hcl::fields::Fields;
use berth_hcl::tree::BlockNode;

/// Nomad's `root_key_rotation_threshold` default: 30 days.
pub const DEFAULT_ROTATION: Duration = Duration::from_secs(720 * 3600);

pub(super) fn rotation(block: &BlockNode, problems: &mut Vec<Problem>) -> Duration {
    let mut fields = Fields::new(
        &block.body,
        "config.keyring".into(),
        block.at,
        &["root_key_rotation_threshold"],
    );
    let rotation = fields.duration("root_key_rotation_threshold", problems);
    if rotation.is_some_and(|r| r < Duration::from_secs(1)) {
        fields.problem_with(
            problems,
            "root_key_rotation_threshold",
            "must be at least 1s".into(),
        );
    }
    fields.finish(problems);
    rotation.unwrap_or(DEFAULT_ROTATION)
}
