//! The `job` block: the entry point of decoding, with the job's `periodic` and
//! `parameterized` blocks.

use berth_hcl::Location;
use berth_hcl::Problem;
use berth_hcl::fields::Fields;
use berth_hcl::tree::{BlockNode, BodyNode};
use berth_jobspec::fields as schema;

use super::check_label;
use super::constraints::constraints;
use super::group::group;
use super::ignored::{
    JOB_SCHEDULER_LEVEL, JOB_UNSUPPORTED, PLACEMENT, scheduler_level, unsupported, written,
};
use crate::Findings;
use crate::reschedule;
use berth_jobspec::names::NameKind;
use berth_jobspec::*;

pub(crate) fn job(tree: &BodyNode, problems: &mut Findings) -> Option<Job> {
    let mut top = Fields::new(tree, "jobspec".into(), Location::default(), &["job"]);
    let jobs = top.labeled_blocks("job", problems);
    top.finish(problems);
    let [(name, block)] = jobs.as_slice() else {
        if jobs.len() > 1 {
            problems.push(Problem {
                path: "jobspec".into(),
                at: Some(jobs[1].1.at),
                message: "a jobspec holds exactly one job".into(),
            });
        } else if problems.is_empty() {
            problems.push(Problem {
                path: "jobspec".into(),
                at: None,
                message: "no job block found: a jobspec starts with job \"name\" { ... }".into(),
            });
        }
        return None;
    };
    let path = format!("job.{name}");
    check_label(NameKind::Job, name, &path, block.at, problems);
    let mut fields = Fields::new(
        &block.body,
        path.clone(),
        block.at,
        &[
            schema::job::TYPE.hcl,
            schema::job::DATACENTERS.hcl,
            schema::job::META.hcl,
            schema::job::GROUP.hcl,
            "region",
            "namespace",
            "priority",
            schema::job::CONSTRAINT.hcl,
            "affinity",
            "spread",
            "update",
            "migrate",
            "reschedule",
            "multiregion",
            "all_at_once",
            "node_pool",
            "ui",
            "consul",
            "vault",
            "vault_token",
            "consul_token",
            schema::job::PERIODIC.hcl,
            schema::job::PARAMETERIZED.hcl,
            "id",
            "name",
        ],
    );
    let job_type_text = fields.string(schema::job::TYPE.hcl, problems);
    let job_type = fields
        .choose(
            job_type_text,
            schema::job::TYPE.hcl,
            &[
                ("service", JobType::Service),
                ("batch", JobType::Batch),
                ("system", JobType::System),
                ("sysbatch", JobType::SysBatch),
            ],
            problems,
            |other| {
                format!(
                    "unknown job type {other:?} (use \"service\", \"batch\", \"system\" or \
                     \"sysbatch\")"
                )
            },
        )
        .unwrap_or(JobType::Service);
    scheduler_level(&mut fields, &block.body, PLACEMENT, problems);
    scheduler_level(&mut fields, &block.body, JOB_SCHEDULER_LEVEL, problems);
    unsupported(&mut fields, &block.body, JOB_UNSUPPORTED, problems);
    let periodic = fields
        .single_block(schema::job::PERIODIC.hcl, problems)
        .and_then(|b| periodic(&path, b, problems));
    let parameterized = fields
        .single_block(schema::job::PARAMETERIZED.hcl, problems)
        .and_then(|b| parameterized(&path, b, problems));
    if let (Some(_), Some(_)) = (&periodic, &parameterized) {
        fields.problem(
            problems,
            schema::job::PARAMETERIZED.hcl,
            written(&block.body, schema::job::PARAMETERIZED.hcl).unwrap_or(block.at),
            "a job is periodic or parameterized, not both".into(),
        );
    }
    if (periodic.is_some() || parameterized.is_some())
        && !job_type.runs_to_completion()
        && !fields.failed(schema::job::TYPE.hcl)
    {
        fields.problem_with(
            problems,
            schema::job::TYPE.hcl,
            "periodic and parameterized jobs must be of type \"batch\" or \"sysbatch\", as \
             in Nomad"
                .into(),
        );
    }
    for ignored in ["vault_token", "consul_token", "id", "name", "node_pool"] {
        fields.string(ignored, problems);
    }
    let constraints = constraints(&mut fields, problems);
    let datacenters = fields.string_list(schema::job::DATACENTERS.hcl, problems);
    let meta = fields.string_map(schema::job::META.hcl, problems);
    for ignored in ["region", "namespace"] {
        fields.string(ignored, problems);
    }
    fields.number("priority", 100, problems);
    let job_reschedule = reschedule::written(&mut fields, job_type.per_node(), problems);
    let groups: Vec<Group> = fields
        .labeled_blocks(schema::job::GROUP.hcl, problems)
        .into_iter()
        .map(|(name, block)| group(&path, &name, block, (job_type, &job_reschedule), problems))
        .collect();
    // A job asks for at most MAX_JOB_ALLOCS allocs in all: each group may count 10,000,
    // and dynamic groups multiply them (attack review: 1,000 groups of 10,000).
    let asked: u64 = groups.iter().map(|g| u64::from(g.count)).sum();
    if asked > MAX_JOB_ALLOCS {
        fields.problem(
            problems,
            "",
            block.at,
            format!(
                "the job's groups ask for {asked} allocs in all; a job may ask for at most \
                 {MAX_JOB_ALLOCS}"
            ),
        );
    }
    if groups.is_empty() && !block.body.writes_block(schema::job::GROUP.hcl) {
        fields.problem(
            problems,
            "",
            block.at,
            "a job needs at least one group".into(),
        );
    }
    fields.finish(problems);
    Some(Job {
        name: name.clone(),
        job_type,
        datacenters,
        meta,
        constraints,
        groups,
        periodic,
        parameterized,
        parent: None,
        payload: None,
        warnings: Vec::new(),
        submitted_by_operator: false,
    })
}

