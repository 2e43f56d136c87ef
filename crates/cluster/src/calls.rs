//! Calls from one node to another through the store, for what only another node can do
//! (its CSI controller's operations). No node listens on the network for another: a
//! caller writes `P/calls/<node>/<id>` under its own lease and watches `P/answers/<id>`;
//! the called node watches its `calls/` prefix, takes each call by deleting it in a
//! transaction (so a call is served at most once, even across its watch restarting),
//! and writes the answer under the caller's lease (so an answer goes with a caller that
//! died). A caller gives up after its deadline, withdraws a call not yet taken, and
//! removes a late answer when it comes.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use super::etcd::{Change, Condition, EtcdError, Write};
use super::store::Store;
use super::{Cluster, key, random_id};

/// The largest request or answer a call carries (store refuses values past 1.5 MiB).
pub const MAX_CALL_BYTES: usize = 1 << 20;

/// Calls one node serves at once; the rest wait their turn.
const CONCURRENT_CALLS: usize = 16;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    #[error(transparent)]
    Store(#[from] EtcdError),
    #[error("node {node:?} did not answer within {within:?}")]
    NoAnswer { node: String, within: Duration },
    #[error("a call to another node carries at most {MAX_CALL_BYTES} bytes; this one has {size}")]
    TooLarge { size: usize },
    #[error("{0:?} is not a node name a call can be addressed to")]
    BadNode(String),
}

/// What serves this node's calls: the request's bytes in, the answer's bytes out.
pub type CallHandler =
    Arc<dyn Fn(Vec<u8>) -> Pin<Box<dyn Future<Output = Vec<u8>> + Send>> + Send + Sync>;

impl Cluster {
    fn calls_prefix(&self, node: &str) -> String {
        format!("{}/", self.key(&["calls", node]))
    }

    /// Sends `request` to `node` (by name) and waits up to `within` for its answer.
    pub async fn call(
        &self,
        node: &str,
        request: Vec<u8>,
        within: Duration,
    ) -> Result<Vec<u8>, CallError> {
        if node.is_empty() || node.contains('/') {
            return Err(CallError::BadNode(node.to_string()));
        }
        if request.len() > MAX_CALL_BYTES {
            return Err(CallError::TooLarge {
                size: request.len(),
            });
        }
        let id = random_id();
        let call_key = format!("{}{id}", self.calls_prefix(node));
        let answer_key = key(&self.settings.prefix, &["answers", &id]);
        let lease = self.lease();
        let store = self.store.clone();
        let node = node.to_string();
        let (sender, receiver) = tokio::sync::oneshot::channel();
        // On the store client's runtime, as every etcd call.
        self.store.spawn(async move {
            let exchange = async {
                let from = store.revision(&answer_key).await?;
                let mut answers = store.watch(&answer_key, from + 1);
                store.put(&call_key, request, lease).await?;
                let deadline = tokio::time::sleep(within);
                tokio::pin!(deadline);
                loop {
                    let answer = tokio::select! {
                        change = answers.recv() => match change {
                            Some(Change::Put(entry)) => Some(entry.value),
                            // The watch was cut: the answer may have come meanwhile.
                            Some(Change::Reset) => store.get(&answer_key).await?.map(|e| e.value),
                            Some(Change::Delete { .. } | Change::Revision(_)) => None,
                            None => return Err(CallError::NoAnswer { node: node.clone(), within }),
                        },
                        () = &mut deadline => {
                            // Withdrawn if not taken yet. If it was, its late answer is
                            // removed when it comes (or goes with this node's lease).
                            let _ = store.delete(&call_key).await;
                            let (store, answer_key) = (store.clone(), answer_key.clone());
                            tokio::spawn(async move {
                                let late = tokio::time::timeout(within, async {
                                    while let Some(change) = answers.recv().await {
                                        if matches!(change, Change::Put(_) | Change::Reset) {
                                            return;
                                        }
                                    }
                                });
                                let _ = late.await;
                                let _ = store.delete(&answer_key).await;
                            });
                            return Err(CallError::NoAnswer { node: node.clone(), within });
                        }
                    };
                    if let Some(answer) = answer {
                        let _ = store.delete(&answer_key).await;
                        return Ok(answer);
                    }
                }
            };
            let _ = sender.send(exchange.await);
        });
        receiver.await.unwrap_or_else(|_| {
            Err(CallError::Store(EtcdError::Refused(
                "the cluster store client stopped".into(),
            )))
        })
    }

