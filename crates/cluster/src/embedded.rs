//! The cluster store of a lone agent: the part of etcd's v3 model berth uses
//! (revisioned keys, transactions on a key's revision or value, leases, prefix watches
//! from a revision, one leader per election) in this process, kept in a redb file
//! (`<data_dir>/cluster.db`) or in memory (`berth run`).
//!
//! Elections are keys, as etcd's election service makes them (`<name>/<lease>`, the
//! oldest the leader), so a write guarded by the leader key's revision holds exactly
//! while the leader is.
//!
//! A lone agent is a one-node cluster on it (as Nomad's `-dev` agent is a server and a
//! client in one): the same scheduler, the same records, the same API answers as a
//! member of an etcd cluster. `conformance` tests run the same cases against this and a
//! real etcd.
//!
//! What differs from etcd, on purpose:
//! - Leases do not run out while the process lives (nothing else could renew them), and
//!   none survives it: keys written under a lease are gone when the file is opened
//!   again, as they would be from etcd once the TTL passed.
//! - A write is durable (redb's `Durability::Immediate`) before any reader or watcher
//!   sees it; a failed write changes nothing.
//! - History kept for watches from an older revision is bounded ([`HISTORY`]); a watch
//!   from before it starts with [`Change::Reset`], as etcd's compaction does.

use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use tokio::sync::mpsc;

use super::etcd::{Change, Condition, Entry, EtcdError, LeaderKey, Write};

const KEYS: TableDefinition<&str, &[u8]> = TableDefinition::new("keys");
const META: TableDefinition<&str, i64> = TableDefinition::new("meta");

/// How many changes are kept for watches that start at an older revision.
pub const HISTORY: usize = 4096;

/// How many changes may wait for a slow watcher before its watch is cut (it gets a
/// [`Change::Reset`] and reads again).
const WATCH_QUEUE: usize = 1024;

#[derive(Debug, Clone, PartialEq, Eq)]
struct Stored {
    value: Vec<u8>,
    create_revision: i64,
    mod_revision: i64,
    lease: i64,
}

impl Stored {
    fn encode(&self) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(24 + self.value.len());
        bytes.extend_from_slice(&self.create_revision.to_le_bytes());
        bytes.extend_from_slice(&self.mod_revision.to_le_bytes());
        bytes.extend_from_slice(&self.lease.to_le_bytes());
        bytes.extend_from_slice(&self.value);
        bytes
    }

    fn decode(bytes: &[u8]) -> Option<Stored> {
        let number = |at: usize| {
            bytes
                .get(at..at + 8)
                .and_then(|b| <[u8; 8]>::try_from(b).ok())
                .map(i64::from_le_bytes)
        };
        Some(Stored {
            create_revision: number(0)?,
            mod_revision: number(8)?,
            lease: number(16)?,
            value: bytes.get(24..)?.to_vec(),
        })
    }

    fn entry(&self, key: &str) -> Entry {
        Entry {
            key: key.to_string(),
            value: self.value.clone(),
            mod_revision: self.mod_revision,
            create_revision: self.create_revision,
            lease: self.lease,
        }
    }
}

struct Watcher {
    prefix: String,
    sender: mpsc::Sender<Change>,
    /// Set while the watcher waits for room for its [`Change::Reset`]: changes meanwhile
    /// are not sent (it reads the prefix again after the reset).
    cut: Arc<std::sync::atomic::AtomicBool>,
    /// Told [`Change::Revision`] after each revision's changes of its prefix.
    whole_revisions: bool,
}

#[derive(Default)]
struct Inner {
    revision: i64,
    keys: BTreeMap<String, Stored>,
    leases: std::collections::BTreeSet<i64>,
    next_lease: i64,
    history: VecDeque<Change>,
    watchers: Vec<Watcher>,
}

/// The store itself; [`super::store::Store`] is how the cluster code reaches it.
pub struct Embedded {
    inner: Mutex<Inner>,
    file: Option<Database>,
    path: Option<PathBuf>,
}

impl std::fmt::Debug for Embedded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Embedded")
            .field("path", &self.path)
            .finish()
    }
}

impl Embedded {
    /// A store that lives as long as the process (`berth run`).
    pub fn in_memory() -> Arc<Embedded> {
        Arc::new(Embedded {
            inner: Mutex::new(Inner {
                next_lease: 1,
                ..Inner::default()
            }),
            file: None,
            path: None,
        })
    }

