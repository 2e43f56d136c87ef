//! Dynamic workload users (Nomad's): an `exec` task whose job names no `user` runs as a
//! uid of its own from the operator's `user { dynamic_range }`, so no host process (not
//! even `nobody`) and no other alloc's task is the same user as it. The alloc's tasks
//! share `/alloc` through a gid of the alloc, from the same range.
//!
//! Ids come back when the alloc is gone, and are handed out again least recently released
//! first, so a freed id rests as long as the range allows before a new task is it; the
//! order is kept in the state store, so a restart does not shorten that rest. A job holds
//! at most half the range, so one job cannot keep every other waiting.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::ops::RangeInclusive;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

pub use super::host_ids::{RangeError, check_host};

/// What the pool keeps across restarts: the order ids were released in, and where the
/// never-used ones begin. Without it a restarted agent would hand out first the ids
/// released just before it stopped, whose files (a setgid file in a volume, say) may
/// still be around.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolRecord {
    /// The range this was kept for: another range's fresh ids start afresh.
    pub first: u32,
    pub last: u32,
    /// The first never-used id (`None`: every id was handed out once).
    pub next: Option<u32>,
    /// Released ids, least recently released first.
    pub released: Vec<u32>,
    /// Ids handed out that their alloc may not have recorded yet.
    #[serde(default)]
    pub pending: Vec<u32>,
}

/// Writes the pool's [`PoolRecord`] durably; called under the pool's lock, after every
/// change, so records land in the order of the changes.
pub type Keeper = Box<dyn Fn(&PoolRecord) + Send + Sync>;

/// Host-wide leases on ids: agents sharing a host (and so, by default, a range) never
/// hand out one id to two tasks.
pub trait Leases: Send + Sync {
    /// Whether `id` is this agent's now (it was free, already this agent's, or held by
    /// an agent whose data dir is gone).
    fn acquire(&self, id: u32) -> bool;
    /// Gives `id` back, if this agent holds it.
    fn release(&self, id: u32);
}

/// No leases: the pool alone decides (tests, and an agent that cannot make its lease
/// dir).
pub struct NoLeases;

impl Leases for NoLeases {
    fn acquire(&self, _: u32) -> bool {
        true
    }
    fn release(&self, _: u32) {}
}

/// Leases as files: `<dir>/<id>`, made exclusively, holding the data dir of the agent
/// that holds the id. A lease whose data dir is gone is stale (that agent and its allocs
/// are gone with it) and is taken over. `dir` is root's (0700), on a tmpfs
/// (`/run`) so a reboot, which ends every task, clears it; restored allocs lease their
/// ids again.
pub struct LeaseDir {
    dir: std::path::PathBuf,
    owner: String,
}

impl LeaseDir {
    /// Leases in `dir` (made 0700 when missing) for the agent of `data_dir`.
    pub fn open(dir: &std::path::Path, data_dir: &std::path::Path) -> std::io::Result<LeaseDir> {
        use std::os::unix::fs::DirBuilderExt as _;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
        Ok(LeaseDir {
            dir: dir.to_path_buf(),
            owner: data_dir.to_string_lossy().into_owned(),
        })
    }

    fn holder(&self, id: u32) -> Option<String> {
        std::fs::read_to_string(self.dir.join(id.to_string())).ok()
    }

    /// Makes the lease of `id` whole or not at all: written under a name of this
    /// process's, then linked into place (`EEXIST` when another holds it), so no agent
    /// ever reads a lease half written.
    fn make(&self, id: u32) -> std::io::Result<()> {
        use std::io::Write as _;
        let draft = self.dir.join(format!(".{id}.{}", std::process::id()));
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&draft)?;
        let linked = file
            .write_all(self.owner.as_bytes())
            .and_then(|()| std::fs::hard_link(&draft, self.dir.join(id.to_string())));
        let _ = std::fs::remove_file(&draft);
        linked
    }

    /// Holds the lease dir's lock while `then` runs: take-overs are made one at a time
    /// across agents, so two never remove each other's fresh lease.
    fn locked<T>(&self, then: impl FnOnce() -> T) -> std::io::Result<T> {
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(self.dir.join(".lock"))?;
        rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive)?;
        Ok(then())
    }
}

