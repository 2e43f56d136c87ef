//! Submitting a job: the checks (who may run what, the jobspec for any node), then the
//! job and its evaluation written to the cluster, whose scheduler places it
//! (`agent/cluster.rs`). `job plan` is `agent/plan.rs`'s.

use std::collections::BTreeSet;

use super::{Agent, SubmitError, Submitted, Submitter};
use berth_jobspec::{Job, JobspecError};

impl Agent {
    /// Parses, validates and runs a job. A job with the name of a running one replaces
    /// it: the old allocs are stopped (and waited for) before the new ones start.
    pub async fn submit(&self, source_name: &str, source: &str) -> Result<Submitted, SubmitError> {
        self.submit_with(source_name, source, &Default::default())
            .await
    }

    /// [`Agent::submit`] with values for the jobspec's variables, as the operator.
    pub async fn submit_with(
        &self,
        source_name: &str,
        source: &str,
        variables: &berth_hcl::eval::VariableInputs,
    ) -> Result<Submitted, SubmitError> {
        self.submit_as(Submitter::Operator, source_name, source, variables)
            .await
    }

    /// The problems submitting `source` would meet, without submitting it (Nomad's
    /// `POST /v1/validate/job`): each as `file:line:col: path: message`.
    pub async fn validate_source(
        &self,
        source_name: &str,
        source: &str,
    ) -> Result<(), Vec<String>> {
        let job = berth_jobspec::parse_with_async(source_name, source, &Default::default())
            .await
            .map_err(|e| e.problems.iter().map(|p| p.to_string()).collect::<Vec<_>>())?;
        let mut problems = crate::validate::validate(
            &job,
            &self.node.drivers,
            &self.node.hooks,
            &self.node.config,
            Some(self.node.csi.catalog.as_ref()),
            &self.node.facts,
        )
        .await;
        problems.extend(self.disk_problems(&job));
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems.iter().map(ToString::to_string).collect())
        }
    }

    /// [`Agent::submit_with`] for `submitter`: a job that runs a CSI plugin needs the
    /// operator, or a token of scope `plugin`.
    pub async fn submit_as(
        &self,
        submitter: Submitter,
        source_name: &str,
        source: &str,
        variables: &berth_hcl::eval::VariableInputs,
    ) -> Result<Submitted, SubmitError> {
        let mut job = berth_jobspec::parse_with_async(source_name, source, variables)
            .await
            .map_err(SubmitError::Invalid)?;
        job.submitted_by_operator = submitter == Submitter::Operator;
        let problems = self.submit_problems(&job, &submitter).await;
        if !problems.is_empty() {
            return Err(SubmitError::Invalid(JobspecError {
                file: source_name.to_string(),
                problems,
            }));
        }
        let cluster = self.cluster.clone();
        self.submit_to_cluster(&cluster, submitter, job, source_name, source, variables)
            .await
    }

    /// Why a submit of `job` by `submitter` is refused before the scheduler sees it:
    /// plugin tasks it may not run, else the jobspec's problems for any node. The
    /// cluster's scheduler places it (on this node, for a lone agent): what a node has or
    /// lacks is its to weigh, as in Nomad, and what fits nowhere stays pending with its
    /// evaluation saying why. `job plan` makes the same checks.
    pub(super) async fn submit_problems(
        &self,
        job: &Job,
        submitter: &Submitter,
    ) -> Vec<berth_hcl::Problem> {
        let refused = plugin_tasks_refused(job, submitter.may_run_plugins());
        if !refused.is_empty() {
            return refused;
        }
        crate::validate::validate_for(
            job,
            &self.node.drivers,
            &self.node.hooks,
            &self.node.config,
            Some(self.node.csi.catalog.as_ref()),
            &self.node.facts,
            crate::validate::Placing::AnyNode,
        )
        .await
    }

    /// The ports this node's running allocs hold (static and dynamic).
    pub(super) fn ports_in_use(&self) -> BTreeSet<u16> {
        self.ports_held_by_others(None)
    }

    /// [`Agent::ports_in_use`], but those of job `besides`' allocs (older versions of
    /// it, being replaced) when named.
    pub(super) fn ports_held_by_others(&self, besides: Option<&str>) -> BTreeSet<u16> {
        let mut in_use = BTreeSet::new();
        for entry in self.allocs.lock().unwrap().values() {
            if *entry.finished.borrow() || Some(entry.runner.job.name.as_str()) == besides {
                continue;
            }
            in_use.extend(entry.runner.group.ports.iter().filter_map(|p| p.number));
        }
        in_use
    }
}

/// The `csi_plugin` tasks of `job`, refused unless its submitter `may_run_plugins`: a
/// plugin task sees the volumes it serves and, granted by the operator, mounts on the
/// node, so it needs more than a submit token (Nomad's `csi-register-plugin` capability).
pub(super) fn plugin_tasks_refused(
    job: &berth_jobspec::Job,
    may_run_plugins: bool,
) -> Vec<berth_hcl::Problem> {
    if may_run_plugins {
        return Vec::new();
    }
    job.groups
        .iter()
        .flat_map(|g| g.tasks.iter().map(move |t| (g, t)))
        .filter(|(_, t)| t.csi_plugin.is_some())
        .map(|(group, task)| berth_hcl::Problem {
            path: format!(
                "job.{}.group.{}.task.{}.csi_plugin",
                job.name, group.name, task.name
            ),
            at: Some(task.at),
            message: format!(
                "task {:?} runs a CSI plugin, which needs the operator's authorization: \
                 submit it through the agent's Unix socket, or with a token of scope \
                 \"plugin\"",
                task.name
            ),
        })
        .collect()
}
