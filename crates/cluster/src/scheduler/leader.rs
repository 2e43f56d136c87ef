//! The scheduler's leader: one agent at a time campaigns through the store's election,
//! reads the cluster once into its [`Mirror`], and from then on applies the changes of
//! its watch to it and plans a round after each burst of them (or when a job's time
//! comes), writing each plan while it still leads.

use std::sync::Arc;
use std::time::Duration;

use super::super::etcd::Change;
use super::super::lost_claims::LostClaims;
use super::super::pace::Pace;
use super::super::{Cluster, now_ms};
use super::mirror::Mirror;
use super::{DEFERRED_RETRY_MS, apply, evals, periodic};
use berth_model::status::ClientStatus;

/// The least time from one round's start to the next's ([`Pace`]: a change that comes
/// alone is planned at once; a stream of them in batches, a round at most every
/// `SETTLE`. A full read of the cluster each round needed 20 ms to batch them).
const SETTLE: Duration = Duration::from_millis(2);

/// How long a round waits for the rest of a transaction's changes before it reads the
/// whole cluster instead (they follow at once: only a broken watch is this slow).
const WHOLE_REVISION_WAIT: Duration = Duration::from_secs(5);

/// The most changes already queued that a round takes when it begins (the watch's
/// queue holds 1,024).
const CHANGES_TAKEN_PER_ROUND: usize = 4096;