impl Leases for LeaseDir {
    fn acquire(&self, id: u32) -> bool {
        match self.make(id) {
            Ok(()) => return true,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(error) => {
                tracing::error!(id, %error, "leasing a dynamic user id");
                return false;
            }
        }
        let taken_over = self.locked(|| {
            // Read again under the lock: another agent may have taken it over meanwhile.
            let Some(holder) = self.holder(id) else {
                return self.make(id).is_ok();
            };
            if holder == self.owner {
                return true;
            }
            if holder.is_empty() || std::path::Path::new(&holder).exists() {
                return false;
            }
            tracing::info!(id, %holder, "taking over the lease of an agent whose data dir is gone");
            let _ = std::fs::remove_file(self.dir.join(id.to_string()));
            self.make(id).is_ok()
        });
        taken_over.unwrap_or_else(|error| {
            tracing::error!(id, %error, "locking the dynamic user leases");
            false
        })
    }

    fn release(&self, id: u32) {
        if self.holder(id).as_deref() == Some(self.owner.as_str()) {
            let _ = std::fs::remove_file(self.dir.join(id.to_string()));
        }
    }
}

/// Why an alloc cannot have its ids yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Shortage {
    /// Fewer ids are free in the range than the alloc needs.
    Range { free: usize },
    /// Its job (with its periodic and dispatched children) would hold more than its
    /// share of the range with these: half of it, as a job's pids are half the node's,
    /// so one job cannot keep every other from starting.
    JobShare { held: usize, share: usize },
}

/// What a waiting alloc waits for, counted while its [`Wanting`] lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Want {
    /// This many ids from the range.
    Ids(usize),
    /// Room in this job's share.
    Share(String),
}

/// The range's ids: taken, released (in release order), and never used yet.
pub struct DynamicUsers {
    range: RangeInclusive<u32>,
    inner: Mutex<Pool>,
    keeper: Keeper,
    leases: Box<dyn Leases>,
    /// Woken on every release, for allocs waiting for ids.
    released: tokio::sync::Notify,
    /// Woken when an alloc starts waiting, or one finishes while others wait: for the
    /// agent's garbage collector.
    wanted: tokio::sync::Notify,
}

struct Pool {
    /// Ids never handed out and not claimed: `next..=end`.
    next: Option<u32>,
    released: VecDeque<u32>,
    /// Which allocs hold each id taken (one, unless two restored allocs recorded one).
    taken: BTreeMap<u32, BTreeSet<String>>,
    /// Ids handed out whose alloc may not have recorded them yet: a restart that finds
    /// no alloc holding one gives it back ([`DynamicUsers::restored`]).
    pending: BTreeSet<u32>,
    /// How many ids each job (its share's key) holds.
    held: BTreeMap<String, usize>,
    /// Ids that allocs waiting for some need, all told ([`DynamicUsers::shortfall`]).
    wanted: usize,
    /// Jobs whose allocs wait for room in their share, and how many allocs.
    wanted_share: BTreeMap<String, usize>,
}

impl DynamicUsers {
    /// A pool that keeps nothing (`berth run`, tests).
    pub fn new(range: RangeInclusive<u32>) -> Self {
        DynamicUsers::resume(range, None, Box::new(|_| {}))
    }

