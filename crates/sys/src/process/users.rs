//! The users a task may run as, looked up on the host (as Nomad does): `/etc/passwd`.

use std::io;

pub use berth_model::driver::TaskUser;

#[derive(Debug, thiserror::Error)]
pub enum UserError {
    #[error("user {0:?} does not exist on this node (looked up in /etc/passwd)")]
    Unknown(String),
    #[error("reading /etc/passwd: {0}")]
    Read(io::Error),
}

/// The uid and primary gid of `name` (a name, or a number as `65534`).
pub fn lookup(name: &str) -> Result<TaskUser, UserError> {
    let passwd = std::fs::read_to_string("/etc/passwd").map_err(UserError::Read)?;
    find(&passwd, name).ok_or_else(|| UserError::Unknown(name.to_string()))
}

fn find(passwd: &str, name: &str) -> Option<TaskUser> {
    passwd.lines().find_map(|line| {
        let mut fields = line.split(':');
        let user = fields.next()?;
        let uid: u32 = fields.nth(1)?.parse().ok()?;
        let gid: u32 = fields.next()?.parse().ok()?;
        (user == name || name.parse() == Ok(uid)).then_some(TaskUser { uid, gid })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_users_by_name_or_number() {
        let passwd = "root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\nbroken line\n";
        assert_eq!(
            find(passwd, "nobody"),
            Some(TaskUser {
                uid: 65534,
                gid: 65534
            })
        );
        assert_eq!(
            find(passwd, "65534"),
            Some(TaskUser {
                uid: 65534,
                gid: 65534
            })
        );
        assert_eq!(find(passwd, "root"), Some(TaskUser { uid: 0, gid: 0 }));
        assert_eq!(find(passwd, "ghost"), None);
        assert_eq!(find(passwd, ""), None);
    }
}
