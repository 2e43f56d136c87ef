//! What this agent made of the job sources stored in the cluster, by source: those it
//! evaluated (kept evaluated, so each version of a job is evaluated once, not on every
//! scheduling round and read) and those it could not (refused from then on without
//! being evaluated again). `state::ClusterJob::spec` reads and fills both.

/// The stored job sources this agent could not evaluate, by `ClusterJob::source_key`:
/// each is logged once, and refused from here on without being evaluated again (a
/// hostile record would otherwise cost its evaluation budget at every scheduling round
/// and every API read).
pub(super) struct Unreadable;

/// The most unreadable sources remembered; past it the memory starts again (and each is
/// logged once more).
const MAX_UNREADABLE: usize = 256;

static UNREADABLE: std::sync::Mutex<std::collections::BTreeMap<u64, berth_jobspec::JobspecError>> =
    std::sync::Mutex::new(std::collections::BTreeMap::new());

impl Unreadable {
    pub(super) fn known(key: u64) -> Option<berth_jobspec::JobspecError> {
        let known = UNREADABLE.lock().unwrap_or_else(|p| p.into_inner());
        known.get(&key).cloned()
    }

    pub(super) fn remember(key: u64, job: &str, error: &berth_jobspec::JobspecError) {
        let mut known = UNREADABLE.lock().unwrap_or_else(|p| p.into_inner());
        if known.len() >= MAX_UNREADABLE {
            known.clear();
        }
        if known.insert(key, error.clone()).is_none() {
            tracing::error!(
                job = %job,
                problems = %error,
                "a job recorded in the cluster cannot be evaluated: nothing is placed for \
                 it and its allocs are left as they are (submit it again, or purge it)"
            );
        }
    }
}

/// The stored job sources this agent evaluated, by `ClusterJob::source_key`, as they
/// evaluated (before a record's own parts go over them).
pub(super) struct Parsed;

/// The most evaluated sources kept; past it the memory starts again.
const MAX_PARSED: usize = 1024;

static PARSED: std::sync::Mutex<
    std::collections::BTreeMap<u64, std::sync::Arc<berth_jobspec::Job>>,
> = std::sync::Mutex::new(std::collections::BTreeMap::new());

impl Parsed {
    pub(super) fn known(key: u64) -> Option<berth_jobspec::Job> {
        let known = PARSED.lock().unwrap_or_else(|p| p.into_inner());
        known.get(&key).map(|job| berth_jobspec::Job::clone(job))
    }

    pub(super) fn remember(key: u64, job: &berth_jobspec::Job) {
        let mut known = PARSED.lock().unwrap_or_else(|p| p.into_inner());
        if known.len() >= MAX_PARSED {
            known.clear();
        }
        known.insert(key, std::sync::Arc::new(job.clone()));
    }
}
