//! The leader's mirror against the full plan: after each change to a cluster, a round of
//! what changed must decide what a plan of everything decides.

use std::collections::{BTreeMap, BTreeSet};

use super::mirror::Mirror;
use super::tests::tests_support::{job, node};
use super::{Plan, evals, plan};
use crate::etcd::{Change, Entry};
use crate::records::decode;
use crate::state::{
    AllocReport, ClusterJob, EvalStatus, Evaluation, NodeSettings, Snapshot, trigger,
};
use crate::{NodeView, random_id};
use berth_model::status::ClientStatus;

const PREFIX: &str = "t";

/// The records of a cluster as a store keeps them, each write a change for the mirror.
#[derive(Default)]
struct Store {
    entries: BTreeMap<String, Entry>,
    revision: i64,
}

impl Store {
    fn put(&mut self, rest: &str, value: Vec<u8>) -> Change {
        self.revision += 1;
        let key = format!("{PREFIX}/{rest}");
        let create_revision = self
            .entries
            .get(&key)
            .map_or(self.revision, |e| e.create_revision);
        let entry = Entry {
            key: key.clone(),
            value,
            mod_revision: self.revision,
            create_revision,
            lease: 0,
        };
        self.entries.insert(key, entry.clone());
        Change::Put(entry)
    }

    fn put_json(&mut self, rest: &str, value: &impl serde::Serialize) -> Change {
        self.put(rest, serde_json::to_vec(value).unwrap())
    }

    fn delete(&mut self, rest: &str) -> Option<Change> {
        let key = format!("{PREFIX}/{rest}");
        self.entries.remove(&key)?;
        self.revision += 1;
        Some(Change::Delete {
            key,
            mod_revision: self.revision,
        })
    }

    /// Every record, read as an agent reads the cluster.
    fn snapshot(&self) -> Snapshot {
        let mut snapshot = Snapshot {
            revision: self.revision,
            ..Snapshot::default()
        };
        for entry in self.entries.values() {
            if let Some(stored) = decode(&format!("{PREFIX}/"), entry) {
                snapshot.add(stored);
            }
        }
        snapshot.finish();
        snapshot
    }

    fn entries(&self) -> Vec<Entry> {
        self.entries.values().cloned().collect()
    }
}

/// The cluster under test: its store, the leader's mirror fed from it, and the time.
struct Cluster {
    store: Store,
    mirror: Mirror,
    now_ms: u64,
    nodes: Vec<NodeView>,
    /// Rounds that planned only some jobs, and all rounds.
    partial_rounds: usize,
    rounds: usize,
    /// The watch events of the leader's own writes not yet come (a watch lags).
    echoes: std::collections::VecDeque<Change>,
}

impl Cluster {
    fn new(nodes: usize) -> Cluster {
        let mut store = Store::default();
        let nodes: Vec<NodeView> = (0..nodes)
            .map(|i| {
                let mut view = node(&format!("n{i}"), 1000, 1000);
                view.record.id = random_id();
                view
            })
            .collect();
        for view in &nodes {
            store.put_json(&format!("nodes/{}", view.record.id), &view.record);
        }
        let mirror = Mirror::load(PREFIX, &store.entries(), store.revision);
        Cluster {
            store,
            mirror,
            now_ms: 10_000_000,
            nodes,
            partial_rounds: 0,
            rounds: 0,
            echoes: Default::default(),
        }
    }

    /// A change made by another (after the leader's own writes, whose events come
    /// first).
    fn change(&mut self, change: Option<Change>) {
        while let Some(echo) = self.echoes.pop_front() {
            self.mirror.apply(&echo);
        }
        if let Some(change) = change {
            self.mirror.apply(&change);
        }
    }

    /// A change made by another that the plan reads: it calls for a round, whether or
    /// not its job is to be planned already (the leader's own writes mark theirs).
    fn change_read(&mut self, change: Change) {
        self.change(None);
        let key = match &change {
            Change::Put(entry) => entry.key.clone(),
            Change::Delete { key, .. } => key.clone(),
            Change::Reset | Change::Revision(_) => "(reset)".into(),
        };
        assert!(
            self.mirror.apply(&change),
            "a change the plan reads calls for a round: {key}"
        );
    }

