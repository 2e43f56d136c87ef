//! Garbage collection of finished allocs and jobs, as Nomad's client does it:
//! beyond `gc { max_allocs }`, or oldest first while the data dir's disk is past
//! `disk_usage_threshold`; a periodic pass and one after each alloc ends.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{Agent, AllocEntry, Submitter};
use crate::alloc_runner::{AllocRunner, AllocStatus};

/// What one garbage collection forgot: finished allocs, and the jobs that had nothing
/// left once they went.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Garbage {
    pub allocs: Vec<String>,
    #[serde(default)]
    pub jobs: Vec<String>,
}

pub(super) struct CollectedAlloc {
    alloc: String,
    job: Option<String>,
}

impl Agent {
    /// Collects the finished allocs beyond the newest `gc { max_allocs }`, and more while
    /// the data dir's disk is fuller than `gc`'s thresholds: their records first, then
    /// their directories. An alloc with anything still mounted below its
    /// directory is kept (removing the directory would reach into the mount) and the
    /// agent's log says so. The ids collected, oldest first.
    pub fn collect_garbage(&self) -> Garbage {
        let mut garbage = Garbage::default();
        let mut collected = self.collect_allocs();
        collected.extend(self.collect_for_user_ids());
        for id in collected {
            garbage.allocs.push(id.alloc);
            garbage.jobs.extend(id.job);
        }
        garbage.jobs.sort();
        if !garbage.allocs.is_empty() {
            self.index.bump();
        }
        garbage
    }

    /// The finished allocs beyond `max_allocs`, and more while the data dir's disk is
    /// fuller than the thresholds, oldest first; and each job whose last alloc that was.
    pub(super) fn collect_allocs(&self) -> Vec<CollectedAlloc> {
        let keep = self.node.config.gc.max_allocs;
        let finished = self.finished_oldest_first();
        if finished.len() <= keep && self.disk_pressure().is_none() {
            return Vec::new();
        }
        let Ok(mounts) = berth_sys::mount::mountinfo::read_self() else {
            tracing::warn!("garbage collection skipped: the mount table is unreadable");
            return Vec::new();
        };
        let mut left = finished.len();
        let mut collected = Vec::new();
        for entry in finished {
            if left <= keep {
                match self.disk_pressure() {
                    None => break,
                    Some(why) => tracing::info!(alloc = %entry.runner.id, %why,
                        "collecting a finished alloc within max_allocs: the disk is full"),
                }
            }
            left -= 1;
            if self.collect(&entry, &mounts) {
                collected.push(CollectedAlloc {
                    alloc: entry.runner.id.clone(),
                    job: self.collect_job_of(&entry),
                });
            }
        }
        collected
    }

    /// The finished allocs, oldest first (by their last event).
    fn finished_oldest_first(&self) -> Vec<AllocEntry> {
        let mut finished: Vec<(u64, AllocEntry)> = self
            .allocs
            .lock()
            .unwrap()
            .values()
            .filter(|a| *a.finished.borrow())
            .map(|a| (finished_at(&a.runner.status()), a.clone()))
            .collect();
        finished.sort_by_key(|(at, _)| *at);
        finished.into_iter().map(|(_, entry)| entry).collect()
    }

    /// Groups whose `ephemeral_disk` is larger than the data dir's whole filesystem.
    pub(super) fn disk_problems(&self, job: &berth_jobspec::Job) -> Vec<berth_hcl::Problem> {
        let Ok(stats) = rustix::fs::statvfs(&self.node.data_dir) else {
            return Vec::new();
        };
        let node_mb = stats.f_blocks.saturating_mul(stats.f_frsize) / berth_model::limits::MIB;
        job.groups
            .iter()
            .filter(|g| g.ephemeral_disk_mb > node_mb)
            .map(|g| berth_hcl::Problem {
                path: format!("job.{}.group.{}.ephemeral_disk", job.name, g.name),
                at: None,
                message: format!(
                    "group {:?} asks for {} MB of ephemeral_disk; this node's data dir has {} MB \
                     in all",
                    g.name, g.ephemeral_disk_mb, node_mb
                ),
            })
            .collect()
    }