/// Runs for as long as the agent does: campaign for leadership; while leader, plan and
/// apply on every change of the cluster's state.
pub async fn run(cluster: Arc<Cluster>, lost_claims: Arc<LostClaims>) {
    let election = cluster.key(&["leader"]);
    loop {
        let leader = match cluster
            .store()
            .campaign(&election, cluster.lease(), cluster.node_id())
            .await
        {
            Ok(leader) => leader,
            Err(error) => {
                tracing::warn!(%error, "campaigning for the scheduler's leadership");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        let leader_key = String::from_utf8_lossy(&leader.key).into_owned();
        tracing::info!(node = %cluster.node_id(), "this agent is the cluster's scheduler");
        lead(&cluster, &lost_claims, &leader_key, leader.rev).await;
        let _ = cluster.store().resign(leader).await;
    }
}

/// Why [`Leading::round`] or [`Leading::wait`] stopped.
enum Stop {
    /// No longer the leader, or the store's watch ended.
    Resign,
    /// The watch was cut: read the cluster again.
    Reload,
}

/// Schedules while this agent leads (the leadership key at `leader_revision`).
async fn lead(
    cluster: &Arc<Cluster>,
    lost_claims: &Arc<LostClaims>,
    leader_key: &str,
    leader_revision: i64,
) {
    loop {
        let Some(mut leading) =
            Leading::start(cluster, lost_claims, leader_key, leader_revision).await
        else {
            tokio::time::sleep(Duration::from_millis(500)).await;
            continue;
        };
        let stop = loop {
            let retry_at = match leading.round().await {
                Ok(retry_at) => retry_at,
                Err(stop) => break stop,
            };
            if let Err(stop) = leading.wait(retry_at).await {
                break stop;
            }
        };
        match stop {
            Stop::Resign => return,
            Stop::Reload => continue,
        }
    }
}

/// The leader's state between rounds.
struct Leading<'a> {
    cluster: &'a Arc<Cluster>,
    lost_claims: &'a Arc<LostClaims>,
    leader_key: &'a str,
    leader_revision: i64,
    /// `None` only while a round holds it.
    mirror: Option<Mirror>,
    changes: tokio::sync::mpsc::Receiver<Change>,
    /// Rounds at most every [`SETTLE`].
    pace: Pace,
}

impl<'a> Leading<'a> {
    /// Reads the whole cluster, then watches it from the revision read.
    async fn start(
        cluster: &'a Arc<Cluster>,
        lost_claims: &'a Arc<LostClaims>,
        leader_key: &'a str,
        leader_revision: i64,
    ) -> Option<Leading<'a>> {
        let prefix = cluster.settings().prefix.clone();
        let (entries, revision) = match cluster.store().list(&format!("{prefix}/")).await {
            Ok(read) => read,
            Err(error) => {
                tracing::warn!(%error, "reading the cluster to schedule");
                return None;
            }
        };
        let changes = cluster
            .store()
            .watch_whole_revisions(&format!("{prefix}/"), revision + 1);
        // Decoding every record is CPU work: off the async workers.
        let mirror = tokio::task::spawn_blocking(move || Mirror::load(&prefix, &entries, revision))
            .await
            .ok()?;
        Some(Leading {
            cluster,
            lost_claims,
            leader_key,
            leader_revision,
            mirror: Some(mirror),
            changes,
            pace: Pace::new(SETTLE),
        })
    }

    /// Plans what changed and writes it; when to plan again though nothing changes (a
    /// round not written or deferred).
    async fn round(&mut self) -> Result<Option<u64>, Stop> {
        let mut mirror = self.mirror.take().ok_or(Stop::Reload)?;
        let now = now_ms();
        // Planning is CPU work (jobs evaluated, nodes weighed): off the async workers.
        let (mut mirror, round, plan) = tokio::task::spawn_blocking(move || {
            let (round, plan) = mirror.plan_round(now);
            (mirror, round, plan)
        })
        .await
        .map_err(|_| Stop::Reload)?;
        tracing::debug!(
            full = round.is_full(),
            jobs = round.jobs_planned(),
            revision = mirror.revision(),
            place = plan.place.len(),
            stop = plan.stop.len(),
            "a scheduling round"
        );
        // Claims of allocs lost longer than the grace go back (a lost node's allocs may
        // still be writing until then), their volumes unpublished from it first.
        self.lost_claims.release_due(mirror.lost_reports());
        if plan.deferred {
            // Nothing of it is written (its empty notes would remove what the jobs it
            // planned could not place): planned again soon.
            tracing::warn!("a scheduling round deferred: the agent is too busy to evaluate a job");
            mirror.finished(round, &plan, false);
            self.mirror = Some(mirror);
            return Ok(Some(now_ms() + DEFERRED_RETRY_MS));
        }
        let snapshot = &round.snapshot;
        match apply(
            self.cluster,
            &plan,
            &snapshot.blocked,
            self.leader_key,
            self.leader_revision,
        )
        .await
        {
            Ok(true) => {}
            Ok(false) => {
                tracing::warn!("no longer the cluster's scheduler");
                return Err(Stop::Resign);
            }
            Err(error) => {
                // Part of it may be written: the cluster is read again, as it is now.
                tracing::warn!(%error, "writing the scheduler's placements");
                tokio::time::sleep(Duration::from_millis(DEFERRED_RETRY_MS)).await;
                return Err(Stop::Reload);
            }
        }
        periodic::launch_children(self.cluster, &plan, snapshot).await;
        let evals = mirror.eval_outcome(&round, &plan, now_ms());
        match evals::apply(self.cluster, &evals, self.leader_key, self.leader_revision).await {
            Ok(()) => mirror.wrote_evals(&evals),
            Err(error) => tracing::warn!(%error, "recording the evaluations' outcome"),
        }
        mirror.finished(round, &plan, true);
        self.mirror = Some(mirror);
        Ok(None)
    }

    /// Waits for a change the plan reads, or the time a job is due to be planned again
    /// (or `retry_at`), applying every change to the mirror; then, when the last round
    /// began less than [`SETTLE`] ago, the changes that come until then; then those
    /// already queued.
    async fn wait(&mut self, retry_at: Option<u64>) -> Result<(), Stop> {
        let Some(mirror) = self.mirror.as_mut() else {
            return Err(Stop::Reload);
        };
        let now = now_ms();
        // Also when a lost alloc's claims come due for release (nothing in the store
        // changes then either), and when claims kept by a failed unpublish are to be
        // tried again.
        let grace_ms =
            u64::try_from(self.cluster.settings().lost_claim_grace.as_millis()).unwrap_or(u64::MAX);
        let claims_due = mirror
            .lost_reports()
            .iter()
            .filter(|r| r.client_status == ClientStatus::Lost)
            .map(|r| r.updated_ms.saturating_add(grace_ms).saturating_add(100))
            .filter(|at| *at > now)
            .min();
        let retry = self.lost_claims.retry_at_ms().map(|at| at.max(now));
        // After a deferred round, no earlier time than its retry (a job's time already
        // past would plan again at once, and defer again).
        let due_in = [Some(mirror.next_wake_ms()), claims_due, retry]
            .into_iter()
            .flatten()
            .min()
            .map(|at| at.max(retry_at.unwrap_or(0)))
            .or(retry_at)
            .map(|at| Duration::from_millis(at.saturating_sub(now)));
        let due = async {
            match due_in {
                Some(wait) => tokio::time::sleep(wait).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(due);
        // A round's own writes that call for another (`Mirror::marked`) are planned
        // without waiting for a change: their echoes change nothing. Not after a
        // deferred round, which waits for its retry.
        let planned_again_at_once = retry_at.is_none() && mirror.marked();
        if !planned_again_at_once {
            loop {
                tokio::select! {
                    change = self.changes.recv() => match change {
                        None => return Err(Stop::Resign),
                        Some(Change::Reset) => return Err(Stop::Reload),
                        // Calls between nodes, their answers and volume use, and what the
                        // leader itself records (evaluations done, what could not be
                        // placed), change nothing the plan reads: no round for them.
                        Some(change) => if mirror.apply(&change) { break },
                    },
                    () = &mut due => break,
                    // A release of lost claims ended wanting a round (a retry time, or
                    // claims that came due while it ran).
                    () = self.lost_claims.woken() => break,
                }
            }
        }
        let rest = self.pace.rest();
        if !rest.is_zero() {
            let settle = tokio::time::sleep(rest);
            tokio::pin!(settle);
            loop {
                tokio::select! {
                    () = &mut settle => break,
                    change = self.changes.recv() => match change {
                        None => return Err(Stop::Resign),
                        Some(Change::Reset) => return Err(Stop::Reload),
                        Some(change) => { mirror.apply(&change); }
                    },
                }
            }
        }
        // And the changes already come (at most a queue's worth: a steady stream of them
        // never holds the round back).
        for _ in 0..CHANGES_TAKEN_PER_ROUND {
            match self.changes.try_recv() {
                Ok(Change::Reset) => return Err(Stop::Reload),
                Ok(change) => {
                    mirror.apply(&change);
                }
                Err(tokio::sync::mpsc::error::TryRecvError::Empty) => break,
                Err(tokio::sync::mpsc::error::TryRecvError::Disconnected) => {
                    return Err(Stop::Resign);
                }
            }
        }
        // A transaction's changes come one by one: the round waits for the rest of the
        // last one taken (a job's evaluation planned without its job would be
        // completed with nothing to say).
        while !mirror.whole() {
            match tokio::time::timeout(WHOLE_REVISION_WAIT, self.changes.recv()).await {
                Ok(None) => return Err(Stop::Resign),
                Ok(Some(Change::Reset)) => return Err(Stop::Reload),
                Ok(Some(change)) => {
                    mirror.apply(&change);
                }
                Err(_) => {
                    tracing::warn!(
                        revision = mirror.revision(),
                        "the watch did not finish a revision: reading the cluster again"
                    );
                    return Err(Stop::Reload);
                }
            }
        }
        self.pace.began();
        Ok(())
    }
}
