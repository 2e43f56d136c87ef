//! Typed task config, strict by default.
//!
//! A task's `config` block reaches the driver as JSON. [`parse`] reads it into the
//! driver's own type and refuses what that type does not name, so a typo in a jobspec
//! (`mesage` for `message`) is an error at `job validate`, not a field silently ignored
//! while the task runs with its default. The error names the field in backquotes, which
//! the agent uses to point at the field's own line in the jobspec, and suggests the
//! closest field the type has:
//!
//! ```text
//! unknown field `mesage` (did you mean `message`?); this driver's config has: `message`, `repeat`
//! ```
//!
//! [`Driver::validate_task_config`](crate::Driver::validate_task_config) calls [`parse`]
//! with the driver's [`Driver::Config`](crate::Driver::Config), so a driver gets this by
//! declaring its config type. `start_task` reads the same type with [`of_task`].

use serde::de::DeserializeOwned;

mod schema;

/// The fields of a task's `config` block as `C` reads them, for the driver's
/// `config-schema` (what `berth driver inspect` shows): each with its HCL type and
/// whether a task must set it. `None` when `C` reads the block loosely (it is no struct).
#[cfg(feature = "driver")]
pub fn schema<C: DeserializeOwned>() -> Option<Vec<crate::ConfigField>> {
    let fields = schema::fields::<C>()?;
    Some(
        fields
            .into_iter()
            .map(|field| crate::ConfigField {
                name: field.name,
                hcl_type: field.hcl_type,
                required: field.required,
            })
            .collect(),
    )
}

/// The config of a driver that takes none: an empty `config` block, or none at all.
/// Any field in it is refused.
#[derive(Debug, Clone, Copy, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoConfig {}

/// Reads a task's `config` block (the JSON the host hands the driver) into `C`. Fields
/// `C` does not name are refused, with the closest name `C` has; wrong types and missing
/// fields are refused with serde's message. An empty string reads as `{}`.
pub fn parse<C: DeserializeOwned>(json: &str) -> Result<C, String> {
    let json = if json.trim().is_empty() { "{}" } else { json };
    let known = field_names::<C>();
    let mut unknown = None;
    let mut reader = serde_json::Deserializer::from_str(json);
    let parsed = serde_ignored::deserialize(&mut reader, |path| {
        unknown.get_or_insert_with(|| path.to_string());
    });
    // A typo of a required field makes serde say the field is missing; the typo is what
    // the user wrote, so it is named first.
    if let Some(field) = &unknown {
        return Err(unknown_field(field, known));
    }
    let parsed = parsed.map_err(|error| explain(&without_position(&error), known))?;
    reader.end().map_err(|error| without_position(&error))?;
    Ok(parsed)
}

/// serde_json's message without its " at line 1 column 9": the JSON is the agent's
/// rendering of the jobspec, so its positions mean nothing to the user (the agent places
/// the error in the jobspec itself).
fn without_position(error: &serde_json::Error) -> String {
    let message = error.to_string();
    let position = format!(" at line {} column {}", error.line(), error.column());
    match message.strip_suffix(&position) {
        Some(bare) => bare.to_string(),
        None => message,
    }
}

/// [`parse`] of a task's config, for `start_task`.
#[cfg(feature = "driver")]
pub fn of_task<C: DeserializeOwned>(config: &crate::TaskConfig) -> Result<C, String> {
    parse(&config.config)
}

/// The message for a field `C` does not have: its name in backquotes first (the agent
/// places the error at that field's line), then the suggestion and the fields there are.
fn unknown_field(field: &str, known: &[&str]) -> String {
    let mut message = format!("unknown field `{field}`");
    // A nested field (`mounts.0.sorce`) is suggested among the top level's names only
    // when its last part is close to one, which it rarely is; say what we know.
    let last = field.rsplit('.').next().unwrap_or(field);
    if let Some(closest) = closest(last, known) {
        message.push_str(&format!(" (did you mean `{closest}`?)"));
    }
    if known.is_empty() {
        message.push_str("; this driver takes no config");
    } else if !field.contains('.') {
        let names: Vec<String> = known.iter().map(|name| format!("`{name}`")).collect();
        message.push_str(&format!("; this driver's config has: {}", names.join(", ")));
    }
    message
}

/// A serde error, with a suggestion when it is serde's own "unknown field" (a config
/// type with `#[serde(deny_unknown_fields)]`, or a nested one).
fn explain(error: &str, known: &[&str]) -> String {
    let Some(rest) = error.strip_prefix("unknown field `") else {
        return error.to_string();
    };
    let Some((field, expected)) = rest.split_once("`, expected ") else {
        return error.to_string();
    };
    // serde lists what it expected as `a`, `a` or `b`, or one of `a`, `b`, `c`.
    let expected: Vec<&str> = expected.split('`').skip(1).step_by(2).collect();
    let candidates = if expected.is_empty() {
        known
    } else {
        &expected
    };
    match closest(field, candidates) {
        Some(closest) => format!("{error} (did you mean `{closest}`?)"),
        None => error.to_string(),
    }
}

