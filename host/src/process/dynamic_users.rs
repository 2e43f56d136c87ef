//! Dynamic workload users (Nomad's): an `exec` task whose job names no `user` runs as a
//! uid of its own from the operator's `user { dynamic_range }`, so no host process (not
//! even `nobody`) and no other alloc's task is the same user as it. The alloc's tasks
//! share `/alloc` through a gid of the alloc, from the same range.
//!
//! Ids come back when the alloc is gone, and are handed out again least recently released
//! first, so a freed id rests as long as the range allows before a new task is it.

use std::collections::{BTreeSet, VecDeque};
use std::ops::RangeInclusive;
use std::sync::Mutex;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RangeError {
    #[error(
        "user {{ dynamic_range = \"{first}-{last}\" }} overlaps {what} {name:?} (id {id}) of \
         {file}: tasks would share that identity; choose a range no user or group of this \
         host uses"
    )]
    Owned {
        first: u32,
        last: u32,
        what: &'static str,
        name: String,
        id: u32,
        file: &'static str,
    },
    #[error("reading {file} to check user {{ dynamic_range }}: {error}")]
    Read { file: &'static str, error: String },
}

/// Refuses a range in which the host's `/etc/passwd` or `/etc/group` names anyone: a
/// task given that id would be that user (its files, its processes) or in that group.
pub fn check_host(range: &RangeInclusive<u32>) -> Result<(), RangeError> {
    for (file, what) in [("/etc/passwd", "user"), ("/etc/group", "group")] {
        let text = std::fs::read_to_string(file).map_err(|e| RangeError::Read {
            file,
            error: e.to_string(),
        })?;
        check_database(range, &text, file, what)?;
    }
    Ok(())
}

/// [`check_host`] on one database's text: a user's uid and gid (passwd) or a group's gid.
fn check_database(
    range: &RangeInclusive<u32>,
    text: &str,
    file: &'static str,
    what: &'static str,
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

/// The range's ids: taken, released (in release order), and never used yet.
pub struct DynamicUsers {
    range: RangeInclusive<u32>,
    inner: Mutex<Pool>,
    /// Woken on every release, for allocs waiting for ids.
    released: tokio::sync::Notify,
}

struct Pool {
    /// Ids never handed out since the agent started and not claimed: `next..=end`.
    next: Option<u32>,
    released: VecDeque<u32>,
    taken: BTreeSet<u32>,
}

impl DynamicUsers {
    pub fn new(range: RangeInclusive<u32>) -> Self {
        DynamicUsers {
            inner: Mutex::new(Pool {
                next: Some(*range.start()),
                released: VecDeque::new(),
                taken: BTreeSet::new(),
            }),
            range,
            released: tokio::sync::Notify::new(),
        }
    }

    pub fn range(&self) -> &RangeInclusive<u32> {
        &self.range
    }

    /// `count` ids, all or none (`None`: the range has fewer free). Fresh ids first,
    /// then the least recently released.
    pub fn take(&self, count: usize) -> Option<Vec<u32>> {
        let mut pool = self.inner.lock().unwrap();
        let fresh_left = pool.next.map_or(0, |next| {
            (next..=*self.range.end())
                .filter(|id| !pool.taken.contains(id))
                .take(count)
                .count()
        });
        if fresh_left + pool.released.len() < count {
            return None;
        }
        let mut ids = Vec::with_capacity(count);
        while ids.len() < count {
            let id = match pool.next {
                Some(next) => {
                    pool.next = (next < *self.range.end()).then(|| next + 1);
                    if pool.taken.contains(&next) {
                        continue;
                    }
                    // A restored alloc's id above `next`, released since: it is handed
                    // out here, never also from the queue.
                    pool.released.retain(|r| *r != next);
                    next
                }
                None => pool.released.pop_front()?,
            };
            // Never an id a live alloc holds, whichever way it came.
            if !pool.taken.insert(id) {
                continue;
            }
            ids.push(id);
        }
        Some(ids)
    }

    /// Marks ids a restored alloc holds as taken (they are not handed out again). Ids
    /// outside the range (the operator changed it) are kept out of the pool for good.
    pub fn claim(&self, ids: &[u32]) {
        let mut pool = self.inner.lock().unwrap();
        for id in ids {
            pool.released.retain(|r| r != id);
            pool.taken.insert(*id);
        }
    }

    /// Gives ids back, after every one the alloc had: they go to the end of the queue.
    pub fn release(&self, ids: &[u32]) {
        {
            let mut pool = self.inner.lock().unwrap();
            for id in ids {
                if pool.taken.remove(id) && self.range.contains(id) {
                    pool.released.push_back(*id);
                }
            }
        }
        self.released.notify_waiters();
    }

    /// Resolves at the next release (register before trying again, so none is missed).
    pub fn released(&self) -> tokio::sync::futures::Notified<'_> {
        self.released.notified()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_holding_a_host_user_or_group_is_refused() {
        let passwd = "root:x:0:0::/root:/bin/sh\nsync:x:4:65534::/bin:/bin/sync\nnobody:x:65534:65534::/:/sbin/nologin\nbad\n";
        let error = check_database(&(65_000..=65_535), passwd, "/etc/passwd", "user")
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("overlaps user \"nobody\" (id 65534)"),
            "{error}"
        );
        assert!(check_database(&(80_000..=89_999), passwd, "/etc/passwd", "user").is_ok());
        let group = "staff:x:81000:\n";
        assert!(check_database(&(80_000..=89_999), group, "/etc/group", "group").is_err());
    }

    #[test]
    fn ids_are_unique_and_reused_least_recently_released_first() {
        let users = DynamicUsers::new(10..=13);
        assert_eq!(users.take(2), Some(vec![10, 11]));
        assert_eq!(users.take(2), Some(vec![12, 13]));
        assert_eq!(users.take(1), None, "exhausted");
        users.release(&[12, 13]);
        users.release(&[10, 11]);
        assert_eq!(users.take(3), Some(vec![12, 13, 10]));
        assert_eq!(users.take(2), None, "all or none");
        assert_eq!(users.take(1), Some(vec![11]));
        users.release(&[11]);
        users.release(&[11]);
        assert_eq!(
            users.take(2),
            None,
            "a double release hands out nothing twice"
        );
    }

    /// An id a restored alloc held above the fresh ones, released, is handed out once:
    /// two live allocs never share a uid (attack review: after a restart, B and E ran as
    /// the same uid).
    #[test]
    fn a_restored_id_released_is_handed_out_once() {
        let users = DynamicUsers::new(80100..=80103);
        users.claim(&[80100, 80101]);
        users.release(&[80100, 80101]);
        let mut handed: Vec<u32> = Vec::new();
        for _ in 0..4 {
            handed.extend(users.take(1).unwrap());
        }
        handed.sort_unstable();
        assert_eq!(handed, [80100, 80101, 80102, 80103]);
        assert_eq!(users.take(1), None);
    }

    #[test]
    fn claimed_ids_are_not_handed_out() {
        let users = DynamicUsers::new(10..=12);
        users.claim(&[11, 99]);
        assert_eq!(users.take(2), Some(vec![10, 12]));
        assert_eq!(users.take(1), None);
        users.release(&[11]);
        assert_eq!(users.take(1), Some(vec![11]));
    }
}
