//! Streams between two nodes through the store, for what must flow both ways for a
//! while (an `alloc exec` session asked of one agent for an alloc another runs). As
//! for [`super::calls`], no node listens on the network for another.
//!
//! ```text
//! P/relays/<node>/<id>      the opening, under the caller's lease; taken (deleted in a
//!                           transaction) by the node, so it is served once
//! P/relay/<id>/open         the caller is there (its lease)
//! P/relay/<id>/served       the node took it and is there (the node's lease)
//! P/relay/<id>/up/<seq>     caller → node frames   } both under the caller's lease:
//! P/relay/<id>/down/<seq>   node → caller frames   } they go with a caller that died
//! ```
//!
//! Each side watches `P/relay/<id>/`. A frame is deleted by its reader once the reader
//! has taken it, and a writer has at most [`WINDOW`] frames not yet deleted: what one
//! side holds for the other is bounded, and a reader that stops reading stops its
//! writer. A side that is done deletes its presence key after its last frame; frames
//! come in the order of their revisions, so the other side reads them all, then sees
//! the end. A side whose lease expires (its agent died) ends the same way.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use super::etcd::{Change, Condition, EtcdError, Write};
use super::store::Store;
use super::{Cluster, key, random_id};

/// The largest frame a relay carries.
pub const MAX_RELAY_FRAME: usize = 64 << 10;

/// The most frames a side has written that the other has not taken yet.
pub const WINDOW: usize = 16;

/// A deadline that does not come.
const NEVER: Duration = Duration::from_secs(365 * 24 * 3600);