    /// The pool as `record` left it, keeping every change with `keeper`. A record of
    /// another range keeps its release order for the ids both hold; the new range's
    /// other ids are fresh.
    pub fn resume(range: RangeInclusive<u32>, record: Option<PoolRecord>, keeper: Keeper) -> Self {
        let same_range = |r: &PoolRecord| (r.first, r.last) == (*range.start(), *range.end());
        let (next, released, pending) = match record {
            Some(record) => {
                let same = same_range(&record);
                let mut seen = BTreeSet::new();
                let released = (record.released.into_iter())
                    .filter(|id| range.contains(id) && seen.insert(*id))
                    .collect();
                let next = match same {
                    true => record.next.filter(|id| range.contains(id)),
                    false => Some(*range.start()),
                };
                let pending = (record.pending.into_iter())
                    .filter(|id| range.contains(id))
                    .collect();
                (next, released, pending)
            }
            None => (Some(*range.start()), VecDeque::new(), BTreeSet::new()),
        };
        DynamicUsers {
            inner: Mutex::new(Pool {
                next,
                released,
                taken: BTreeMap::new(),
                pending,
                held: BTreeMap::new(),
                wanted: 0,
                wanted_share: BTreeMap::new(),
            }),
            range,
            keeper,
            leases: Box::new(NoLeases),
            released: tokio::sync::Notify::new(),
            wanted: tokio::sync::Notify::new(),
        }
    }

    /// The pool, leasing every id it hands out or claims with `leases`.
    pub fn with_leases(mut self, leases: Box<dyn Leases>) -> Self {
        self.leases = leases;
        self
    }

    pub fn range(&self) -> &RangeInclusive<u32> {
        &self.range
    }

    /// A job's share: half the range, rounded up.
    pub fn job_share(&self) -> usize {
        self.range_len().div_ceil(2)
    }

    fn range_len(&self) -> usize {
        (*self.range.end() as usize).saturating_sub(*self.range.start() as usize) + 1
    }

    /// Ids free to hand out now.
    pub fn free(&self) -> usize {
        let pool = self.inner.lock().unwrap();
        self.free_in(&pool)
    }

    fn free_in(&self, pool: &Pool) -> usize {
        let fresh = pool.next.map_or(0, |next| {
            let fresh = next..=*self.range.end();
            let above = fresh.size_hint().0;
            // Ids a restored alloc holds, or the queue has (another range's), up there.
            let claimed = pool.taken.range(fresh.clone()).count();
            let queued = pool.released.iter().filter(|id| fresh.contains(id)).count();
            above.saturating_sub(claimed + queued)
        });
        fresh + pool.released.len()
    }

    /// How many more ids the allocs waiting for some need than are free: finished allocs
    /// holding ids are collected while this is above 0.
    pub fn shortfall(&self) -> usize {
        let pool = self.inner.lock().unwrap();
        pool.wanted.saturating_sub(self.free_in(&pool))
    }

    /// The jobs (share keys) whose allocs wait for room in their share: their own
    /// finished allocs holding ids are collected.
    pub fn short_shares(&self) -> BTreeSet<String> {
        self.inner
            .lock()
            .unwrap()
            .wanted_share
            .keys()
            .cloned()
            .collect()
    }

    /// `count` ids for `alloc` of `job` (its share's key), all or none. Fresh ids first,
    /// then the least recently released. The caller records them with the alloc, then
    /// calls [`DynamicUsers::recorded`].
    pub fn take(&self, count: usize, job: &str, alloc: &str) -> Result<Vec<u32>, Shortage> {
        let mut pool = self.inner.lock().unwrap();
        let held = pool.held.get(job).copied().unwrap_or(0);
        if held + count > self.job_share() {
            return Err(Shortage::JobShare {
                held,
                share: self.job_share(),
            });
        }
        let free = self.free_in(&pool);
        if free < count {
            return Err(Shortage::Range { free });
        }
        let mut ids = Vec::with_capacity(count);
        // Ids another agent on this host leases: back to the queue's end, tried later.
        let mut elsewhere = Vec::new();
        while ids.len() < count {
            let id = match pool.next {
                Some(next) => {
                    pool.next = (next < *self.range.end()).then(|| next + 1);
                    // Held, or queued (a restored alloc's id released since, or another
                    // range's): it comes from the queue in its turn, never twice.
                    if pool.taken.contains_key(&next) || pool.released.contains(&next) {
                        continue;
                    }
                    next
                }
                None => match pool.released.pop_front() {
                    Some(id) => id,
                    None => break,
                },
            };
            // Never an id a live alloc holds, whichever way it came.
            if pool.taken.contains_key(&id) {
                continue;
            }
            if !self.leases.acquire(id) {
                elsewhere.push(id);
                continue;
            }
            pool.taken.insert(id, BTreeSet::from([alloc.to_string()]));
            ids.push(id);
        }
        pool.released.extend(elsewhere);
        if ids.len() < count {
            // Other agents lease the rest: given back, in the order they came.
            for id in ids.iter().rev() {
                pool.taken.remove(id);
                self.leases.release(*id);
                pool.released.push_front(*id);
            }
            self.keep(&pool);
            return Err(Shortage::Range { free: ids.len() });
        }
        *pool.held.entry(job.to_string()).or_default() += count;
        pool.pending.extend(ids.iter().copied());
        self.keep(&pool);
        Ok(ids)
    }

