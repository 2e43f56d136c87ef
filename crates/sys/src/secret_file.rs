//! Reading a secret the operator keeps in a file (the API's `token_file`, etcd's
//! `password_file`): the file must be a regular file owned by the agent's user and
//! readable by no one else, so that another user of the machine can neither read the
//! secret nor put one of their own in its place.

use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

/// Why a secret file was refused. `what` names the file's role ("token file").
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretFileError {
    #[error(
        "the {what} {} is open to others (mode {mode:03o}): run `chmod 600 {}`",
        path.display(),
        path.display()
    )]
    Open {
        what: &'static str,
        path: PathBuf,
        mode: u32,
    },
    #[error(
        "the {what} {} is owned by uid {owner}, not by the agent's user (uid {agent}): \
         that user could read or change it. Run `chown {agent} {}`",
        path.display(),
        path.display()
    )]
    Owner {
        what: &'static str,
        path: PathBuf,
        owner: u32,
        agent: u32,
    },
    #[error("the {what} {} is not a regular file", path.display())]
    NotAFile { what: &'static str, path: PathBuf },
    #[error("the {what} {} is empty", path.display())]
    Empty { what: &'static str, path: PathBuf },
    #[error("the {what} {}: {reason}", path.display())]
    Unreadable {
        what: &'static str,
        path: PathBuf,
        reason: String,
    },
}

impl SecretFileError {
    /// Whether the file does not exist (a token file is then created).
    pub fn is_missing(&self) -> bool {
        matches!(self, SecretFileError::Unreadable { reason, .. } if reason == MISSING)
    }
}

const MISSING: &str = "no such file";

/// The secret in the file at `path` (its content without surrounding whitespace), after
/// checking that only the agent's user can read or change it.
pub fn read_secret_file(what: &'static str, path: &Path) -> Result<String, SecretFileError> {
    let unreadable = |error: std::io::Error| SecretFileError::Unreadable {
        what,
        path: path.to_path_buf(),
        reason: if error.kind() == std::io::ErrorKind::NotFound {
            MISSING.to_string()
        } else {
            error.to_string()
        },
    };
    // Not followed: a link could point the check at one file and the read at another.
    let meta = std::fs::symlink_metadata(path).map_err(unreadable)?;
    if !meta.file_type().is_file() {
        return Err(SecretFileError::NotAFile {
            what,
            path: path.to_path_buf(),
        });
    }
    let agent = rustix::process::geteuid().as_raw();
    if meta.uid() != agent {
        return Err(SecretFileError::Owner {
            what,
            path: path.to_path_buf(),
            owner: meta.uid(),
            agent,
        });
    }
    let mode = meta.mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(SecretFileError::Open {
            what,
            path: path.to_path_buf(),
            mode,
        });
    }
    let secret = std::fs::read_to_string(path).map_err(unreadable)?;
    let secret = secret.trim();
    if secret.is_empty() {
        return Err(SecretFileError::Empty {
            what,
            path: path.to_path_buf(),
        });
    }
    Ok(secret.to_string())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::{SecretFileError, read_secret_file};

    #[test]
    fn a_private_file_is_read_and_an_open_or_foreign_one_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("password");
        assert!(
            read_secret_file("password file", &path)
                .unwrap_err()
                .is_missing()
        );
        std::fs::write(&path, "s3cret\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(read_secret_file("password file", &path).unwrap(), "s3cret");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        assert!(matches!(
            read_secret_file("password file", &path),
            Err(SecretFileError::Open { mode: 0o640, .. })
        ));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        rustix::fs::chown(&path, Some(rustix::fs::Uid::from_raw(65534)), None).unwrap();
        let error = read_secret_file("password file", &path).unwrap_err();
        assert!(
            error.to_string().starts_with(&format!(
                "the password file {} is owned by uid 65534",
                path.display()
            )),
            "{error}"
        );
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        assert!(matches!(
            read_secret_file("password file", &link),
            Err(SecretFileError::NotAFile { .. })
        ));
    }
}