    fn submit(&mut self, id: &str, kind: &str, count: u32, memory: u32, port: Option<u16>) {
        let network = port.map_or(String::new(), |p| {
            format!("network {{\n port \"p\" {{\n static = {p}\n }}\n }}\n")
        });
        // A periodic batch job launches a child every 10 s, one at a time.
        let (kind, periodic) = match kind {
            "periodic" => (
                "batch",
                "periodic {\n crons = [\"*/10 * * * * * *\"]\n prohibit_overlap = true\n }\n",
            ),
            kind => (kind, ""),
        };
        let source = format!(
            "job \"{id}\" {{\n type = \"{kind}\"\n {periodic} group \"g\" {{\n count = {count}\n {network}\n \
             reschedule {{\n delay = \"10s\"\n delay_function = \"constant\"\n unlimited = true\n }}\n \
             task \"t\" {{\n driver = \"exec\"\n config {{\n command = \"/bin/true\"\n }}\n \
             resources {{\n cpu = 100\n memory = {memory}\n }}\n }}\n }}\n}}\n"
        );
        let (mut job, _) = job(id, count, "");
        job.source = source;
        job.submitted_ms = self.now_ms;
        let change = self.store.put_json(&format!("jobs/{id}"), &job);
        self.change_read(change);
        let eval = Evaluation::pending(id, trigger::REGISTER);
        let change = self.store.put_json(&format!("evals/{}", eval.id), &eval);
        self.change(Some(change));
    }

    fn stop(&mut self, id: &str) {
        let key = format!("{PREFIX}/jobs/{id}");
        let Some(entry) = self.store.entries.get(&key) else {
            return;
        };
        let mut job: ClusterJob = serde_json::from_slice(&entry.value).unwrap();
        job.stopped = true;
        let change = self.store.put_json(&format!("jobs/{id}"), &job);
        self.change(Some(change));
    }

    fn purge(&mut self, id: &str) {
        let change = self.store.delete(&format!("jobs/{id}"));
        self.change(change);
    }

    /// What the node of the `n`th placement reports of it.
    fn report(&mut self, n: usize, status: ClientStatus) {
        let snapshot = self.store.snapshot();
        if snapshot.placements.is_empty() {
            return;
        }
        let placement = &snapshot.placements[n % snapshot.placements.len()];
        let report = AllocReport {
            alloc_id: placement.alloc_id.clone(),
            job_id: placement.job_id.clone(),
            name: placement.name.clone(),
            node_id: placement.node_id.clone(),
            node_name: String::new(),
            client_status: status,
            description: String::new(),
            updated_ms: self.now_ms,
            tasks: Default::default(),
        };
        let again = snapshot.reports.contains(&report);
        let change = self
            .store
            .put_json(&format!("status/{}", report.alloc_id), &report);
        if again {
            // The same report written again (a node repeating itself, the echo of a
            // lost alloc's report) changes nothing the plan reads.
            self.change(Some(change));
        } else {
            self.change_read(change);
        }
    }

    fn node_down(&mut self, n: usize) {
        let id = self.nodes[n % self.nodes.len()].record.id.clone();
        let change = self.store.delete(&format!("nodes/{id}"));
        self.change(change);
    }

    fn node_up(&mut self, n: usize) {
        let record = self.nodes[n % self.nodes.len()].record.clone();
        let change = self
            .store
            .put_json(&format!("nodes/{}", record.id), &record);
        self.change(Some(change));
    }

    fn drain(&mut self, n: usize, drain: bool) {
        let id = self.nodes[n % self.nodes.len()].record.id.clone();
        let settings = NodeSettings {
            ineligible: false,
            drain,
            drain_deadline_ms: 0,
        };
        let change = self
            .store
            .put_json(&format!("node-settings/{id}"), &settings);
        self.change(Some(change));
    }

