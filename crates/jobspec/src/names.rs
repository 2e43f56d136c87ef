//! What a job author may call things and where a task may have things mounted. Names
//! become directory names, state keys and log prefixes, and task paths become mount
//! points inside the task's root, so both are checked when the jobspec is parsed, before
//! anything touches the disk.
//!
//! Names (job, group, task, volume): 1 to 128 of `A-Z a-z 0-9 . _ -`, starting with a
//! letter or a digit. Nomad is looser (a job id may not hold spaces or NUL, a task name
//! no slash); berth is stricter because its names are paths, and a name such as `../x`
//! must never become one.

use std::fmt;

/// The longest name berth accepts.
pub const MAX_NAME: usize = 128;

/// The deepest and longest task path berth accepts.
const MAX_PATH_BYTES: usize = 1024;

/// What a name names, for messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameKind {
    Job,
    Group,
    Task,
    Volume,
}

impl fmt::Display for NameKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NameKind::Job => "job",
            NameKind::Group => "group",
            NameKind::Task => "task",
            NameKind::Volume => "volume",
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error(
        "{kind} name {name:?} is not allowed: use 1 to {MAX_NAME} letters, digits, '.', '_' or '-', \
         starting with a letter or a digit"
    )]
    Charset { kind: NameKind, name: String },
}

/// Checks a job, group, task or volume name.
pub fn check_name(kind: NameKind, name: &str) -> Result<(), NameError> {
    let fine = (1..=MAX_NAME).contains(&name.len())
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if fine {
        Ok(())
    } else {
        Err(NameError::Charset {
            kind,
            name: name.to_string(),
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TaskPathError {
    #[error("{0:?} must be an absolute path inside the task (starting with '/')")]
    Relative(String),
    #[error("{0:?} leaves the task's root: '..' is not allowed in a task path")]
    Escapes(String),
    #[error("{0:?} holds a NUL or a control character")]
    Control(String),
    #[error("a task path is at most {MAX_PATH_BYTES} bytes")]
    TooLong,
}

/// Checks a path inside a task (a `volume_mount` destination, a CSI plugin's
/// `mount_dir`) and returns it normalised: no `.`, no repeated or trailing `/`. A `..`
/// is refused rather than resolved: `/data/../etc` is a typo or an attempt, not a path.
pub fn normalise_task_path(path: &str) -> Result<String, TaskPathError> {
    if path.len() > MAX_PATH_BYTES {
        return Err(TaskPathError::TooLong);
    }
    if path.chars().any(char::is_control) {
        return Err(TaskPathError::Control(path.to_string()));
    }
    if !path.starts_with('/') {
        return Err(TaskPathError::Relative(path.to_string()));
    }
    let mut parts = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => return Err(TaskPathError::Escapes(path.to_string())),
            part => parts.push(part),
        }
    }
    Ok(format!("/{}", parts.join("/")))
}

/// An RFC 1123 label, as Nomad validates service names (and Consul takes them).
pub fn is_dns_label(name: &str) -> bool {
    let bytes = name.as_bytes();
    (1..=63).contains(&bytes.len())
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || *b == b'-')
        && bytes[0] != b'-'
        && bytes[bytes.len() - 1] != b'-'
}

/// A host name as RFC 1123 has it: dot-separated [`is_dns_label`]s, at most 253
/// characters in all.
pub fn is_host_name(name: &str) -> bool {
    name.len() <= 253 && name.split('.').all(is_dns_label)
}

/// A search domain of `resolv.conf`: a host name, `_` allowed (service names), a
/// trailing dot too.
pub fn is_search_domain(name: &str) -> bool {
    let name = name.strip_suffix('.').unwrap_or(name);
    is_host_name(&name.replace('_', "x"))
}

/// A resolver option of `resolv.conf`: one word of letters, digits, `-`, `_`, `:` and
/// `.` (`ndots:2`, `timeout:1`, `edns0`, `single-request-reopen`).
pub fn is_resolver_option(option: &str) -> bool {
    (1..=64).contains(&option.len())
        && option
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b':' | b'.'))
}

/// A name server of `resolv.conf`: an IPv4 or IPv6 address.
pub fn is_name_server(server: &str) -> bool {
    server.parse::<std::net::IpAddr>().is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_safe_path_segments() {
        for fine in [
            "web",
            "my-job",
            "redis.cache",
            "api_v2",
            "9lives",
            &"a".repeat(128),
        ] {
            assert_eq!(check_name(NameKind::Task, fine), Ok(()), "{fine:?}");
        }
        for bad in [
            "",
            "..",
            ".",
            "../x",
            "a/b",
            "/etc",
            "-rf",
            ".hidden",
            "a b",
            "tab\t",
            "nul\0",
            "é",
            &"a".repeat(129),
        ] {
            assert!(
                check_name(NameKind::Task, bad).is_err(),
                "{bad:?} was accepted"
            );
        }
        assert_eq!(
            check_name(NameKind::Job, "../x").unwrap_err().to_string(),
            "job name \"../x\" is not allowed: use 1 to 128 letters, digits, '.', '_' or '-', \
             starting with a letter or a digit"
        );
    }

    #[test]
    fn task_paths_are_normalised_and_never_escape() {
        assert_eq!(normalise_task_path("/data"), Ok("/data".into()));
        assert_eq!(normalise_task_path("//data/./x//"), Ok("/data/x".into()));
        assert_eq!(normalise_task_path("/"), Ok("/".into()));
        assert_eq!(
            normalise_task_path("/data/../../etc"),
            Err(TaskPathError::Escapes("/data/../../etc".into()))
        );
        assert_eq!(
            normalise_task_path("data"),
            Err(TaskPathError::Relative("data".into()))
        );
        assert_eq!(
            normalise_task_path("/a\nb"),
            Err(TaskPathError::Control("/a\nb".into()))
        );
        assert_eq!(
            normalise_task_path(&"/a".repeat(600)),
            Err(TaskPathError::TooLong)
        );
    }
}
