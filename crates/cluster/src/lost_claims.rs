//! Claims of lost allocs, given back. An alloc whose node went down is `lost`; once it
//! has been for `lost_claim_grace` (its node may still be writing until then), its
//! volumes' claims are released, so another node can claim them.
//!
//! **Unpublished first.** Each volume is first unpublished from the lost node by its
//! plugin's controller, wherever that runs (ControllerUnpublishVolume, to the CSI node
//! id the claim recorded). A storage that attaches a single-node volume to one node at
//! a time refuses the next node's ControllerPublish while the lost node still has it
//! (the CSI spec's FAILED_PRECONDITION): released without it, the claim would only move
//! the failure to the alloc that claims the volume next. The lost node cannot unstage
//! first, as the spec's order asks; its grace is what stands for that.
//!
//! **Kept when that fails.** A release whose unpublish fails (no healthy controller,
//! the storage refuses) keeps the claim, says why in the agent's log, and is tried again
//! [`RETRY`] later: the volume is never handed on while it may still be attached. That
//! includes a controller that ran on the lost node: the claim waits for another. A
//! claim made while its plugin had no controller names no CSI node id (nothing was
//! published), and goes at once.
//!
//! The scheduler (one per cluster) starts a release on each of its rounds, off the
//! round itself: an unpublish may wait for a controller, and placing allocs does not
//! wait with it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use super::Cluster;
use super::catalog::{EtcdCatalog, LostClaim};
use super::state::AllocReport;
use berth_state::catalog::{Catalog, Volume};

/// How soon a release whose unpublish failed is tried again.
pub const RETRY: Duration = Duration::from_secs(5);

/// Why a volume was not unpublished from a lost node, in the CSI manager's words.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UnpublishFailed(pub String);

/// An unpublish under way: `Ok(true)` once done, `Ok(false)` when there was nothing to
/// unpublish, or why it failed.
pub type Unpublishing<'a> =
    Pin<Box<dyn Future<Output = Result<bool, UnpublishFailed>> + Send + 'a>>;

/// Unpublishes a volume from a lost node (the agent's CSI manager, through the plugin's
/// controller wherever it runs).
pub trait Unpublisher: Send + Sync {
    fn unpublish<'a>(&'a self, volume: &'a Volume, node_id: &'a str) -> Unpublishing<'a>;
}

/// Releases lost allocs' claims, one release at a time.
pub struct LostClaims {
    cluster: Arc<Cluster>,
    unpublisher: Arc<dyn Unpublisher>,
    busy: AtomicBool,
    /// A release was asked for while one ran: the scheduler is woken when it ends.
    again: AtomicBool,
    /// When claims kept by a failed unpublish are due again (ms since the epoch; 0:
    /// none). No release starts before.
    retry_at_ms: AtomicU64,
    /// Wakes the scheduler when a release ended that wants another round (it kept
    /// claims, or others came due meanwhile): nothing in etcd changes for that.
    wake: tokio::sync::Notify,
}

impl LostClaims {
    pub fn new(cluster: Arc<Cluster>, unpublisher: Arc<dyn Unpublisher>) -> Arc<LostClaims> {
        Arc::new(LostClaims {
            cluster,
            unpublisher,
            busy: AtomicBool::new(false),
            again: AtomicBool::new(false),
            retry_at_ms: AtomicU64::new(0),
            wake: tokio::sync::Notify::new(),
        })
    }

    /// Returns when a release ended that wants the scheduler to plan again.
    pub async fn woken(&self) {
        self.wake.notified().await;
    }

    /// When claims kept by a failed unpublish are to be tried again, if any are.
    pub fn retry_at_ms(&self) -> Option<u64> {
        match self.retry_at_ms.load(Ordering::SeqCst) {
            0 => None,
            at => Some(at),
        }
    }

    /// Starts releasing the claims of allocs lost longer than the grace, unless claims
    /// kept by a failed unpublish wait for their retry time (the scheduler wakes then)
    /// or a release is under way (the scheduler is woken when it ends).
    pub fn release_due(self: &Arc<Self>, reports: Vec<AllocReport>) {
        let now = super::now_ms();
        if self.retry_at_ms().is_some_and(|at| now < at) {
            return;
        }
        if self.busy.swap(true, Ordering::SeqCst) {
            self.again.store(true, Ordering::SeqCst);
            return;
        }
        self.retry_at_ms.store(0, Ordering::SeqCst);
        let this = self.clone();
        tokio::spawn(async move {
            let kept = this.release(reports, now).await;
            let mut wake = this.again.swap(false, Ordering::SeqCst);
            if kept > 0 {
                let retry_ms = u64::try_from(RETRY.as_millis()).unwrap_or(u64::MAX);
                this.retry_at_ms
                    .store(super::now_ms().saturating_add(retry_ms), Ordering::SeqCst);
                wake = true;
            }
            this.busy.store(false, Ordering::SeqCst);
            if wake {
                this.wake.notify_one();
            }
        });
    }

