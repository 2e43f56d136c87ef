//! Who a task on an image is inside it: Docker's `User` (`name`, `uid`, `name:group`,
//! `uid:gid`, or empty for root), looked up in the image's own `/etc/passwd` and
//! `/etc/group`, never the host's.
//!
//! The files are read from the image's layers as overlayfs would merge them, the top
//! layer first: a whiteout (a 0:0 character device) or an opaque `etc/` hides those
//! below. Nothing is followed through a link (an image may point `etc/passwd` at
//! anything), and a file is read up to [`MAX_DATABASE`].

use std::io::Read as _;
use std::path::PathBuf;

use rustix::fs::{Mode, OFlags, ResolveFlags};

use berth_model::driver::TaskUser;

/// The most of an image's `/etc/passwd` or `/etc/group` read.
const MAX_DATABASE: u64 = 1 << 20;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ImageUserError {
    #[error("user {user:?} is not in the image's /etc/passwd")]
    UnknownUser { user: String },
    #[error("group {group:?} is not in the image's /etc/group")]
    UnknownGroup { group: String },
}

/// The uid and primary gid of `spec` in the image of `layers` (top first).
pub fn resolve(layers: &[PathBuf], spec: &str) -> Result<TaskUser, ImageUserError> {
    let spec = spec.trim();
    let (user, group) = match spec.split_once(':') {
        Some((user, group)) => (user, Some(group)),
        None => (spec, None),
    };
    let passwd = || read_merged(layers, "etc/passwd").unwrap_or_default();
    let (uid, primary) = match (user, user.parse::<u32>()) {
        ("", _) => (0, find(&passwd(), 2, "0", 3).unwrap_or(0)),
        (_, Ok(uid)) => (uid, find(&passwd(), 2, user, 3).unwrap_or(0)),
        (name, Err(_)) => {
            let passwd = passwd();
            match (find(&passwd, 0, name, 2), find(&passwd, 0, name, 3)) {
                (Some(uid), Some(gid)) => (uid, gid),
                _ => {
                    return Err(ImageUserError::UnknownUser {
                        user: name.to_string(),
                    });
                }
            }
        }
    };
    let gid = match group {
        None | Some("") => primary,
        Some(group) => match group.parse::<u32>() {
            Ok(gid) => gid,
            Err(_) => {
                let groups = read_merged(layers, "etc/group").unwrap_or_default();
                find(&groups, 0, group, 2).ok_or_else(|| ImageUserError::UnknownGroup {
                    group: group.to_string(),
                })?
            }
        },
    };
    Ok(TaskUser { uid, gid })
}

/// In a `passwd`/`group` text, the numeric column `want` of the first line whose column
/// `key` is `value` (for a number, the number as written).
fn find(text: &str, key: usize, value: &str, want: usize) -> Option<u32> {
    text.lines().find_map(|line| {
        let fields: Vec<&str> = line.split(':').collect();
        let matches = fields.get(key).is_some_and(|field| {
            *field == value || (key != 0 && field.parse::<u32>().ok() == value.parse().ok())
        });
        matches.then(|| fields.get(want)?.parse().ok()).flatten()
    })
}

