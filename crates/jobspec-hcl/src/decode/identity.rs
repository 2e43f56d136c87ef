//! A task's `identity` blocks (Nomad's workload identities).

use berth_hcl::Problem;
use berth_hcl::fields::Fields;
use berth_hcl::tree::BlockNode;

use crate::Findings;
use berth_jobspec::{Identity, IdentityChange};

pub(super) fn identities(
    parent: &str,
    blocks: Vec<&BlockNode>,
    problems: &mut Findings,
) -> Vec<Identity> {
    let mut out: Vec<Identity> = Vec::new();
    for block in blocks {
        let Some(identity) = identity(parent, block, problems) else {
            continue;
        };
        if out.iter().any(|i| i.name == identity.name) {
            problems.problems.push(Problem {
                path: format!("{parent}.identity"),
                at: Some(block.at),
                message: format!("a second identity named {:?}", identity.name),
            });
            continue;
        }
        out.push(identity);
    }
    out
}

fn identity(parent: &str, block: &BlockNode, problems: &mut Findings) -> Option<Identity> {
    let mut fields = Fields::new(
        &block.body,
        format!("{parent}.identity"),
        block.at,
        &[
            "name",
            "aud",
            "env",
            "file",
            "ttl",
            "change_mode",
            "change_signal",
            "filepath",
            "service_name",
        ],
    );
    let name = fields
        .string("name", problems)
        .unwrap_or_else(|| "default".into());
    // The name is part of an env var's name and a file's.
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        fields.problem_with(
            problems,
            "name",
            format!("identity name {name:?} may hold only letters, digits and _"),
        );
    }
    let mut audience = fields.string_list("aud", problems);
    if audience.is_empty() {
        if name == "default" {
            audience = vec!["nomad.io".into()];
        } else {
            fields.problem(
                problems,
                "aud",
                block.at,
                "is required for a named identity".into(),
            );
        }
    }
    let env = fields.bool("env", problems).unwrap_or(false);
    let file = fields.bool("file", problems).unwrap_or(false);
    let ttl = fields.duration("ttl", problems).filter(|t| !t.is_zero());
    if ttl.is_some_and(|t| t < std::time::Duration::from_secs(1)) {
        fields.problem_with(problems, "ttl", "must be at least 1s".into());
    }
    let signal = fields.string("change_signal", problems);
    let change_mode = match fields.string("change_mode", problems).as_deref() {
        None | Some("noop") => IdentityChange::Noop,
        Some("restart") => IdentityChange::Restart,
        Some("signal") => match signal {
            Some(signal) if berth_jobspec::template::is_signal(&signal) => {
                IdentityChange::Signal(signal)
            }
            other => {
                fields.problem_with(
                    problems,
                    "change_signal",
                    format!(
                        "change_mode = \"signal\" needs a change_signal berth sends (one of {}), \
                         not {other:?}",
                        berth_jobspec::template::SIGNALS.join(", ")
                    ),
                );
                IdentityChange::Noop
            }
        },
        Some(other) => {
            fields.problem_with(
                problems,
                "change_mode",
                format!("change_mode {other:?} is not noop, signal or restart"),
            );
            IdentityChange::Noop
        }
    };
    for refused in ["filepath", "service_name"] {
        if fields.attr(refused).is_some() {
            fields.problem_with(
                problems,
                refused,
                format!(
                    "{refused} is not supported: berth writes the token to the task's \
                     secrets/ (file = true) and signs no service identities"
                ),
            );
        }
    }
    fields.finish(problems);
    Some(Identity {
        name,
        audience,
        env,
        file,
        ttl,
        change_mode,
        at: block.at,
    })
}