    /// Opens (or creates, readable by its owner only) the store kept in `path`. Keys
    /// written under a lease are removed: no lease outlives the process that held it.
    pub fn open(path: &Path) -> Result<Arc<Embedded>, EtcdError> {
        let failed = |reason: String| EtcdError::Embedded {
            path: path.display().to_string(),
            reason,
        };
        berth_state::restrict_to_owner(path).map_err(|e| failed(e.to_string()))?;
        let file = Database::create(path).map_err(|e| failed(e.to_string()))?;
        let mut inner = Inner {
            next_lease: 1,
            ..Inner::default()
        };
        let mut expired = Vec::new();
        {
            let read = file.begin_read().map_err(|e| failed(e.to_string()))?;
            if let Ok(meta) = read.open_table(META)
                && let Some(revision) = meta.get("revision").map_err(|e| failed(e.to_string()))?
            {
                inner.revision = revision.value();
            }
            if let Ok(keys) = read.open_table(KEYS) {
                for row in keys.iter().map_err(|e| failed(e.to_string()))? {
                    let (key, value) = row.map_err(|e| failed(e.to_string()))?;
                    let stored = Stored::decode(value.value()).ok_or_else(|| {
                        failed(format!("the record of key {:?} is cut short", key.value()))
                    })?;
                    if stored.lease != 0 {
                        expired.push(key.value().to_string());
                    }
                    inner.keys.insert(key.value().to_string(), stored);
                }
            }
        }
        let store = Embedded {
            inner: Mutex::new(inner),
            file: Some(file),
            path: Some(path.to_path_buf()),
        };
        // The tables exist from now on, and the leased keys are gone.
        let writes = expired.into_iter().map(Write::Delete).collect();
        store.apply(Vec::new(), writes)?;
        Ok(Arc::new(store))
    }

    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn failed(&self, reason: impl std::fmt::Display) -> EtcdError {
        EtcdError::Embedded {
            path: self
                .path
                .as_ref()
                .map_or_else(|| "memory".into(), |p| p.display().to_string()),
            reason: reason.to_string(),
        }
    }

    pub fn get(&self, key: &str) -> Option<Entry> {
        self.lock().keys.get(key).map(|stored| stored.entry(key))
    }

    /// Every key under `prefix`, and the revision they were read at.
    pub fn list(&self, prefix: &str) -> (Vec<Entry>, i64) {
        let inner = self.lock();
        let entries = inner
            .keys
            .range(prefix.to_string()..)
            .take_while(|(key, _)| key.starts_with(prefix))
            .map(|(key, stored)| stored.entry(key))
            .collect();
        (entries, inner.revision)
    }

    pub fn revision(&self) -> i64 {
        self.lock().revision
    }

    /// Applies `writes` if every condition holds (`Ok(false)`: one did not, nothing
    /// was written). A transaction that changes something moves the revision by one,
    /// as etcd's does.
    pub fn apply(&self, conditions: Vec<Condition>, writes: Vec<Write>) -> Result<bool, EtcdError> {
        let mut inner = self.lock();
        let holds = conditions.iter().all(|condition| match condition {
            Condition::ModRevision(key, revision) => {
                inner.keys.get(key).map_or(0, |s| s.mod_revision) == *revision
            }
            Condition::ValueIs(key, value) => {
                inner.keys.get(key).is_some_and(|s| s.value == *value)
            }
        });
        if !holds {
            return Ok(false);
        }
        for write in &writes {
            if let Write::Put { key, lease, .. } = write
                && *lease != 0
                && !inner.leases.contains(lease)
            {
                return Err(EtcdError::Refused(format!(
                    "lease {lease:x} not found (writing {key:?})"
                )));
            }
        }
        let revision = inner.revision + 1;
        let mut changed: BTreeMap<String, Option<Stored>> = BTreeMap::new();
        for write in writes {
            match write {
                Write::Put { key, value, lease } => {
                    let create_revision = match changed.get(&key) {
                        Some(Some(stored)) => stored.create_revision,
                        Some(None) => revision,
                        None => inner.keys.get(&key).map_or(revision, |s| s.create_revision),
                    };
                    let stored = Stored {
                        value,
                        create_revision,
                        mod_revision: revision,
                        lease,
                    };
                    changed.insert(key, Some(stored));
                }
                Write::Delete(key) => {
                    let exists = match changed.get(&key) {
                        Some(stored) => stored.is_some(),
                        None => inner.keys.contains_key(&key),
                    };
                    if exists {
                        changed.insert(key, None);
                    }
                }
            }
        }
        if changed.is_empty() {
            return Ok(true);
        }
        self.persist(revision, &changed)?;
        inner.revision = revision;
        let keys: Vec<String> = changed.keys().cloned().collect();
        for (key, stored) in changed {
            let change = match stored {
                Some(stored) => {
                    let change = Change::Put(stored.entry(&key));
                    inner.keys.insert(key, stored);
                    change
                }
                None => {
                    inner.keys.remove(&key);
                    Change::Delete {
                        key,
                        mod_revision: revision,
                    }
                }
            };
            inner.notify(&change);
            inner.history.push_back(change);
        }
        // Whole revisions go from the history: a replay from its oldest revision hands
        // that revision whole, or the watcher is told to read again.
        while inner.history.len() > HISTORY {
            let Some(oldest) = inner.history.front().map(revision_of) else {
                break;
            };
            while inner
                .history
                .front()
                .is_some_and(|c| revision_of(c) == oldest)
            {
                inner.history.pop_front();
            }
        }
        inner.notify_revision(revision, &keys);
        Ok(true)
    }