/// The text of `relative` as the merged image shows it, or `None` when no layer has it
/// (or one above hides it).
fn read_merged(layers: &[PathBuf], relative: &str) -> Option<String> {
    let parent = relative.rsplit_once('/').map(|(dir, _)| dir);
    for layer in layers {
        let root = rustix::fs::open(
            layer,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .ok()?;
        let opened = rustix::fs::openat2(
            &root,
            relative,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
        );
        match opened {
            Ok(fd) => {
                let file = std::fs::File::from(fd);
                let kind = file.metadata().ok()?.file_type();
                if !kind.is_file() {
                    // A whiteout, or something that is no database.
                    return None;
                }
                let mut text = String::new();
                file.take(MAX_DATABASE).read_to_string(&mut text).ok()?;
                return Some(text);
            }
            Err(rustix::io::Errno::NOENT) => {
                let hidden_below = parent.is_some_and(|dir| {
                    rustix::fs::openat2(
                        &root,
                        dir,
                        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                        Mode::empty(),
                        ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS,
                    )
                    .is_ok_and(|dir| {
                        let mut value = [0u8; 1];
                        rustix::fs::fgetxattr(&dir, "trusted.overlay.opaque", &mut value)
                            .is_ok_and(|n| n == 1 && value[0] == b'y')
                    })
                });
                if hidden_below || whited_out(&root, parent) {
                    return None;
                }
            }
            // A link, a way out, or unreadable: the image has no usable database.
            Err(_) => return None,
        }
    }
    None
}

/// Whether `dir` (of `relative`) is itself a whiteout in this layer.
fn whited_out(root: &impl std::os::fd::AsFd, dir: Option<&str>) -> bool {
    let Some(dir) = dir else { return false };
    rustix::fs::statat(root, dir, rustix::fs::AtFlags::SYMLINK_NOFOLLOW).is_ok_and(|stat| {
        rustix::fs::FileType::from_raw_mode(stat.st_mode) == rustix::fs::FileType::CharacterDevice
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layer(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (path, text) in files {
            let path = dir.path().join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        dir
    }

    const PASSWD: &str = "root:x:0:0:root:/root:/bin/sh\nredis:x:999:1000::/data:/bin/sh\n";
    const GROUP: &str = "root:x:0:\nredis:x:1000:\nwww:x:33:\n";

    #[test]
    fn users_and_groups_come_from_the_images_own_files() {
        let base = layer(&[("etc/passwd", PASSWD), ("etc/group", GROUP)]);
        let layers = vec![base.path().to_path_buf()];
        let user = |spec| resolve(&layers, spec);
        assert_eq!(user(""), Ok(TaskUser { uid: 0, gid: 0 }));
        assert_eq!(
            user("redis"),
            Ok(TaskUser {
                uid: 999,
                gid: 1000
            })
        );
        assert_eq!(
            user("999"),
            Ok(TaskUser {
                uid: 999,
                gid: 1000
            })
        );
        assert_eq!(user("1234"), Ok(TaskUser { uid: 1234, gid: 0 }));
        assert_eq!(user("redis:www"), Ok(TaskUser { uid: 999, gid: 33 }));
        assert_eq!(user("5:6"), Ok(TaskUser { uid: 5, gid: 6 }));
        assert_eq!(
            user("nginx"),
            Err(ImageUserError::UnknownUser {
                user: "nginx".into()
            })
        );
        assert_eq!(
            user("redis:staff").unwrap_err().to_string(),
            "group \"staff\" is not in the image's /etc/group"
        );
    }

    #[test]
    fn the_top_layer_wins_and_a_link_or_a_whiteout_hides_the_database() {
        let base = layer(&[("etc/passwd", PASSWD)]);
        let top = layer(&[("etc/passwd", "app:x:1000:1000::/:/bin/sh\n")]);
        let layers = vec![top.path().to_path_buf(), base.path().to_path_buf()];
        assert_eq!(
            resolve(&layers, "app"),
            Ok(TaskUser {
                uid: 1000,
                gid: 1000
            })
        );
        assert!(
            resolve(&layers, "redis").is_err(),
            "the top file hides the base's"
        );
        let linked = tempfile::tempdir().unwrap();
        std::fs::create_dir(linked.path().join("etc")).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", linked.path().join("etc/passwd")).unwrap();
        let layers = vec![linked.path().to_path_buf(), base.path().to_path_buf()];
        assert!(
            resolve(&layers, "root").is_err(),
            "a link is never followed (to the host's file)"
        );
        let whiteout = tempfile::tempdir().unwrap();
        std::fs::create_dir(whiteout.path().join("etc")).unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            whiteout.path().join("etc/passwd"),
            rustix::fs::FileType::CharacterDevice,
            Mode::from_raw_mode(0),
            0,
        )
        .unwrap();
        let layers = vec![whiteout.path().to_path_buf(), base.path().to_path_buf()];
        assert!(resolve(&layers, "redis").is_err());
        let missing = layer(&[("etc/hostname", "x")]);
        let layers = vec![missing.path().to_path_buf(), base.path().to_path_buf()];
        assert_eq!(
            resolve(&layers, "redis"),
            Ok(TaskUser {
                uid: 999,
                gid: 1000
            }),
            "a layer without the file shows the one below"
        );
    }
}