    /// Collects finished allocs holding user ids, oldest first, while allocs wait for
    /// ids: for the range (until the shortfall is covered) or for their job's share (that
    /// job's own finished allocs). Finished allocs holding none are never taken for this:
    /// collecting them frees no id.
    fn collect_for_user_ids(&self) -> Vec<CollectedAlloc> {
        let users = &self.node.dynamic_users;
        let short_shares = users.short_shares();
        if users.shortfall() == 0 && short_shares.is_empty() {
            return Vec::new();
        }
        let Ok(mounts) = berth_sys::mount::mountinfo::read_self() else {
            return Vec::new();
        };
        let mut collected = Vec::new();
        for entry in self.finished_oldest_first() {
            if !entry.runner.holds_dynamic_ids() {
                continue;
            }
            let for_share = short_shares.contains(&entry.runner.share_key());
            if !for_share && users.shortfall() == 0 {
                continue;
            }
            if self.collect(&entry, &mounts) {
                tracing::info!(alloc = %entry.runner.id,
                    "collected a finished alloc: allocs wait for the user ids it held");
                collected.push(CollectedAlloc {
                    alloc: entry.runner.id.clone(),
                    job: self.collect_job_of(&entry),
                });
            }
        }
        collected
    }

    /// Why the data dir's filesystem is fuller than `gc`'s thresholds, if it is.
    pub(super) fn disk_pressure(&self) -> Option<String> {
        let gc = &self.node.config.gc;
        let stats = rustix::fs::statvfs(&self.node.data_dir).ok()?;
        let percent =
            |free: u64, total: u64| (total > 0).then(|| 100 * total.saturating_sub(free) / total);
        if let Some(used) = percent(stats.f_bfree, stats.f_blocks)
            && used > u64::from(gc.disk_usage_threshold)
        {
            return Some(format!(
                "{used}% of its disk in use (disk_usage_threshold = {})",
                gc.disk_usage_threshold
            ));
        }
        if let Some(used) = percent(stats.f_ffree, stats.f_files)
            && used > u64::from(gc.inode_usage_threshold)
        {
            return Some(format!(
                "{used}% of its inodes in use (inode_usage_threshold = {})",
                gc.inode_usage_threshold
            ));
        }
        None
    }

    /// Stops a job (the caller did), waits for its allocs to finish (a minute at most),
    /// and forgets them and the job: Nomad's `purge`. A job whose allocs are still
    /// running after the wait, or hold something mounted, is kept, stopped, for the
    /// collector; returns whether the job is gone.
    ///
    /// The whole purge holds the job's lock, which a submit of the job takes too: a
    /// resubmit waits for the purge to end, and a job submitted again before the purge
    /// began (no longer stopped) is not purged.
    pub async fn purge_job(&self, submitter: &Submitter, id: &str) -> bool {
        let _this_job = self.job_locks.lock(id).await;
        // The cluster's own check: only the stopped version is deleted.
        match self.stop_cluster_job(submitter, id, true).await {
            Ok(Ok(_)) => {}
            Ok(Err(refused)) => {
                tracing::warn!(job = %id, %refused, "not purging a job");
                return false;
            }
            Err(error) => {
                tracing::error!(job = %id, %error, "purging a job from the cluster");
                return false;
            }
        }
        let _ = tokio::time::timeout(std::time::Duration::from_secs(60), self.wait_job(id)).await;
        self.forget_allocs_of(id);
        let alone = !self
            .allocs
            .lock()
            .unwrap()
            .values()
            .any(|a| a.runner.job.name == id);
        if !alone {
            return false;
        }
        let last_seen = self.job_spec(id).ok();
        if let Err(error) = self.node.store.remove_job(id) {
            tracing::error!(job = %id, %error, "purging a job's record");
            return false;
        }
        self.jobs.lock().unwrap().remove(id);
        self.index.bump();
        if let Some((status, job)) = last_seen {
            self.publish_job_snapshot("JobDeregistered", status, job);
        }
        true
    }

    /// Forgets the job of a collected alloc when nothing of it is left: no other alloc,
    /// and the job is still the version that alloc ran (a job submitted again since is a
    /// new version, kept). Returns the job's id when it was collected.
    pub(super) fn collect_job_of(&self, collected: &AllocEntry) -> Option<String> {
        let name = &collected.runner.job.name;
        // A submit, stop or purge of the job is under way: it decides what is left of the
        // job (forgetting it now could drop the record of a version being placed).
        let _this_job = self.job_locks.try_lock(name)?;
        let mut jobs = self.jobs.lock().unwrap();
        let same_version = jobs
            .get(name)
            .is_some_and(|entry| Arc::ptr_eq(&entry.job, &collected.runner.job));
        let others = self
            .allocs
            .lock()
            .unwrap()
            .values()
            .any(|a| &a.runner.job.name == name);
        if !same_version || others {
            return None;
        }
        if let Err(error) = self.node.store.remove_job(name) {
            tracing::error!(job = %name, %error, "collecting a finished job's record");
            return None;
        }
        jobs.remove(name);
        drop(jobs);
        self.forget_dead_job(name);
        Some(name.clone())
    }

