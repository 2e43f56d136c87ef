//! A task's own user namespace, for tasks on an image: root in the image is not root on
//! the host (as Podman's rootless mode and Docker's `userns-remap`).
//!
//! Inside, the task has the 65536 ids a container expects. Outside, the task's user
//! (the image's `User`, or the job's; root by default) is the task's dynamic uid, so
//! the task's own directories, `local/` and `secrets/`, are its inside, and every other
//! id is one of the task's **subordinate ids**, a block no other task and no host user
//! holds; gid 65536 is the alloc's group, every task's supplementary group, for
//! `/alloc`. For root:
//!
//! ```text
//! uid  0 ─► the task's dynamic uid     1..65535 ─► subordinate + 1..65535
//! gid  0..65535 ─► subordinate + 0..65535          65536 ─► the alloc's gid
//! ```
//!
//! (for user 1000, uid 1000 is the dynamic uid and 0..999 are subordinate + 0..999).
//! The image's layers are mounted **idmapped** through the same namespace: a file the
//! image gives the task's user is the task's dynamic uid on the host, and one it gives
//! uid 999 is subordinate + 999, so inside they are owned as the image says, and what
//! the task writes lands in its upper directory under those host ids. A host file (a volume's)
//! owned by an id outside the map is nobody's inside: root in the image has no
//! capability over it, and no more than "other" access.
//!
//! The namespace is made by the task's keeper (one thread, so it may fork): a helper
//! child unshares it and waits while the keeper writes its maps, opens it and lets the
//! helper exit. The keeper mounts the layers idmapped through it, and the task's init
//! enters it last, after its mounts and its `pivot_root`, before it drops capabilities.

use std::io;
use std::os::fd::OwnedFd;

use serde::{Deserialize, Serialize};

use berth_model::driver::TaskUser;

/// How many ids a task's namespace has (uids and gids each, the alloc's gid aside).
pub const NAMESPACE_IDS: u32 = 65536;

/// The gid inside every image task's namespace that is its alloc's group on the host.
pub const ALLOC_GROUP_INSIDE: u32 = NAMESPACE_IDS;

/// One line of `uid_map` or `gid_map`: `count` ids from `inside` are `outside` onward.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdMap {
    pub inside: u32,
    pub outside: u32,
    pub count: u32,
}

/// A task's user namespace: its maps, and who the task is inside it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserNamespace {
    pub uid_map: Vec<IdMap>,
    pub gid_map: Vec<IdMap>,
    /// The task's uid and primary gid inside.
    pub user: TaskUser,
    /// Its supplementary groups inside.
    pub groups: Vec<u32>,
}

/// Why an image task's namespace cannot be made as asked.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum NamespaceError {
    #[error(
        "the image's user has {what} {id}, outside the {NAMESPACE_IDS} ids of a task's user \
         namespace (0-{last})",
        last = NAMESPACE_IDS - 1
    )]
    OutsideNamespace { what: &'static str, id: u32 },
    #[error("subordinate ids from {first} pass the highest id a task may have on the host")]
    SubordinateOverflow { first: u32 },
}

