//! Stopping a job: its allocs stop, the job stays listed as stopped (Nomad's `job
//! stop`), when the one asking owns it ([`super::owner`]).

use super::{Agent, ClusterError, JobAction, LookupError, StopError, Submitter};

/// What a job's stop did.
#[derive(Debug, Clone, Default)]
pub struct JobStopped {
    /// The allocs asked to stop (on this agent).
    pub allocs: Vec<String>,
    /// The evaluation the stop made (Nomad's `EvalID`), in a cluster.
    pub eval_id: String,
}

impl Agent {
    /// Stops a job's allocs, as the operator; the job stays listed as stopped. Returns
    /// the allocs asked to stop.
    pub async fn stop_job(&self, id: &str) -> Result<Vec<String>, StopError> {
        Ok(self
            .stop_job_as(&Submitter::Operator, id, JobAction::Stop)
            .await?
            .allocs)
    }

    /// [`Agent::stop_job`] for `submitter`, which must own the job (or be the operator);
    /// `action` (a stop, or the stop before a purge) is what a refusal names.
    pub async fn stop_job_as(
        &self,
        submitter: &Submitter,
        id: &str,
        action: JobAction,
    ) -> Result<JobStopped, StopError> {
        // The scheduler removes the placements; each node stops its allocs.
        let refused =
            self.stop_cluster_job(submitter, id, false)
                .await
                .map_err(|error| match error {
                    ClusterError::Store(_) => LookupError::Cluster(error),
                    _ => LookupError::NotFound {
                        kind: "job",
                        id: id.to_string(),
                    },
                })?;
        let eval_id = match refused {
            Ok(eval_id) => eval_id,
            Err(mut refused) => {
                refused.action = action;
                return Err(refused.into());
            }
        };
        self.publish_job("JobDeregistered", id);
        let (_, allocs) = self.evaluated(&self.cluster, &eval_id).await;
        Ok(JobStopped { allocs, eval_id })
    }
}