    /// Rounds until the cluster is settled, each compared with a full plan of the same
    /// records; each round's plan is written as the leader writes it.
    fn settle(&mut self, what: &str) {
        for _ in 0..8 {
            // Half the events of the leader's last writes have come: a round reads its
            // own writes all the same.
            for _ in 0..self.echoes.len() / 2 {
                if let Some(echo) = self.echoes.pop_front() {
                    self.mirror.apply(&echo);
                }
            }
            let full_snapshot = self.store.snapshot();
            let full = plan(&full_snapshot, self.now_ms);
            let full_outcome = evals::outcome(&full_snapshot, &full, self.now_ms);
            let (round, partial) = self.mirror.plan_round(self.now_ms);
            self.rounds += 1;
            if !round.is_full() {
                self.partial_rounds += 1;
            }
            assert_eq!(
                decided(&partial),
                decided(&full),
                "after {what}: a round of {} job(s) (full: {}) decided otherwise than a full plan",
                round.jobs_planned(),
                round.is_full()
            );
            // What could not be placed, as recorded after the round: the jobs it did
            // not plan keep theirs. Nomad's blocked evaluations are evaluated again when
            // room grows, not when it shrinks: the reasons of a job not planned may be
            // older (how much was free), what could not be placed is the same.
            let mut recorded = full_snapshot.blocked.clone();
            recorded.retain(|job, _| !round.planned(job));
            for entry in &partial.blocked {
                recorded
                    .entry(entry.job_id.clone())
                    .or_default()
                    .push(entry.clone());
            }
            let mut expected: BTreeMap<String, Vec<_>> = BTreeMap::new();
            for entry in &full.blocked {
                expected
                    .entry(entry.job_id.clone())
                    .or_default()
                    .push(entry.clone());
            }
            let unplaced = |blocked: &BTreeMap<String, Vec<crate::state::Blocked>>| {
                blocked
                    .iter()
                    .map(|(job, entries)| {
                        let planned = round.planned(job);
                        let entries: Vec<_> = entries
                            .iter()
                            .map(|b| (b.group.clone(), b.coalesced, planned.then(|| b.why.clone())))
                            .collect();
                        (job.clone(), entries)
                    })
                    .collect::<BTreeMap<_, _>>()
            };
            assert_eq!(
                unplaced(&recorded),
                unplaced(&expected),
                "after {what}: what could not be placed differs"
            );
            let outcome = self.mirror.eval_outcome(&round, &partial, self.now_ms);
            assert_eq!(
                completed(&outcome),
                completed(&full_outcome),
                "after {what}: the evaluations completed differ"
            );
            let echoes = self.write(&partial, &round.snapshot, &outcome);
            self.mirror.wrote_evals(&outcome);
            self.mirror.finished(round, &partial, true);
            self.echoes.extend(echoes);
            self.launch(&partial);
            assert_eq!(
                self.mirror.timers(),
                &full.wake_jobs,
                "after {what}: the jobs' wake times differ"
            );
            // The leader plans again at once only when the round's own writes call for
            // it (their echoes do not): when they do not, nothing is left to do until
            // the next change or timer (a replacement placed, the alloc it replaces is
            // stopped by the next round: that round must be called for).
            if !self.mirror.marked() {
                let left = plan(&self.store.snapshot(), self.now_ms);
                assert!(
                    left.place.is_empty()
                        && left.stop.is_empty()
                        && left.lost.is_empty()
                        && left.forget.is_empty()
                        && left.launch.is_empty(),
                    "after {what}: the leader would wait with work left: {:?}",
                    decided(&left)
                );
                return;
            }
        }
        panic!("after {what}: the cluster did not settle in 8 rounds");
    }

    /// The children a round launched, written as `Cluster::create_child` writes them
    /// (a child already there is not written again).
    fn launch(&mut self, plan: &Plan) {
        for launch in &plan.launch {
            let parent_key = format!("{PREFIX}/jobs/{}", launch.parent);
            let Some(parent) = self.store.entries.get(&parent_key) else {
                continue;
            };
            let parent: ClusterJob = serde_json::from_slice(&parent.value).unwrap();
            let child = super::periodic::child_of_launch(&parent, launch);
            let id = child.id.clone();
            if self
                .store
                .entries
                .contains_key(&format!("{PREFIX}/jobs/{id}"))
            {
                continue;
            }
            let change = self.store.put_json(&format!("jobs/{id}"), &child);
            self.change(Some(change));
            let change = self.store.put(
                &format!("launches/{}", launch.parent),
                launch.at_ms.to_string().into_bytes(),
            );
            self.change(Some(change));
            let eval = Evaluation::pending(&id, trigger::PERIODIC);
            let change = self.store.put_json(&format!("evals/{}", eval.id), &eval);
            self.change(Some(change));
        }
    }

    /// Writes what the leader writes after a round; the watch events of those writes.
    fn write(
        &mut self,
        plan: &Plan,
        snapshot: &Snapshot,
        outcome: &evals::EvalOutcome,
    ) -> Vec<Change> {
        let mut changes = Vec::new();
        for (node, alloc) in &plan.stop {
            changes.push(self.store.delete(&format!("allocs/{node}/{alloc}")));
        }
        for alloc in &plan.forget {
            changes.push(self.store.delete(&format!("status/{alloc}")));
        }
        for job in &plan.forget_jobs {
            changes.push(self.store.delete(&format!("jobs/{job}")));
        }
        for report in &plan.lost {
            changes.push(Some(
                self.store
                    .put_json(&format!("status/{}", report.alloc_id), report),
            ));
        }
        for placement in &plan.place {
            changes.push(Some(self.store.put_json(
                &format!("allocs/{}/{}", placement.node_id, placement.alloc_id),
                placement,
            )));
        }
        let mut blocked: BTreeMap<&str, Vec<_>> = BTreeMap::new();
        for entry in &plan.blocked {
            blocked
                .entry(&entry.job_id)
                .or_default()
                .push(entry.clone());
        }
        for (job, entries) in &blocked {
            if snapshot.blocked.get(*job) != Some(entries) {
                changes.push(Some(
                    self.store.put_json(&format!("blocked/{job}"), entries),
                ));
            }
        }
        for job in snapshot.blocked.keys() {
            if !blocked.contains_key(job.as_str()) {
                changes.push(self.store.delete(&format!("blocked/{job}")));
            }
        }
        for eval in &outcome.complete {
            changes.push(Some(
                self.store.put_json(&format!("evals/{}", eval.id), eval),
            ));
        }
        for id in &outcome.forget {
            changes.push(self.store.delete(&format!("evals/{id}")));
        }
        changes.into_iter().flatten().collect()
    }
}

