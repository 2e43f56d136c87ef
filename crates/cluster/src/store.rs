//! The cluster store as the cluster code reaches it: etcd ([`Etcd`], agents sharing
//! one cluster) or the embedded store ([`Embedded`], a lone agent as a one-node
//! cluster). Both answer the same calls with the same meaning (revisions, transactions,
//! leases, watches, elections); `conformance` tests hold them to it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;

use super::embedded::Embedded;
use super::etcd::{Change, Condition, Entry, Etcd, EtcdError, LeaderKey, Runtime, Write};

/// How long a blocking call on the embedded store may wait for its answer.
const EMBEDDED_DEADLINE: Duration = Duration::from_secs(10);

#[derive(Clone)]
pub struct Store {
    backend: Backend,
}

#[derive(Clone)]
enum Backend {
    Etcd(Etcd),
    Embedded {
        store: Arc<Embedded>,
        /// The runtime its watches, keep-alives and blocking calls run on, as etcd's
        /// client has its own.
        _runtime: Arc<Runtime>,
        handle: tokio::runtime::Handle,
    },
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("at", &self.endpoints())
            .finish()
    }
}

impl From<Etcd> for Store {
    fn from(etcd: Etcd) -> Store {
        Store {
            backend: Backend::Etcd(etcd),
        }
    }
}