/// Relays one node serves at once; a later one is not taken until one ends.
const CONCURRENT_RELAYS: usize = 64;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RelayError {
    #[error(transparent)]
    Store(#[from] EtcdError),
    #[error("node {node:?} did not take the session within {within:?}")]
    NotTaken { node: String, within: Duration },
    #[error("{0:?} is not a node name a relay can be addressed to")]
    BadNode(String),
    #[error("a relay's opening carries at most {MAX_RELAY_FRAME} bytes; this one has {size}")]
    TooLarge { size: usize },
}

/// One side's ends of a relay: frames to send (dropping it ends this side), and the
/// other side's frames (their end is the other side's).
pub struct Relay {
    pub send: mpsc::Sender<Vec<u8>>,
    pub frames: mpsc::Receiver<Vec<u8>>,
    /// Ready once the other side is gone (done, or its lease expired), before its last
    /// frames are read: for a side that stops on it whatever is left to read.
    pub peer_gone: oneshot::Receiver<()>,
}

/// Notes that the other side is gone, and says so once.
fn gone(their_gone: &mut bool, peer_gone: &mut Option<oneshot::Sender<()>>) {
    *their_gone = true;
    if let Some(told) = peer_gone.take() {
        let _ = told.send(());
    }
}

/// What serves this node's relays: the opening, and this side's ends.
pub type RelayHandler =
    Arc<dyn Fn(Vec<u8>, Relay) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// Where one relay's keys are.
#[derive(Clone)]
struct Keys {
    base: String,
}

impl Keys {
    fn new(prefix: &str, id: &str) -> Keys {
        Keys {
            base: format!("{}/", key(prefix, &["relay", id])),
        }
    }
    fn open(&self) -> String {
        format!("{}open", self.base)
    }
    fn served(&self) -> String {
        format!("{}served", self.base)
    }
    fn frames(&self, direction: &str) -> String {
        format!("{}{direction}/", self.base)
    }
}

/// Which side a pump is.
struct Side {
    keys: Keys,
    /// This side's frames' folder name and presence key, and the other's.
    mine: &'static str,
    theirs: &'static str,
    my_presence: String,
    their_presence: String,
    /// The lease frames are written under (the caller's).
    frames_lease: i64,
}

impl Cluster {
    fn relays_prefix(&self, node: &str) -> String {
        format!("{}/", self.key(&["relays", node]))
    }

    /// Opens a relay to `node` (by name) with `opening`; answers once the node took it
    /// (at most `within`).
    pub async fn open_relay(
        &self,
        node: &str,
        opening: Vec<u8>,
        within: Duration,
    ) -> Result<Relay, RelayError> {
        if node.is_empty() || node.contains('/') {
            return Err(RelayError::BadNode(node.to_string()));
        }
        if opening.len() > MAX_RELAY_FRAME {
            return Err(RelayError::TooLarge {
                size: opening.len(),
            });
        }
        let id = random_id();
        let keys = Keys::new(&self.settings.prefix, &id);
        let request_key = format!("{}{id}", self.relays_prefix(node));
        let lease = self.lease();
        let side = Side {
            my_presence: keys.open(),
            their_presence: keys.served(),
            keys,
            mine: "up",
            theirs: "down",
            frames_lease: lease,
        };
        let (send, outbox) = mpsc::channel(WINDOW);
        let (inbox, frames) = mpsc::channel(WINDOW);
        let (taken, answer) = oneshot::channel();
        let (peer_gone_tx, peer_gone) = oneshot::channel();
        let store = self.store.clone();
        let node = node.to_string();
        self.store.spawn(async move {
            let opened = async {
                let from = store.revision(&side.keys.base).await?;
                store.put(&side.my_presence, Vec::new(), lease).await?;
                store.put(&request_key, opening, lease).await?;
                Ok::<_, EtcdError>(from)
            };
            let from = match opened.await {
                Ok(from) => from,
                Err(error) => {
                    let _ = taken.send(Err(error.into()));
                    let _ = store.delete(&side.my_presence).await;
                    return;
                }
            };
            let not_taken = RelayError::NotTaken {
                node: node.clone(),
                within,
            };
            let waiting = Waiting {
                taken,
                within,
                not_taken,
                request_key,
            };
            pump(
                &store,
                side,
                from,
                outbox,
                inbox,
                Some(waiting),
                peer_gone_tx,
            )
            .await;
        });
        answer.await.unwrap_or_else(|_| {
            Err(RelayError::Store(EtcdError::Refused(
                "the cluster store client stopped".into(),
            )))
        })?;
        Ok(Relay {
            send,
            frames,
            peer_gone,
        })
    }

    /// Serves the relays addressed to this node with `handler`, for as long as the
    /// store client runs.
    pub fn serve_relays(self: &Arc<Self>, handler: RelayHandler) {
        let prefix = self.relays_prefix(&self.node_name);
        let store = self.store.clone();
        let cluster = self.clone();
        let settings_prefix = self.settings.prefix.clone();
        let slots = Arc::new(tokio::sync::Semaphore::new(CONCURRENT_RELAYS));
        self.store.spawn(async move {
            let take = |entry: super::etcd::Entry| {
                // At its limit, the node leaves an opening to its caller's deadline
                // rather than holding it: nothing waits in memory.
                let Ok(slot) = slots.clone().try_acquire_owned() else {
                    tracing::warn!(key = %entry.key, "at the limit of relays served; not taken");
                    return;
                };
                let store = store.clone();
                let handler = handler.clone();
                let prefix = settings_prefix.clone();
                // This node's lease now (it is another after the node joined again).
                let own_lease = cluster.lease();
                tokio::spawn(async move {
                    let _slot = slot;
                    serve_one(&store, &prefix, own_lease, entry, handler).await;
                });
            };
            super::calls::each_arrival(&store.clone(), &prefix, "relays", take).await;
        });
    }
}

/// Takes one relay (deletes its opening, if no one else did) and serves it.
async fn serve_one(
    store: &Store,
    prefix: &str,
    own_lease: i64,
    opening: super::etcd::Entry,
    handler: RelayHandler,
) {
    let Some(id) = opening.key.rsplit('/').next().map(str::to_string) else {
        return;
    };
    let taken = store
        .transaction(
            vec![Condition::ModRevision(
                opening.key.clone(),
                opening.mod_revision,
            )],
            vec![Write::Delete(opening.key.clone())],
        )
        .await;
    if !matches!(taken, Ok(true)) {
        return;
    }
    if opening.lease == 0 || !super::is_uuid(&id) || opening.value.len() > MAX_RELAY_FRAME {
        tracing::warn!(key = %opening.key, "dropping a malformed relay to this node");
        return;
    }
    let keys = Keys::new(prefix, &id);
    let from = match store.revision(&keys.base).await {
        Ok(from) => from,
        Err(error) => {
            tracing::debug!(%error, "taking a relay");
            return;
        }
    };
    if let Err(error) = store.put(&keys.served(), Vec::new(), own_lease).await {
        tracing::debug!(%error, "taking a relay");
        return;
    }
    // A caller that gave up before `from` is not seen by the watch: looked at once.
    if !matches!(store.get(&keys.open()).await, Ok(Some(_))) {
        let _ = store.delete(&keys.served()).await;
        return;
    }
    let side = Side {
        my_presence: keys.served(),
        their_presence: keys.open(),
        keys,
        mine: "down",
        theirs: "up",
        frames_lease: opening.lease,
    };
    let (send, outbox) = mpsc::channel(WINDOW);
    let (inbox, frames) = mpsc::channel(WINDOW);
    let (peer_gone_tx, peer_gone) = oneshot::channel();
    let relay = Relay {
        send,
        frames,
        peer_gone,
    };
    let served = tokio::spawn(handler(opening.value, relay));
    pump(store, side, from, outbox, inbox, None, peer_gone_tx).await;
    let _ = served.await;
}

/// The caller's wait for its relay to be taken.
struct Waiting {
    taken: oneshot::Sender<Result<(), RelayError>>,
    within: Duration,
    not_taken: RelayError,
    request_key: String,
}

/// Moves one side's frames to the store and the other side's from it, within the
/// window, until both this side is done and the other's frames have been read (or
/// the other side is gone). Deletes what this side leaves behind.
async fn pump(
    store: &Store,
    side: Side,
    from: i64,
    mut outbox: mpsc::Receiver<Vec<u8>>,
    inbox: mpsc::Sender<Vec<u8>>,
    mut waiting: Option<Waiting>,
    peer_gone: oneshot::Sender<()>,
) {
    let mut peer_gone = Some(peer_gone);
    let mine = side.keys.frames(side.mine);
    let theirs = side.keys.frames(side.theirs);
    let mut changes = store.watch(&side.keys.base, from + 1);
    let deadline = tokio::time::sleep(waiting.as_ref().map_or(NEVER, |w| w.within));
    tokio::pin!(deadline);
    let mut next_out: u64 = 0;
    let mut outstanding: usize = 0;
    let mut next_in: u64 = 0;
    // Their frames read from the store, not yet taken by this side's reader.
    let mut pending: VecDeque<(String, Vec<u8>)> = VecDeque::new();
    let mut sending = true;
    let mut their_gone = false;
    let mut inbox = Some(inbox);
    loop {
        if their_gone && pending.is_empty() {
            // Their frames are all read: the reader sees the end, and no one reads what
            // this side would send.
            inbox = None;
            if sending {
                sending = false;
                let _ = store.delete(&side.my_presence).await;
            }
        }
        if inbox.as_ref().is_some_and(mpsc::Sender::is_closed) {
            // The reader went away: what else comes is dropped as it comes.
            for (key, _) in pending.drain(..) {
                let _ = store.delete(&key).await;
            }
            inbox = None;
        }
        if !sending && inbox.is_none() {
            break;
        }
        tokio::select! {
            frame = outbox.recv(), if sending && outstanding < WINDOW && waiting.is_none() => {
                match frame {
                    Some(frame) => {
                        let key = format!("{mine}{next_out:016}");
                        if store.put(&key, frame, side.frames_lease).await.is_err() {
                            // The caller's lease is gone, or the store: nothing more
                            // can be carried.
                            gone(&mut their_gone, &mut peer_gone);
                            pending.clear();
                            continue;
                        }
                        next_out += 1;
                        outstanding += 1;
                    }
                    None => {
                        sending = false;
                        let _ = store.delete(&side.my_presence).await;
                    }
                }
            }
            permit = reserve(&inbox), if !pending.is_empty() && inbox.is_some() => {
                // No permit: the reader went away, seen at the top of the loop.
                if let Some(permit) = permit
                    && let Some((key, frame)) = pending.pop_front()
                {
                    permit.send(frame);
                    let _ = store.delete(&key).await;
                }
            }
            change = changes.recv() => match change {
                Some(Change::Put(entry)) => {
                    if entry.key == side.their_presence {
                        if let Some(waiting) = waiting.take() {
                            let _ = waiting.taken.send(Ok(()));
                        }
                    } else if let Some(seq) = sequence(&entry.key, &theirs)
                        && seq == next_in
                    {
                        next_in += 1;
                        if inbox.is_some() {
                            pending.push_back((entry.key, entry.value));
                        } else {
                            let _ = store.delete(&entry.key).await;
                        }
                    }
                }
                Some(Change::Delete { key, .. }) => {
                    if key == side.their_presence {
                        gone(&mut their_gone, &mut peer_gone);
                    } else if sequence(&key, &mine).is_some() {
                        outstanding = outstanding.saturating_sub(1);
                    }
                }
                Some(Change::Revision(_)) => {}
                Some(Change::Reset) => {
                    match reconcile(store, &side, &mine, &theirs, &mut next_in, &mut pending).await {
                        Ok((revision, present, theirs_present)) => {
                            outstanding = present;
                            if theirs_present {
                                if let Some(waiting) = waiting.take() {
                                    let _ = waiting.taken.send(Ok(()));
                                }
                            } else if waiting.is_none() {
                                gone(&mut their_gone, &mut peer_gone);
                            }
                            changes = store.watch(&side.keys.base, revision + 1);
                        }
                        Err(_) => {
                            tokio::time::sleep(Duration::from_millis(200)).await;
                            changes = store.watch(&side.keys.base, from + 1);
                        }
                    }
                }
                None => {
                    gone(&mut their_gone, &mut peer_gone);
                    pending.clear();
                }
            },
            () = &mut deadline, if waiting.is_some() => {
                // Withdrawn before the caller hears of it.
                let _ = store.delete(&side.my_presence).await;
                if let Some(waiting) = waiting.take() {
                    let _ = store.delete(&waiting.request_key).await;
                    let _ = waiting.taken.send(Err(waiting.not_taken));
                }
                break;
            }
        }
    }
    // What is left under this relay's folder of this side's making.
    if let Ok((entries, _)) = store.list(&mine).await {
        for entry in entries {
            let _ = store.delete(&entry.key).await;
        }
    }
    let _ = store.delete(&side.my_presence).await;
}

/// A send slot in the reader's channel; `None` once the reader went away.
async fn reserve(inbox: &Option<mpsc::Sender<Vec<u8>>>) -> Option<mpsc::Permit<'_, Vec<u8>>> {
    match inbox {
        Some(inbox) => inbox.reserve().await.ok(),
        None => None,
    }
}

