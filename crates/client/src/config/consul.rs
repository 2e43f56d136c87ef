//! The agent config's `consul` block.

use std::path::PathBuf;

use berth_hcl::Problem;
use berth_hcl::fields::Fields;
use berth_hcl::tree::BlockNode;

use super::ConsulSettings;

pub(super) fn consul_settings(block: &BlockNode, problems: &mut Vec<Problem>) -> ConsulSettings {
    let mut fields = Fields::new(
        &block.body,
        "config.consul".into(),
        block.at,
        &[
            "address",
            "token",
            "token_file",
            "sync_interval",
            "service_address",
            "ssl",
            "scheme",
            "service_identity_timeout",
            "grpc_address",
            "binary",
        ],
    );
    let address = fields
        .string("address", problems)
        .unwrap_or_else(|| "127.0.0.1:8500".into());
    let address = address
        .strip_prefix("http://")
        .unwrap_or(&address)
        .trim_end_matches('/')
        .to_string();
    if address.starts_with("https://")
        || fields.bool("ssl", problems) == Some(true)
        || fields.string("scheme", problems).as_deref() == Some("https")
    {
        fields.problem(
            problems,
            "ssl",
            block.at,
            "berth talks plain HTTP to the local Consul agent; TLS to Consul is not built yet"
                .into(),
        );
    }
    let token = fields.string("token", problems);
    let token_file = fields.string("token_file", problems).map(PathBuf::from);
    let sync_interval = fields
        .duration("sync_interval", problems)
        .unwrap_or(std::time::Duration::from_secs(30))
        .max(std::time::Duration::from_secs(1));
    let service_address = fields.string("service_address", problems);
    let service_identity_timeout = fields
        .duration("service_identity_timeout", problems)
        .unwrap_or(std::time::Duration::from_secs(300));
    let grpc_address = fields
        .string("grpc_address", problems)
        .unwrap_or_else(|| "127.0.0.1:8502".into());
    let binary = fields
        .string("binary", problems)
        .unwrap_or_else(|| "consul".into());
    fields.finish(problems);
    ConsulSettings {
        address,
        token,
        token_file,
        sync_interval,
        service_address,
        service_identity_timeout,
        grpc_address,
        binary,
    }
}