/// The most cron expressions one `periodic` block holds (each is evaluated for every
/// launch time).
pub(super) const MAX_CRONS: usize = 32;

/// The most allocs one job asks for, its groups' counts summed (a group's own `count`
/// is at most 10,000 too).
pub const MAX_JOB_ALLOCS: u64 = 10_000;

pub(super) fn periodic(
    parent: &str,
    block: &BlockNode,
    problems: &mut Findings,
) -> Option<Periodic> {
    let mut fields = Fields::new(
        &block.body,
        format!("{parent}.periodic"),
        block.at,
        &[
            "cron",
            schema::periodic::CRONS.hcl,
            schema::periodic::PROHIBIT_OVERLAP.hcl,
            "time_zone",
            schema::periodic::ENABLED.hcl,
        ],
    );
    let mut crons = fields.string_list(schema::periodic::CRONS.hcl, problems);
    crons.extend(fields.string("cron", problems));
    if crons.is_empty() && !fields.failed("cron") && !fields.failed(schema::periodic::CRONS.hcl) {
        fields.problem(
            problems,
            schema::periodic::CRONS.hcl,
            block.at,
            "a periodic block needs cron or crons".into(),
        );
    }
    let written_as = if fields.attr("cron").is_some() {
        "cron"
    } else {
        schema::periodic::CRONS.hcl
    };
    if crons.len() > MAX_CRONS {
        fields.problem_with(
            problems,
            written_as,
            format!(
                "{} cron expressions; a periodic block has at most {MAX_CRONS}",
                crons.len()
            ),
        );
        crons.truncate(MAX_CRONS);
    }
    for text in &crons {
        if let Err(error) = text.parse::<berth_jobspec::cron::CronSpec>() {
            fields.problem_with(
                problems,
                written_as,
                format!("{text:?} is not a cron expression: {error}"),
            );
        }
    }
    if let Some(zone) = fields.string("time_zone", problems)
        && !matches!(zone.as_str(), "UTC" | "Etc/UTC" | "")
    {
        fields.problem_with(
            problems,
            "time_zone",
            format!("time zone {zone:?} is not supported: berth launches periodic jobs in UTC"),
        );
    }
    let prohibit_overlap = fields
        .bool(schema::periodic::PROHIBIT_OVERLAP.hcl, problems)
        .unwrap_or(false);
    let enabled = fields
        .bool(schema::periodic::ENABLED.hcl, problems)
        .unwrap_or(true);
    fields.finish(problems);
    Some(Periodic {
        crons,
        prohibit_overlap,
        enabled,
    })
}

pub(super) fn parameterized(
    parent: &str,
    block: &BlockNode,
    problems: &mut Findings,
) -> Option<Parameterized> {
    let mut fields = Fields::new(
        &block.body,
        format!("{parent}.parameterized"),
        block.at,
        &[
            schema::parameterized::PAYLOAD.hcl,
            schema::parameterized::META_REQUIRED.hcl,
            schema::parameterized::META_OPTIONAL.hcl,
        ],
    );
    let payload_text = fields.string(schema::parameterized::PAYLOAD.hcl, problems);
    let payload = fields
        .choose(
            payload_text,
            schema::parameterized::PAYLOAD.hcl,
            &[
                ("optional", PayloadRule::Optional),
                ("required", PayloadRule::Required),
                ("forbidden", PayloadRule::Forbidden),
            ],
            problems,
            |other| {
                format!(
                    "unknown payload rule {other:?} (use \"optional\", \"required\" or \
                     \"forbidden\")"
                )
            },
        )
        .unwrap_or(PayloadRule::Optional);
    let meta_required = fields.string_list(schema::parameterized::META_REQUIRED.hcl, problems);
    let meta_optional = fields.string_list(schema::parameterized::META_OPTIONAL.hcl, problems);
    fields.finish(problems);
    Some(Parameterized {
        payload,
        meta_required,
        meta_optional,
    })
}
