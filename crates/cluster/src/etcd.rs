//! A thin client of etcd's v3 gRPC API over the stubs `berth-proto` compiles with protox
//! (the `etcd-client` crate would need a system `protoc` to build): key-values,
//! transactions, leases with keep-alive, prefix watches and leader election.
//!
//! The connection lives on its own small runtime, so the catalog's synchronous calls can
//! wait for an answer from any thread ([`Etcd::block`]) and async callers use the same
//! clients directly. Every call has a deadline; an unreachable etcd is an
//! [`EtcdError::Unavailable`] that names the endpoints, never a hang.
//!
//! TLS and etcd's users are `etcd_access`'s: every request carries the current token, and
//! a request etcd refused for its token is sent once more with a new one ([`Etcd::call`]).

use std::sync::Arc;
use std::time::Duration;

use berth_proto::etcd::etcdserverpb::{
    self as pb, compare, kv_client::KvClient, lease_client::LeaseClient,
    maintenance_client::MaintenanceClient, request_op, watch_client::WatchClient,
};
use berth_proto::etcd::mvccpb;
use berth_proto::etcd::v3electionpb::{self as election, election_client::ElectionClient};
use tokio::sync::mpsc;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

use super::etcd_access::{
    AuthFailure, Authenticator, EtcdAccess, Transport, error_chain, status_text, token_refused,
};

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
    #[error("the node's cluster store ({path}) failed: {reason}")]
    Embedded { path: String, reason: String },
    #[error("the cluster store's endpoint {0:?} is not a valid URL (e.g. http://127.0.0.1:2379)")]
    BadEndpoint(String),
    #[error(
        "etcd refused the credentials of user {user:?}: check cluster.username and the \
         password in cluster.password_file"
    )]
    CredentialsRefused { user: String },
    #[error(
        "etcd at {endpoints} requires a user (its auth is enabled): set username and \
         password_file in the cluster block"
    )]
    CredentialsNeeded { endpoints: String },
    #[error(
        "cluster.username is set, but etcd at {endpoints} has authentication turned off: \
         anyone who reaches it may read and write berth's keys. Run `etcdctl auth enable` \
         (after creating the user), or remove username and password_file"
    )]
    AuthNotEnabled { endpoints: String },
    #[error("cannot set up TLS to etcd endpoint {endpoint:?}: {reason}")]
    Tls { endpoint: String, reason: String },
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

/// The key that proves an election's leadership: writes made "while still leader" compare
/// its revision (etcd's `LeaderKey`, as a plain type).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderKey {
    pub name: Vec<u8>,
    pub key: Vec<u8>,
    pub rev: i64,
    pub lease: i64,
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
    /// Every change up to this revision has been delivered: the changes of one
    /// transaction (a job and its evaluation) come one by one, and a watcher that must
    /// see a transaction whole waits for this. Sent only on a watch made with
    /// `whole_revisions`, after the changes of each revision it saw.
    Revision(i64),
}

