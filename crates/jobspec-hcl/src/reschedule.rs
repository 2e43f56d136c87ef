//! The `reschedule` block, at job and group level: each field written is kept apart
//! from the ones left out, so that the group's block overrides the job's field by
//! field, and both override Nomad's defaults for the job type (Nomad's `Merge`).
//!
//! The scheduler acts on the merged policy (`cluster/scheduler/reschedule.rs`), on a
//! lone agent's one-node cluster too.

use std::time::Duration;

use crate::Findings;
use berth_hcl::Problem;
use berth_hcl::fields::Fields;
use berth_hcl::tree::BlockNode;
use berth_jobspec::{DelayFunction, ReschedulePolicy};

/// Nomad refuses a shorter delay: a failing alloc is not placed again in a tight loop.
pub const MIN_DELAY: Duration = Duration::from_secs(5);

/// The most attempts one interval may allow (each leaves an event on the replacement).
const MAX_ATTEMPTS: u64 = 100;

/// The fields one `reschedule` block writes; `None`: left to the level below.
#[derive(Debug, Clone, Default)]
pub(super) struct Written {
    attempts: Option<u32>,
    interval: Option<Duration>,
    delay: Option<Duration>,
    delay_function: Option<DelayFunction>,
    max_delay: Option<Duration>,
    unlimited: Option<bool>,
}

/// Reads the `reschedule` block of `fields` (a job's or a group's), if it has one: its
/// fields as written, and a warning for a system or sysbatch job (`runs_everywhere`),
/// which no scheduler reschedules. Every other job is rescheduled as it says, a lone
/// agent's too (its one-node cluster places a failed alloc again on itself).
pub(super) fn written(
    fields: &mut Fields,
    runs_everywhere: bool,
    problems: &mut Findings,
) -> Written {
    let Some(block) = fields.single_block("reschedule", problems) else {
        return Written::default();
    };
    let path = format!("{}.reschedule", fields.path);
    if runs_everywhere {
        problems.warnings.push(Problem {
            path: path.clone(),
            at: Some(block.at),
            message: "reschedule has no effect on system or sysbatch jobs: they run on every \
                      node"
                .into(),
        });
    }
    block_fields(&path, block, problems)
}

fn block_fields(path: &str, block: &BlockNode, problems: &mut Findings) -> Written {
    let mut fields = Fields::new(
        &block.body,
        path.to_string(),
        block.at,
        &[
            "attempts",
            "interval",
            "delay",
            "delay_function",
            "max_delay",
            "unlimited",
        ],
    );
    let function_text = fields.string("delay_function", problems);
    let written = Written {
        attempts: fields
            .number("attempts", MAX_ATTEMPTS, problems)
            .map(|n| n as u32),
        interval: fields.duration("interval", problems),
        delay: fields.duration("delay", problems),
        delay_function: fields.choose(
            function_text,
            "delay_function",
            &[
                ("constant", DelayFunction::Constant),
                ("exponential", DelayFunction::Exponential),
                ("fibonacci", DelayFunction::Fibonacci),
            ],
            problems,
            |other| {
                format!(
                    "unknown delay_function {other:?} (use \"constant\", \"exponential\" or \
                     \"fibonacci\")"
                )
            },
        ),
        max_delay: fields.duration("max_delay", problems),
        unlimited: fields.bool("unlimited", problems),
    };
    if written.delay.is_some_and(|d| d < MIN_DELAY) {
        fields.problem_with(
            problems,
            "delay",
            format!(
                "a reschedule delay cannot be less than {}s",
                MIN_DELAY.as_secs()
            ),
        );
    }
    fields.finish(problems);
    written
}

