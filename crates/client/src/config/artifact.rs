//! The agent config's `artifact` block, with the names Nomad's client gives its limits
//! on what a job's `artifact` may fetch: `http_read_timeout` (the whole download),
//! `http_max_size`, `decompression_size_limit` and `decompression_file_count_limit`; and
//! berth's `denied_networks`, where no download may connect (by default loopback and
//! link-local: the agent's own API, Consul, a cloud's metadata service).

use std::sync::Arc;

use berth_artifact::Limits;
use berth_artifact::networks::Network;
use berth_hcl::Problem;
use berth_hcl::fields::Fields;
use berth_hcl::tree::BlockNode;

pub(super) fn artifact_limits(block: &BlockNode, problems: &mut Vec<Problem>) -> Limits {
    let mut fields = Fields::new(
        &block.body,
        "config.artifact".into(),
        block.at,
        &[
            "http_read_timeout",
            "http_max_size",
            "decompression_size_limit",
            "decompression_file_count_limit",
            "denied_networks",
        ],
    );
    let defaults = Limits::default();
    let limits = Limits {
        read_timeout: fields
            .duration("http_read_timeout", problems)
            .unwrap_or(defaults.read_timeout),
        max_download: fields
            .size("http_max_size", problems)
            .unwrap_or(defaults.max_download),
        max_unpacked: fields
            .size("decompression_size_limit", problems)
            .unwrap_or(defaults.max_unpacked),
        max_files: fields
            .number("decompression_file_count_limit", u64::MAX, problems)
            .unwrap_or(defaults.max_files),
        denied_networks: denied_networks(&mut fields, defaults.denied_networks, problems),
    };
    fields.finish(problems);
    limits
}

/// `denied_networks`, CIDRs (`169.254.0.0/16`) or addresses; `default` when not set.
pub(super) fn denied_networks(
    fields: &mut Fields,
    default: Arc<[Network]>,
    problems: &mut Vec<Problem>,
) -> Arc<[Network]> {
    if fields.attr("denied_networks").is_none() {
        return default;
    }
    let mut networks = Vec::new();
    for text in fields.string_list("denied_networks", problems) {
        match text.parse::<Network>() {
            Ok(network) => networks.push(network),
            Err(error) => fields.problem_with(problems, "denied_networks", error.to_string()),
        }
    }
    networks.into()
}