impl UserNamespace {
    /// The namespace of an image task whose host ids are `host` (its dynamic uid, its
    /// alloc's gid) and whose block of subordinate ids starts at `subordinate`, running
    /// as `inside` (the image's user, or the job's).
    pub fn for_image_task(
        host: TaskUser,
        subordinate: u32,
        inside: TaskUser,
    ) -> Result<UserNamespace, NamespaceError> {
        for (what, id) in [("uid", inside.uid), ("gid", inside.gid)] {
            if id >= NAMESPACE_IDS {
                return Err(NamespaceError::OutsideNamespace { what, id });
            }
        }
        if subordinate.checked_add(NAMESPACE_IDS - 1).is_none() {
            return Err(NamespaceError::SubordinateOverflow { first: subordinate });
        }
        let mut groups = vec![ALLOC_GROUP_INSIDE];
        if inside.gid != 0 {
            groups.push(inside.gid);
        }
        // The task's user is its dynamic uid, whoever it is inside: the task's own
        // directories are its; every other id is the block's.
        let mut uid_map = Vec::with_capacity(3);
        if inside.uid > 0 {
            uid_map.push(IdMap {
                inside: 0,
                outside: subordinate,
                count: inside.uid,
            });
        }
        uid_map.push(IdMap {
            inside: inside.uid,
            outside: host.uid,
            count: 1,
        });
        if inside.uid + 1 < NAMESPACE_IDS {
            uid_map.push(IdMap {
                inside: inside.uid + 1,
                outside: subordinate + inside.uid + 1,
                count: NAMESPACE_IDS - inside.uid - 1,
            });
        }
        Ok(UserNamespace {
            uid_map,
            gid_map: vec![
                IdMap {
                    inside: 0,
                    outside: subordinate,
                    count: NAMESPACE_IDS,
                },
                IdMap {
                    inside: ALLOC_GROUP_INSIDE,
                    outside: host.gid,
                    count: 1,
                },
            ],
            user: inside,
            groups,
        })
    }

    /// The host's ids of root inside (uid 0, gid 0): the owner of what the host makes in
    /// the task's upper directory.
    pub fn root_on_host(&self) -> Option<TaskUser> {
        Some(TaskUser {
            uid: outside(&self.uid_map, 0)?,
            gid: outside(&self.gid_map, 0)?,
        })
    }

