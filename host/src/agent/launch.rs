//! Jobs that launch other jobs, as in Nomad: a `periodic` job launches a child
//! (`<job>/periodic-<unix time>`) on its cron schedule, and `berth job periodic force`
//! launches one now; a `parameterized` job launches a child
//! (`<job>/dispatch-<unix time>-<random>`) per `berth job dispatch`, with the dispatch's
//! meta and payload.
//!
//! A child is a job of its own, recorded with its parent's source at launch and what it
//! was launched with ([`ChildOf`]), so a restarted agent rebuilds it exactly and a
//! parent submitted again does not change the children already running.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Weak};
use std::time::Duration;

use base64::Engine as _;
use chrono::{DateTime, Utc};

use super::{Agent, LookupError, SubmitError, Submitted, now_ms};
use crate::jobspec::{Job, MAX_DISPATCH_PAYLOAD, PayloadRule};
use crate::state::{ChildOf, JobRecord};

/// The job a child runs: its parent's, under the child's id, with the dispatch's meta
/// over the job's and its payload.
pub(super) fn child_job(mut job: Job, id: &str, child: &ChildOf) -> Job {
    job.name = id.to_string();
    job.periodic = None;
    job.parameterized = None;
    job.parent = Some(child.parent.clone());
    for (key, value) in &child.meta {
        job.meta.retain(|(k, _)| k != key);
        job.meta.push((key.clone(), value.clone()));
    }
    job.payload = child
        .payload
        .as_ref()
        .and_then(|p| base64::engine::general_purpose::STANDARD.decode(p).ok());
    job
}

impl Agent {
    /// Launches a child of the parameterized job `parent` with `meta` and `payload`,
    /// checked against the job's `parameterized` block as Nomad checks them.
    pub async fn dispatch(
        &self,
        parent: &str,
        meta: BTreeMap<String, String>,
        payload: Option<Vec<u8>>,
    ) -> Result<Submitted, SubmitError> {
        let job = self.launcher(parent)?;
        let Some(rules) = &job.parameterized else {
            return Err(SubmitError::Refused(format!(
                "job {parent:?} is not parameterized: only a job with a parameterized block \
                 is dispatched"
            )));
        };
        let payload = payload.filter(|p| !p.is_empty());
        match (rules.payload, &payload) {
            (PayloadRule::Required, None) => {
                return Err(SubmitError::Refused(format!(
                    "job {parent:?} requires a payload (parameterized {{ payload = \"required\" }})"
                )));
            }
            (PayloadRule::Forbidden, Some(_)) => {
                return Err(SubmitError::Refused(format!(
                    "job {parent:?} takes no payload (parameterized {{ payload = \"forbidden\" }})"
                )));
            }
            (_, Some(p)) if p.len() > MAX_DISPATCH_PAYLOAD => {
                return Err(SubmitError::Refused(format!(
                    "the payload is {} bytes; a dispatch payload is at most {MAX_DISPATCH_PAYLOAD} \
                     bytes, as in Nomad",
                    p.len()
                )));
            }
            _ => {}
        }
        let missing: Vec<&str> = rules
            .meta_required
            .iter()
            .filter(|key| !meta.contains_key(*key))
            .map(String::as_str)
            .collect();
        if !missing.is_empty() {
            return Err(SubmitError::Refused(format!(
                "job {parent:?} requires meta {} (give it with -meta KEY=VALUE)",
                missing.join(", ")
            )));
        }
        let unknown: Vec<&str> = meta
            .keys()
            .filter(|key| !rules.meta_required.contains(key) && !rules.meta_optional.contains(key))
            .map(String::as_str)
            .collect();
        if !unknown.is_empty() {
            return Err(SubmitError::Refused(format!(
                "job {parent:?} does not take meta {} (its parameterized block allows: {})",
                unknown.join(", "),
                allowed_meta(&rules.meta_required, &rules.meta_optional)
            )));
        }
        let child = ChildOf {
            parent: parent.to_string(),
            meta: meta.into_iter().collect(),
            payload: payload.map(|p| base64::engine::general_purpose::STANDARD.encode(p)),
        };
        let suffix = format!("{:08x}", random_u32());
        self.launch_child(&job, "dispatch", Some(&suffix), child)
            .await
    }

    /// Launches a child of the periodic job `parent` now, whatever its schedule says (and
    /// whether or not another child runs), as `nomad job periodic force` does.
    pub async fn force_periodic(&self, parent: &str) -> Result<Submitted, SubmitError> {
        let job = self.launcher(parent)?;
        if job.periodic.is_none() {
            return Err(SubmitError::Refused(format!(
                "job {parent:?} is not periodic: only a job with a periodic block is forced"
            )));
        }
        self.launch_child(&job, "periodic", None, periodic_child(parent))
            .await
    }

    /// The running (not stopped) job `id`, to launch from.
    fn launcher(&self, id: &str) -> Result<Arc<Job>, SubmitError> {
        let jobs = self.jobs.lock().unwrap();
        let entry = jobs.get(id).ok_or_else(|| LookupError::NotFound {
            kind: "job",
            id: id.to_string(),
        })?;
        if entry.record.stopped {
            return Err(SubmitError::Refused(format!(
                "job {id:?} is stopped: run it again to launch from it"
            )));
        }
        Ok(entry.job.clone())
    }

