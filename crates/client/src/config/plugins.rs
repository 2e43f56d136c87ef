//! The agent config's `plugin` and `hook` blocks, each component with its pin.

use std::path::{Path, PathBuf};

use berth_hcl::fields::Fields;
use berth_hcl::tree::BlockNode;
use berth_hcl::{Location, Problem};
use berth_model::hook::{HookSpec, OnFailure, WriteQuota};
use berth_model::pins::parse_sha256;

use super::PluginConfig;

pub(super) fn plugin_config(
    name: String,
    block: &BlockNode,
    problems: &mut Vec<Problem>,
) -> PluginConfig {
    let path = format!("config.plugin.{name}");
    let mut plugin = Fields::new(
        &block.body,
        path.clone(),
        block.at,
        &["config", "sha256", "allow_unconfined", "path"],
    );
    let sha256 = pin(&mut plugin, block.at, problems);
    let allow_unconfined = plugin.bool("allow_unconfined", problems).unwrap_or(false);
    let file = plugin.string("path", problems).map(PathBuf::from);
    if allow_unconfined && file.is_none() && sha256.is_none() {
        plugin.problem_with(
            problems,
            "allow_unconfined",
            format!(
                "allow_unconfined names no file: any driver file can report the name {name:?}, \
                 so the grant must name the file it is for: add path = \"/path/to/{name}.wasm\" \
                 or sha256 = \"...\" to this block"
            ),
        );
    }
    let mut enabled = None;
    if let Some(config) = plugin.single_block("config", problems) {
        let mut settings = Fields::new(
            &config.body,
            format!("{path}.config"),
            config.at,
            &["enabled"],
        );
        enabled = settings.bool("enabled", problems);
        settings.finish(problems);
    }
    plugin.finish(problems);
    PluginConfig {
        name,
        enabled,
        sha256,
        allow_unconfined,
        path: file,
    }
}

/// The `sha256` field of a plugin or hook block, checked.
pub(super) fn pin(
    fields: &mut Fields,
    block_at: Location,
    problems: &mut Vec<Problem>,
) -> Option<String> {
    let text = fields.string("sha256", problems)?;
    match parse_sha256(&text) {
        Ok(digest) => Some(digest),
        Err(error) => {
            let at = fields.attr("sha256").map(|a| a.at).unwrap_or(block_at);
            fields.problem(problems, "sha256", at, error.to_string());
            None
        }
    }
}

pub(super) fn hook_spec(
    name: String,
    block: &BlockNode,
    problems: &mut Vec<Problem>,
) -> Option<HookSpec> {
    let mut hook = Fields::new(
        &block.body,
        format!("config.hook.{name}"),
        block.at,
        &[
            "path",
            "config",
            "timeout",
            "memory_max",
            "on_failure",
            "all_tasks",
            "sha256",
            "quota_bytes",
            "quota_inodes",
        ],
    );
    let defaults = WriteQuota::default();
    let quota = WriteQuota {
        bytes: hook.size("quota_bytes", problems).unwrap_or(defaults.bytes),
        inodes: hook
            .number("quota_inodes", 1_000_000, problems)
            .unwrap_or(defaults.inodes),
    };
    let sha256 = pin(&mut hook, block.at, problems);
    let path = hook.required_string("path", problems);
    if let Some(path) = path.as_ref().filter(|p| !Path::new(p).is_absolute()) {
        let at = hook.attr("path").map(|v| v.at).unwrap_or(block.at);
        hook.problem(
            problems,
            "path",
            at,
            format!("{path:?} must be an absolute path"),
        );
    }
    let config = hook.string_map("config", problems);
    let timeout = hook
        .duration("timeout", problems)
        .unwrap_or(HookSpec::DEFAULT_TIMEOUT);
    let memory_max = match hook.size("memory_max", problems) {
        None => HookSpec::DEFAULT_MEMORY_MAX,
        Some(bytes) if (HookSpec::MEMORY_MAX_RANGE).contains(&bytes) => bytes as usize,
        Some(_) => {
            let at = hook.attr("memory_max").map(|a| a.at).unwrap_or_default();
            hook.problem(
                problems,
                "memory_max",
                at,
                "must be at least 1MiB and at most 4GiB".into(),
            );
            HookSpec::DEFAULT_MEMORY_MAX
        }
    };
    let on_failure_text = hook.string("on_failure", problems);
    let on_failure = match on_failure_text {
        None => Some(OnFailure::Fail),
        text => hook.choose(
            text,
            "on_failure",
            &[("fail", OnFailure::Fail), ("ignore", OnFailure::Ignore)],
            problems,
            |other| format!("unknown on_failure {other:?} (use \"fail\" or \"ignore\")"),
        ),
    };
    let all_tasks = hook.bool("all_tasks", problems).unwrap_or(false);
    hook.finish(problems);
    Some(HookSpec {
        name,
        path: PathBuf::from(path?),
        config,
        timeout,
        memory_max,
        on_failure: on_failure?,
        all_tasks,
        sha256,
        quota,
    })
}