/// What a plan decided, without the ids it made up (and without what could not be placed
/// and when its jobs are due again: a round of some jobs says those of its jobs; they
/// are compared as recorded after the round).
fn decided(plan: &Plan) -> impl PartialEq + std::fmt::Debug {
    let place: BTreeSet<_> = plan
        .place
        .iter()
        .map(|p| {
            (
                p.job_id.clone(),
                p.group.clone(),
                p.alloc_index,
                p.node_id.clone(),
                p.replaces.clone(),
                p.job_version,
            )
        })
        .collect();
    let stop: BTreeSet<_> = plan.stop.iter().cloned().collect();
    let lost: BTreeSet<_> = plan.lost.iter().map(|r| r.alloc_id.clone()).collect();
    let forget: BTreeSet<_> = plan.forget.iter().cloned().collect();
    let launch: Vec<_> = plan
        .launch
        .iter()
        .map(|l| (l.parent.clone(), l.at_ms))
        .collect();
    (
        launch,
        place,
        stop,
        lost,
        forget,
        plan.forget_jobs.clone(),
        plan.deferred,
    )
}

fn completed(outcome: &evals::EvalOutcome) -> impl PartialEq + std::fmt::Debug {
    let complete: BTreeSet<_> = outcome
        .complete
        .iter()
        .map(|e| {
            (
                e.id.clone(),
                e.status == EvalStatus::Complete,
                e.failed.len(),
            )
        })
        .collect();
    let forget: BTreeSet<_> = outcome.forget.iter().cloned().collect();
    (complete, forget)
}

/// Submits, stops, purges, reports, nodes going and coming, drains and time passing,
/// drawn from `seed` (the same sequence on every run); after each, rounds are compared
/// with full plans until the cluster settles.
fn changes_compared(seed: u64, steps: usize) {
    let mut cluster = Cluster::new(4);
    cluster.settle("loading");
    let mut seed = seed;
    let mut next = move |below: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % below
    };
    for step in 0..steps {
        let job = format!("j{}", next(12));
        let n = usize::try_from(next(1000)).unwrap();
        let what = match next(14) {
            0 | 1 => {
                let count = u32::try_from(next(4)).unwrap() + 1;
                let memory = [50, 100, 300, 900][usize::try_from(next(4)).unwrap()];
                let port = (next(3) == 0).then_some(8000 + u16::try_from(next(3)).unwrap());
                cluster.submit(&job, "service", count, memory, port);
                format!("submit {job} x{count} of {memory} MiB, port {port:?}")
            }
            2 => {
                cluster.submit(&job, "batch", 2, 100, None);
                format!("submit batch {job}")
            }
            3 => {
                cluster.submit("sys", "system", 1, 50, None);
                "submit the system job".into()
            }
            12 => {
                // Submitted again while a child may run, its next launch due in the
                // round that plans it.
                cluster.submit("tick", "periodic", 1, 50, None);
                cluster.now_ms += 10_000;
                "submit the periodic job, 10 s before its round".into()
            }
            4 => {
                cluster.stop(&job);
                format!("stop {job}")
            }
            5 => {
                cluster.purge(&job);
                format!("purge {job}")
            }
            6 => {
                cluster.report(n, ClientStatus::Running);
                format!("alloc {n} running")
            }
            7 => {
                cluster.report(n, ClientStatus::Failed);
                format!("alloc {n} failed")
            }
            8 => {
                cluster.report(n, ClientStatus::Complete);
                format!("alloc {n} complete")
            }
            9 => {
                if next(2) == 0 {
                    cluster.node_down(n);
                    format!("node {n} down")
                } else {
                    cluster.node_up(n);
                    format!("node {n} up")
                }
            }
            10 => {
                let drain = next(2) == 0;
                cluster.drain(n, drain);
                format!("node {n} drain {drain}")
            }
            _ => {
                cluster.now_ms += next(200_000);
                "time passes".into()
            }
        };
        cluster.settle(&format!("step {step}: {what}"));
    }
    // Most rounds planned only what changed (a full one every FULL_ROUND_MS).
    assert!(
        cluster.partial_rounds * 10 > cluster.rounds * 9,
        "{} of {} rounds partial",
        cluster.partial_rounds,
        cluster.rounds
    );
}

#[test]
fn a_round_of_what_changed_decides_what_a_full_plan_decides() {
    changes_compared(0x7777_1234_abcd_0042, 500);
    changes_compared(0x0bad_cafe_f00d_0001, 500);
}