/// The group's policy: `defaults` (Nomad's for the job type), then the job's block, then
/// the group's, field by field. A policy that is enabled is checked as Nomad checks it,
/// at `path` (the group).
pub(super) fn merged(
    path: &str,
    defaults: ReschedulePolicy,
    job: &Written,
    group: &Written,
    problems: &mut Findings,
) -> ReschedulePolicy {
    let mut policy = defaults;
    for level in [job, group] {
        policy.attempts = level.attempts.unwrap_or(policy.attempts);
        policy.interval = level.interval.unwrap_or(policy.interval);
        policy.delay = level.delay.unwrap_or(policy.delay);
        policy.delay_function = level.delay_function.unwrap_or(policy.delay_function);
        policy.max_delay = level.max_delay.unwrap_or(policy.max_delay);
        policy.unlimited = level.unlimited.unwrap_or(policy.unlimited);
    }
    if !policy.enabled() {
        return policy;
    }
    let mut problem = |message: String| {
        problems.push(Problem {
            path: format!("{path}.reschedule"),
            at: None,
            message,
        })
    };
    if policy.delay_function != DelayFunction::Constant && policy.max_delay < policy.delay {
        problem(format!(
            "max_delay ({}s) cannot be less than delay ({}s) with a {} delay_function",
            policy.max_delay.as_secs(),
            policy.delay.as_secs(),
            match policy.delay_function {
                DelayFunction::Exponential => "exponential",
                _ => "fibonacci",
            }
        ));
    }
    if !policy.unlimited && policy.interval.is_zero() {
        problem(format!(
            "interval must be set for {} limited attempts (or set unlimited = true)",
            policy.attempts
        ));
    }
    policy
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::parse;
    use berth_jobspec::{DelayFunction, JobType, ReschedulePolicy};

    fn jobspec(job_type: &str, job_block: &str, group_block: &str) -> String {
        format!(
            "job \"j\" {{\n  type = \"{job_type}\"\n  {job_block}\n  group \"g\" {{\n    \
             {group_block}\n    task \"t\" {{\n      driver = \"exec\"\n      config {{\n        \
             command = \"/bin/true\"\n      }}\n    }}\n  }}\n}}\n"
        )
    }

    fn policy(job_type: &str, job_block: &str, group_block: &str) -> ReschedulePolicy {
        let job = parse("j.hcl", &jobspec(job_type, job_block, group_block)).unwrap();
        job.groups[0].reschedule.clone()
    }

    fn problems(job_type: &str, job_block: &str, group_block: &str) -> String {
        parse("j.hcl", &jobspec(job_type, job_block, group_block))
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn without_a_block_a_group_has_nomads_defaults_for_its_job_type() {
        assert_eq!(
            policy("service", "", ""),
            ReschedulePolicy::default_for(JobType::Service)
        );
        let batch = policy("batch", "", "");
        assert_eq!(
            (batch.attempts, batch.interval, batch.delay, batch.unlimited),
            (
                1,
                Duration::from_secs(24 * 3600),
                Duration::from_secs(5),
                false
            )
        );
        assert!(!policy("system", "", "").enabled());
    }

    #[test]
    fn the_groups_fields_override_the_jobs_which_override_the_defaults() {
        let merged = policy(
            "service",
            "reschedule {\n    attempts = 3\n    interval = \"1h\"\n    delay = \"10s\"\n    unlimited = false\n  }",
            "reschedule {\n      delay = \"20s\"\n      delay_function = \"fibonacci\"\n    }",
        );
        assert_eq!(
            merged,
            ReschedulePolicy {
                attempts: 3,
                interval: Duration::from_secs(3600),
                delay: Duration::from_secs(20),
                delay_function: DelayFunction::Fibonacci,
                max_delay: Duration::from_secs(3600),
                unlimited: false,
            }
        );
        let off = policy(
            "service",
            "",
            "reschedule {\n  attempts = 0\n  unlimited = false\n}",
        );
        assert!(!off.enabled());
    }

    #[test]
    fn a_block_is_checked_as_nomad_checks_it() {
        let short = problems("batch", "", "reschedule {\n  delay = \"1s\"\n}");
        assert!(
            short.contains("reschedule.delay: a reschedule delay cannot be less than 5s"),
            "{short}"
        );
        let unknown = problems(
            "batch",
            "",
            "reschedule {\n  delay_function = \"linear\"\n}",
        );
        assert!(
            unknown.contains("unknown delay_function \"linear\""),
            "{unknown}"
        );
        let ceiling = problems(
            "service",
            "reschedule {\n  delay = \"1m\"\n  max_delay = \"30s\"\n}",
            "",
        );
        assert!(
            ceiling.contains("max_delay (30s) cannot be less than delay (60s)"),
            "{ceiling}"
        );
        let unknown_field = problems("batch", "", "reschedule {\n  tries = 2\n}");
        assert!(
            unknown_field.contains("unknown field \"tries\""),
            "{unknown_field}"
        );
    }

    #[test]
    fn a_reschedule_block_draws_no_warning_where_it_acts() {
        let job = parse(
            "j.hcl",
            &jobspec("batch", "reschedule {\n  attempts = 2\n}", ""),
        )
        .unwrap();
        assert!(job.warnings.is_empty(), "{:?}", job.warnings);
    }
}
