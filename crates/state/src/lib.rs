//! The agent's local state: jobs, allocs, task states, driver handles and hook state,
//! in one redb file under the data dir.
//!
//! Every write the agent relies on is its own durable transaction (redb's
//! `Durability::Immediate`), made *before* the agent relies on what it records: a driver
//! handle is stored before the task is reported started, so an agent killed right after
//! can still recover the task. Purely informative writes (a task event between two state
//! transitions) are [`Commit::Lazy`]: they reach the disk with the next durable commit.
//!
//! Records are JSON, so a person can read them and a newer agent can add fields. A record
//! that does not decode is reported and skipped, never deleted: nothing recorded is lost
//! because one entry is unreadable. A file that redb cannot open as a database is moved
//! aside (kept, with a name that says why) and the agent starts with empty state.
//!
//! The catalog of CSI volumes and their claims ([`catalog`]) lives here too: on a lone
//! agent's embedded store it is a table of this file, and both the CSI manager and the
//! cluster stand on it.

pub mod catalog;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use berth_hcl::eval::VariableInputs;
use berth_model::driver::TaskHandle;
use berth_model::events::TaskState;
use berth_model::status::{ClientStatus, DesiredStatus};
use berth_sys::blocking;

const META: TableDefinition<&str, &str> = TableDefinition::new("meta");
const JOBS: TableDefinition<&str, &[u8]> = TableDefinition::new("jobs");
const ALLOCS: TableDefinition<&str, &[u8]> = TableDefinition::new("allocs");
/// Keyed `alloc_id/task`.
const TASK_STATES: TableDefinition<&str, &[u8]> = TableDefinition::new("task_states");
/// Keyed `alloc_id/task`.
const TASK_HANDLES: TableDefinition<&str, &[u8]> = TableDefinition::new("task_handles");
/// Keyed `alloc_id/hook`.
const HOOK_STATE: TableDefinition<&str, &[u8]> = TableDefinition::new("hook_state");

/// Tables of the CSI parts and the embedded catalog, read and written as whole JSON
/// records by key (see [`StateStore::put_record`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordTable {
    /// The dynamic plugin registry, keyed `kind/plugin_id`.
    CsiPlugins,
    /// Which allocs use a staged volume, keyed by volume id (the CSI manager's usage).
    CsiUsage,
    /// Catalog: registered volumes, keyed by volume id.
    Volumes,
    /// Catalog: claims, keyed `volume_id/alloc_id`.
    Claims,
    /// Catalog: plugin providers, keyed `plugin_id/kind/alloc_id`.
    PluginProviders,
    /// The dynamic users' pool (its release order), one record keyed `pool`.
    DynamicUsers,
}

impl RecordTable {
    const ALL: [RecordTable; 6] = [
        RecordTable::CsiPlugins,
        RecordTable::CsiUsage,
        RecordTable::Volumes,
        RecordTable::Claims,
        RecordTable::PluginProviders,
        RecordTable::DynamicUsers,
    ];

    fn name(self) -> &'static str {
        match self {
            RecordTable::CsiPlugins => "csi_plugins",
            RecordTable::CsiUsage => "csi_usage",
            RecordTable::Volumes => "volumes",
            RecordTable::Claims => "claims",
            RecordTable::PluginProviders => "plugin_providers",
            RecordTable::DynamicUsers => "dynamic_users",
        }
    }

    fn definition(self) -> TableDefinition<'static, &'static str, &'static [u8]> {
        TableDefinition::new(self.name())
    }
}

const SCHEMA_VERSION: &str = "1";

/// The records that decoded, and the ones that did not.
pub type Scanned<T> = (Vec<T>, Vec<Unreadable>);

/// How soon a write must be on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Commit {
    /// On disk when the call returns: for what the agent relies on (handles, records,
    /// state transitions).
    Durable,
    /// On disk with the next durable commit: for what is informative only (a task
    /// event between two state transitions). A crash may lose it; nothing depends on it.
    Lazy,
}

/// A submitted job, kept as the source the user sent so a restored agent decodes it with
/// exactly the rules that accepted it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobRecord {
    /// The job's name, which is its id.
    pub id: String,
    /// Where the source came from (a file name), for messages.
    pub source_name: String,
    pub source: String,
    /// The values its variables were given, to evaluate it the same way on restore.
    #[serde(default, skip_serializing_if = "VariableInputs::is_empty")]
    pub variables: VariableInputs,
    pub submitted_ms: u64,
    pub stopped: bool,
    /// Set for a job launched from a periodic or parameterized one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub child_of: Option<ChildOf>,
    /// Submitted by the operator (`Job::submitted_by_operator`), which a plugin grant
    /// asks for; a record from before berth kept it was not.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub by_operator: bool,
    /// The name of the API token that first submitted it, the only one that may change
    /// it besides the operator; `None`: the operator's (and so is a record from before
    /// berth kept owners).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// A periodic job's last scheduled launch (ms since the epoch), kept in its own
    /// record: its children's records, which the collector forgets, cannot say it (the
    /// same launch was made again each time its child was collected).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_launch_ms: Option<u64>,
}