    /// Writes one revision's changes to the file before anyone sees them.
    fn persist(
        &self,
        revision: i64,
        changed: &BTreeMap<String, Option<Stored>>,
    ) -> Result<(), EtcdError> {
        let Some(file) = &self.file else {
            return Ok(());
        };
        let txn = file.begin_write().map_err(|e| self.failed(e))?;
        {
            let mut keys = txn.open_table(KEYS).map_err(|e| self.failed(e))?;
            for (key, stored) in changed {
                match stored {
                    Some(stored) => {
                        keys.insert(key.as_str(), stored.encode().as_slice())
                            .map_err(|e| self.failed(e))?;
                    }
                    None => {
                        keys.remove(key.as_str()).map_err(|e| self.failed(e))?;
                    }
                }
            }
            let mut meta = txn.open_table(META).map_err(|e| self.failed(e))?;
            meta.insert("revision", revision)
                .map_err(|e| self.failed(e))?;
        }
        txn.commit().map_err(|e| self.failed(e))
    }

    pub fn grant_lease(&self) -> i64 {
        let mut inner = self.lock();
        let lease = inner.next_lease;
        inner.next_lease += 1;
        inner.leases.insert(lease);
        lease
    }

    /// Whether the lease still exists (it does until revoked).
    pub fn keep_alive(&self, lease: i64) -> bool {
        self.lock().leases.contains(&lease)
    }

    /// Ends a lease: its keys are deleted, and a leader elected with it resigns.
    pub fn revoke_lease(&self, lease: i64) -> Result<(), EtcdError> {
        let keys: Vec<Write> = {
            let mut inner = self.lock();
            if !inner.leases.remove(&lease) {
                return Ok(());
            }
            inner
                .keys
                .iter()
                .filter(|(_, stored)| stored.lease == lease)
                .map(|(key, _)| Write::Delete(key.clone()))
                .collect()
        };
        self.apply(Vec::new(), keys).map(drop)
    }

    /// Watches every key under `prefix` from `start_revision` (0: from now), as
    /// [`super::etcd::Etcd::watch`] does, with a [`Change::Revision`] after each
    /// revision's changes when `whole_revisions`.
    pub fn watch(
        &self,
        prefix: &str,
        start_revision: i64,
        whole_revisions: bool,
    ) -> mpsc::Receiver<Change> {
        let (sender, receiver) = mpsc::channel(WATCH_QUEUE);
        let mut inner = self.lock();
        if start_revision > 0 && start_revision <= inner.revision {
            let oldest = inner
                .history
                .front()
                .map_or(inner.revision + 1, revision_of);
            let mut missed: Vec<Change> = Vec::new();
            for change in inner
                .history
                .iter()
                .filter(|c| revision_of(c) >= start_revision && key_of(c).starts_with(prefix))
            {
                if whole_revisions
                    && let Some(last) = missed.last().map(revision_of)
                    && last != revision_of(change)
                {
                    missed.push(Change::Revision(last));
                }
                missed.push(change.clone());
            }
            if whole_revisions && let Some(last) = missed.last().map(revision_of) {
                missed.push(Change::Revision(last));
            }
            if start_revision < oldest || missed.len() >= WATCH_QUEUE {
                // Compacted, or more than the watcher could be handed: it reads the
                // prefix again.
                let _ = sender.try_send(Change::Reset);
            } else {
                for change in missed {
                    let _ = sender.try_send(change);
                }
            }
        }
        inner.watchers.push(Watcher {
            prefix: prefix.to_string(),
            sender,
            cut: Arc::default(),
            whole_revisions,
        });
        receiver
    }