    /// Unpublishes and releases each claim due at `now_ms`; how many were kept.
    pub async fn release(&self, reports: Vec<AllocReport>, now_ms: u64) -> usize {
        let catalog = Arc::new(EtcdCatalog::new(self.cluster.clone()));
        let grace = self.cluster.settings().lost_claim_grace;
        let due = {
            let catalog = catalog.clone();
            tokio::task::spawn_blocking(move || catalog.lost_claims_due(&reports, now_ms, grace))
                .await
        };
        let due = match due {
            Ok(Ok(due)) => due,
            Ok(Err(error)) => {
                tracing::warn!(%error, "reading the claims of lost allocs");
                return 1;
            }
            Err(_) => return 1,
        };
        let mut kept = 0;
        for lost in due {
            if !self.unpublish(&lost).await {
                kept += 1;
                continue;
            }
            let (volume_id, alloc_id) = (lost.volume.id.clone(), lost.claim.alloc_id.clone());
            let catalog = catalog.clone();
            let released =
                tokio::task::spawn_blocking(move || catalog.release(&volume_id, &alloc_id)).await;
            match released {
                Ok(Ok(())) => tracing::warn!(
                    volume = %lost.volume.id,
                    alloc = %lost.claim.alloc_id,
                    node = %lost.node_name,
                    "released the claim of a lost alloc: its node has been down longer than \
                     lost_claim_grace"
                ),
                Ok(Err(error)) => {
                    tracing::warn!(volume = %lost.volume.id, alloc = %lost.claim.alloc_id,
                        %error, "releasing the claim of a lost alloc");
                    kept += 1;
                }
                Err(_) => kept += 1,
            }
        }
        kept
    }

