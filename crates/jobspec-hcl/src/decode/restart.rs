//! A group's or a task's `restart` block, over the job type's defaults.

use berth_hcl::fields::Fields;
use berth_hcl::tree::BlockNode;
use berth_jobspec::fields as schema;

use crate::Findings;
use berth_jobspec::*;

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
        &[
            schema::restart::ATTEMPTS.hcl,
            schema::restart::INTERVAL.hcl,
            schema::restart::DELAY.hcl,
            schema::restart::MODE.hcl,
        ],
    );
    let mode_text = fields.string(schema::restart::MODE.hcl, problems);
    let mode = fields
        .choose(
            mode_text,
            schema::restart::MODE.hcl,
            &[
                ("fail", RestartMode::Fail),
                (schema::restart::DELAY.hcl, RestartMode::Delay),
            ],
            problems,
            |other| format!("unknown restart mode {other:?} (use \"fail\" or \"delay\")"),
        )
        .unwrap_or(defaults.mode);
    let policy = RestartPolicy {
        attempts: fields
            .number(schema::restart::ATTEMPTS.hcl, 1000, problems)
            .map(|n| n as u32)
            .unwrap_or(defaults.attempts),
        interval: fields
            .duration(schema::restart::INTERVAL.hcl, problems)
            .unwrap_or(defaults.interval),
        delay: fields
            .duration(schema::restart::DELAY.hcl, problems)
            .unwrap_or(defaults.delay),
        mode,
    };
    fields.finish(problems);
    policy
}
