//! `template` blocks: consul-template's `{{ }}` syntax, of which berth renders what a
//! single node has, `{{ env "NAME" }}` (the task's environment), and comments. Anything
//! else (`key`, `service`, `secret`, `range`, …) needs Consul or Vault and is refused at
//! submit time with its name, rather than rendered wrong.

/// Why a template cannot be rendered or placed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    #[error("a template action {{{{ is never closed with }}}}")]
    Unclosed,
    #[error("{{{{ {action} }}}}: env takes one quoted name, as {{{{ env \"HOME\" }}}}")]
    EnvArgument { action: String },
    #[error(
        "{{{{ {action} }}}}: template function {function:?} is not supported (berth renders \
         {{{{ env \"NAME\" }}}} and comments; {function} needs Consul, Vault or Nomad's servers)"
    )]
    Unsupported { action: String, function: String },
    #[error(
        "{0:?} must be a file in the task's local/ or secrets/ directory (as \
         \"local/app.conf\" or \"${{NOMAD_SECRETS_DIR}}/token\")"
    )]
    Destination(String),
    #[error("line {line} is not KEY=value: {text:?}")]
    EnvLine { line: usize, text: String },
}

/// Checks `data` renders with berth's subset.
pub fn check(data: &str) -> Result<(), TemplateError> {
    render(data, &|_| None).map(|_| ())
}

/// Renders `data`, with `env(name)` for `{{ env "name" }}` (unset: empty, as
/// consul-template does).
pub fn render(data: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<String, TemplateError> {
    let mut out = String::with_capacity(data.len());
    let mut rest = data;
    while let Some(start) = rest.find("{{") {
        let mut before = &rest[..start];
        let after = &rest[start + 2..];
        let end = after.find("}}").ok_or(TemplateError::Unclosed)?;
        let mut action = &after[..end];
        let mut next = &after[end + 2..];
        // `{{-` and `-}}` trim the white space beside them.
        if let Some(trimmed) = action.strip_prefix('-') {
            action = trimmed;
            before = before.trim_end();
        }
        if let Some(trimmed) = action.strip_suffix('-') {
            action = trimmed;
            next = next.trim_start();
        }
        out.push_str(before);
        out.push_str(&evaluate(action.trim(), env)?);
        rest = next;
    }
    out.push_str(rest);
    Ok(out)
}

fn evaluate(action: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<String, TemplateError> {
    if action.starts_with("/*") && action.ends_with("*/") {
        return Ok(String::new());
    }
    if let Some(argument) = action.strip_prefix("env ") {
        let name = argument.trim();
        let name = name
            .strip_prefix('"')
            .and_then(|n| n.strip_suffix('"'))
            .filter(|n| !n.contains('"'))
            .ok_or_else(|| TemplateError::EnvArgument {
                action: action.to_string(),
            })?;
        return Ok(env(name).unwrap_or_default());
    }
    let function = action.split_whitespace().next().unwrap_or("");
    Err(TemplateError::Unsupported {
        action: action.to_string(),
        function: function.to_string(),
    })
}

/// The destination relative to the task's directory: `local/app.conf`, from that or
/// `${NOMAD_TASK_DIR}/app.conf` or `${NOMAD_SECRETS_DIR}/x`. It must stay in the task's
/// `local/` or `secrets/` directory.
pub fn destination(written: &str) -> Result<String, TemplateError> {
    let relative = if let Some(rest) = written.strip_prefix("${NOMAD_TASK_DIR}/") {
        format!("local/{rest}")
    } else if let Some(rest) = written.strip_prefix("${NOMAD_SECRETS_DIR}/") {
        format!("secrets/{rest}")
    } else {
        written.trim_start_matches("./").to_string()
    };
    let parts: Vec<&str> = relative
        .split('/')
        .filter(|p| !p.is_empty() && *p != ".")
        .collect();
    let inside = matches!(parts.first(), Some(&"local" | &"secrets")) && parts.len() >= 2;
    if !inside || parts.contains(&"..") || relative.starts_with('/') || relative.contains('\0') {
        return Err(TemplateError::Destination(written.to_string()));
    }
    Ok(parts.join("/"))
}

/// `KEY=value` lines of a rendered `env = true` template (blank lines and `#` comments
/// skipped), as Nomad reads them.
pub fn env_lines(rendered: &str) -> Result<Vec<(String, String)>, TemplateError> {
    let mut out = Vec::new();
    for (index, line) in rendered.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (key, value) = line.split_once('=').ok_or_else(|| TemplateError::EnvLine {
            line: index + 1,
            text: line.to_string(),
        })?;
        out.push((
            key.trim().to_string(),
            value.trim().trim_matches('"').to_string(),
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_env_and_comments_and_trims() {
        let env = |name: &str| (name == "USER").then(|| "ada".to_string());
        assert_eq!(
            render(
                "user={{ env \"USER\" }} none={{env \"NOPE\"}}\n{{- /* c */ -}}\n!",
                &env
            ),
            Ok("user=ada none=!".into())
        );
    }

    #[test]
    fn what_needs_consul_or_vault_is_refused_by_name() {
        let error = check("{{ key \"app/config\" }}").unwrap_err().to_string();
        assert!(
            error.contains("template function \"key\" is not supported"),
            "{error}"
        );
        assert!(check("{{ env \"A\"").unwrap_err() == TemplateError::Unclosed);
    }

    #[test]
    fn destinations_stay_in_local_or_secrets() {
        assert_eq!(
            destination("${NOMAD_TASK_DIR}/a.conf"),
            Ok("local/a.conf".into())
        );
        assert_eq!(destination("secrets/token"), Ok("secrets/token".into()));
        for bad in [
            "/etc/passwd",
            "local/../../x",
            "alloc/x",
            "local",
            "../local/x",
        ] {
            assert!(destination(bad).is_err(), "{bad}");
        }
        assert_eq!(
            env_lines("# c\nA=1\nB = \"two\"\n"),
            Ok(vec![("A".into(), "1".into()), ("B".into(), "two".into())])
        );
    }
}
