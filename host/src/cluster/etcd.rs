//! A thin client of etcd's v3 gRPC API over the stubs `berth-proto` compiles with protox
//! (the `etcd-client` crate would need a system `protoc` to build): key-values,
//! transactions, leases with keep-alive, prefix watches and leader election.
//!
//! The connection lives on its own small runtime, so the catalog's synchronous calls can
//! wait for an answer from any thread ([`Etcd::block`]) and async callers use the same
//! clients directly. Every call has a deadline; an unreachable etcd is an
//! [`EtcdError::Unavailable`] that names the endpoints, never a hang.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use berth_proto::etcd::etcdserverpb::{
    self as pb, compare, kv_client::KvClient, lease_client::LeaseClient, request_op,
    watch_client::WatchClient,
};
use berth_proto::etcd::mvccpb;
use berth_proto::etcd::v3electionpb::{self as election, election_client::ElectionClient};
use tokio::sync::mpsc;
use tonic::transport::{Channel, Endpoint};

/// The largest answer read from etcd (a listing of the whole cluster).
const MAX_ANSWER: usize = 256 << 20;

/// How long one call may take before etcd counts as unavailable.
const CALL_DEADLINE: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EtcdError {
    #[error("the cluster store (etcd at {endpoints}) is unavailable{since}: {reason}")]
    Unavailable {
        endpoints: String,
        reason: String,
        /// ` since 14:02:57 UTC` when it has been away since then.
        since: String,
    },
    #[error("the cluster store (etcd) refused the request: {0}")]
    Refused(String),
    #[error("the cluster store's endpoint {0:?} is not a valid URL (e.g. http://127.0.0.1:2379)")]
    BadEndpoint(String),
}

/// One key's value and the revision it was last written at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub key: String,
    pub value: Vec<u8>,
    pub mod_revision: i64,
    pub create_revision: i64,
    pub lease: i64,
}

impl Entry {
    fn from_kv(kv: mvccpb::KeyValue) -> Entry {
        Entry {
            key: String::from_utf8_lossy(&kv.key).into_owned(),
            value: kv.value,
            mod_revision: kv.mod_revision,
            create_revision: kv.create_revision,
            lease: kv.lease,
        }
    }
}

/// A condition of a transaction on one key.
#[derive(Debug, Clone)]
pub enum Condition {
    /// The key was last written at this revision (0: the key does not exist).
    ModRevision(String, i64),
    /// The key's value is exactly this.
    ValueIs(String, Vec<u8>),
}

/// A write of a transaction.
#[derive(Debug, Clone)]
pub enum Write {
    Put {
        key: String,
        value: Vec<u8>,
        lease: i64,
    },
    Delete(String),
}

/// A change a watch saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    Put(Entry),
    Delete {
        key: String,
        mod_revision: i64,
    },
    /// The watch was cut (etcd restarted, compaction): the watcher must read again.
    Reset,
}

struct Runtime(Option<tokio::runtime::Runtime>);

impl Drop for Runtime {
    fn drop(&mut self) {
        // Dropping a runtime inside an async context panics; this never waits.
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}

/// A connection to an etcd cluster.
#[derive(Clone)]
pub struct Etcd {
    /// Kept so the runtime lives as long as any handle on the connection.
    _runtime: Arc<Runtime>,
    handle: tokio::runtime::Handle,
    channel: Channel,
    /// The same endpoints without the call deadline: a campaign waits until elected.
    waiting_channel: Channel,
    endpoints: String,
    /// When calls started failing (ms since the epoch; 0: they do not).
    failing_since: Arc<std::sync::atomic::AtomicU64>,
}

impl std::fmt::Debug for Etcd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Etcd")
            .field("endpoints", &self.endpoints)
            .finish()
    }
}

