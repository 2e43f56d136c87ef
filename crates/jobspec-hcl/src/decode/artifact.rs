//! An `artifact` block.

use crate::Findings;
use berth_hcl::fields::Fields;
use berth_hcl::tree::BlockNode;
use berth_jobspec::artifact::{Artifact, OPTIONS};
use berth_jobspec::fields as schema;

/// An `artifact` block: checked now as far as it can be before the task's names are
/// known (a `${...}` in a field leaves that field to the fetch).
pub(super) fn artifact(
    parent: &str,
    block: &BlockNode,
    problems: &mut Findings,
) -> Option<Artifact> {
    use schema::artifact as f;
    let mut fields = Fields::new(
        &block.body,
        format!("{parent}.artifact"),
        block.at,
        &[
            f::SOURCE.hcl,
            f::DESTINATION.hcl,
            f::MODE.hcl,
            f::OPTIONS.hcl,
            f::HEADERS.hcl,
            f::CHOWN.hcl,
        ],
    );
    let source = fields.required_string(f::SOURCE.hcl, problems);
    let destination = fields
        .string(f::DESTINATION.hcl, problems)
        .unwrap_or_else(|| "local/".into());
    let mode = fields
        .string(f::MODE.hcl, problems)
        .unwrap_or_else(|| "any".into());
    let options = fields.string_map(f::OPTIONS.hcl, problems);
    let headers = fields.string_map(f::HEADERS.hcl, problems);
    let chown = fields.bool(f::CHOWN.hcl, problems).unwrap_or(false);
    let artifact = Artifact {
        source: source?,
        destination,
        mode,
        options,
        headers,
        chown,
        at: block.at,
    };
    // The task's directories have their task-relative names; any other name is known
    // only when the task starts.
    let unknown_names = |s: &str| berth_jobspec::artifact::task_relative(s).contains("${");
    let later = unknown_names(&artifact.source)
        || unknown_names(&artifact.destination)
        || artifact
            .options
            .iter()
            .chain(&artifact.headers)
            .any(|(_, v)| unknown_names(v));
    let checked = if later {
        // What needs no name: the mode and the option names.
        let mut blank = artifact.clone();
        blank.source = "http://h/f".into();
        blank.destination = "local".into();
        blank
            .options
            .retain(|(k, _)| !OPTIONS.contains(&k.as_str()));
        blank.headers.clear();
        if blank.mode == "dir" || blank.mode == "file" {
            blank.mode = "any".into();
        }
        blank.plan(&|s: &str| s.to_string()).map(|_| ())
    } else {
        artifact.plan(&|s: &str| s.to_string()).map(|_| ())
    };
    if let Err(problem) = checked {
        fields.problem_with(problems, problem.field(), problem.to_string());
    }
    fields.finish(problems);
    Some(artifact)
}
