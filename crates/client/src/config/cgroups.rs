//! The agent config's `cgroups` block.

use berth_hcl::Problem;
use berth_hcl::fields::Fields;
use berth_hcl::tree::BlockNode;
use berth_model::limits::CgroupSettings;

use berth_jobspec::names::{NameKind, check_name};

pub(super) fn cgroup_settings(block: &BlockNode, problems: &mut Vec<Problem>) -> CgroupSettings {
    let mut fields = Fields::new(
        &block.body,
        "config.cgroups".into(),
        block.at,
        &[
            "parent",
            "pids_max",
            "all_tasks_pids_max",
            "job_pids_max",
            "allow_missing_controllers",
            "favor_dynmods",
        ],
    );
    let defaults = CgroupSettings::default();
    let parent = fields.string("parent", problems).unwrap_or(defaults.parent);
    let parent_ok = !parent.is_empty()
        && parent
            .split('/')
            .all(|part| check_name(NameKind::Job, part).is_ok());
    if !parent_ok {
        fields.problem_with(
            problems,
            "parent",
            format!(
                "{parent:?} is not a cgroup path berth can use: names of letters, digits, \
                 '.', '_' and '-', separated by '/'"
            ),
        );
    }
    let pids_max = fields
        .number("pids_max", 4_194_304, problems)
        .unwrap_or(defaults.pids_max);
    if pids_max < 8 {
        fields.problem_with(
            problems,
            "pids_max",
            format!("{pids_max} is too few processes for any task (at least 8)"),
        );
    }
    let all_tasks_pids_max = fields.number("all_tasks_pids_max", 4_194_304, problems);
    if let Some(max) = all_tasks_pids_max.filter(|max| *max < pids_max) {
        fields.problem_with(
            problems,
            "all_tasks_pids_max",
            format!("{max} is fewer processes than one task may have (pids_max = {pids_max})"),
        );
    }
    let job_pids_max = fields.number("job_pids_max", 4_194_304, problems);
    if let Some(max) = job_pids_max.filter(|max| *max < pids_max) {
        fields.problem_with(
            problems,
            "job_pids_max",
            format!("{max} is fewer processes than one task may have (pids_max = {pids_max})"),
        );
    }
    if let (Some(job), Some(all)) = (job_pids_max, all_tasks_pids_max)
        && job > all
    {
        fields.problem_with(
            problems,
            "job_pids_max",
            format!("{job} is more processes than all tasks together may have (all_tasks_pids_max = {all})"),
        );
    }
    let allow_missing_controllers = fields
        .bool("allow_missing_controllers", problems)
        .unwrap_or(false);
    let favor_dynmods = fields.bool("favor_dynmods", problems).unwrap_or(false);
    fields.finish(problems);
    CgroupSettings {
        parent,
        pids_max,
        all_tasks_pids_max,
        job_pids_max,
        allow_missing_controllers,
        favor_dynmods,
    }
}