    /// Forgets job `id` in the cluster once it is dead there (no alloc runs, waits or
    /// waits to be placed again) and launches nothing: a node collected the last of it
    /// (Nomad's job collection). Only the version read is removed, so a job submitted
    /// again meanwhile stays.
    fn forget_dead_job(&self, id: &str) {
        use berth_cluster::evals::{Evaluation, trigger};
        use berth_cluster::job_view::{JobState, job_status};
        let cluster = self.cluster.clone();
        let forgotten = berth_sys::blocking::run(|| {
            let snapshot = cluster.job_snapshot(id)?;
            let Some((_, version)) = snapshot.jobs.iter().find(|(j, _)| j.id == id) else {
                return Ok(false);
            };
            let dead = matches!(job_status(&snapshot, id),
                Some(Ok((status, job))) if status.status == JobState::Dead && job.launches().is_none());
            if !dead {
                return Ok(false);
            }
            let eval = Evaluation::pending(id, trigger::DEREGISTER);
            cluster.delete_job_if(id, *version, &eval)
        });
        match forgotten {
            Ok(true) => tracing::info!(job = %id, "forgot a dead job with nothing left"),
            Ok(false) => {}
            Err(error) => tracing::warn!(job = %id, %error, "forgetting a dead job"),
        }
    }

    /// Forgets one finished alloc: its records, then its directory. Refused (false) while
    /// anything is mounted below the directory.
    pub(super) fn collect(
        &self,
        entry: &AllocEntry,
        mounts: &[berth_sys::mount::mountinfo::MountEntry],
    ) -> bool {
        let id = &entry.runner.id;
        if entry.runner.holds_csi_volumes() {
            // Its record says what to give back, and the give-back is still trying.
            return false;
        }
        // The cluster hears how it ended before this node forgets it: its placement may
        // stay (a finished batch alloc does), and a node never runs an ended one again.
        let status = entry.runner.status();
        let report = berth_cluster::state::AllocReport {
            alloc_id: status.id.clone(),
            job_id: status.job_id.clone(),
            name: status.name.clone(),
            node_id: self.cluster.node_id().to_string(),
            node_name: self.cluster.node_name().to_string(),
            client_status: status.client_status,
            description: String::new(),
            updated_ms: super::now_ms(),
            tasks: berth_cluster::state::AllocReport::tasks_of(&status.tasks),
        };
        if !status.client_status.is_terminal() {
            return false;
        }
        let networks = |runner: &crate::alloc_runner::AllocRunner| {
            runner.resources.network().is_some() || !runner.resources.task_networks().is_empty()
        };
        if networks(&entry.runner) {
            // A network whose release failed at the alloc's end: tried again, and the
            // record that says what to release is kept until it goes (attack review).
            entry.runner.release_network();
            if networks(&entry.runner) {
                return false;
            }
        }
        if let Err(error) = berth_sys::blocking::run(|| self.cluster.report(&report)) {
            tracing::warn!(alloc = %id, %error, "not collecting a finished alloc: its end is not recorded in the cluster yet");
            return false;
        }
        let root = entry.runner.alloc_dir.root();
        let root = root.canonicalize().unwrap_or_else(|_| root.to_path_buf());
        // The alloc's own filesystem (its `ephemeral_disk` image) is mounted at its root
        // and goes with it; nothing else may be mounted there.
        if let Some(mount) = mounts
            .iter()
            .find(|m| m.mount_point != root && m.mount_point.starts_with(&root))
        {
            tracing::warn!(alloc = %id, mount = %mount.mount_point.display(),
                "not collecting a finished alloc: something is still mounted in it");
            return false;
        }
        // Its disk first: one still held (a process outside the alloc kept a file of it)
        // keeps the alloc, its image and the image's promise, for the next round.
        let mut remove_dir = || match std::fs::remove_dir_all(&root) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            other => other,
        };
        let released = berth_sys::blocking::run(|| {
            self.node.sys.release_alloc_disk(id, &root, &mut remove_dir)
        });
        if let Err(error) = released {
            tracing::warn!(alloc = %id, %error, "not collecting a finished alloc yet");
            return false;
        }
        // Its processes are dead and its files gone (with its disk, above): its ids may
        // be another task's. Files still theirs kept the alloc from being collected. The
        // pool keeps their release before the record goes: a restart in between claims
        // them again from the record, never loses them.
        entry.runner.release_users();
        if let Err(error) = self.node.store.remove_alloc(id) {
            tracing::error!(alloc = %id, %error, "collecting a finished alloc's records");
            return false;
        }
        self.allocs.lock().unwrap().remove(id);
        true
    }
}