    /// Records and starts a child of `parent` (`<parent>/<kind>-<unix time>[-suffix]`).
    async fn launch_child(
        &self,
        parent: &Arc<Job>,
        kind: &str,
        suffix: Option<&str>,
        child: ChildOf,
    ) -> Result<Submitted, SubmitError> {
        let _one_at_a_time = self.submitting.lock().await;
        let (source_name, source, variables) = {
            let jobs = self.jobs.lock().unwrap();
            let entry = jobs
                .get(&parent.name)
                .ok_or_else(|| LookupError::NotFound {
                    kind: "job",
                    id: parent.name.clone(),
                })?;
            (
                entry.record.source_name.clone(),
                entry.record.source.clone(),
                entry.record.variables.clone(),
            )
        };
        let launched = Utc::now().timestamp();
        let mut id = match suffix {
            Some(suffix) => format!("{}/{kind}-{launched}-{suffix}", parent.name),
            None => format!("{}/{kind}-{launched}", parent.name),
        };
        // Two launches in one second (a force next to a scheduled launch).
        let taken = |id: &str| self.jobs.lock().unwrap().contains_key(id);
        let base = id.clone();
        let mut n = 1;
        while taken(&id) {
            n += 1;
            id = format!("{base}-{n}");
        }
        let job = Arc::new(child_job(Job::clone(parent), &id, &child));
        let record = JobRecord {
            id: id.clone(),
            source_name,
            source,
            variables,
            submitted_ms: now_ms(),
            stopped: false,
            child_of: Some(child),
        };
        let alloc_ids = self.record_and_place(record, job)?;
        tracing::info!(job = %parent.name, child = %id, "launched a child job");
        Ok(Submitted {
            job_id: id,
            alloc_ids,
            replaced: Vec::new(),
            warnings: Vec::new(),
        })
    }

    /// Whether a periodic child of `parent` still runs.
    fn periodic_child_running(&self, parent: &str) -> bool {
        let prefix = format!("{parent}/periodic-");
        self.allocs
            .lock()
            .unwrap()
            .values()
            .any(|a| a.runner.job.name.starts_with(&prefix) && !*a.finished.borrow())
    }

    /// The periodic jobs that launch: (id, job), running and enabled.
    fn periodic_jobs(&self) -> Vec<(String, Arc<Job>)> {
        self.jobs
            .lock()
            .unwrap()
            .values()
            .filter(|e| !e.record.stopped)
            .filter(|e| e.job.periodic.as_ref().is_some_and(|p| p.enabled))
            .map(|e| (e.record.id.clone(), e.job.clone()))
            .collect()
    }
}

fn periodic_child(parent: &str) -> ChildOf {
    ChildOf {
        parent: parent.to_string(),
        meta: Vec::new(),
        payload: None,
    }
}

fn allowed_meta(required: &[String], optional: &[String]) -> String {
    let all: Vec<&str> = required
        .iter()
        .chain(optional)
        .map(String::as_str)
        .collect();
    if all.is_empty() {
        "none".into()
    } else {
        all.join(", ")
    }
}

fn random_u32() -> u32 {
    let mut bytes = [0u8; 4];
    let _ = rustix::rand::getrandom(&mut bytes, rustix::rand::GetRandomFlags::empty());
    u32::from_le_bytes(bytes)
}

/// Launches the periodic jobs' children on their schedules for as long as the agent
/// lives. Each job's next launch is computed from when the job was first seen (or last
/// launched); a job submitted again starts a new schedule. Launches missed while the
/// agent was down are not made up, as in Nomad.
pub(super) fn spawn_periodic_launcher(agent: &Arc<Agent>) {
    let agent: Weak<Agent> = Arc::downgrade(agent);
    tokio::spawn(async move {
        // By job id: the version scheduled, and its next launch.
        let mut schedule: HashMap<String, (Arc<Job>, DateTime<Utc>)> = HashMap::new();
        loop {
            let Some(live) = agent.upgrade() else {
                return;
            };
            let now = Utc::now();
            let jobs = live.periodic_jobs();
            schedule.retain(|id, (job, _)| {
                jobs.iter()
                    .any(|(other, version)| other == id && Arc::ptr_eq(version, job))
            });
            let mut due = Vec::new();
            for (id, job) in jobs {
                let Some(periodic) = &job.periodic else {
                    continue;
                };
                let entry = match schedule.get(&id) {
                    Some(entry) => entry.clone(),
                    None => match periodic.next_after(now) {
                        Some(next) => (job.clone(), next),
                        None => continue,
                    },
                };
                if entry.1 <= now {
                    due.push((id.clone(), periodic.prohibit_overlap));
                    match periodic.next_after(now) {
                        Some(next) => schedule.insert(id, (job.clone(), next)),
                        None => schedule.remove(&id),
                    };
                } else {
                    schedule.insert(id, entry);
                }
            }
            for (id, prohibit_overlap) in due {
                if prohibit_overlap && live.periodic_child_running(&id) {
                    tracing::info!(job = %id,
                        "skipping a periodic launch: the last one still runs (prohibit_overlap)");
                    continue;
                }
                if let Err(error) = live.force_periodic(&id).await {
                    tracing::error!(job = %id, %error, "launching a periodic job");
                }
            }
            let next = schedule.values().map(|(_, at)| *at).min();
            drop(live);
            // At most a second, so a newly submitted periodic job is picked up.
            let wait = next
                .and_then(|at| (at - Utc::now()).to_std().ok())
                .unwrap_or(Duration::ZERO)
                .min(Duration::from_secs(1));
            tokio::time::sleep(wait.max(Duration::from_millis(20))).await;
        }
    });
}