/// The sequence number of a frame key in `folder`.
fn sequence(key: &str, folder: &str) -> Option<u64> {
    key.strip_prefix(folder)?.parse().ok()
}

/// After a cut watch: reads the relay's folder again. Their frames not yet read are
/// queued, in order; returns the revision read at, how many of this side's frames are
/// not taken yet, and whether the other side is there.
async fn reconcile(
    store: &Store,
    side: &Side,
    mine: &str,
    theirs: &str,
    next_in: &mut u64,
    pending: &mut VecDeque<(String, Vec<u8>)>,
) -> Result<(i64, usize, bool), EtcdError> {
    let (entries, revision) = store.list(&side.keys.base).await?;
    let mut present = 0;
    let mut theirs_present = false;
    let mut new: Vec<(u64, String, Vec<u8>)> = Vec::new();
    for entry in entries {
        if entry.key == side.their_presence {
            theirs_present = true;
        } else if sequence(&entry.key, mine).is_some() {
            present += 1;
        } else if let Some(seq) = sequence(&entry.key, theirs)
            && seq >= *next_in
        {
            new.push((seq, entry.key, entry.value));
        }
    }
    new.sort_by_key(|(seq, _, _)| *seq);
    for (seq, key, value) in new {
        if seq != *next_in {
            break;
        }
        *next_in += 1;
        pending.push_back((key, value));
    }
    Ok((revision, present, theirs_present))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests as cluster_tests;
    use berth_testkit::etcd::EtcdServer;

    fn join(server: &EtcdServer, name: &str) -> (Arc<Cluster>, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let settings = cluster_tests::settings(server, "/relays");
        let joined = Cluster::join(&settings, dir.path(), cluster_tests::node(name)).unwrap();
        (joined, dir)
    }

    fn leftovers(cluster: &Cluster) -> Vec<String> {
        let store = cluster.store().clone();
        let (entries, _) = cluster
            .store()
            .block(async move { store.list("/relays/").await })
            .unwrap();
        entries
            .into_iter()
            .map(|e| e.key)
            .filter(|k| k.starts_with("/relays/relay/") || k.starts_with("/relays/relays/"))
            .collect()
    }

    /// Echoes each frame back upper-cased, after the opening; ends when the caller does.
    fn echo() -> RelayHandler {
        Arc::new(|opening: Vec<u8>, mut relay: Relay| {
            Box::pin(async move {
                let _ = relay.send.send(opening).await;
                while let Some(frame) = relay.frames.recv().await {
                    if relay.send.send(frame.to_ascii_uppercase()).await.is_err() {
                        return;
                    }
                }
            })
        })
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn frames_flow_both_ways_in_order_within_the_window_and_leave_nothing() {
        let server = EtcdServer::start();
        let (a, _da) = join(&server, "a");
        let (b, _db) = join(&server, "b");
        b.serve_relays(echo());
        let mut relay = a
            .open_relay("b", b"hello".to_vec(), Duration::from_secs(10))
            .await
            .unwrap();
        assert_eq!(relay.frames.recv().await.unwrap(), b"hello");
        // More frames than the window, sent while none is read back: the writer waits
        // for the reader instead of piling them up.
        let writer = {
            let send = relay.send.clone();
            tokio::spawn(async move {
                for n in 0..(WINDOW * 3) {
                    send.send(format!("frame {n}").into_bytes()).await.unwrap();
                }
            })
        };
        for n in 0..(WINDOW * 3) {
            let frame = tokio::time::timeout(Duration::from_secs(10), relay.frames.recv())
                .await
                .unwrap()
                .unwrap();
            assert_eq!(frame, format!("FRAME {n}").into_bytes());
        }
        writer.await.unwrap();
        drop(relay.send);
        // The server's side ends once the caller's does, and the caller's frames end.
        assert_eq!(
            tokio::time::timeout(Duration::from_secs(10), relay.frames.recv())
                .await
                .unwrap(),
            None
        );
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !leftovers(&a).is_empty() {
            assert!(std::time::Instant::now() < deadline, "{:?}", leftovers(&a));
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // A node that serves no relays does not take one: refused in time, withdrawn.
        let refused = a
            .open_relay("nobody", Vec::new(), Duration::from_millis(500))
            .await
            .err()
            .unwrap();
        assert!(matches!(refused, RelayError::NotTaken { .. }), "{refused}");
        assert_eq!(leftovers(&a), Vec::<String>::new());
    }
}