    /// Unpublishes the claim's volume from its lost node: whether the claim may go.
    async fn unpublish(&self, lost: &LostClaim) -> bool {
        let Some(node_id) = &lost.claim.external_node_id else {
            // Made while the plugin had no controller (nothing was published), or
            // recorded before claims named the node's CSI id.
            tracing::info!(volume = %lost.volume.id, node = %lost.node_name,
                "the claim of a lost alloc names no CSI node id: released without \
                 ControllerUnpublishVolume");
            return true;
        };
        if lost.node_id_in_use {
            tracing::warn!(volume = %lost.volume.id, node = %lost.node_name, csi_node = %node_id,
                "the claim of a lost alloc is released without ControllerUnpublishVolume: \
                 another claim of the volume is on the same CSI node id");
            return true;
        }
        match self.unpublisher.unpublish(&lost.volume, node_id).await {
            Ok(true) => {
                tracing::info!(volume = %lost.volume.id, node = %lost.node_name,
                    csi_node = %node_id, "unpublished the volume from a lost node");
                true
            }
            Ok(false) => true,
            Err(error) => {
                tracing::warn!(volume = %lost.volume.id, alloc = %lost.claim.alloc_id,
                    node = %lost.node_name, %error,
                    "keeping the claim of a lost alloc: its volume could not be unpublished \
                     from the lost node (tried again in {RETRY:?})");
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::tests::{join, volume, writer};
    use berth_model::status::ClientStatus;
    use berth_testkit::etcd::EtcdServer;

    /// The unpublishes asked for (volume, CSI node id); failing while `refuse` is set.
    /// A recorder of what this module asks the CSI manager, which the e2e test
    /// `cluster_csi::a_lost_nodes_volume_is_unpublished_from_it_before_another_node_claims_it`
    /// drives for real.
    #[derive(Default)]
    struct Recorder {
        asked: Mutex<Vec<(String, String)>>,
        refuse: AtomicBool,
    }

    impl Unpublisher for Recorder {
        fn unpublish<'a>(&'a self, volume: &'a Volume, node_id: &'a str) -> Unpublishing<'a> {
            Box::pin(async move {
                self.asked
                    .lock()
                    .unwrap()
                    .push((volume.id.clone(), node_id.to_string()));
                if self.refuse.load(Ordering::SeqCst) {
                    Err(UnpublishFailed(
                        "the controller of CSI plugin \"hostpath\" is not healthy".into(),
                    ))
                } else {
                    Ok(true)
                }
            })
        }
    }

    #[test]
    fn a_lost_allocs_claim_is_unpublished_from_its_node_and_released_after_the_grace() {
        let server = EtcdServer::start();
        let (a, _da) = join(&server, "a");
        let catalog = EtcdCatalog::new(a.clone());
        catalog.register_volume(volume("data")).unwrap();
        let mut claim = writer("held", "b");
        claim.external_node_id = Some("csi-b".into());
        catalog.claim("data", claim).unwrap();
        let recorder = Arc::new(Recorder::default());
        let lost = LostClaims::new(a.clone(), recorder.clone());
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let lost_at = 1_000_000;
        let report = |status: ClientStatus| AllocReport {
            alloc_id: "held".into(),
            job_id: "web".into(),
            name: "web.g[0]".into(),
            node_id: crate::random_id(),
            node_name: "b".into(),
            client_status: status,
            description: String::new(),
            updated_ms: lost_at,
            tasks: Default::default(),
        };
        let grace = u64::try_from(a.settings().lost_claim_grace.as_millis()).unwrap();
        let release = |status: ClientStatus, at: u64| {
            runtime.block_on(lost.release(vec![report(status)], at))
        };
        let claims = || catalog.volume("data").unwrap().claims.len();

        // Within the grace: kept, nothing asked.
        assert_eq!(release(ClientStatus::Lost, lost_at + grace - 1), 0);
        assert_eq!(claims(), 1);
        // A running alloc's claim is never released, whatever the time.
        assert_eq!(release(ClientStatus::Running, lost_at * 10), 0);
        assert_eq!(claims(), 1);
        assert!(recorder.asked.lock().unwrap().is_empty());
        // Past the grace, with no controller to unpublish it: kept, to be tried again.
        recorder.refuse.store(true, Ordering::SeqCst);
        assert_eq!(release(ClientStatus::Lost, lost_at + grace), 1);
        assert_eq!(claims(), 1);
        // Unpublished from the lost node's CSI id, then released.
        recorder.refuse.store(false, Ordering::SeqCst);
        assert_eq!(release(ClientStatus::Lost, lost_at + grace), 0);
        assert_eq!(claims(), 0);
        assert_eq!(
            *recorder.asked.lock().unwrap(),
            [
                ("data".to_string(), "csi-b".to_string()),
                ("data".to_string(), "csi-b".to_string())
            ]
        );

        // Another claim that stays is on the lost claim's CSI node id: released unasked,
        // the volume left where that claim uses it.
        let mut claim = writer("held", "b");
        claim.external_node_id = Some("csi-b".into());
        catalog.claim("data", claim).unwrap();
        let mut other = writer("stays", "b");
        other.access_mode = berth_model::csi::AccessMode::MultiNodeMultiWriter;
        other.mode = berth_state::catalog::ClaimMode::Read;
        other.external_node_id = Some("csi-b".into());
        catalog.claim("data", other).unwrap();
        recorder.refuse.store(true, Ordering::SeqCst);
        assert_eq!(release(ClientStatus::Lost, lost_at + grace), 0);
        assert_eq!(claims(), 1);
        assert_eq!(recorder.asked.lock().unwrap().len(), 2);
        catalog.release("data", "stays").unwrap();

        // A claim recorded before claims named the node's CSI id: released unasked.
        catalog.claim("data", writer("held", "b")).unwrap();
        recorder.refuse.store(true, Ordering::SeqCst);
        assert_eq!(release(ClientStatus::Lost, lost_at + grace), 0);
        assert_eq!(claims(), 0);
        assert_eq!(recorder.asked.lock().unwrap().len(), 2);
    }

    /// A release that keeps a claim wakes the scheduler and sets when it is tried
    /// again; no release starts before that time, and one after it releases.
    #[test]
    fn a_kept_claim_is_tried_again_after_the_retry_delay_and_not_before() {
        let server = EtcdServer::start();
        let (a, _da) = join(&server, "a");
        let catalog = EtcdCatalog::new(a.clone());
        catalog.register_volume(volume("data")).unwrap();
        let mut claim = writer("held", "b");
        claim.external_node_id = Some("csi-b".into());
        catalog.claim("data", claim).unwrap();
        let recorder = Arc::new(Recorder::default());
        recorder.refuse.store(true, Ordering::SeqCst);
        let lost = LostClaims::new(a.clone(), recorder.clone());
        let report = AllocReport {
            alloc_id: "held".into(),
            job_id: "web".into(),
            name: "web.g[0]".into(),
            node_id: crate::random_id(),
            node_name: "b".into(),
            client_status: ClientStatus::Lost,
            description: String::new(),
            updated_ms: 0,
            tasks: Default::default(),
        };
        let runtime = tokio::runtime::Runtime::new().unwrap();
        runtime.block_on(async {
            let before = crate::now_ms();
            lost.release_due(vec![report.clone()]);
            tokio::time::timeout(Duration::from_secs(10), lost.woken())
                .await
                .expect("the scheduler is woken when a claim is kept");
            let retry_at = lost.retry_at_ms().expect("a retry time");
            let retry_ms = u64::try_from(RETRY.as_millis()).unwrap();
            assert!(retry_at >= before + retry_ms);
            // Before its time: no release starts, nothing is asked.
            recorder.refuse.store(false, Ordering::SeqCst);
            lost.release_due(vec![report.clone()]);
            tokio::time::sleep(Duration::from_millis(200)).await;
            assert_eq!(recorder.asked.lock().unwrap().len(), 1);
            assert_eq!(catalog.volume("data").unwrap().claims.len(), 1);
            // After it: released.
            let wait = retry_at.saturating_sub(crate::now_ms());
            tokio::time::sleep(Duration::from_millis(wait + 50)).await;
            lost.release_due(vec![report]);
            let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
            while catalog.volume("data").unwrap().claims.len() == 1 {
                assert!(tokio::time::Instant::now() < deadline, "never released");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            assert_eq!(lost.retry_at_ms(), None);
        });
    }
}