    /// `ids` are recorded with their alloc: a restart claims them from there.
    pub fn recorded(&self, ids: &[u32]) {
        let mut pool = self.inner.lock().unwrap();
        for id in ids {
            pool.pending.remove(id);
        }
    }

    /// Marks ids a restored `alloc` of `job` holds as taken (they are not handed out
    /// again). Ids outside the range (the operator changed it) are kept out of the pool
    /// for good.
    pub fn claim(&self, ids: &[u32], job: &str, alloc: &str) {
        let mut pool = self.inner.lock().unwrap();
        let mut claimed = 0;
        for id in ids {
            pool.released.retain(|r| r != id);
            pool.pending.remove(id);
            let holders = pool.taken.entry(*id).or_default();
            if !holders.is_empty() && !holders.contains(alloc) {
                tracing::error!(id, alloc, others = ?holders,
                    "two restored allocs recorded one user id; it is free only once both are collected");
            }
            claimed += usize::from(holders.insert(alloc.to_string()));
            if !self.leases.acquire(*id) {
                tracing::error!(
                    id,
                    "a restored alloc's user id is leased by another agent of this host"
                );
            }
        }
        *pool.held.entry(job.to_string()).or_default() += claimed;
    }

    /// Every restored alloc has claimed its ids: ids handed out that no alloc recorded
    /// (the agent died in between) go back, to the end of the queue.
    pub fn restored(&self) {
        let mut pool = self.inner.lock().unwrap();
        let lost: Vec<u32> = std::mem::take(&mut pool.pending)
            .into_iter()
            .filter(|id| !pool.taken.contains_key(id) && !pool.released.contains(id))
            .collect();
        if lost.is_empty() {
            return;
        }
        tracing::info!(ids = ?lost, "user ids handed out before a crash and never recorded are free again");
        for id in lost {
            self.leases.release(id);
            pool.released.push_back(id);
        }
        self.keep(&pool);
    }

    /// Gives `alloc` of `job`'s ids back, after every one the alloc had: each id no
    /// other alloc holds goes to the end of the queue, and the queue is kept before this
    /// returns (the alloc's record may go only then: a restart in between claims them
    /// again).
    pub fn release(&self, ids: &[u32], job: &str, alloc: &str) {
        {
            let mut pool = self.inner.lock().unwrap();
            let mut returned = 0;
            for id in ids {
                let Some(holders) = pool.taken.get_mut(id) else {
                    continue;
                };
                if !holders.remove(alloc) {
                    continue;
                }
                returned += 1;
                if holders.is_empty() {
                    pool.taken.remove(id);
                    pool.pending.remove(id);
                    self.leases.release(*id);
                    if self.range.contains(id) {
                        pool.released.push_back(*id);
                    }
                }
            }
            if let Some(held) = pool.held.get_mut(job) {
                *held = held.saturating_sub(returned);
                if *held == 0 {
                    pool.held.remove(job);
                }
            }
            self.keep(&pool);
        }
        self.released.notify_waiters();
    }