/// What a child job was launched from and with; its source is its parent's at launch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChildOf {
    pub parent: String,
    /// A dispatch's meta, over the job's own.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub meta: Vec<(String, String)>,
    /// A dispatch's payload, base64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload: Option<String>,
}

impl ChildOf {
    /// The dispatch's payload, decoded (none when absent or not base64).
    pub fn payload_bytes(&self) -> Option<Vec<u8>> {
        use base64::Engine as _;
        self.payload
            .as_ref()
            .and_then(|p| base64::engine::general_purpose::STANDARD.decode(p).ok())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocRecord {
    pub id: String,
    pub job_id: String,
    pub group_index: usize,
    pub alloc_index: u32,
    pub name: String,
    pub desired_status: DesiredStatus,
    pub client_status: ClientStatus,
    /// The numbers of the group's dynamic ports, by label.
    #[serde(default)]
    pub ports: BTreeMap<String, u16>,
}

/// A started task's driver handle, with the driver that issued it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredHandle {
    pub driver: String,
    pub handle: TaskHandle,
}

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error(
        "the state file {path} is in use by another process (is another berth agent running \
         with this data dir?)"
    )]
    InUse { path: PathBuf },
    #[error("opening the state file {path}: {message}")]
    Open { path: PathBuf, message: String },
    #[error("writing state: {0}")]
    Write(String),
    #[error("reading state: {0}")]
    Read(String),
}

/// What happened when the state file was opened, for the agent to tell its operator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpenOutcome {
    Opened,
    /// There was no state file: a first start, or one was removed.
    Created,
    /// The file was not a readable database; it was kept at `moved_to`.
    MovedAside {
        reason: String,
        moved_to: PathBuf,
    },
}

/// A record that is present but could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unreadable {
    pub table: &'static str,
    pub key: String,
    pub reason: String,
}

impl std::fmt::Display for Unreadable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} record {:?} is unreadable ({}); it is kept as is",
            self.table, self.key, self.reason
        )
    }
}

pub struct StateStore {
    db: Database,
    path: Option<PathBuf>,
}

impl std::fmt::Debug for StateStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateStore")
            .field("path", &self.path)
            .finish()
    }
}

impl StateStore {
    /// Opens (or creates) the state file at `path`.
    pub fn open(path: &Path) -> Result<(StateStore, OpenOutcome), StateError> {
        let existed = path.exists();
        restrict_to_owner(path).map_err(|e| StateError::Open {
            path: path.to_path_buf(),
            message: format!("making the state file readable by its owner only: {e}"),
        })?;
        let mut outcome = if existed {
            OpenOutcome::Opened
        } else {
            OpenOutcome::Created
        };
        let db = match Database::create(path) {
            Ok(created) => created,
            Err(error) => match unreadable_file(&error) {
                None => return Err(open_error(path, &error)),
                Some(reason) => {
                    let moved_to = aside_path(path);
                    std::fs::rename(path, &moved_to).map_err(|e| StateError::Open {
                        path: path.to_path_buf(),
                        message: format!(
                            "{reason}, and it could not be moved aside to {}: {e}",
                            moved_to.display()
                        ),
                    })?;
                    outcome = OpenOutcome::MovedAside { reason, moved_to };
                    restrict_to_owner(path).map_err(|e| StateError::Open {
                        path: path.to_path_buf(),
                        message: format!("creating a new state file (mode 0600): {e}"),
                    })?;
                    Database::create(path).map_err(|e| open_error(path, &e))?
                }
            },
        };
        let store = StateStore {
            db,
            path: Some(path.to_path_buf()),
        };
        store.init()?;
        Ok((store, outcome))
    }

