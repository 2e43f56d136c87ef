//! Nomad's constraint operators, checked against what a node says of itself. On a single
//! node a constraint either holds, or the job cannot run here: the message gives the
//! attribute's actual value.

use std::collections::BTreeMap;

use super::interpolate::interpolate;
use super::spec::{Constraint, Group, Job};

/// A constraint a node does not meet, and why.
#[derive(Debug)]
pub struct Unmet<'a> {
    pub constraint: &'a Constraint,
    pub why: ConstraintError,
}

/// The constraints of `job` that a node with `attributes` does not meet: the job's own
/// (`group` is `None`), or one group's and its tasks'. Each sees the node's attributes
/// and `meta.*` merged down to it (job, then group, then task, the later winning, as
/// Nomad merges them). The one feasibility check: a lone agent's validation and the
/// cluster's scheduler both ask it, with the node's attributes and its drivers
/// ([`with_drivers`]).
pub fn unmet<'a>(
    job: &'a Job,
    group: Option<&'a Group>,
    attributes: &BTreeMap<String, String>,
) -> Vec<Unmet<'a>> {
    let mut found = Vec::new();
    let mut check = |constraints: &'a [Constraint], meta: &[&[(String, String)]]| {
        // Most groups and tasks have none: the scheduler asks once per group and node.
        if constraints.is_empty() {
            return;
        }
        let mut names = attributes.clone();
        for (key, value) in meta.iter().flat_map(|m| m.iter()) {
            names.insert(format!("meta.{key}"), value.clone());
        }
        for constraint in constraints {
            if let Err(why) = check(constraint, &|n| names.get(n).cloned()) {
                found.push(Unmet { constraint, why });
            }
        }
    };
    match group {
        None => check(&job.constraints, &[&job.meta]),
        Some(group) => {
            check(&group.constraints, &[&job.meta, &group.meta]);
            for task in &group.tasks {
                check(&task.constraints, &[&job.meta, &group.meta, &task.meta]);
            }
        }
    }
    found
}

/// Whether a node of `datacenter` is one `job` may run in: one of its `datacenters`,
/// each a glob where `*` matches any run of characters (Nomad's). A job that names none
/// runs anywhere, as Nomad's default `["*"]`. Nodes outside are not evaluated at all.
pub fn in_datacenters(job: &Job, datacenter: &str) -> bool {
    job.datacenters.is_empty()
        || job
            .datacenters
            .iter()
            .any(|pattern| glob_matches(pattern, datacenter))
}

/// `*` matches any run of characters, everything else itself.
fn glob_matches(pattern: &str, text: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or("");
    let Some(mut rest) = text.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        // No `*`: the whole text.
        return rest.is_empty();
    };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

/// A node's `attributes` with `attr.driver.<name>` set for each of its `drivers`.
pub fn with_drivers<'d>(
    attributes: &BTreeMap<String, String>,
    drivers: impl IntoIterator<Item = &'d str>,
) -> BTreeMap<String, String> {
    let mut names = attributes.clone();
    for driver in drivers {
        names.insert(format!("attr.driver.{driver}"), "1".into());
    }
    names
}

/// Why a constraint does not hold here.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConstraintError {
    #[error("constraint {shown} is not met: this node has no {name}")]
    NoSuchAttribute { shown: String, name: String },
    #[error("constraint {shown} is not met: on this node it is {actual:?}")]
    Unmet { shown: String, actual: String },
    #[error("constraint {shown}: not a regular expression: {reason}")]
    BadRegex { shown: String, reason: String },
    #[error("constraint {shown}: {version:?} is not a version")]
    NotAVersion { shown: String, version: String },
    #[error("unknown constraint operator {0:?}")]
    UnknownOperator(String),
}

