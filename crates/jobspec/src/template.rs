//! `template` blocks: their text is consul-template's language, read by
//! `berth-template` at submit time (with the template's delimiters) so that a function
//! berth does not have is refused with its reason; their destination stays in the
//! task's `local/` or `secrets/` directory; an `env = true` one is read as `KEY=value`
//! lines.

/// Why a template cannot be placed or read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    #[error("{0}")]
    Parse(#[from] berth_template::ParseError),
    #[error(
        "{0:?} must be a file in the task's local/ or secrets/ directory (as \
         \"local/app.conf\" or \"${{NOMAD_SECRETS_DIR}}/token\")"
    )]
    Destination(String),
    #[error(
        "the template is {len} bytes; berth reads templates of up to {} bytes",
        MAX_TEMPLATE_BYTES
    )]
    TooLarge { len: usize },
    #[error("line {line} is not KEY=value: {text:?}")]
    EnvLine { line: usize, text: String },
}

/// Checks `data` reads as a template with these delimiters, and calls only functions
/// berth has (see `docs/templates.md`).
pub fn check(data: &str, delimiters: &berth_template::Delimiters) -> Result<(), TemplateError> {
    if data.len() > MAX_TEMPLATE_BYTES {
        return Err(TemplateError::TooLarge { len: data.len() });
    }
    berth_template::Template::parse(data, delimiters)?;
    Ok(())
}

/// The most `template` blocks a task may have.
pub const MAX_TEMPLATES: usize = 64;

/// The largest template text: far past any config file, short of what would make
/// each render of it (on every change) a burden.
pub const MAX_TEMPLATE_BYTES: usize = 256 << 10;

/// The signals a `change_signal` may name: the ones the task runner sends
/// (`berth_sys::process::parse_signal`), with or without `SIG`.
pub const SIGNALS: &[&str] = &[
    "SIGHUP", "SIGINT", "SIGQUIT", "SIGTERM", "SIGKILL", "SIGUSR1", "SIGUSR2", "SIGCONT", "SIGSTOP",
];

pub fn is_signal(name: &str) -> bool {
    let bare = name.strip_prefix("SIG").unwrap_or(name);
    SIGNALS.iter().any(|s| s[3..] == *bare)
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
    fn what_berth_lacks_is_refused_by_name_with_its_line() {
        let error = check("a\n{{ secret \"db/creds\" }}", &Default::default())
            .unwrap_err()
            .to_string();
        assert!(
            error.starts_with(
                "line 2: template function \"secret\" is not supported: it reads Vault"
            ),
            "{error}"
        );
        assert!(check("{{ env \"A\"", &Default::default()).is_err());
        assert!(is_signal("SIGHUP") && is_signal("USR1") && !is_signal("SIGWINCH"));
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