impl Etcd {
    /// Connects to the first endpoint that answers within `dial_timeout` (each is tried).
    pub fn connect(endpoints: &[String], dial_timeout: Duration) -> Result<Etcd, EtcdError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("berth-etcd")
            .enable_all()
            .build()
            .map_err(|e| EtcdError::Refused(format!("cannot start the etcd client: {e}")))?;
        let handle = runtime.handle().clone();
        let runtime = Arc::new(Runtime(Some(runtime)));
        let mut parsed = Vec::new();
        for endpoint in endpoints {
            let uri = Endpoint::from_shared(endpoint.clone())
                .map_err(|_| EtcdError::BadEndpoint(endpoint.clone()))?;
            parsed.push(uri.connect_timeout(dial_timeout).tcp_nodelay(true));
        }
        if parsed.is_empty() {
            return Err(EtcdError::BadEndpoint(String::new()));
        }
        let joined = endpoints.join(", ");
        let (channel, waiting_channel) = {
            let _entered = handle.enter();
            (
                Channel::balance_list(parsed.iter().map(|e| e.clone().timeout(CALL_DEADLINE))),
                Channel::balance_list(parsed.into_iter()),
            )
        };
        let etcd = Etcd {
            _runtime: runtime,
            handle,
            channel,
            waiting_channel,
            endpoints: joined,
            failing_since: Arc::default(),
        };
        // A first read proves the store answers (and warms the connection).
        etcd.block_with(dial_timeout + CALL_DEADLINE, {
            let etcd = etcd.clone();
            async move { etcd.get("\0berth-connect-probe").await.map(|_| ()) }
        })?;
        Ok(etcd)
    }

    pub fn endpoints(&self) -> &str {
        &self.endpoints
    }

    fn unavailable(&self, reason: impl std::fmt::Display) -> EtcdError {
        use std::sync::atomic::Ordering;
        let now = super::now_ms();
        let since =
            match self
                .failing_since
                .compare_exchange(0, now, Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(_) => now,
                Err(earlier) => earlier,
            };
        let since = chrono::DateTime::<chrono::Utc>::from_timestamp_millis(
            i64::try_from(since).unwrap_or(0),
        )
        .map(|t| format!(" since {} UTC", t.format("%H:%M:%S")))
        .unwrap_or_default();
        EtcdError::Unavailable {
            endpoints: self.endpoints.clone(),
            reason: reason.to_string(),
            since,
        }
    }

    fn status(&self, status: tonic::Status) -> EtcdError {
        use tonic::Code;
        match status.code() {
            Code::Unavailable | Code::DeadlineExceeded | Code::Unknown | Code::Cancelled => {
                self.unavailable(status.message())
            }
            _ => EtcdError::Refused(status.message().to_string()),
        }
    }

    /// Runs `future` on the client's runtime and waits for it from this thread (any
    /// thread: async callers should await the methods instead).
    pub fn block<T: Send + 'static, E: From<EtcdError> + Send + 'static>(
        &self,
        future: impl std::future::Future<Output = Result<T, E>> + Send + 'static,
    ) -> Result<T, E> {
        self.block_with(CALL_DEADLINE * 2, future)
    }

    fn block_with<T: Send + 'static, E: From<EtcdError> + Send + 'static>(
        &self,
        limit: Duration,
        future: impl std::future::Future<Output = Result<T, E>> + Send + 'static,
    ) -> Result<T, E> {
        let (sender, receiver) = std::sync::mpsc::sync_channel(1);
        self.handle.spawn(async move {
            let _ = sender.send(future.await);
        });
        match receiver.recv_timeout(limit) {
            Ok(result) => {
                if result.is_ok() {
                    self.failing_since
                        .store(0, std::sync::atomic::Ordering::SeqCst);
                }
                result
            }
            Err(_) => Err(self
                .unavailable(format!("no answer within {limit:?}"))
                .into()),
        }
    }

    /// Spawns a task on the client's runtime (watch loops, keep-alives).
    pub fn spawn(
        &self,
        future: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> tokio::task::JoinHandle<()> {
        self.handle.spawn(future)
    }

    fn kv(&self) -> KvClient<Channel> {
        // A cluster's listing can pass tonic's default 4 MiB answer; etcd caps each
        // value at 1.5 MiB, and berth bounds what it writes.
        KvClient::new(self.channel.clone()).max_decoding_message_size(MAX_ANSWER)
    }

    pub async fn get(&self, key: &str) -> Result<Option<Entry>, EtcdError> {
        let response = self
            .kv()
            .range(pb::RangeRequest {
                key: key.as_bytes().to_vec(),
                ..Default::default()
            })
            .await
            .map_err(|s| self.status(s))?
            .into_inner();
        Ok(response.kvs.into_iter().next().map(Entry::from_kv))
    }

    /// Every key under `prefix`, and the store's revision they were read at.
    pub async fn list(&self, prefix: &str) -> Result<(Vec<Entry>, i64), EtcdError> {
        let response = self
            .kv()
            .range(pb::RangeRequest {
                key: prefix.as_bytes().to_vec(),
                range_end: range_end(prefix),
                ..Default::default()
            })
            .await
            .map_err(|s| self.status(s))?
            .into_inner();
        let revision = response.header.map(|h| h.revision).unwrap_or(0);
        Ok((
            response.kvs.into_iter().map(Entry::from_kv).collect(),
            revision,
        ))
    }

    /// The store's current revision.
    pub async fn revision(&self) -> Result<i64, EtcdError> {
        let response = self
            .kv()
            .range(pb::RangeRequest {
                key: b"\0".to_vec(),
                count_only: true,
                ..Default::default()
            })
            .await
            .map_err(|s| self.status(s))?
            .into_inner();
        Ok(response.header.map(|h| h.revision).unwrap_or(0))
    }

    pub async fn put(&self, key: &str, value: Vec<u8>, lease: i64) -> Result<(), EtcdError> {
        self.kv()
            .put(pb::PutRequest {
                key: key.as_bytes().to_vec(),
                value,
                lease,
                ..Default::default()
            })
            .await
            .map_err(|s| self.status(s))?;
        Ok(())
    }

    pub async fn delete(&self, key: &str) -> Result<(), EtcdError> {
        self.kv()
            .delete_range(pb::DeleteRangeRequest {
                key: key.as_bytes().to_vec(),
                ..Default::default()
            })
            .await
            .map_err(|s| self.status(s))?;
        Ok(())
    }

    /// Applies `writes` if every condition holds; `Ok(false)` when one did not (nothing
    /// was written).
    pub async fn transaction(
        &self,
        conditions: Vec<Condition>,
        writes: Vec<Write>,
    ) -> Result<bool, EtcdError> {
        let compare = conditions
            .into_iter()
            .map(|condition| match condition {
                Condition::ModRevision(key, revision) => pb::Compare {
                    result: compare::CompareResult::Equal as i32,
                    target: compare::CompareTarget::Mod as i32,
                    key: key.into_bytes(),
                    range_end: Vec::new(),
                    target_union: Some(compare::TargetUnion::ModRevision(revision)),
                },
                Condition::ValueIs(key, value) => pb::Compare {
                    result: compare::CompareResult::Equal as i32,
                    target: compare::CompareTarget::Value as i32,
                    key: key.into_bytes(),
                    range_end: Vec::new(),
                    target_union: Some(compare::TargetUnion::Value(value)),
                },
            })
            .collect();
        let success = writes
            .into_iter()
            .map(|write| pb::RequestOp {
                request: Some(match write {
                    Write::Put { key, value, lease } => {
                        request_op::Request::RequestPut(pb::PutRequest {
                            key: key.into_bytes(),
                            value,
                            lease,
                            ..Default::default()
                        })
                    }
                    Write::Delete(key) => {
                        request_op::Request::RequestDeleteRange(pb::DeleteRangeRequest {
                            key: key.into_bytes(),
                            ..Default::default()
                        })
                    }
                }),
            })
            .collect();
        let response = self
            .kv()
            .txn(pb::TxnRequest {
                compare,
                success,
                failure: Vec::new(),
            })
            .await
            .map_err(|s| self.status(s))?
            .into_inner();
        Ok(response.succeeded)
    }

    /// A lease of `ttl`: keys written with it vanish when it is not kept alive.
    pub async fn grant_lease(&self, ttl: Duration) -> Result<i64, EtcdError> {
        let response = LeaseClient::new(self.channel.clone())
            .lease_grant(pb::LeaseGrantRequest {
                ttl: ttl.as_secs().max(1) as i64,
                id: 0,
            })
            .await
            .map_err(|s| self.status(s))?
            .into_inner();
        if !response.error.is_empty() {
            return Err(EtcdError::Refused(response.error));
        }
        Ok(response.id)
    }

    /// Renews a lease once: `Ok(false)` when etcd no longer has it (it expired).
    pub async fn keep_alive_once(&self, lease: i64) -> Result<bool, EtcdError> {
        let (sender, receiver) = mpsc::channel(1);
        let _ = sender.send(pb::LeaseKeepAliveRequest { id: lease }).await;
        drop(sender);
        let mut answers = LeaseClient::new(self.channel.clone())
            .lease_keep_alive(tokio_stream::wrappers::ReceiverStream::new(receiver))
            .await
            .map_err(|s| self.status(s))?
            .into_inner();
        match answers.message().await.map_err(|s| self.status(s))? {
            Some(answer) => Ok(answer.ttl > 0),
            None => Err(self.unavailable("the lease keep-alive stream ended")),
        }
    }

    pub async fn revoke_lease(&self, lease: i64) -> Result<(), EtcdError> {
        LeaseClient::new(self.channel.clone())
            .lease_revoke(pb::LeaseRevokeRequest { id: lease })
            .await
            .map_err(|s| self.status(s))?;
        Ok(())
    }

    /// Watches every key under `prefix` from `start_revision` (0: from now). Changes
    /// arrive in order on the receiver; a [`Change::Reset`] means the watch was cut and
    /// has been made again from the latest revision: read the prefix again. The watch
    /// ends when the receiver is dropped.
    pub fn watch(&self, prefix: &str, start_revision: i64) -> mpsc::Receiver<Change> {
        let (sender, receiver) = mpsc::channel(1024);
        let etcd = self.clone();
        let prefix = prefix.to_string();
        self.spawn(async move {
            let mut from = start_revision;
            loop {
                let result = etcd.watch_once(&prefix, from, &sender).await;
                if sender.is_closed() {
                    return;
                }
                match result {
                    Ok(next) => from = next,
                    Err(_) => {
                        // Cut: tell the watcher, wait a little, watch again from now.
                        if sender.send(Change::Reset).await.is_err() {
                            return;
                        }
                        from = 0;
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
            }
        });
        receiver
    }

    /// One watch stream until it ends; the revision to continue from.
    async fn watch_once(
        &self,
        prefix: &str,
        from: i64,
        sender: &mpsc::Sender<Change>,
    ) -> Result<i64, EtcdError> {
        use pb::watch_request::RequestUnion;
        let (requests, receiver) = mpsc::channel(1);
        let _ = requests
            .send(pb::WatchRequest {
                request_union: Some(RequestUnion::CreateRequest(pb::WatchCreateRequest {
                    key: prefix.as_bytes().to_vec(),
                    range_end: range_end(prefix),
                    start_revision: from,
                    ..Default::default()
                })),
            })
            .await;
        let mut stream = WatchClient::new(self.channel.clone())
            .watch(tokio_stream::wrappers::ReceiverStream::new(receiver))
            .await
            .map_err(|s| self.status(s))?
            .into_inner();
        let mut next = from;
        loop {
            let message = tokio::select! {
                message = stream.message() => message,
                () = sender.closed() => return Ok(next),
            };
            let Some(response) = message.map_err(|s| self.status(s))? else {
                return Err(self.unavailable("the watch ended"));
            };
            if response.canceled || response.compact_revision > 0 {
                return Err(self.unavailable(format!(
                    "the watch was cancelled ({})",
                    response.cancel_reason
                )));
            }
            for event in response.events {
                let Some(kv) = event.kv else { continue };
                next = next.max(kv.mod_revision + 1);
                let change = if event.r#type == mvccpb::event::EventType::Delete as i32 {
                    Change::Delete {
                        key: String::from_utf8_lossy(&kv.key).into_owned(),
                        mod_revision: kv.mod_revision,
                    }
                } else {
                    Change::Put(Entry::from_kv(kv))
                };
                if sender.send(change).await.is_err() {
                    return Ok(next);
                }
            }
            // Keep `requests` alive: dropping it would end the watch stream.
            let _ = &requests;
        }
    }

    /// Campaigns for leadership of `name` with `lease` until elected; the key that
    /// proves leadership.
    pub async fn campaign(
        &self,
        name: &str,
        lease: i64,
        value: &str,
    ) -> Result<election::LeaderKey, EtcdError> {
        let response = ElectionClient::new(self.waiting_channel.clone())
            .campaign(election::CampaignRequest {
                name: name.as_bytes().to_vec(),
                lease,
                value: value.as_bytes().to_vec(),
            })
            .await
            .map_err(|s| self.status(s))?
            .into_inner();
        response
            .leader
            .ok_or_else(|| EtcdError::Refused("campaign answered without a leader key".into()))
    }

    /// The value the current leader of `name` proclaimed, if there is a leader.
    pub async fn leader(&self, name: &str) -> Result<Option<String>, EtcdError> {
        match ElectionClient::new(self.channel.clone())
            .leader(election::LeaderRequest {
                name: name.as_bytes().to_vec(),
            })
            .await
        {
            Ok(response) => Ok(response
                .into_inner()
                .kv
                .map(|kv| String::from_utf8_lossy(&kv.value).into_owned())),
            // etcd answers "election: no leader" as an error.
            Err(status) if status.message().contains("no leader") => Ok(None),
            Err(status) => Err(self.status(status)),
        }
    }

    pub async fn resign(&self, leader: election::LeaderKey) -> Result<(), EtcdError> {
        ElectionClient::new(self.channel.clone())
            .resign(election::ResignRequest {
                leader: Some(leader),
            })
            .await
            .map_err(|s| self.status(s))?;
        Ok(())
    }
}

/// The end of the key range of every key that starts with `prefix`.
fn range_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // Every byte was 0xff (or the prefix is empty): to the end of the key space.
    vec![0]
}