    fn keep(&self, pool: &Pool) {
        (self.keeper)(&PoolRecord {
            first: *self.range.start(),
            last: *self.range.end(),
            next: pool.next,
            released: pool.released.iter().copied().collect(),
            pending: pool.pending.iter().copied().collect(),
        });
    }

    /// Counts what a waiting alloc wants until the guard drops, and wakes the collector.
    pub fn want(&self, want: Want) -> Wanting<'_> {
        {
            let mut pool = self.inner.lock().unwrap();
            match &want {
                Want::Ids(count) => pool.wanted += count,
                Want::Share(job) => *pool.wanted_share.entry(job.clone()).or_default() += 1,
            }
        }
        self.wanted.notify_one();
        Wanting { users: self, want }
    }

    /// An alloc finished: if allocs wait for ids, the collector is woken (the finished
    /// one may hold some).
    pub fn alloc_finished(&self) {
        let waiting = {
            let pool = self.inner.lock().unwrap();
            pool.wanted > 0 || !pool.wanted_share.is_empty()
        };
        if waiting {
            self.wanted.notify_one();
        }
    }

    /// Resolves when finished allocs should be collected for allocs waiting for ids (one
    /// stored wake-up if none listens).
    pub fn collection_wanted(&self) -> tokio::sync::futures::Notified<'_> {
        self.wanted.notified()
    }

    /// Resolves at the next release (register before trying again, so none is missed).
    pub fn released(&self) -> tokio::sync::futures::Notified<'_> {
        self.released.notified()
    }
}

/// What a waiting alloc wants, counted in [`DynamicUsers::shortfall`] and
/// [`DynamicUsers::short_shares`] while it lives.
pub struct Wanting<'a> {
    users: &'a DynamicUsers,
    want: Want,
}