impl Agent {
    /// Collects finished allocs, oldest first, until `runners` (allocs about to start)
    /// find room for their disks and their user ids: a finished alloc's image keeps its
    /// size promised, and its dynamic users their ids, until it is collected, so without
    /// this a job that ran once with a large `ephemeral_disk` (or many tasks) would keep
    /// every later one off the node.
    pub(super) fn make_room(&self, runners: &[Arc<AllocRunner>]) {
        let sizes_mb: Vec<u64> = runners.iter().map(|r| r.group.ephemeral_disk_mb).collect();
        let ids: usize = runners.iter().map(|r| r.dynamic_ids_needed()).sum();
        let disk_short = || berth_sys::blocking::run(|| self.node.sys.disk_room_short(&sizes_mb));
        let ids_short = || self.node.dynamic_users.free() < ids;
        if !disk_short() && !ids_short() {
            return;
        }
        let finished = self.finished_oldest_first();
        let Ok(mounts) = berth_sys::blocking::run(berth_sys::mount::mountinfo::read_self) else {
            return;
        };
        let mut collected = 0;
        for entry in finished {
            let disk = disk_short();
            if !disk && !ids_short() {
                break;
            }
            // Short of ids only: an alloc holding none would be collected for nothing.
            if !disk && !entry.runner.holds_dynamic_ids() {
                continue;
            }
            if self.collect(&entry, &mounts) {
                collected += 1;
                self.collect_job_of(&entry);
                tracing::info!(alloc = %entry.runner.id,
                    "collected a finished alloc to make room for a new alloc's disk or user ids");
            }
        }
        if collected > 0 {
            self.index.bump();
        }
    }

    /// Collects these allocs now, finished or not yet collected: `berth run`'s end, whose
    /// state lives in memory and dies with it, so nothing of its allocs (their disks
    /// above all) may outlive it. The ids collected.
    pub fn collect_now(&self, ids: &[String]) -> Vec<String> {
        let entries: Vec<AllocEntry> = {
            let allocs = self.allocs.lock().unwrap();
            ids.iter()
                .filter_map(|id| allocs.get(id).cloned())
                .collect()
        };
        let Ok(mounts) = berth_sys::blocking::run(berth_sys::mount::mountinfo::read_self) else {
            return Vec::new();
        };
        entries
            .iter()
            .filter(|entry| *entry.finished.borrow() && self.collect(entry, &mounts))
            .map(|entry| entry.runner.id.clone())
            .collect()
    }

    /// Gives back the disks of allocs no record names (the agent died between making an
    /// alloc's image and recording the alloc, or between forgetting the alloc and
    /// removing its image): unmounted, removed, with their directories.
    pub(super) fn sweep_orphan_disks(&self, known: &std::collections::BTreeSet<String>) {
        let dir = self.node.data_dir.join("alloc-disks");
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(id) = name.to_str().and_then(|n| n.strip_suffix(".ext4")) else {
                continue;
            };
            if known.contains(id) || id.contains('/') || id.starts_with('.') {
                continue;
            }
            let root = berth_sys::alloc_dir::AllocDir::new(&self.node.data_dir, id)
                .root()
                .to_path_buf();
            let mut remove_dir = || match std::fs::remove_dir_all(&root) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                other => other,
            };
            match berth_sys::blocking::run(|| {
                self.node.sys.release_alloc_disk(id, &root, &mut remove_dir)
            }) {
                Ok(()) => {
                    tracing::info!(alloc = %id, "removed the disk of an alloc no record names")
                }
                Err(error) => tracing::warn!(alloc = %id, %error,
                    "removing the disk of an alloc no record names"),
            }
        }
    }
}

/// Collects finished allocs every `gc { interval }`, and at once when an alloc starts
/// waiting for user ids or one finishes while others wait (finished allocs may hold
/// them), for as long as the agent lives.
pub(super) fn spawn_garbage_collector(agent: &Arc<Agent>) {
    let interval = agent.node.config.gc.interval;
    let users = agent.node.dynamic_users.clone();
    let agent = Arc::downgrade(agent);
    tokio::spawn(async move {
        loop {
            tokio::select! {
                () = tokio::time::sleep(interval) => {}
                () = users.collection_wanted() => {}
            }
            let Some(agent) = agent.upgrade() else {
                return;
            };
            let collected = agent.collect_garbage();
            if !collected.allocs.is_empty() {
                tracing::info!(
                    allocs = collected.allocs.len(),
                    jobs = collected.jobs.len(),
                    "collected finished allocs and jobs"
                );
            }
        }
    });
}

/// When an alloc finished: its last task event (0 without any).
pub(super) fn finished_at(status: &AllocStatus) -> u64 {
    status
        .tasks
        .values()
        .filter_map(|task| task.events.last())
        .map(|event| event.time_ms)
        .max()
        .unwrap_or(0)
}