/// A lease kept alive in the background until dropped (then revoked), re-granted when
/// etcd lost it; `on_regrant` runs with the new lease id so its keys are written again.
pub struct KeptLease {
    current: Arc<Mutex<i64>>,
    task: tokio::task::JoinHandle<()>,
    etcd: Etcd,
}

impl KeptLease {
    pub async fn start(
        etcd: &Etcd,
        ttl: Duration,
        on_regrant: impl Fn(i64) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>
        + Send
        + Sync
        + 'static,
    ) -> Result<KeptLease, EtcdError> {
        let first = etcd.grant_lease(ttl).await?;
        let current = Arc::new(Mutex::new(first));
        let task = etcd.spawn({
            let etcd = etcd.clone();
            let current = current.clone();
            async move {
                let period = (ttl / 3).max(Duration::from_millis(200));
                loop {
                    tokio::time::sleep(period).await;
                    let lease = *current.lock().unwrap_or_else(|p| p.into_inner());
                    match etcd.keep_alive_once(lease).await {
                        Ok(true) => {}
                        Ok(false) => {
                            // Expired (etcd was away longer than the TTL): a new lease,
                            // and its keys written again.
                            if let Ok(new) = etcd.grant_lease(ttl).await {
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
            etcd: etcd.clone(),
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
        let etcd = self.etcd.clone();
        let lease = self.id();
        self.etcd.spawn(async move {
            let _ = etcd.revoke_lease(lease).await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::range_end;

    #[test]
    fn the_range_of_a_prefix_ends_past_every_key_that_starts_with_it() {
        assert_eq!(range_end("/berth/"), b"/berth0".to_vec());
        assert_eq!(range_end("a\u{7f}"), b"a\x80".to_vec());
        assert_eq!(range_end(""), vec![0]);
    }
}