/// Whether `constraint` holds, with `lookup` resolving `${...}` names. `Err` says why not.
pub fn check(
    constraint: &Constraint,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<(), ConstraintError> {
    let operator = constraint.operator.as_str();
    if matches!(operator, "distinct_hosts" | "distinct_property") {
        // One node: every alloc is on a distinct host, and a property has one value.
        return Ok(());
    }
    let resolved = resolve(&constraint.attribute, lookup);
    let value = interpolate(&constraint.value, lookup);
    let shown = format!("{} {operator} {:?}", constraint.attribute, constraint.value);
    let Some(actual) = resolved else {
        return match operator {
            "is_not_set" => Ok(()),
            _ => Err(ConstraintError::NoSuchAttribute {
                shown,
                name: constraint
                    .attribute
                    .trim()
                    .trim_start_matches("${")
                    .trim_end_matches('}')
                    .to_string(),
            }),
        };
    };
    let holds = match operator {
        "is_set" => true,
        "is_not_set" => false,
        "=" | "==" | "is" => actual == value,
        "!=" | "not" => actual != value,
        "<" | "<=" | ">" | ">=" => {
            let ordering = match (actual.trim().parse::<f64>(), value.trim().parse::<f64>()) {
                (Ok(a), Ok(b)) => a.partial_cmp(&b),
                _ => Some(actual.as_str().cmp(value.as_str())),
            };
            ordering.is_some_and(|o| match operator {
                "<" => o.is_lt(),
                "<=" => o.is_le(),
                ">" => o.is_gt(),
                _ => o.is_ge(),
            })
        }
        "regexp" => regex::Regex::new(&value)
            .map_err(|e| ConstraintError::BadRegex {
                shown: shown.clone(),
                reason: e.to_string(),
            })?
            .is_match(&actual),
        "version" | "semver" => {
            version_matches(&actual, &value).map_err(|BadVersion(version)| {
                ConstraintError::NotAVersion {
                    shown: shown.clone(),
                    version,
                }
            })?
        }
        "set_contains" | "set_contains_all" | "set_contains_any" => {
            let set: Vec<&str> = actual.split(',').map(str::trim).collect();
            let mut wanted = value.split(',').map(str::trim).filter(|v| !v.is_empty());
            if operator == "set_contains_any" {
                wanted.any(|w| set.contains(&w))
            } else {
                wanted.all(|w| set.contains(&w))
            }
        }
        other => return Err(ConstraintError::UnknownOperator(other.to_string())),
    };
    if holds {
        Ok(())
    } else {
        Err(ConstraintError::Unmet { shown, actual })
    }
}

/// The attribute's value: `${attr.x}` resolved, `None` when the node has no such name.
fn resolve(attribute: &str, lookup: &dyn Fn(&str) -> Option<String>) -> Option<String> {
    let trimmed = attribute.trim();
    if let Some(name) = trimmed.strip_prefix("${").and_then(|n| n.strip_suffix('}'))
        && !name.contains("${")
    {
        return lookup(name.trim());
    }
    Some(interpolate(trimmed, lookup))
}

/// A version's numeric parts (`6.18.44`); `None` when `text` is not one.
fn parse_version(text: &str) -> Option<Vec<u64>> {
    let core = text.trim().trim_start_matches('v');
    let core = core.split(['-', '+']).next().unwrap_or("");
    let parts = core
        .split('.')
        .map(|part| part.parse::<u64>().ok())
        .collect::<Option<Vec<_>>>()?;
    (!parts.is_empty() && parts.len() <= 4).then_some(parts)
}

fn compare(a: &[u64], b: &[u64]) -> std::cmp::Ordering {
    let len = a.len().max(b.len());
    let at = |v: &[u64], i: usize| v.get(i).copied().unwrap_or(0);
    (0..len)
        .map(|i| at(a, i).cmp(&at(b, i)))
        .find(|o| o.is_ne())
        .unwrap_or(std::cmp::Ordering::Equal)
}

/// The text that is not a version.
struct BadVersion(String);

/// `actual` against a go-version constraint list: `>= 1.2, < 2.0`, `~> 1.4`, `= 6.1`.
fn version_matches(actual: &str, constraints: &str) -> Result<bool, BadVersion> {
    let version =
        |text: &str| parse_version(text).ok_or_else(|| BadVersion(text.trim().to_string()));
    let have = version(actual)?;
    for clause in constraints.split(',') {
        let clause = clause.trim();
        let (operator, wanted) = ["~>", ">=", "<=", "!=", ">", "<", "="]
            .iter()
            .find_map(|op| clause.strip_prefix(op).map(|rest| (*op, rest)))
            .unwrap_or(("=", clause));
        let want = version(wanted)?;
        let ordering = compare(&have, &want);
        let ok = match operator {
            "=" => ordering.is_eq(),
            "!=" => ordering.is_ne(),
            ">" => ordering.is_gt(),
            "<" => ordering.is_lt(),
            ">=" => ordering.is_ge(),
            "<=" => ordering.is_le(),
            // ~> 1.4 means >= 1.4, < 2; ~> 1.4.2 means >= 1.4.2, < 1.5.
            _ => {
                let upper = if want.len() == 1 {
                    vec![want[0] + 1]
                } else {
                    let mut upper = want[..want.len() - 1].to_vec();
                    if let Some(last) = upper.last_mut() {
                        *last += 1;
                    }
                    upper
                };
                ordering.is_ge() && compare(&have, &upper).is_lt()
            }
        };
        if !ok {
            return Ok(false);
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str) -> Option<String> {
        match name {
            "attr.kernel.name" => Some("linux".into()),
            "attr.kernel.version" => Some("6.18.44".into()),
            "attr.cpu.numcores" => Some("2".into()),
            "meta.tags" => Some("ssd, gpu-less, eu".into()),
            _ => None,
        }
    }

    fn holds(attribute: &str, operator: &str, value: &str) -> Result<(), String> {
        check(
            &Constraint {
                attribute: attribute.into(),
                operator: operator.into(),
                value: value.into(),
                at: Default::default(),
                path: String::new(),
            },
            &node,
        )
        .map_err(|e| e.to_string())
    }

    #[test]
    fn nomads_operators_on_this_nodes_values() {
        assert!(holds("${attr.kernel.name}", "=", "linux").is_ok());
        assert!(holds("${attr.cpu.numcores}", ">=", "2").is_ok());
        assert!(
            holds("${attr.cpu.numcores}", ">", "10").is_err(),
            "numbers, not text"
        );
        assert!(holds("${attr.kernel.name}", "regexp", "^lin").is_ok());
        assert!(holds("${attr.kernel.version}", "version", ">= 5.10, < 7").is_ok());
        assert!(holds("${attr.kernel.version}", "version", "~> 6.18.0").is_ok());
        assert!(holds("${attr.kernel.version}", "version", "~> 6.17.0").is_err());
        assert!(holds("${meta.tags}", "set_contains", "ssd,eu").is_ok());
        assert!(holds("${meta.tags}", "set_contains_any", "hdd,eu").is_ok());
        assert!(holds("${meta.rack}", "is_not_set", "").is_ok());
        assert!(holds("", "distinct_hosts", "true").is_ok());
    }

    #[test]
    fn datacenters_are_globs_and_none_means_any() {
        for (pattern, datacenter, matches) in [
            ("dc1", "dc1", true),
            ("dc1", "dc10", false),
            ("dc*", "dc10", true),
            ("*", "anything", true),
            ("eu-*-1a", "eu-west-1a", true),
            ("eu-*-1a", "eu-west-1b", false),
            ("*-1a", "1a", false),
            ("a*a", "a", false),
            ("a*a", "aa", true),
        ] {
            assert_eq!(
                glob_matches(pattern, datacenter),
                matches,
                "{pattern:?} against {datacenter:?}"
            );
        }
    }

    #[test]
    fn an_unmet_constraint_shows_the_actual_value() {
        assert_eq!(
            holds("${attr.kernel.name}", "=", "windows").unwrap_err(),
            "constraint ${attr.kernel.name} = \"windows\" is not met: on this node it is \"linux\""
        );
        assert_eq!(
            holds("${meta.rack}", "=", "r1").unwrap_err(),
            "constraint ${meta.rack} = \"r1\" is not met: this node has no meta.rack"
        );
    }
}