impl Store {
    /// The embedded store, on a small runtime of its own.
    pub fn embedded(store: Arc<Embedded>) -> Result<Store, EtcdError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("berth-store")
            .enable_all()
            .build()
            .map_err(|e| EtcdError::Embedded {
                path: store
                    .path()
                    .map_or_else(|| "memory".into(), |p| p.display().to_string()),
                reason: format!("cannot start its runtime: {e}"),
            })?;
        let handle = runtime.handle().clone();
        Ok(Store {
            backend: Backend::Embedded {
                store,
                _runtime: Arc::new(Runtime(Some(runtime))),
                handle,
            },
        })
    }

    /// How many tokens etcd has given this connection (0 for the embedded store).
    #[cfg(test)]
    pub(crate) fn token_exchanges(&self) -> u64 {
        match &self.backend {
            Backend::Etcd(etcd) => etcd.token_exchanges(),
            Backend::Embedded { .. } => 0,
        }
    }

    /// Whether this is the embedded store of a lone agent.
    pub fn is_embedded(&self) -> bool {
        matches!(self.backend, Backend::Embedded { .. })
    }

    /// Where the store is: etcd's endpoints, or the embedded store's file.
    pub fn endpoints(&self) -> String {
        match &self.backend {
            Backend::Etcd(etcd) => etcd.endpoints().to_string(),
            Backend::Embedded { store, .. } => store
                .path()
                .map_or_else(|| "memory".into(), |p| p.display().to_string()),
        }
    }

    /// Runs `future` on the store's runtime and waits for it from this thread (any
    /// thread: async callers should await the methods instead).
    pub fn block<T: Send + 'static, E: From<EtcdError> + Send + 'static>(
        &self,
        future: impl std::future::Future<Output = Result<T, E>> + Send + 'static,
    ) -> Result<T, E> {
        match &self.backend {
            Backend::Etcd(etcd) => etcd.block(future),
            Backend::Embedded { handle, store, .. } => {
                let (sender, receiver) = std::sync::mpsc::sync_channel(1);
                handle.spawn(async move {
                    let _ = sender.send(future.await);
                });
                receiver
                    .recv_timeout(EMBEDDED_DEADLINE)
                    .unwrap_or_else(|_| {
                        Err(EtcdError::Embedded {
                            path: store
                                .path()
                                .map_or_else(|| "memory".into(), |p| p.display().to_string()),
                            reason: format!("no answer within {EMBEDDED_DEADLINE:?}"),
                        }
                        .into())
                    })
            }
        }
    }

    /// Spawns a task on the store's runtime (watch loops, keep-alives).
    pub fn spawn(
        &self,
        future: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> tokio::task::JoinHandle<()> {
        match &self.backend {
            Backend::Etcd(etcd) => etcd.spawn(future),
            Backend::Embedded { handle, .. } => handle.spawn(future),
        }
    }

    pub async fn get(&self, key: &str) -> Result<Option<Entry>, EtcdError> {
        match &self.backend {
            Backend::Etcd(etcd) => etcd.get(key).await,
            Backend::Embedded { store, .. } => Ok(store.get(key)),
        }
    }

    /// Every key under `prefix`, and the store's revision they were read at.
    pub async fn list(&self, prefix: &str) -> Result<(Vec<Entry>, i64), EtcdError> {
        match &self.backend {
            Backend::Etcd(etcd) => etcd.list(prefix).await,
            Backend::Embedded { store, .. } => Ok(store.list(prefix)),
        }
    }

    /// The store's current revision (`key`: one berth may read, for etcd's users).
    pub async fn revision(&self, key: &str) -> Result<i64, EtcdError> {
        match &self.backend {
            Backend::Etcd(etcd) => etcd.revision(key).await,
            Backend::Embedded { store, .. } => Ok(store.revision()),
        }
    }

    pub async fn put(&self, key: &str, value: Vec<u8>, lease: i64) -> Result<(), EtcdError> {
        match &self.backend {
            Backend::Etcd(etcd) => etcd.put(key, value, lease).await,
            Backend::Embedded { store, .. } => {
                let key = key.to_string();
                store
                    .apply(Vec::new(), vec![Write::Put { key, value, lease }])
                    .map(drop)
            }
        }
    }

    pub async fn delete(&self, key: &str) -> Result<(), EtcdError> {
        match &self.backend {
            Backend::Etcd(etcd) => etcd.delete(key).await,
            Backend::Embedded { store, .. } => store
                .apply(Vec::new(), vec![Write::Delete(key.to_string())])
                .map(drop),
        }
    }

    /// Applies `writes` if every condition holds; `Ok(false)` when one did not (nothing
    /// was written).
    pub async fn transaction(
        &self,
        conditions: Vec<Condition>,
        writes: Vec<Write>,
    ) -> Result<bool, EtcdError> {
        match &self.backend {
            Backend::Etcd(etcd) => etcd.transaction(conditions, writes).await,
            Backend::Embedded { store, .. } => store.apply(conditions, writes),
        }
    }

    /// A lease of `ttl`: keys written with it vanish when it is not kept alive.
    pub async fn grant_lease(&self, ttl: Duration) -> Result<i64, EtcdError> {
        match &self.backend {
            Backend::Etcd(etcd) => etcd.grant_lease(ttl).await,
            Backend::Embedded { store, .. } => Ok(store.grant_lease()),
        }
    }

    /// Renews a lease once: `Ok(false)` when the store no longer has it.
    pub async fn keep_alive_once(&self, lease: i64) -> Result<bool, EtcdError> {
        match &self.backend {
            Backend::Etcd(etcd) => etcd.keep_alive_once(lease).await,
            Backend::Embedded { store, .. } => Ok(store.keep_alive(lease)),
        }
    }

    pub async fn revoke_lease(&self, lease: i64) -> Result<(), EtcdError> {
        match &self.backend {
            Backend::Etcd(etcd) => etcd.revoke_lease(lease).await,
            Backend::Embedded { store, .. } => store.revoke_lease(lease),
        }
    }

    /// Watches every key under `prefix` from `start_revision` (0: from now). Changes
    /// arrive in order; a [`Change::Reset`] means the watch was cut and goes on from a
    /// later revision: read the prefix again. It ends when the receiver is dropped.
    pub fn watch(&self, prefix: &str, start_revision: i64) -> mpsc::Receiver<Change> {
        self.watch_with(prefix, start_revision, false)
    }

    /// [`Store::watch`], with a [`Change::Revision`] after the changes of each revision
    /// (of the prefix): a watcher that must see each transaction whole (the scheduler's
    /// leader) waits for it before it acts.
    pub fn watch_whole_revisions(
        &self,
        prefix: &str,
        start_revision: i64,
    ) -> mpsc::Receiver<Change> {
        self.watch_with(prefix, start_revision, true)
    }

    fn watch_with(
        &self,
        prefix: &str,
        start_revision: i64,
        whole_revisions: bool,
    ) -> mpsc::Receiver<Change> {
        match &self.backend {
            Backend::Etcd(etcd) => etcd.watch(prefix, start_revision, whole_revisions),
            Backend::Embedded { store, handle, .. } => {
                let _entered = handle.enter();
                store.watch(prefix, start_revision, whole_revisions)
            }
        }
    }

    /// Campaigns for leadership of `name` with `lease` until elected; the key that
    /// proves leadership.
    pub async fn campaign(
        &self,
        name: &str,
        lease: i64,
        value: &str,
    ) -> Result<LeaderKey, EtcdError> {
        match &self.backend {
            Backend::Etcd(etcd) => etcd.campaign(name, lease, value).await,
            Backend::Embedded { store, .. } => store.campaign(name, lease, value).await,
        }
    }

    /// The value the current leader of `name` proclaimed, if there is a leader.
    pub async fn leader(&self, name: &str) -> Result<Option<String>, EtcdError> {
        match &self.backend {
            Backend::Etcd(etcd) => etcd.leader(name).await,
            Backend::Embedded { store, .. } => Ok(store.leader(name)),
        }
    }

    pub async fn resign(&self, leader: LeaderKey) -> Result<(), EtcdError> {
        match &self.backend {
            Backend::Etcd(etcd) => etcd.resign(leader).await,
            Backend::Embedded { store, .. } => store.resign(&leader),
        }
    }
}

