//! A group's or a task's `restart` block, over the job type's defaults.

use berth_hcl::fields::Fields;
use berth_hcl::tree::BlockNode;

use crate::spec::*;

/// A `restart` block; what it leaves out comes from `defaults` (Nomad's for the job type
/// in a group, the group's policy in a task).
pub(super) fn restart(
    parent: &str,
    block: &BlockNode,
    defaults: RestartPolicy,
    problems: &mut Findings,
) -> RestartPolicy {
    let mut fields = Fields::new(
        &block.body,
        format!("{parent}.restart"),
        block.at,
        &["attempts", "interval", "delay", "mode"],
    );
    let mode_text = fields.string("mode", problems);
    let mode = fields
        .choose(
            mode_text,
            "mode",
            &[("fail", RestartMode::Fail), ("delay", RestartMode::Delay)],
            problems,
            |other| format!("unknown restart mode {other:?} (use \"fail\" or \"delay\")"),
        )
        .unwrap_or(defaults.mode);
    let policy = RestartPolicy {
        attempts: fields
            .number("attempts", 1000, problems)
            .map(|n| n as u32)
            .unwrap_or(defaults.attempts),
        interval: fields
            .duration("interval", problems)
            .unwrap_or(defaults.interval),
        delay: fields.duration("delay", problems).unwrap_or(defaults.delay),
        mode,
    };
    fields.finish(problems);
    policy
}