    /// A store that lives only as long as the process: for `berth run`, which has
    /// nothing to restore.
    pub fn in_memory() -> StateStore {
        let db = Database::builder()
            .create_with_backend(redb::backends::InMemoryBackend::new())
            .expect("an in-memory database always opens");
        let store = StateStore { db, path: None };
        store
            .init()
            .expect("an in-memory database always initialises");
        store
    }

    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    fn init(&self) -> Result<(), StateError> {
        let txn = self.db.begin_write().map_err(write_error)?;
        {
            let mut meta = txn.open_table(META).map_err(write_error)?;
            if meta.get("schema").map_err(write_error)?.is_none() {
                meta.insert("schema", SCHEMA_VERSION).map_err(write_error)?;
            }
            for table in [JOBS, ALLOCS, TASK_STATES, TASK_HANDLES, HOOK_STATE] {
                txn.open_table(table).map_err(write_error)?;
            }
            for table in RecordTable::ALL {
                txn.open_table(table.definition()).map_err(write_error)?;
            }
        }
        txn.commit().map_err(write_error)
    }

    pub fn put_job(&self, job: &JobRecord) -> Result<(), StateError> {
        self.put(JOBS, &job.id, job)
    }

    /// A job and all its new allocs, in one durable transaction: an agent killed at any
    /// moment of a submit comes back with all of them or none.
    pub fn put_job_and_allocs(
        &self,
        job: &JobRecord,
        allocs: &[AllocRecord],
    ) -> Result<(), StateError> {
        let job_bytes = encode(job)?;
        let alloc_bytes: Vec<(String, Vec<u8>)> = allocs
            .iter()
            .map(|a| Ok((a.id.clone(), encode(a)?)))
            .collect::<Result<_, StateError>>()?;
        self.write(Commit::Durable, |txn| {
            txn.open_table(JOBS)
                .map_err(write_error)?
                .insert(job.id.as_str(), job_bytes.as_slice())
                .map_err(write_error)?;
            let mut table = txn.open_table(ALLOCS).map_err(write_error)?;
            for (id, bytes) in &alloc_bytes {
                table
                    .insert(id.as_str(), bytes.as_slice())
                    .map_err(write_error)?;
            }
            Ok(())
        })
    }

    pub fn remove_job(&self, id: &str) -> Result<(), StateError> {
        self.remove(JOBS, id)
    }

    pub fn jobs(&self) -> Result<(Vec<JobRecord>, Vec<Unreadable>), StateError> {
        self.scan(JOBS, "jobs", "")
    }

    pub fn put_alloc(&self, alloc: &AllocRecord) -> Result<(), StateError> {
        self.put(ALLOCS, &alloc.id, alloc)
    }

    /// An alloc record update that nothing relies on until a durable commit follows
    /// (e.g. pending → running).
    pub fn put_alloc_lazily(&self, alloc: &AllocRecord) -> Result<(), StateError> {
        self.put_with(ALLOCS, &alloc.id, alloc, Commit::Lazy)
    }

    pub fn allocs(&self) -> Result<(Vec<AllocRecord>, Vec<Unreadable>), StateError> {
        self.scan(ALLOCS, "allocs", "")
    }

    pub fn put_task_state(
        &self,
        alloc_id: &str,
        task: &str,
        state: &TaskState,
        commit: Commit,
    ) -> Result<(), StateError> {
        self.put_with(TASK_STATES, &task_key(alloc_id, task), state, commit)
    }

    /// The task states of one alloc, by task name.
    pub fn task_states(&self, alloc_id: &str) -> Result<Scanned<(String, TaskState)>, StateError> {
        self.scan_keyed(TASK_STATES, "task_states", &format!("{alloc_id}/"))
    }

    pub fn put_task_handle(
        &self,
        alloc_id: &str,
        task: &str,
        handle: &StoredHandle,
        commit: Commit,
    ) -> Result<(), StateError> {
        self.put_with(TASK_HANDLES, &task_key(alloc_id, task), handle, commit)
    }

    pub fn remove_task_handle(&self, alloc_id: &str, task: &str) -> Result<(), StateError> {
        self.remove(TASK_HANDLES, &task_key(alloc_id, task))
    }

    pub fn task_handle(
        &self,
        alloc_id: &str,
        task: &str,
    ) -> Result<Option<StoredHandle>, StateError> {
        let key = task_key(alloc_id, task);
        match self.get_bytes(TASK_HANDLES, &key)? {
            None => Ok(None),
            Some(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| {
                StateError::Read(
                    Unreadable {
                        table: "task_handles",
                        key,
                        reason: e.to_string(),
                    }
                    .to_string(),
                )
            }),
        }
    }

    /// Opaque state a hook keeps for an alloc (e.g. what it mounted), by hook name.
    pub fn put_hook_state(
        &self,
        alloc_id: &str,
        hook: &str,
        data: &[u8],
        commit: Commit,
    ) -> Result<(), StateError> {
        self.put_bytes(HOOK_STATE, &task_key(alloc_id, hook), data, commit)
    }

