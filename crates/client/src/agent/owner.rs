//! Who a request comes from, and whose a job is.
//!
//! A job belongs to whoever first submitted it: the operator (the Unix socket, `berth
//! run`, a `-dev` agent's open listener), or the named `token "x"` block of the agent's
//! `http` config. Only its owner and the operator may stop, purge, replace (submit again)
//! or launch from it (dispatch, force a periodic launch), nor stop, restart or signal
//! its allocs; another token is refused,
//! told whose the job is. The owner is kept with the job's record (the agent's state and
//! the cluster's job), so it outlives restarts; a record from before owners were kept is
//! the operator's. A launched child belongs to its parent's owner.
//!
//! In a cluster, a token is known by its name: agents that share a cluster give the
//! same name to the same holder.

use std::fmt;

/// Who submits or changes a job, as the API's access check found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Submitter {
    /// The operator: the Unix socket's owner (or its group), `berth run`.
    Operator,
    /// A `-dev` agent's open TCP listener: anyone on this machine, with no token to
    /// tell one from another. It changes any job, as the operator does (whoever could
    /// reach it could reach the rest), but runs no CSI plugin and gets no operator grant.
    Dev,
    /// A request with the secret of the `token "name"` block; with scope `plugin`, it
    /// may run CSI plugin jobs.
    Token { name: String, may_run_plugins: bool },
}

impl Submitter {
    /// Whether it may run `csi_plugin` tasks (the operator, or a `plugin` token).
    pub fn may_run_plugins(&self) -> bool {
        matches!(
            self,
            Submitter::Operator
                | Submitter::Token {
                    may_run_plugins: true,
                    ..
                }
        )
    }

    /// The owner of a job it submits first: a token's name, `None` for the operator.
    pub fn owner(&self) -> Option<String> {
        match self {
            Submitter::Operator | Submitter::Dev => None,
            Submitter::Token { name, .. } => Some(name.clone()),
        }
    }

    /// Whether it may `action` job `job` of `owner` (`None`: the operator's).
    pub fn may_change(
        &self,
        job: &str,
        owner: Option<&str>,
        action: JobAction,
    ) -> Result<(), NotOwner> {
        match self {
            Submitter::Operator | Submitter::Dev => Ok(()),
            Submitter::Token { name, .. } if owner == Some(name.as_str()) => Ok(()),
            Submitter::Token { name, .. } => Err(NotOwner {
                job: job.to_string(),
                owner: owner.map(str::to_string),
                token: name.clone(),
                action,
            }),
        }
    }
}

impl super::Agent {
    /// Whether `submitter` may `action` an alloc of job `job`: the job's owner's, or
    /// the operator's (a job this agent has no record of is the operator's).
    pub fn may_change_allocs_of(
        &self,
        submitter: &Submitter,
        job: &str,
        action: JobAction,
    ) -> Result<(), NotOwner> {
        let owner = self
            .jobs
            .lock()
            .unwrap()
            .get(job)
            .and_then(|entry| entry.record.owner.clone());
        submitter.may_change(job, owner.as_deref(), action)
    }
}

/// What is done to a job that only its owner and the operator may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobAction {
    Stop,
    Purge,
    /// Submit a job of its name again.
    Replace,
    Dispatch,
    /// Force a periodic launch.
    Launch,
    StopAlloc,
    RestartAlloc,
    SignalAlloc,
    /// Run a command inside an alloc's task (`alloc exec`).
    ExecAlloc,
}

impl fmt::Display for JobAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            JobAction::Stop => "stop",
            JobAction::Purge => "purge",
            JobAction::Replace => "replace",
            JobAction::Dispatch => "dispatch",
            JobAction::Launch => "force a launch of",
            JobAction::StopAlloc => "stop an alloc of",
            JobAction::RestartAlloc => "restart an alloc of",
            JobAction::SignalAlloc => "signal an alloc of",
            JobAction::ExecAlloc => "run commands inside an alloc of",
        })
    }
}

/// A token asked to change a job that is another's (answered 403).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("job {job:?} belongs to {}; token {token:?} may not {action} it", owner_words(.owner))]
pub struct NotOwner {
    pub job: String,
    /// `None`: the operator.
    pub owner: Option<String>,
    pub token: String,
    pub action: JobAction,
}

fn owner_words(owner: &Option<String>) -> String {
    match owner {
        Some(name) => format!("token {name:?}"),
        None => "the operator".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(name: &str) -> Submitter {
        Submitter::Token {
            name: name.into(),
            may_run_plugins: false,
        }
    }

    #[test]
    fn only_the_owner_and_the_operator_change_a_job() {
        let a = token("team-a");
        assert_eq!(a.may_change("web", Some("team-a"), JobAction::Stop), Ok(()));
        let refused = token("team-b")
            .may_change("web", Some("team-a"), JobAction::Stop)
            .unwrap_err();
        assert_eq!(
            refused.to_string(),
            "job \"web\" belongs to token \"team-a\"; token \"team-b\" may not stop it"
        );
        let refused = a.may_change("csi", None, JobAction::Purge).unwrap_err();
        assert_eq!(
            refused.to_string(),
            "job \"csi\" belongs to the operator; token \"team-a\" may not purge it"
        );
        for anyone in [Submitter::Operator, Submitter::Dev] {
            assert_eq!(
                anyone.may_change("web", Some("team-a"), JobAction::Replace),
                Ok(())
            );
            assert_eq!(anyone.owner(), None);
        }
        assert_eq!(a.owner().as_deref(), Some("team-a"));
    }
}