/// Past this length a name is not a typo of a field, and comparing it would cost a
/// job author's megabyte key times every field name of the driver's call time.
const MAX_SUGGESTED_FROM: usize = 64;

/// The candidate a typo most likely meant: the nearest by edit distance, if it is near
/// enough to be a typo rather than another word.
fn closest<'a>(typed: &str, candidates: &[&'a str]) -> Option<&'a str> {
    if typed.len() > MAX_SUGGESTED_FROM {
        return None;
    }
    let (distance, best) = candidates
        .iter()
        .map(|candidate| (strsim::damerau_levenshtein(typed, candidate), *candidate))
        .min_by_key(|(distance, _)| *distance)?;
    let allowed = (typed.chars().count().max(best.chars().count()) / 3).max(1);
    (distance <= allowed).then_some(best)
}

/// The field names of `C` when it is a struct (what `#[derive(Deserialize)]` declares),
/// or none.
fn field_names<C: DeserializeOwned>() -> &'static [&'static str] {
    schema::struct_fields::<C>().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize, PartialEq)]
    struct Echo {
        message: String,
        #[serde(default)]
        repeat: u32,
    }

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code, reason = "read by serde only")]
    struct Strict {
        command: String,
        args: Vec<String>,
    }

    #[test]
    fn a_config_that_names_only_known_fields_is_read() {
        let echo: Echo = parse(r#"{"message": "hi", "repeat": 2}"#).unwrap();
        assert_eq!(
            echo,
            Echo {
                message: "hi".into(),
                repeat: 2
            }
        );
    }

    #[test]
    fn a_typo_is_refused_with_the_field_first_and_the_closest_name() {
        let error = parse::<Echo>(r#"{"mesage": "hi"}"#).unwrap_err();
        assert!(error.starts_with("unknown field `mesage`"), "{error}");
        assert!(error.contains("did you mean `message`?"), "{error}");
        assert!(error.contains("`message`, `repeat`"), "{error}");
    }

    #[test]
    fn a_typo_of_a_required_field_is_named_as_the_typo_not_as_a_missing_field() {
        let error = parse::<Echo>(r#"{"mesage": "hi", "repeat": 1}"#).unwrap_err();
        assert!(error.starts_with("unknown field `mesage`"), "{error}");
        assert!(error.contains("did you mean `message`?"), "{error}");
    }

    #[test]
    fn a_missing_field_is_named() {
        let error = parse::<Echo>(r#"{"repeat": 1}"#).unwrap_err();
        assert!(error.contains("missing field `message`"), "{error}");
    }

    #[test]
    fn a_field_unlike_any_gets_no_suggestion() {
        let error = parse::<Echo>(r#"{"message": "hi", "colour": "red"}"#).unwrap_err();
        assert!(error.starts_with("unknown field `colour`;"), "{error}");
        assert!(!error.contains("did you mean"), "{error}");
    }

    #[test]
    fn serdes_own_refusal_gets_the_suggestion_too_and_no_json_position() {
        let error = parse::<Strict>(r#"{"comand": "/bin/true", "args": []}"#).unwrap_err();
        assert_eq!(
            error,
            "unknown field `comand`, expected `command` or `args` (did you mean `command`?)"
        );
    }

    #[test]
    fn no_config_takes_an_empty_block_and_refuses_any_field() {
        parse::<NoConfig>("").unwrap();
        parse::<NoConfig>("{}").unwrap();
        let error = parse::<NoConfig>(r#"{"command": "x"}"#).unwrap_err();
        assert!(error.starts_with("unknown field `command`"), "{error}");
    }

    #[test]
    fn a_huge_unknown_field_is_refused_without_a_suggestion() {
        let key = "m".repeat(1 << 20);
        let error = parse::<Echo>(&format!(r#"{{"message": "hi", "{key}": 1}}"#)).unwrap_err();
        assert!(error.starts_with("unknown field `mmmm"), "{}", &error[..40]);
        assert!(!error.contains("did you mean"));
    }

    #[test]
    fn a_wrong_type_is_serdes_message() {
        let error = parse::<Echo>(r#"{"message": 3}"#).unwrap_err();
        assert_eq!(error, "invalid type: integer `3`, expected a string");
    }

    #[test]
    fn json_config_passes_through_when_the_driver_reads_it_loosely() {
        let value: serde_json::Value = parse(r#"{"anything": [1, 2]}"#).unwrap();
        assert_eq!(value["anything"][1], 2);
    }
}