    /// Campaigns in `name` with `lease` until elected, as etcd's election service does:
    /// each candidate writes `<name>/<lease>` under its lease, and the oldest key is
    /// the leader. The leader key's revision is what writes made "while still leader"
    /// compare.
    pub async fn campaign(
        &self,
        name: &str,
        lease: i64,
        value: &str,
    ) -> Result<LeaderKey, EtcdError> {
        let key = format!("{name}/{lease:x}");
        let prefix = format!("{name}/");
        let mut changes = self.watch(&prefix, 0, false);
        let write = Write::Put {
            key: key.clone(),
            value: value.as_bytes().to_vec(),
            lease,
        };
        self.apply(vec![Condition::ModRevision(key.clone(), 0)], vec![write])?;
        loop {
            let (candidates, _) = self.list(&prefix);
            let Some(ours) = candidates.iter().find(|e| e.key == key) else {
                // Its lease was revoked while it waited.
                return Err(EtcdError::Refused(format!("lease {lease:x} not found")));
            };
            let oldest = candidates.iter().min_by_key(|e| e.create_revision);
            if oldest.is_some_and(|e| e.key == key) {
                return Ok(LeaderKey {
                    name: name.as_bytes().to_vec(),
                    key: key.into_bytes(),
                    rev: ours.create_revision,
                    lease,
                });
            }
            if changes.recv().await.is_none() {
                return Err(EtcdError::Refused("the store was closed".into()));
            }
        }
    }

    /// The value the leader of `name` proclaimed.
    pub fn leader(&self, name: &str) -> Option<String> {
        let (candidates, _) = self.list(&format!("{name}/"));
        candidates
            .into_iter()
            .min_by_key(|e| e.create_revision)
            .map(|e| String::from_utf8_lossy(&e.value).into_owned())
    }

    pub fn resign(&self, leader: &LeaderKey) -> Result<(), EtcdError> {
        let key = String::from_utf8_lossy(&leader.key).into_owned();
        self.apply(Vec::new(), vec![Write::Delete(key)]).map(drop)
    }
}

impl Inner {
    /// Hands `change` to every watcher of its key; a watcher too slow to take it is cut:
    /// it gets a [`Change::Reset`] and then changes from the next revision on.
    fn notify(&mut self, change: &Change) {
        let key = key_of(change);
        self.watchers.retain(|watcher| !watcher.sender.is_closed());
        for watcher in &self.watchers {
            if key.starts_with(&watcher.prefix) {
                watcher.send(change.clone());
            }
        }
    }

    /// Tells the watchers that want it that `revision`, which changed `keys`, has been
    /// handed to them whole.
    fn notify_revision(&mut self, revision: i64, keys: &[String]) {
        for watcher in &self.watchers {
            if watcher.whole_revisions && keys.iter().any(|k| k.starts_with(&watcher.prefix)) {
                watcher.send(Change::Revision(revision));
            }
        }
    }
}

impl Watcher {
    /// Hands it `change`, unless it is cut; one too slow to take it is cut.
    fn send(&self, change: Change) {
        use std::sync::atomic::Ordering;
        if self.cut.load(Ordering::SeqCst) {
            return;
        }
        if let Err(mpsc::error::TrySendError::Full(_)) = self.sender.try_send(change) {
            self.cut.store(true, Ordering::SeqCst);
            reset_when_room(self.sender.clone(), self.cut.clone());
        }
    }
}

/// Sends a cut watcher its [`Change::Reset`] once it has room, then hands it changes
/// again: it reads the prefix again after the reset, as after etcd cut a watch.
fn reset_when_room(sender: mpsc::Sender<Change>, cut: Arc<std::sync::atomic::AtomicBool>) {
    let clear = move || cut.store(false, std::sync::atomic::Ordering::SeqCst);
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => {
            runtime.spawn(async move {
                if sender.send(Change::Reset).await.is_ok() {
                    clear();
                }
            });
        }
        Err(_) => {
            let _ = std::thread::Builder::new()
                .name("berth-watch-reset".into())
                .spawn(move || {
                    if sender.blocking_send(Change::Reset).is_ok() {
                        clear();
                    }
                });
        }
    }
}

fn revision_of(change: &Change) -> i64 {
    match change {
        Change::Put(entry) => entry.mod_revision,
        Change::Delete { mod_revision, .. } => *mod_revision,
        Change::Revision(revision) => *revision,
        Change::Reset => 0,
    }
}

fn key_of(change: &Change) -> &str {
    match change {
        Change::Put(entry) => &entry.key,
        Change::Delete { key, .. } => key,
        Change::Reset | Change::Revision(_) => "",
    }
}