impl Drop for Wanting<'_> {
    fn drop(&mut self) {
        let mut pool = self.users.inner.lock().unwrap();
        match &self.want {
            Want::Ids(count) => pool.wanted = pool.wanted.saturating_sub(*count),
            Want::Share(job) => {
                if let Some(waiting) = pool.wanted_share.get_mut(job) {
                    *waiting -= 1;
                    if *waiting == 0 {
                        pool.wanted_share.remove(job);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kept_pool(
        range: RangeInclusive<u32>,
    ) -> (DynamicUsers, std::sync::Arc<Mutex<Vec<PoolRecord>>>) {
        let kept = std::sync::Arc::new(Mutex::new(Vec::new()));
        let sink = kept.clone();
        let users = DynamicUsers::resume(
            range,
            None,
            Box::new(move |record| sink.lock().unwrap().push(record.clone())),
        );
        (users, kept)
    }

    /// `count` ids for a new alloc of its own job, recorded at once.
    fn take(users: &DynamicUsers, count: usize, job: &str) -> Option<Vec<u32>> {
        let ids = users.take(count, job, &format!("{job}-alloc")).ok()?;
        users.recorded(&ids);
        Some(ids)
    }

    fn release(users: &DynamicUsers, ids: &[u32], job: &str) {
        users.release(ids, job, &format!("{job}-alloc"));
    }

    #[test]
    fn ids_are_unique_and_reused_least_recently_released_first() {
        let users = DynamicUsers::new(10..=17);
        assert_eq!(take(&users, 2, "a"), Some(vec![10, 11]));
        assert_eq!(take(&users, 2, "b"), Some(vec![12, 13]));
        assert_eq!(take(&users, 2, "c"), Some(vec![14, 15]));
        assert_eq!(take(&users, 2, "d"), Some(vec![16, 17]));
        assert_eq!(users.take(1, "e", "e1"), Err(Shortage::Range { free: 0 }));
        release(&users, &[12, 13], "b");
        release(&users, &[10, 11], "a");
        release(&users, &[14, 15], "c");
        assert_eq!(take(&users, 3, "e"), Some(vec![12, 13, 10]));
        // Not the alloc holding them: nothing given back.
        release(&users, &[16, 17], "c");
        assert_eq!(take(&users, 2, "f"), Some(vec![11, 14]));
        release(&users, &[11, 14], "f");
        release(&users, &[11, 14], "f");
        assert_eq!(take(&users, 3, "g"), Some(vec![15, 11, 14]));
        assert_eq!(
            take(&users, 1, "h"),
            None,
            "a double release hands out nothing twice"
        );
    }

    /// The release order survives a restart: an agent that stopped right after releasing
    /// an id hands it out last, not first (attack review: after a restart the ids
    /// released before it came first, so a setgid file left in a volume by the last
    /// holder of a gid gave a local user the next alloc's group).
    #[test]
    fn the_release_order_survives_a_restart() {
        let (users, kept) = kept_pool(10..=13);
        assert_eq!(take(&users, 2, "a").unwrap(), [10, 11]);
        assert_eq!(take(&users, 2, "b").unwrap(), [12, 13]);
        release(&users, &[12], "b");
        release(&users, &[10, 11], "a");
        let record = kept.lock().unwrap().last().cloned();
        assert_eq!(
            record.as_ref().map(|r| (r.next, r.released.clone())),
            Some((None, vec![12, 10, 11]))
        );
        let restarted = DynamicUsers::resume(10..=13, record.clone(), Box::new(|_| {}));
        restarted.claim(&[13], "b", "b-alloc");
        restarted.restored();
        assert_eq!(take(&restarted, 1, "c").unwrap(), [12]);
        assert_eq!(take(&restarted, 1, "d").unwrap(), [10]);
        assert_eq!(take(&restarted, 1, "e").unwrap(), [11]);
        assert!(take(&restarted, 1, "f").is_none());

        // Another range keeps the order of the ids both hold; its others are fresh, and
        // come first.
        let moved = DynamicUsers::resume(10..=15, record, Box::new(|_| {}));
        moved.claim(&[13], "b", "b-alloc");
        assert_eq!(take(&moved, 2, "c").unwrap(), [14, 15]);
        assert_eq!(take(&moved, 3, "d").unwrap(), [12, 10, 11]);
    }

    /// Ids handed out whose alloc never recorded them (the agent died in between) come
    /// back after a restart, at the end of the queue; recorded ones stay with their alloc.
    #[test]
    fn ids_handed_out_but_never_recorded_come_back_after_a_restart() {
        let (users, kept) = kept_pool(10..=15);
        assert_eq!(take(&users, 2, "a").unwrap(), [10, 11]);
        release(&users, &[10, 11], "a");
        assert_eq!(users.take(2, "b", "b-alloc").unwrap(), [12, 13]);
        // Died here: b's alloc never recorded 12 and 13.
        let record = kept.lock().unwrap().last().cloned();
        let restarted = DynamicUsers::resume(10..=15, record, Box::new(|_| {}));
        restarted.restored();
        assert_eq!(take(&restarted, 2, "c").unwrap(), [14, 15]);
        assert_eq!(take(&restarted, 2, "d").unwrap(), [10, 11]);
        assert_eq!(take(&restarted, 2, "e").unwrap(), [12, 13]);
    }

    /// An id two restored allocs recorded (it should never happen) is free again only
    /// when both are collected.
    #[test]
    fn an_id_two_allocs_hold_is_free_only_when_both_let_go() {
        let users = DynamicUsers::new(10..=13);
        users.claim(&[10, 11], "a", "one");
        users.claim(&[10, 12], "b", "two");
        users.restored();
        users.release(&[10, 11], "a", "one");
        assert_eq!(take(&users, 2, "c").unwrap(), [13, 11]);
        users.release(&[10, 12], "b", "two");
        assert_eq!(take(&users, 2, "d").unwrap(), [10, 12]);
    }

    #[test]
    fn a_job_holds_at_most_half_the_range_and_waiting_allocs_count() {
        let users = DynamicUsers::new(1..=10);
        assert_eq!(users.job_share(), 5);
        assert_eq!(DynamicUsers::new(1..=3).job_share(), 2);
        assert_eq!(users.take(3, "greedy", "g1").unwrap().len(), 3);
        assert_eq!(
            users.take(3, "greedy", "g2"),
            Err(Shortage::JobShare { held: 3, share: 5 })
        );
        let ids = users.take(2, "greedy", "g3").unwrap();
        assert_eq!(users.take(5, "other", "o1").unwrap().len(), 5);
        assert_eq!(users.free(), 0);
        {
            let _waiting = users.want(Want::Ids(2));
            let _sharing = users.want(Want::Share("greedy".into()));
            assert_eq!(users.shortfall(), 2);
            assert_eq!(users.short_shares(), BTreeSet::from(["greedy".to_string()]));
            users.release(&ids, "greedy", "g3");
            assert_eq!(users.shortfall(), 0);
            // Its share comes back with its ids.
            assert!(users.take(2, "greedy", "g4").is_ok());
            assert_eq!(users.shortfall(), 2);
        }
        assert_eq!(users.shortfall(), 0, "no longer waiting");
        assert!(users.short_shares().is_empty());
    }

    /// An id a restored alloc held above the fresh ones, released, is handed out once:
    /// two live allocs never share a uid (attack review: after a restart, B and E ran as
    /// the same uid).
    #[test]
    fn a_restored_id_released_is_handed_out_once() {
        let users = DynamicUsers::new(80100..=80107);
        users.claim(&[80100, 80101], "a", "a1");
        users.release(&[80100, 80101], "a", "a1");
        let mut handed: Vec<u32> = Vec::new();
        for job in ["b", "c", "d", "e", "f", "g", "h", "i"] {
            handed.extend(take(&users, 1, job).unwrap());
        }
        handed.sort_unstable();
        assert_eq!(handed, (80100..=80107).collect::<Vec<_>>());
        assert!(take(&users, 1, "j").is_none());
    }

    /// Two agents of one host with the same range (the default) never hand out one id
    /// twice (attack review: they shared the range without coordinating, so tasks of
    /// two agents could be one user); an agent whose data dir is gone loses its leases.
    #[test]
    fn agents_sharing_a_host_lease_their_ids() {
        let leases = tempfile::tempdir().unwrap();
        let (first_dir, second_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let agent = |data: &std::path::Path| {
            DynamicUsers::new(10..=15)
                .with_leases(Box::new(LeaseDir::open(leases.path(), data).unwrap()))
        };
        let (first, second) = (agent(first_dir.path()), agent(second_dir.path()));
        assert_eq!(take(&first, 2, "a").unwrap(), [10, 11]);
        assert_eq!(take(&second, 2, "b").unwrap(), [12, 13]);
        assert_eq!(take(&first, 2, "c").unwrap(), [14, 15]);
        assert_eq!(second.take(1, "d", "d1"), Err(Shortage::Range { free: 0 }));
        release(&first, &[10, 11], "a");
        assert_eq!(
            take(&second, 2, "d").unwrap(),
            [10, 11],
            "released, and leased by no one"
        );
        // The first agent restarts: its restored alloc's ids are still its own.
        let restarted = agent(first_dir.path());
        restarted.claim(&[14, 15], "c", "c-alloc");
        assert!(take(&restarted, 1, "e").is_none());
        // The second agent's data dir is gone (and its allocs with it).
        let gone = second_dir.path().to_path_buf();
        drop(second_dir);
        assert!(!gone.exists());
        assert_eq!(
            take(&restarted, 2, "e").unwrap(),
            [10, 11],
            "stale leases are taken over"
        );
    }

    #[test]
    fn claimed_ids_are_not_handed_out() {
        let users = DynamicUsers::new(10..=15);
        users.claim(&[11, 99], "a", "a1");
        assert_eq!(take(&users, 2, "b").unwrap(), [10, 12]);
        assert_eq!(take(&users, 3, "c").unwrap(), [13, 14, 15]);
        assert!(take(&users, 1, "d").is_none());
        users.release(&[11], "a", "a1");
        assert_eq!(take(&users, 1, "d").unwrap(), [11]);
    }
}