    /// Makes the namespace: a helper child unshares it and waits while its maps are
    /// written. Forks: only in a process with one thread (a keeper).
    pub fn create(&self) -> io::Result<OwnedFd> {
        let uid_map = map_text(&self.uid_map);
        let gid_map = map_text(&self.gid_map);
        let (wait_read, wait_write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
        let (ready_read, ready_write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
        // SAFETY: the keeper has one thread; the child makes raw system calls only and
        // ends with `_exit`.
        let child = unsafe { libc::fork() };
        if child < 0 {
            return Err(io::Error::last_os_error());
        }
        if child == 0 {
            drop(wait_write);
            drop(ready_read);
            // SAFETY: raw system calls in the forked child, then `_exit`.
            unsafe {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                let ok = libc::unshare(libc::CLONE_NEWUSER) == 0;
                let byte = [u8::from(ok)];
                libc::write(
                    std::os::fd::AsRawFd::as_raw_fd(&ready_write),
                    byte.as_ptr().cast(),
                    1,
                );
                // Until the keeper has opened the namespace (or died): end of file.
                let mut buffer = [0u8; 1];
                libc::read(
                    std::os::fd::AsRawFd::as_raw_fd(&wait_read),
                    buffer.as_mut_ptr().cast(),
                    1,
                );
                libc::_exit(0);
            }
        }
        drop(wait_read);
        drop(ready_write);
        let made = (|| {
            let mut byte = [0u8; 1];
            if rustix::io::read(&ready_read, &mut byte)? != 1 || byte[0] != 1 {
                return Err(io::Error::other(
                    "the helper could not unshare a user namespace",
                ));
            }
            for (file, text) in [("uid_map", &uid_map), ("gid_map", &gid_map)] {
                std::fs::write(format!("/proc/{child}/{file}"), text)
                    .map_err(|e| io::Error::new(e.kind(), format!("writing {file}: {e}")))?;
            }
            let namespace = std::fs::File::open(format!("/proc/{child}/ns/user"))?;
            Ok(OwnedFd::from(namespace))
        })();
        drop(wait_write);
        let mut status = 0;
        // SAFETY: waits for the child forked above.
        unsafe { libc::waitpid(child, &mut status, 0) };
        made
    }
}

/// Who a process of a task is inside the task's user namespace, for a command run
/// inside the task as the task runs ([`super::enter`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    pub user: TaskUser,
    pub groups: Vec<u32>,
    /// Its capability bounding set (`CapBnd`): the task's own, its `cap_drop` applied.
    pub capabilities: u64,
}

/// [`Identity`] of `pid`: its `/proc/<pid>/status` (as the host sees its ids) read
/// through its `uid_map` and `gid_map`.
pub fn identity_inside(pid: u32) -> io::Result<Identity> {
    let read = |file: &str| std::fs::read_to_string(format!("/proc/{pid}/{file}"));
    let uid_map = parse_map(&read("uid_map")?);
    let gid_map = parse_map(&read("gid_map")?);
    let status = read("status")?;
    let field = |name: &str| -> Vec<u32> {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .map(|rest| {
                rest.split_whitespace()
                    .filter_map(|id| id.parse().ok())
                    .collect()
            })
            .unwrap_or_default()
    };
    let unmapped = |what: &str, id: u32| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("the task's {what} {id} is outside its user namespace's map"),
        )
    };
    // Real ids: what the task's user is, whatever it set its effective ids to.
    let uid = *field("Uid:")
        .first()
        .ok_or_else(|| unmapped("uid", u32::MAX))?;
    let gid = *field("Gid:")
        .first()
        .ok_or_else(|| unmapped("gid", u32::MAX))?;
    let user = TaskUser {
        uid: inside(&uid_map, uid).ok_or_else(|| unmapped("uid", uid))?,
        gid: inside(&gid_map, gid).ok_or_else(|| unmapped("gid", gid))?,
    };
    let groups = field("Groups:")
        .into_iter()
        .filter_map(|gid| inside(&gid_map, gid))
        .collect();
    let capabilities = status
        .lines()
        .find_map(|line| line.strip_prefix("CapBnd:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .ok_or_else(|| unmapped("capability bounding set", u32::MAX))?;
    Ok(Identity {
        user,
        groups,
        capabilities,
    })
}

/// A `uid_map` or `gid_map` as the host reads it: `inside outside count` lines.
fn parse_map(text: &str) -> Vec<IdMap> {
    text.lines()
        .filter_map(|line| {
            let mut ids = line.split_whitespace().map(|id| id.parse::<u32>().ok());
            Some(IdMap {
                inside: ids.next()??,
                outside: ids.next()??,
                count: ids.next()??,
            })
        })
        .collect()
}

/// The id inside of host id `outside` under `map`.
fn inside(map: &[IdMap], outside: u32) -> Option<u32> {
    map.iter().find_map(|line| {
        let offset = outside.checked_sub(line.outside)?;
        (offset < line.count).then(|| line.inside + offset)
    })
}

/// Becomes `user` with `groups` inside a user namespace the caller entered, while it
/// still has every capability in it ([`keep_capabilities_only_as_root`] comes after the
/// capability drop). Async-signal-safe: raw system calls on data read before the fork.
pub fn become_inside(user: TaskUser, groups: &[u32]) -> io::Result<()> {
    let mut kept = [rustix::process::Gid::ROOT; 8];
    let count = groups.len().min(kept.len());
    for (slot, gid) in kept.iter_mut().zip(groups) {
        *slot = rustix::process::Gid::from_raw(*gid);
    }
    rustix::thread::set_thread_groups(&kept[..count])?;
    let gid = rustix::process::Gid::from_raw(user.gid);
    rustix::thread::set_thread_res_gid(gid, gid, gid)?;
    let uid = rustix::process::Uid::from_raw(user.uid);
    rustix::thread::set_thread_res_uid(uid, uid, uid)?;
    Ok(())
}

/// A user other than root in the namespace keeps no capability, as under Docker:
/// entering the namespace was not being root in it, so the kernel cleared nothing when
/// the user changed. Async-signal-safe.
pub fn keep_capabilities_only_as_root(user: TaskUser) -> io::Result<()> {
    if user.uid != 0 {
        rustix::thread::set_capabilities(
            None,
            rustix::thread::CapabilitySets {
                effective: rustix::thread::CapabilitySet::empty(),
                permitted: rustix::thread::CapabilitySet::empty(),
                inheritable: rustix::thread::CapabilitySet::empty(),
            },
        )?;
    }
    Ok(())
}

/// Enters the namespace `fd` (made by [`UserNamespace::create`]): the caller then has
/// every capability inside it, and none over anything the host's namespace owns.
pub fn enter(fd: std::os::fd::BorrowedFd<'_>) -> io::Result<()> {
    Ok(rustix::thread::move_into_link_name_space(
        fd,
        Some(rustix::thread::LinkNameSpaceType::User),
    )?)
}

/// The host id of `inside` under `map`.
fn outside(map: &[IdMap], inside: u32) -> Option<u32> {
    map.iter().find_map(|line| {
        let offset = inside.checked_sub(line.inside)?;
        (offset < line.count).then(|| line.outside + offset)
    })
}

/// A map as `/proc/<pid>/uid_map` takes it: one line per range, written at once.
fn map_text(map: &[IdMap]) -> String {
    map.iter()
        .map(|line| format!("{} {} {}\n", line.inside, line.outside, line.count))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOST: TaskUser = TaskUser {
        uid: 80_001,
        gid: 80_000,
    };

    #[test]
    fn root_inside_is_the_tasks_dynamic_uid_and_everyone_else_its_subordinate_ids() {
        let root = TaskUser { uid: 0, gid: 0 };
        let ns = UserNamespace::for_image_task(HOST, 1_000_065_536, root).unwrap();
        assert_eq!(
            map_text(&ns.uid_map),
            "0 80001 1\n1 1000065537 65535\n",
            "uid 0 is the dynamic uid; 1.. the block"
        );
        assert_eq!(map_text(&ns.gid_map), "0 1000065536 65536\n65536 80000 1\n");
        assert_eq!(
            ns.root_on_host(),
            Some(TaskUser {
                uid: 80_001,
                gid: 1_000_065_536
            })
        );
        assert_eq!(outside(&ns.uid_map, 999), Some(1_000_066_535));
        assert_eq!(outside(&ns.uid_map, 65_536), None);
        assert_eq!(ns.groups, vec![ALLOC_GROUP_INSIDE]);
        let app = TaskUser {
            uid: 1000,
            gid: 1000,
        };
        let ns = UserNamespace::for_image_task(HOST, 1_000_065_536, app).unwrap();
        assert_eq!(ns.groups, vec![ALLOC_GROUP_INSIDE, 1000]);
        assert_eq!(
            map_text(&ns.uid_map),
            "0 1000065536 1000\n1000 80001 1\n1001 1000066537 64535\n",
            "the image's user is the dynamic uid; root one of the block"
        );
        assert_eq!(
            ns.root_on_host(),
            Some(TaskUser {
                uid: 1_000_065_536,
                gid: 1_000_065_536
            })
        );
        let last = TaskUser {
            uid: 65_535,
            gid: 0,
        };
        let ns = UserNamespace::for_image_task(HOST, 1_000_065_536, last).unwrap();
        assert_eq!(map_text(&ns.uid_map), "0 1000065536 65535\n65535 80001 1\n");
        // Read back as the host reads a task's map.
        let read =
            parse_map("         0      80001          1\n         1 1000065537      65535\n");
        assert_eq!(inside(&read, 80_001), Some(0));
        assert_eq!(inside(&read, 1_000_066_535), Some(999));
        assert_eq!(inside(&read, 80_000), None);
    }

    #[test]
    fn an_id_past_the_namespace_or_a_block_past_the_id_space_is_refused() {
        let far = TaskUser {
            uid: 70_000,
            gid: 0,
        };
        let error = UserNamespace::for_image_task(HOST, 1_000_000_000, far).unwrap_err();
        assert_eq!(
            error.to_string(),
            "the image's user has uid 70000, outside the 65536 ids of a task's user namespace (0-65535)"
        );
        let root = TaskUser { uid: 0, gid: 0 };
        assert!(matches!(
            UserNamespace::for_image_task(HOST, u32::MAX - 10, root),
            Err(NamespaceError::SubordinateOverflow { .. })
        ));
    }
}