    pub fn hook_state(&self, alloc_id: &str, hook: &str) -> Result<Option<Vec<u8>>, StateError> {
        self.get_bytes(HOOK_STATE, &task_key(alloc_id, hook))
    }

    /// Forgets an alloc and everything recorded under it, in one transaction.
    pub fn remove_alloc(&self, alloc_id: &str) -> Result<(), StateError> {
        let prefix = format!("{alloc_id}/");
        self.write(Commit::Durable, |txn| {
            txn.open_table(ALLOCS)
                .map_err(write_error)?
                .remove(alloc_id)
                .map_err(write_error)?;
            for table in [TASK_STATES, TASK_HANDLES, HOOK_STATE] {
                let mut table = txn.open_table(table).map_err(write_error)?;
                let keys: Vec<String> = table
                    .range(prefix.as_str()..)
                    .map_err(write_error)?
                    .map_while(|entry| {
                        let key = entry.ok()?.0.value().to_string();
                        key.starts_with(&prefix).then_some(key)
                    })
                    .collect();
                for key in keys {
                    table.remove(key.as_str()).map_err(write_error)?;
                }
            }
            Ok(())
        })
    }

    /// Writes one record durably: these records are relied on (a claim, a staged
    /// volume's users) as soon as the call returns.
    pub fn put_record<T: Serialize>(
        &self,
        table: RecordTable,
        key: &str,
        value: &T,
    ) -> Result<(), StateError> {
        self.put(table.definition(), key, value)
    }

    pub fn remove_record(&self, table: RecordTable, key: &str) -> Result<(), StateError> {
        self.remove(table.definition(), key)
    }

    pub fn record<T: DeserializeOwned>(
        &self,
        table: RecordTable,
        key: &str,
    ) -> Result<Option<T>, StateError> {
        match self.get_bytes(table.definition(), key)? {
            None => Ok(None),
            Some(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| {
                StateError::Read(
                    Unreadable {
                        table: table.name(),
                        key: key.to_string(),
                        reason: e.to_string(),
                    }
                    .to_string(),
                )
            }),
        }
    }

    /// Every record whose key starts with `prefix`, with its full key.
    pub fn records<T: DeserializeOwned>(
        &self,
        table: RecordTable,
        prefix: &str,
    ) -> Result<Scanned<(String, T)>, StateError> {
        let (records, unreadable) = self.scan_keyed(table.definition(), table.name(), prefix)?;
        Ok((
            records
                .into_iter()
                .map(|(short, value)| (format!("{prefix}{short}"), value))
                .collect(),
            unreadable,
        ))
    }

    fn put<T: Serialize>(
        &self,
        table: TableDefinition<&str, &[u8]>,
        key: &str,
        value: &T,
    ) -> Result<(), StateError> {
        self.put_with(table, key, value, Commit::Durable)
    }

    fn begin_write(&self, commit: Commit) -> Result<redb::WriteTransaction, StateError> {
        let mut txn = self.db.begin_write().map_err(write_error)?;
        if commit == Commit::Lazy {
            txn.set_durability(redb::Durability::None)
                .map_err(write_error)?;
        }
        Ok(txn)
    }

    fn put_with<T: Serialize>(
        &self,
        table: TableDefinition<&str, &[u8]>,
        key: &str,
        value: &T,
        commit: Commit,
    ) -> Result<(), StateError> {
        self.put_bytes(table, key, &encode(value)?, commit)
    }

    fn put_bytes(
        &self,
        table: TableDefinition<&str, &[u8]>,
        key: &str,
        bytes: &[u8],
        commit: Commit,
    ) -> Result<(), StateError> {
        self.write(commit, |txn| {
            txn.open_table(table)
                .map_err(write_error)?
                .insert(key, bytes)
                .map_err(write_error)?;
            Ok(())
        })
    }

    fn remove(&self, table: TableDefinition<&str, &[u8]>, key: &str) -> Result<(), StateError> {
        self.write(Commit::Durable, |txn| {
            txn.open_table(table)
                .map_err(write_error)?
                .remove(key)
                .map_err(write_error)?;
            Ok(())
        })
    }