    /// Serves the calls addressed to this node with `handler`, for as long as the store
    /// client runs: those waiting now, then each as it arrives.
    pub fn serve_calls(self: &Arc<Self>, handler: CallHandler) {
        let prefix = self.calls_prefix(&self.node_name);
        let answers = key(&self.settings.prefix, &["answers"]);
        let store = self.store.clone();
        let slots = Arc::new(tokio::sync::Semaphore::new(CONCURRENT_CALLS));
        self.store.spawn(async move {
            let take = |entry: super::etcd::Entry| {
                let store = store.clone();
                let handler = handler.clone();
                let slots = slots.clone();
                let answers = answers.clone();
                tokio::spawn(async move {
                    let Ok(_slot) = slots.acquire_owned().await else {
                        return;
                    };
                    serve_one(&store, &answers, entry, handler).await;
                });
            };
            each_arrival(&store.clone(), &prefix, "calls", take).await;
        });
    }
}

/// Hands `take` every entry put under `prefix` (`what` names them in logs): those
/// there now, then each as it arrives, for as long as the store client runs. A cut
/// watch lists again: an entry handed twice is refused by its taker's transaction.
pub(super) async fn each_arrival(
    store: &Store,
    prefix: &str,
    what: &str,
    mut take: impl FnMut(super::etcd::Entry),
) {
    loop {
        let (waiting, revision) = match store.list(prefix).await {
            Ok(listed) => listed,
            Err(error) => {
                tracing::debug!(%error, what, "listing what is addressed to this node; trying again");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        for entry in waiting {
            take(entry);
        }
        let mut changes = store.watch(prefix, revision + 1);
        loop {
            match changes.recv().await {
                Some(Change::Put(entry)) => take(entry),
                Some(Change::Delete { .. } | Change::Revision(_)) => {}
                Some(Change::Reset) => break,
                None => return,
            }
        }
    }
}

/// Takes one call (deletes it, if no one else did), serves it, and answers it under the
/// caller's lease. A call written without a lease is dropped: its answer would stay in
/// the store for good.
async fn serve_one(store: &Store, answers: &str, call: super::etcd::Entry, handler: CallHandler) {
    let Some(id) = call.key.rsplit('/').next().map(str::to_string) else {
        return;
    };
    let taken = store
        .transaction(
            vec![Condition::ModRevision(call.key.clone(), call.mod_revision)],
            vec![Write::Delete(call.key.clone())],
        )
        .await;
    if !matches!(taken, Ok(true)) {
        return;
    }
    if call.lease == 0 || !super::is_uuid(&id) || call.value.len() > MAX_CALL_BYTES {
        tracing::warn!(key = %call.key, "dropping a malformed call to this node");
        return;
    }
    let answer = handler(call.value).await;
    if answer.len() > MAX_CALL_BYTES {
        tracing::warn!(
            size = answer.len(),
            "an answer too large to send; the caller will time out"
        );
        return;
    }
    if let Err(error) = store
        .put(&format!("{answers}/{id}"), answer, call.lease)
        .await
    {
        // Most often: the caller is gone, and its lease with it.
        tracing::debug!(%error, "answering a call");
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::random_id;
    use crate::tests as cluster_tests;
    use berth_testkit::etcd::EtcdServer;

    fn join(server: &EtcdServer, name: &str) -> (Arc<Cluster>, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let settings = cluster_tests::settings(server, "/calls");
        let joined = Cluster::join(&settings, dir.path(), cluster_tests::node(name)).unwrap();
        (joined, dir)
    }

    /// Serves by echoing the request reversed, counting the calls served.
    fn reverser(served: Arc<AtomicUsize>) -> CallHandler {
        Arc::new(move |mut request: Vec<u8>| {
            served.fetch_add(1, Ordering::SeqCst);
            Box::pin(async move {
                request.reverse();
                request
            })
        })
    }

    /// Calls and answers left in the store.
    fn leftovers(cluster: &Cluster) -> Vec<String> {
        let store = cluster.store().clone();
        let prefix = "/calls/".to_string();
        let (entries, _) = cluster
            .store()
            .block(async move { store.list(&prefix).await })
            .unwrap();
        entries
            .into_iter()
            .map(|e| e.key)
            .filter(|k| k.starts_with("/calls/calls/") || k.starts_with("/calls/answers/"))
            .collect()
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_call_is_answered_once_by_its_node_and_leaves_nothing_behind() {
        let server = EtcdServer::start();
        let (a, _da) = join(&server, "a");
        let (b, _db) = join(&server, "b");
        let served = Arc::new(AtomicUsize::new(0));
        b.serve_calls(reverser(served.clone()));
        for round in 0..20u8 {
            let answer = a
                .call("b", vec![1, 2, round], Duration::from_secs(5))
                .await
                .unwrap();
            assert_eq!(answer, [round, 2, 1]);
        }
        assert_eq!(served.load(Ordering::SeqCst), 20, "each call served once");
        assert_eq!(leftovers(&a), Vec::<String>::new());
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_call_to_a_node_that_does_not_serve_times_out_and_is_withdrawn() {
        let server = EtcdServer::start();
        let (a, _da) = join(&server, "a");
        let started = std::time::Instant::now();
        let error = a
            .call("nobody", b"hello".to_vec(), Duration::from_millis(500))
            .await
            .unwrap_err();
        assert_eq!(
            error.to_string(),
            "node \"nobody\" did not answer within 500ms"
        );
        assert!(started.elapsed() < Duration::from_secs(3));
        assert_eq!(
            leftovers(&a),
            Vec::<String>::new(),
            "the call was withdrawn"
        );
        // An oversized call and a name that is not one are refused before anything is
        // written.
        let error = a
            .call("b", vec![0; MAX_CALL_BYTES + 1], Duration::from_secs(1))
            .await
            .unwrap_err();
        assert!(matches!(error, CallError::TooLarge { .. }), "{error}");
        let error = a
            .call("../nodes", b"x".to_vec(), Duration::from_secs(1))
            .await
            .unwrap_err();
        assert!(matches!(error, CallError::BadNode(_)), "{error}");
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_call_written_before_its_node_serves_is_served_when_it_starts() {
        let server = EtcdServer::start();
        let (a, _da) = join(&server, "a");
        let (b, _db) = join(&server, "b");
        let caller = tokio::spawn({
            let a = a.clone();
            async move {
                a.call("b", b"early".to_vec(), Duration::from_secs(10))
                    .await
            }
        });
        tokio::time::sleep(Duration::from_millis(500)).await;
        let served = Arc::new(AtomicUsize::new(0));
        b.serve_calls(reverser(served.clone()));
        assert_eq!(caller.await.unwrap().unwrap(), b"ylrae");
        assert_eq!(served.load(Ordering::SeqCst), 1);
    }

    /// A call with no lease (not written by a member: its answer would stay in the
    /// store for good) is taken and dropped, never served or answered.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_call_without_a_lease_is_dropped_unserved() {
        let server = EtcdServer::start();
        let (b, _db) = join(&server, "b");
        let served = Arc::new(AtomicUsize::new(0));
        b.serve_calls(reverser(served.clone()));
        let store = b.store().clone();
        let key = format!("/calls/calls/b/{}", random_id());
        b.store()
            .block(async move { store.put(&key, b"forged".to_vec(), 0).await })
            .unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while leftovers(&b).iter().any(|k| k.starts_with("/calls/calls/")) {
            assert!(std::time::Instant::now() < deadline, "{:?}", leftovers(&b));
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // Time for a (wrong) answer to be written after the call was taken.
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(served.load(Ordering::SeqCst), 0);
        assert_eq!(leftovers(&b), Vec::<String>::new(), "no answer written");
    }
}
