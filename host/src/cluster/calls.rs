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
use super::{Cluster, key, random_id};

/// The largest request or answer a call carries (etcd refuses values past 1.5 MiB).
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
        let etcd = self.etcd.clone();
        let node = node.to_string();
        let (sender, receiver) = tokio::sync::oneshot::channel();
        // On the store client's runtime, as every etcd call.
        self.etcd.spawn(async move {
            let exchange = async {
                let from = etcd.revision().await?;
                let mut answers = etcd.watch(&answer_key, from + 1);
                etcd.put(&call_key, request, lease).await?;
                let deadline = tokio::time::sleep(within);
                tokio::pin!(deadline);
                loop {
                    let answer = tokio::select! {
                        change = answers.recv() => match change {
                            Some(Change::Put(entry)) => Some(entry.value),
                            // The watch was cut: the answer may have come meanwhile.
                            Some(Change::Reset) => etcd.get(&answer_key).await?.map(|e| e.value),
                            Some(Change::Delete { .. }) => None,
                            None => return Err(CallError::NoAnswer { node: node.clone(), within }),
                        },
                        () = &mut deadline => {
                            // Withdrawn if not taken yet. If it was, its late answer is
                            // removed when it comes (or goes with this node's lease).
                            let _ = etcd.delete(&call_key).await;
                            let (etcd, answer_key) = (etcd.clone(), answer_key.clone());
                            tokio::spawn(async move {
                                let late = tokio::time::timeout(within, async {
                                    while let Some(change) = answers.recv().await {
                                        if matches!(change, Change::Put(_) | Change::Reset) {
                                            return;
                                        }
                                    }
                                });
                                let _ = late.await;
                                let _ = etcd.delete(&answer_key).await;
                            });
                            return Err(CallError::NoAnswer { node: node.clone(), within });
                        }
                    };
                    if let Some(answer) = answer {
                        let _ = etcd.delete(&answer_key).await;
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
        let etcd = self.etcd.clone();
        let slots = Arc::new(tokio::sync::Semaphore::new(CONCURRENT_CALLS));
        self.etcd.spawn(async move {
            loop {
                let (waiting, revision) = match etcd.list(&prefix).await {
                    Ok(listed) => listed,
                    Err(error) => {
                        tracing::debug!(%error, "listing the calls to this node; trying again");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        continue;
                    }
                };
                let take = |entry: super::etcd::Entry| {
                    let etcd = etcd.clone();
                    let handler = handler.clone();
                    let slots = slots.clone();
                    let answers = answers.clone();
                    tokio::spawn(async move {
                        let Ok(_slot) = slots.acquire_owned().await else {
                            return;
                        };
                        serve_one(&etcd, &answers, entry, handler).await;
                    });
                };
                for entry in waiting {
                    take(entry);
                }
                let mut changes = etcd.watch(&prefix, revision + 1);
                loop {
                    match changes.recv().await {
                        Some(Change::Put(entry)) => take(entry),
                        Some(Change::Delete { .. }) => {}
                        // Cut: list again (a call taken twice is refused by its claim).
                        Some(Change::Reset) => break,
                        None => return,
                    }
                }
            }
        });
    }
}

/// Takes one call (deletes it, if no one else did), serves it, and answers it under the
/// caller's lease. A call written without a lease is dropped: its answer would stay in
/// the store for good.
async fn serve_one(
    etcd: &super::etcd::Etcd,
    answers: &str,
    call: super::etcd::Entry,
    handler: CallHandler,
) {
    let Some(id) = call.key.rsplit('/').next().map(str::to_string) else {
        return;
    };
    let taken = etcd
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
    if let Err(error) = etcd
        .put(&format!("{answers}/{id}"), answer, call.lease)
        .await
    {
        // Most often: the caller is gone, and its lease with it.
        tracing::debug!(%error, "answering a call");
    }
}
