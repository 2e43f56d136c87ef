//! The agent config's `http` block: the API's addresses, tokens and limits.

use std::path::PathBuf;

use berth_hcl::Problem;
use berth_hcl::fields::Fields;
use berth_hcl::tree::BlockNode;
use berth_model::limits::ConnectionLimits;

use super::{ApiToken, HttpConfig, MIN_TOKEN_SECRET, TokenScope};

pub(super) fn http_config(block: &BlockNode, problems: &mut Vec<Problem>) -> HttpConfig {
    let mut fields = Fields::new(
        &block.body,
        "config.http".into(),
        block.at,
        &[
            "address",
            "socket_group",
            "token_file",
            "token",
            "max_connections",
            "max_connections_per_client",
            "header_timeout",
            "idle_timeout",
        ],
    );
    let address = fields.string("address", problems).and_then(|text| {
        let parsed = text.parse::<std::net::SocketAddr>().ok();
        if parsed.is_none() {
            let at = fields.attr("address").map(|a| a.at).unwrap_or(block.at);
            fields.problem(
                problems,
                "address",
                at,
                format!("{text:?} is not an address such as \"127.0.0.1:4646\""),
            );
        }
        parsed
    });
    let socket_group = fields.string("socket_group", problems);
    let token_file = fields.string("token_file", problems).map(PathBuf::from);
    if let Some(file) = token_file.as_ref().filter(|f| !f.is_absolute()) {
        let at = fields.attr("token_file").map(|a| a.at).unwrap_or(block.at);
        fields.problem(
            problems,
            "token_file",
            at,
            format!("{:?} must be an absolute path", file.display()),
        );
    }
    let mut tokens = Vec::new();
    for (name, token) in fields.labeled_blocks("token", problems) {
        let path = format!("config.http.token.{name}");
        let mut token_fields = Fields::new(&token.body, path, token.at, &["secret", "scope"]);
        let secret = token_fields.required_string("secret", problems);
        let long_enough = secret
            .as_ref()
            .is_some_and(|s| s.chars().count() >= MIN_TOKEN_SECRET);
        if let Some(short) = secret.as_ref().filter(|_| !long_enough) {
            let at = token_fields
                .attr("secret")
                .map(|a| a.at)
                .unwrap_or(token.at);
            token_fields.problem(
                problems,
                "secret",
                at,
                format!(
                    "is {} characters; a token secret needs at least {MIN_TOKEN_SECRET}",
                    short.chars().count()
                ),
            );
        }
        let scope_text = token_fields.required_string("scope", problems);
        let scope = token_fields.choose(
            scope_text,
            "scope",
            &[
                ("read", TokenScope::Read),
                ("submit", TokenScope::Submit),
                ("alloc-exec", TokenScope::AllocExec),
                ("plugin", TokenScope::Plugin),
            ],
            problems,
            |other| {
                format!(
                    "unknown scope {other:?} (use \"read\", \"submit\", \"alloc-exec\" or \
                     \"plugin\")"
                )
            },
        );
        token_fields.finish(problems);
        if let (Some(secret), Some(scope), true) = (secret, scope, long_enough) {
            tokens.push(ApiToken {
                name,
                secret,
                scope,
            });
        }
    }
    let defaults = ConnectionLimits::TCP;
    let tcp_limits = ConnectionLimits {
        max_connections: fields
            .number("max_connections", 1_000_000, problems)
            .map_or(defaults.max_connections, |n| n.max(1) as usize),
        max_connections_per_client: fields
            .number("max_connections_per_client", 1_000_000, problems)
            .map_or(defaults.max_connections_per_client, |n| n.max(1) as usize),
        reserved_for_tokens: defaults.reserved_for_tokens,
        header_timeout: fields
            .duration("header_timeout", problems)
            .unwrap_or(defaults.header_timeout)
            .max(std::time::Duration::from_millis(100)),
        idle_timeout: fields
            .duration("idle_timeout", problems)
            .unwrap_or(defaults.idle_timeout)
            .max(std::time::Duration::from_millis(100)),
    };
    fields.finish(problems);
    HttpConfig {
        address,
        socket_group,
        token_file,
        tokens,
        tcp_limits,
        socket_limits: ConnectionLimits::SOCKET,
    }
}