pub(super) struct Runtime(pub(super) Option<tokio::runtime::Runtime>);

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
    channel: Transport,
    /// The same endpoints without the call deadline: a campaign waits until elected.
    waiting_channel: Transport,
    /// etcd's user, when berth has one: exchanges its password for new tokens.
    auth: Option<Arc<Authenticator>>,
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
    /// Connects to the first endpoint that answers within `dial_timeout` (each is tried),
    /// over TLS and as etcd's user when `access` says so.
    pub fn connect(access: &EtcdAccess) -> Result<Etcd, EtcdError> {
        let (endpoints, dial_timeout) = (&access.endpoints, access.dial_timeout);
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
            let mut uri = Endpoint::from_shared(endpoint.clone())
                .map_err(|_| EtcdError::BadEndpoint(endpoint.clone()))?;
            if let Some(tls) = access.client_tls() {
                uri = uri.tls_config(tls).map_err(|e| EtcdError::Tls {
                    endpoint: endpoint.clone(),
                    reason: error_chain(&e),
                })?;
            }
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
        let auth = access
            .credentials
            .clone()
            .map(|credentials| Arc::new(Authenticator::new(credentials, channel.clone())));
        let token = auth.as_ref().map(|a| a.token.clone()).unwrap_or_default();
        let etcd = Etcd {
            _runtime: runtime,
            handle,
            channel: InterceptedService::new(channel, token.clone()),
            waiting_channel: InterceptedService::new(waiting_channel, token),
            auth,
            endpoints: joined,
            failing_since: Arc::default(),
        };
        // A first token, then a first call: the store answers, and takes berth's
        // credentials (a wrong password is a plain error at start, not a retry loop).
        // The call reads no key: berth's user may read only its prefix.
        etcd.block_with(dial_timeout + CALL_DEADLINE, {
            let etcd = etcd.clone();
            async move {
                etcd.authenticate(None).await?;
                etcd.status_probe().await
            }
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
        if self.auth.is_none() && token_refused(status.message()) {
            return EtcdError::CredentialsNeeded {
                endpoints: self.endpoints.clone(),
            };
        }
        match status.code() {
            Code::Unavailable | Code::DeadlineExceeded | Code::Unknown | Code::Cancelled => {
                // The cause (a refused certificate, a closed port) is in the source chain.
                self.unavailable(status_text(&status))
            }
            _ => EtcdError::Refused(status.message().to_string()),
        }
    }

    /// A new token for berth's user (nothing without one), unless another request
    /// already replaced `stale`.
    async fn authenticate(
        &self,
        stale: Option<&tonic::metadata::AsciiMetadataValue>,
    ) -> Result<(), EtcdError> {
        let Some(auth) = &self.auth else {
            return Ok(());
        };
        match auth.refresh(stale).await {
            Ok(()) => Ok(()),
            Err(AuthFailure::Refused) => Err(EtcdError::CredentialsRefused {
                user: auth.username().to_string(),
            }),
            Err(AuthFailure::NotEnabled) => Err(EtcdError::AuthNotEnabled {
                endpoints: self.endpoints.clone(),
            }),
            Err(AuthFailure::Call(status)) => Err(self.status(status)),
        }
    }

    /// How many tokens etcd has given this connection.
    #[cfg(test)]
    pub(crate) fn token_exchanges(&self) -> u64 {
        self.auth.as_ref().map_or(0, |a| {
            a.exchanges.load(std::sync::atomic::Ordering::Relaxed)
        })
    }

    /// The token requests carry now.
    fn token(&self) -> Option<tonic::metadata::AsciiMetadataValue> {
        self.auth.as_ref().and_then(|a| a.token.current())
    }

    /// Runs `attempt`, and once more with a new token when etcd refused the first for
    /// its token (expired after etcd's `--auth-token-ttl`, or from before etcd restarted).
    async fn call<T, Attempt>(&self, attempt: impl Fn() -> Attempt) -> Result<T, EtcdError>
    where
        Attempt: std::future::Future<Output = Result<T, tonic::Status>>,
    {
        let sent_with = self.token();
        match attempt().await {
            Ok(answer) => Ok(answer),
            Err(status) if self.auth.is_some() && token_refused(status.message()) => {
                self.authenticate(sent_with.as_ref()).await?;
                attempt().await.map_err(|s| self.status(s))
            }
            Err(status) => Err(self.status(status)),
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

    fn kv(&self) -> KvClient<Transport> {
        // A cluster's listing can pass tonic's default 4 MiB answer; etcd caps each
        // value at 1.5 MiB, and berth bounds what it writes.
        KvClient::new(self.channel.clone()).max_decoding_message_size(MAX_ANSWER)
    }

    async fn kv_range(&self, request: pb::RangeRequest) -> Result<pb::RangeResponse, EtcdError> {
        self.call(|| {
            let (mut kv, request) = (self.kv(), request.clone());
            async move { kv.range(request).await.map(tonic::Response::into_inner) }
        })
        .await
    }

    async fn kv_put(&self, request: pb::PutRequest) -> Result<pb::PutResponse, EtcdError> {
        self.call(|| {
            let (mut kv, request) = (self.kv(), request.clone());
            async move { kv.put(request).await.map(tonic::Response::into_inner) }
        })
        .await
    }

    async fn kv_delete_range(
        &self,
        request: pb::DeleteRangeRequest,
    ) -> Result<pb::DeleteRangeResponse, EtcdError> {
        self.call(|| {
            let (mut kv, request) = (self.kv(), request.clone());
            async move {
                kv.delete_range(request)
                    .await
                    .map(tonic::Response::into_inner)
            }
        })
        .await
    }

    async fn kv_txn(&self, request: pb::TxnRequest) -> Result<pb::TxnResponse, EtcdError> {
        self.call(|| {
            let (mut kv, request) = (self.kv(), request.clone());
            async move { kv.txn(request).await.map(tonic::Response::into_inner) }
        })
        .await
    }

    pub async fn get(&self, key: &str) -> Result<Option<Entry>, EtcdError> {
        let response = self
            .kv_range(pb::RangeRequest {
                key: key.as_bytes().to_vec(),
                ..Default::default()
            })
            .await?;
        Ok(response.kvs.into_iter().next().map(Entry::from_kv))
    }

    /// Every key under `prefix`, and the store's revision they were read at.
    pub async fn list(&self, prefix: &str) -> Result<(Vec<Entry>, i64), EtcdError> {
        let response = self
            .kv_range(pb::RangeRequest {
                key: prefix.as_bytes().to_vec(),
                range_end: range_end(prefix),
                ..Default::default()
            })
            .await?;
        let revision = response.header.map(|h| h.revision).unwrap_or(0);
        Ok((
            response.kvs.into_iter().map(Entry::from_kv).collect(),
            revision,
        ))
    }

    /// The store's current revision, read with a count of `key` (one berth may read:
    /// an etcd user is granted berth's prefix, not the whole key space).
    pub async fn revision(&self, key: &str) -> Result<i64, EtcdError> {
        let response = self
            .kv_range(pb::RangeRequest {
                key: key.as_bytes().to_vec(),
                count_only: true,
                ..Default::default()
            })
            .await?;
        Ok(response.header.map(|h| h.revision).unwrap_or(0))
    }

    pub async fn put(&self, key: &str, value: Vec<u8>, lease: i64) -> Result<(), EtcdError> {
        self.kv_put(pb::PutRequest {
            key: key.as_bytes().to_vec(),
            value,
            lease,
            ..Default::default()
        })
        .await?;
        Ok(())
    }

    pub async fn delete(&self, key: &str) -> Result<(), EtcdError> {
        self.kv_delete_range(pb::DeleteRangeRequest {
            key: key.as_bytes().to_vec(),
            ..Default::default()
        })
        .await?;
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
            .kv_txn(pb::TxnRequest {
                compare,
                success,
                failure: Vec::new(),
            })
            .await?;
        Ok(response.succeeded)
    }

    /// Whether the endpoint answers (etcd's Maintenance.Status, which needs no key).
    async fn status_probe(&self) -> Result<(), EtcdError> {
        self.call(|| {
            let mut maintenance = MaintenanceClient::new(self.channel.clone());
            async move { maintenance.status(pb::StatusRequest {}).await.map(drop) }
        })
        .await
    }

    /// A lease of `ttl`: keys written with it vanish when it is not kept alive.
    pub async fn grant_lease(&self, ttl: Duration) -> Result<i64, EtcdError> {
        let request = pb::LeaseGrantRequest {
            ttl: ttl.as_secs().max(1) as i64,
            id: 0,
        };
        let response = self
            .call(|| {
                let mut leases = LeaseClient::new(self.channel.clone());
                async move {
                    leases
                        .lease_grant(request)
                        .await
                        .map(tonic::Response::into_inner)
                }
            })
            .await?;
        if !response.error.is_empty() {
            return Err(EtcdError::Refused(response.error));
        }
        Ok(response.id)
    }

    /// Renews a lease once: `Ok(false)` when etcd no longer has it (it expired).
    pub async fn keep_alive_once(&self, lease: i64) -> Result<bool, EtcdError> {
        // A stream per renewal, with the token of the moment: a long-lived stream
        // would carry a token etcd may have let expire since.
        let answer = self
            .call(|| {
                let mut leases = LeaseClient::new(self.channel.clone());
                async move {
                    let (sender, receiver) = mpsc::channel(1);
                    let _ = sender.send(pb::LeaseKeepAliveRequest { id: lease }).await;
                    drop(sender);
                    let mut answers = leases
                        .lease_keep_alive(tokio_stream::wrappers::ReceiverStream::new(receiver))
                        .await?
                        .into_inner();
                    answers.message().await
                }
            })
            .await?;
        match answer {
            Some(answer) => Ok(answer.ttl > 0),
            None => Err(self.unavailable("the lease keep-alive stream ended")),
        }
    }

    pub async fn revoke_lease(&self, lease: i64) -> Result<(), EtcdError> {
        self.call(|| {
            let mut leases = LeaseClient::new(self.channel.clone());
            async move {
                leases
                    .lease_revoke(pb::LeaseRevokeRequest { id: lease })
                    .await
                    .map(drop)
            }
        })
        .await
    }

    /// Watches every key under `prefix` from `start_revision` (0: from now). Changes
    /// arrive in order on the receiver; a [`Change::Reset`] means the watch was cut and
    /// has been made again from the latest revision: read the prefix again. When
    /// `whole_revisions`, a [`Change::Revision`] follows each revision's changes (etcd
    /// hands a revision's events in one response, and sometimes several revisions in
    /// one). The watch ends when the receiver is dropped.
    pub fn watch(
        &self,
        prefix: &str,
        start_revision: i64,
        whole_revisions: bool,
    ) -> mpsc::Receiver<Change> {
        let (sender, receiver) = mpsc::channel(1024);
        let etcd = self.clone();
        let prefix = prefix.to_string();
        self.spawn(async move {
            let mut from = start_revision;
            loop {
                let sent_with = etcd.token();
                let result = etcd
                    .watch_once(&prefix, from, &sender, whole_revisions)
                    .await;
                if sender.is_closed() {
                    return;
                }
                match result {
                    Ok(next) => from = next,
                    Err(error) => {
                        if etcd.auth.is_some() && refused_for_token(&error) {
                            // etcd checks the token when a watch is made; a new one
                            // before making it again (a failure shows at the next try).
                            let _ = etcd.authenticate(sent_with.as_ref()).await;
                        }
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
        whole_revisions: bool,
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
        // etcd cancels a watch it does not permit (an expired token: "invalid auth
        // token" in 3.4, "permission denied" in others); its own client makes the watch
        // again with a new token.
        const NOT_PERMITTED: &str = "permission denied";
        let mut next = from;
        loop {
            let message = tokio::select! {
                message = stream.message() => message,
                () = sender.closed() => return Ok(next),
            };
            let Some(response) = message.map_err(|s| self.status(s))? else {
                return Err(self.unavailable("the watch ended"));
            };
            let reason = &response.cancel_reason;
            if response.canceled && (reason.contains(NOT_PERMITTED) || token_refused(reason)) {
                return Err(EtcdError::Refused(response.cancel_reason));
            }
            if response.canceled || response.compact_revision > 0 {
                return Err(self.unavailable(format!(
                    "the watch was cancelled ({})",
                    response.cancel_reason
                )));
            }
            // A response holds whole revisions, in order, but may hold several (a
            // watcher that lags is handed them together): each revision's changes are
            // followed by its own marker, as the embedded store tells them.
            let mut last = None;
            for event in response.events {
                let Some(kv) = event.kv else { continue };
                next = next.max(kv.mod_revision + 1);
                if let Some(previous) = last.filter(|&r| whole_revisions && r != kv.mod_revision)
                    && sender.send(Change::Revision(previous)).await.is_err()
                {
                    return Ok(next);
                }
                last = Some(kv.mod_revision);
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
            if let Some(revision) = last.filter(|_| whole_revisions)
                && sender.send(Change::Revision(revision)).await.is_err()
            {
                return Ok(next);
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
    ) -> Result<LeaderKey, EtcdError> {
        let request = election::CampaignRequest {
            name: name.as_bytes().to_vec(),
            lease,
            value: value.as_bytes().to_vec(),
        };
        let response = self
            .call(|| {
                let (mut elections, request) = (
                    ElectionClient::new(self.waiting_channel.clone()),
                    request.clone(),
                );
                async move {
                    elections
                        .campaign(request)
                        .await
                        .map(tonic::Response::into_inner)
                }
            })
            .await?;
        response
            .leader
            .map(|key| LeaderKey {
                name: key.name,
                key: key.key,
                rev: key.rev,
                lease: key.lease,
            })
            .ok_or_else(|| EtcdError::Refused("campaign answered without a leader key".into()))
    }

    /// The value the current leader of `name` proclaimed, if there is a leader.
    pub async fn leader(&self, name: &str) -> Result<Option<String>, EtcdError> {
        let request = election::LeaderRequest {
            name: name.as_bytes().to_vec(),
        };
        self.call(|| {
            let (mut elections, request) =
                (ElectionClient::new(self.channel.clone()), request.clone());
            async move {
                match elections.leader(request).await {
                    Ok(response) => Ok(response
                        .into_inner()
                        .kv
                        .map(|kv| String::from_utf8_lossy(&kv.value).into_owned())),
                    // etcd answers "election: no leader" as an error.
                    Err(status) if status.message().contains("no leader") => Ok(None),
                    Err(status) => Err(status),
                }
            }
        })
        .await
    }

    pub async fn resign(&self, leader: LeaderKey) -> Result<(), EtcdError> {
        let request = election::ResignRequest {
            leader: Some(election::LeaderKey {
                name: leader.name,
                key: leader.key,
                rev: leader.rev,
                lease: leader.lease,
            }),
        };
        self.call(|| {
            let (mut elections, request) =
                (ElectionClient::new(self.channel.clone()), request.clone());
            async move { elections.resign(request).await.map(drop) }
        })
        .await
    }
}

/// Whether etcd refused a request or a watch for its token (a new one may pass).
fn refused_for_token(error: &EtcdError) -> bool {
    matches!(error, EtcdError::Refused(reason)
        if token_refused(reason) || reason.contains("permission denied"))
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