/// A lease kept alive in the background until dropped (then revoked), re-granted when
/// the store lost it; `on_regrant` runs with the new lease id so its keys are written again.
pub struct KeptLease {
    current: Arc<Mutex<i64>>,
    task: tokio::task::JoinHandle<()>,
    store: Store,
}

impl KeptLease {
    pub async fn start(
        store: &Store,
        ttl: Duration,
        on_regrant: impl Fn(i64) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>
        + Send
        + Sync
        + 'static,
    ) -> Result<KeptLease, EtcdError> {
        let first = store.grant_lease(ttl).await?;
        let current = Arc::new(Mutex::new(first));
        let task = store.spawn({
            let store = store.clone();
            let current = current.clone();
            async move {
                let period = (ttl / 3).max(Duration::from_millis(200));
                loop {
                    tokio::time::sleep(period).await;
                    let lease = *current.lock().unwrap_or_else(|p| p.into_inner());
                    match store.keep_alive_once(lease).await {
                        Ok(true) => {}
                        Ok(false) => {
                            // Expired (the store was away longer than the TTL): a new lease,
                            // and its keys written again.
                            if let Ok(new) = store.grant_lease(ttl).await {
                                *current.lock().unwrap_or_else(|p| p.into_inner()) = new;
                                tracing::warn!(
                                    old = lease,
                                    new,
                                    "the cluster store had lost this node's lease; registered again"
                                );
                                on_regrant(new).await;
                            }
                        }
                        Err(error) => {
                            tracing::warn!(%error, "could not renew this node's lease");
                        }
                    }
                }
            }
        });
        Ok(KeptLease {
            current,
            task,
            store: store.clone(),
        })
    }

    pub fn id(&self) -> i64 {
        *self.current.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stops renewing without revoking, as a killed agent would: the lease runs out.
    #[cfg(test)]
    pub(crate) fn abandon(self) {
        self.task.abort();
        std::mem::forget(self);
    }
}

impl Drop for KeptLease {
    fn drop(&mut self) {
        self.task.abort();
        let store = self.store.clone();
        let lease = self.id();
        self.store.spawn(async move {
            let _ = store.revoke_lease(lease).await;
        });
    }
}
