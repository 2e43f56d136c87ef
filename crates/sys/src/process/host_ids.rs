//! Ranges of ids the agent hands to tasks (`user { dynamic_range }`, the subordinate ids
//! of tasks on images) checked against the host's: no user or group of `/etc/passwd` or
//! `/etc/group` holds one, and no `/etc/subuid` or `/etc/subgid` range overlaps them, or
//! a task would share that identity.

use std::ops::RangeInclusive;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RangeError {
    #[error(
        "user {{ {setting} }} ({first}-{last}) overlaps {what} {name:?} (id {id}) of \
         {file}: tasks would share that identity; choose a range no user or group of this \
         host uses"
    )]
    Owned {
        setting: &'static str,
        first: u32,
        last: u32,
        what: &'static str,
        name: String,
        id: u32,
        file: &'static str,
    },
    #[error(
        "user {{ {setting} }} ({first}-{last}) overlaps the ids {start}-{end} that \
         {file} gives {name:?}: that user may become them in a user namespace; choose a range \
         outside every subordinate range"
    )]
    Subordinate {
        setting: &'static str,
        first: u32,
        last: u32,
        name: String,
        start: u64,
        end: u64,
        file: &'static str,
    },
    #[error("reading {file} to check the agent's user ids: {error}")]
    Read { file: &'static str, error: String },
}

/// Refuses a range in which the host's `/etc/passwd` or `/etc/group` names anyone: a
/// task given that id would be that user (its files, its processes) or in that group.
/// `setting` names the range in errors (`dynamic_range`, `subordinate_base`).
pub fn check_host(range: &RangeInclusive<u32>, setting: &'static str) -> Result<(), RangeError> {
    for (file, what) in [("/etc/passwd", "user"), ("/etc/group", "group")] {
        let text = std::fs::read_to_string(file).map_err(|e| RangeError::Read {
            file,
            error: e.to_string(),
        })?;
        check_database(range, &text, file, what, setting)?;
    }
    // Subordinate ids (newuidmap, rootless containers): a host user may be them.
    for file in ["/etc/subuid", "/etc/subgid"] {
        match std::fs::read_to_string(file) {
            Ok(text) => check_subordinates(range, &text, file, setting)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(RangeError::Read {
                    file,
                    error: e.to_string(),
                });
            }
        }
    }
    Ok(())
}

/// [`check_host`] on `/etc/subuid` or `/etc/subgid`'s text: `name:start:count` lines.
fn check_subordinates(
    range: &RangeInclusive<u32>,
    text: &str,
    file: &'static str,
    setting: &'static str,
) -> Result<(), RangeError> {
    for line in text.lines() {
        let mut fields = line.split(':');
        let (Some(name), Some(start), Some(count)) = (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let (Ok(start), Ok(count)) = (start.trim().parse::<u64>(), count.trim().parse::<u64>())
        else {
            continue;
        };
        if count == 0 {
            continue;
        }
        let end = start.saturating_add(count - 1);
        if start <= u64::from(*range.end()) && u64::from(*range.start()) <= end {
            return Err(RangeError::Subordinate {
                setting,
                first: *range.start(),
                last: *range.end(),
                name: name.to_string(),
                start,
                end,
                file,
            });
        }
    }
    Ok(())
}

/// [`check_host`] on one database's text: a user's uid and gid (passwd) or a group's gid.
fn check_database(
    range: &RangeInclusive<u32>,
    text: &str,
    file: &'static str,
    what: &'static str,
    setting: &'static str,
) -> Result<(), RangeError> {
    // Users' uids first, then the gids (a user's primary group, or a group's): the
    // holder named is the one an operator looks for (`nobody`, not `sync` whose group
    // is nogroup).
    let columns: &[usize] = if what == "user" { &[2, 3] } else { &[2] };
    for column in columns {
        for line in text.lines() {
            let fields: Vec<&str> = line.split(':').collect();
            if let Some(Ok(id)) = fields.get(*column).map(|id| id.parse::<u32>())
                && range.contains(&id)
            {
                return Err(RangeError::Owned {
                    setting,
                    first: *range.start(),
                    last: *range.end(),
                    what,
                    name: fields[0].to_string(),
                    id,
                    file,
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_holding_a_host_user_or_group_is_refused() {
        let passwd = "root:x:0:0::/root:/bin/sh\nsync:x:4:65534::/bin:/bin/sync\nnobody:x:65534:65534::/:/sbin/nologin\nbad\n";
        let error = check_database(
            &(65_000..=65_535),
            passwd,
            "/etc/passwd",
            "user",
            "dynamic_range",
        )
        .unwrap_err()
        .to_string();
        assert!(
            error.contains("overlaps user \"nobody\" (id 65534)"),
            "{error}"
        );
        assert!(
            check_database(
                &(80_000..=89_999),
                passwd,
                "/etc/passwd",
                "user",
                "dynamic_range"
            )
            .is_ok()
        );
        let group = "staff:x:81000:\n";
        assert!(
            check_database(
                &(80_000..=89_999),
                group,
                "/etc/group",
                "group",
                "dynamic_range"
            )
            .is_err()
        );
    }

    /// A pool of `range` whose every change is written to the returned list.
    #[test]
    fn a_range_overlapping_a_subordinate_range_is_refused() {
        let subuid = "alice:100000:65536\nbad line\nbob:300000:0\n";
        let range = 80_000..=89_999;
        assert!(check_subordinates(&range, subuid, "/etc/subuid", "dynamic_range").is_ok());
        let error =
            check_subordinates(&(150_000..=150_009), subuid, "/etc/subuid", "dynamic_range")
                .unwrap_err()
                .to_string();
        assert!(
            error.contains("overlaps the ids 100000-165535 that /etc/subuid gives \"alice\""),
            "{error}"
        );
        assert!(
            check_subordinates(&(165_536..=170_000), subuid, "/etc/subuid", "dynamic_range")
                .is_ok()
        );
        assert!(
            check_subordinates(&(300_000..=300_000), subuid, "/etc/subuid", "dynamic_range")
                .is_ok()
        );
    }
}