    /// One write transaction. A durable one waits for the disk (fsync), so it runs
    /// through [`blocking::run`] and the async workers keep serving other tasks; a lazy
    /// one only touches memory.
    fn write(
        &self,
        commit: Commit,
        body: impl FnOnce(&redb::WriteTransaction) -> Result<(), StateError>,
    ) -> Result<(), StateError> {
        let transact = || {
            let txn = self.begin_write(commit)?;
            body(&txn)?;
            txn.commit().map_err(write_error)
        };
        match commit {
            Commit::Durable => blocking::run(transact),
            Commit::Lazy => transact(),
        }
    }

    fn get_bytes(
        &self,
        table: TableDefinition<&str, &[u8]>,
        key: &str,
    ) -> Result<Option<Vec<u8>>, StateError> {
        let txn = self.db.begin_read().map_err(read_error)?;
        let table = txn.open_table(table).map_err(read_error)?;
        Ok(table
            .get(key)
            .map_err(read_error)?
            .map(|value| value.value().to_vec()))
    }

    fn scan<T: DeserializeOwned>(
        &self,
        table: TableDefinition<&str, &[u8]>,
        name: &'static str,
        prefix: &str,
    ) -> Result<(Vec<T>, Vec<Unreadable>), StateError> {
        let (keyed, unreadable) = self.scan_keyed(table, name, prefix)?;
        Ok((keyed.into_iter().map(|(_, v)| v).collect(), unreadable))
    }

    /// Every record whose key starts with `prefix`, with the key minus the prefix.
    fn scan_keyed<T: DeserializeOwned>(
        &self,
        table: TableDefinition<&str, &[u8]>,
        name: &'static str,
        prefix: &str,
    ) -> Result<Scanned<(String, T)>, StateError> {
        let txn = self.db.begin_read().map_err(read_error)?;
        let table = txn.open_table(table).map_err(read_error)?;
        let mut records = Vec::new();
        let mut unreadable = Vec::new();
        for entry in table.range(prefix..).map_err(read_error)? {
            let (key, value) = entry.map_err(read_error)?;
            let key = key.value();
            let Some(short) = key.strip_prefix(prefix) else {
                break;
            };
            match serde_json::from_slice(value.value()) {
                Ok(record) => records.push((short.to_string(), record)),
                Err(error) => unreadable.push(Unreadable {
                    table: name,
                    key: key.to_string(),
                    reason: error.to_string(),
                }),
            }
        }
        Ok((records, unreadable))
    }
}

fn task_key(alloc_id: &str, name: &str) -> String {
    format!("{alloc_id}/{name}")
}

/// Why the file at hand is not a database we can use, when that is the problem (rather
/// than, say, a permission or a lock).
fn unreadable_file(error: &redb::DatabaseError) -> Option<String> {
    use redb::{DatabaseError, StorageError};
    match error {
        DatabaseError::DatabaseAlreadyOpen
        | DatabaseError::LockProtocolMismatch
        | DatabaseError::TransactionInProgress
        | DatabaseError::UpgradeRequired(_) => None,
        DatabaseError::Storage(StorageError::Io(io))
            if io.kind() != std::io::ErrorKind::UnexpectedEof
                && io.kind() != std::io::ErrorKind::InvalidData =>
        {
            None
        }
        other => Some(format!("it is not a readable state database ({other})")),
    }
}

fn open_error(path: &Path, error: &redb::DatabaseError) -> StateError {
    match error {
        redb::DatabaseError::DatabaseAlreadyOpen => StateError::InUse {
            path: path.to_path_buf(),
        },
        other => StateError::Open {
            path: path.to_path_buf(),
            message: other.to_string(),
        },
    }
}

/// `state.db` → `state.db.unreadable-<unix seconds>`, never overwriting an earlier one.
fn aside_path(path: &Path) -> PathBuf {
    let seconds = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let mut candidate = PathBuf::from(format!("{}.unreadable-{seconds}", path.display()));
    let mut n = 1;
    while candidate.exists() {
        candidate = PathBuf::from(format!("{}.unreadable-{seconds}-{n}", path.display()));
        n += 1;
    }
    candidate
}

/// The state file holds task env, hook output and volume secrets: mode 0600. A missing
/// file is created empty with that mode (redb initialises an empty file), so it is never
/// readable by others, not even for a moment; an existing one is fixed.
pub fn restrict_to_owner(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        }
        Err(e) => Err(e),
    }
}

fn write_error(error: impl std::fmt::Display) -> StateError {
    StateError::Write(error.to_string())
}

fn read_error(error: impl std::fmt::Display) -> StateError {
    StateError::Read(error.to_string())
}

/// A record as the state file keeps it (JSON).
fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, StateError> {
    serde_json::to_vec(value).map_err(|e| StateError::Write(e.to_string()))
}

#[cfg(test)]
mod tests;
