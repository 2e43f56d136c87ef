//! Submitting a job: the checks (who may run what, the jobspec for any node), then the
//! job and its evaluation written to the cluster, whose scheduler places it
//! (`agent/cluster.rs`); and the dry run of `job plan`.

use std::collections::BTreeMap;

use super::{Agent, SubmitError, Submitted, Submitter};
use crate::jobspec::{self, Job, JobspecError};

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
        variables: &jobspec::eval::VariableInputs,
    ) -> Result<Submitted, SubmitError> {
        self.submit_as(Submitter::Operator, source_name, source, variables)
            .await
    }

    /// [`Agent::submit_with`] for `submitter`: a job that runs a CSI plugin needs the
    /// operator, or a token of scope `plugin`.
    /// The problems submitting `source` would meet, without submitting it (Nomad's
    /// `POST /v1/validate/job`): each as `file:line:col: path: message`.
    pub async fn validate_source(
        &self,
        source_name: &str,
        source: &str,
    ) -> Result<(), Vec<String>> {
        let job = jobspec::parse_with_async(source_name, source, &Default::default())
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

    /// What submitting `source` would meet, without submitting it (Nomad's plan, a dry
    /// run): the job, and the problems of the checks [`Agent::submit_as`] makes (who may
    /// run what, the jobspec against this node, its disk, its static ports).
    pub async fn dry_run(
        &self,
        submitter: Submitter,
        source_name: &str,
        source: &str,
        variables: &jobspec::eval::VariableInputs,
    ) -> Result<(Job, Vec<jobspec::Problem>), JobspecError> {
        let mut job = jobspec::parse_with_async(source_name, source, variables).await?;
        job.submitted_by_operator = submitter == Submitter::Operator;
        let mut problems = plugin_tasks_refused(&job, submitter.may_run_plugins());
        problems.extend(
            crate::validate::validate(
                &job,
                &self.node.drivers,
                &self.node.hooks,
                &self.node.config,
                Some(self.node.csi.catalog.as_ref()),
                &self.node.facts,
            )
            .await,
        );
        problems.extend(self.disk_problems(&job));
        let places = job.periodic.is_none() && job.parameterized.is_none();
        if let Some(why) = places.then(|| self.static_port_clash(&job)).flatten() {
            problems.push(jobspec::Problem {
                path: format!("job.{}.network", job.name),
                at: None,
                message: why,
            });
        }
        Ok((job, problems))
    }

    pub async fn submit_as(
        &self,
        submitter: Submitter,
        source_name: &str,
        source: &str,
        variables: &jobspec::eval::VariableInputs,
    ) -> Result<Submitted, SubmitError> {
        let mut job = jobspec::parse_with_async(source_name, source, variables)
            .await
            .map_err(SubmitError::Invalid)?;
        job.submitted_by_operator = submitter == Submitter::Operator;
        let refused = plugin_tasks_refused(&job, submitter.may_run_plugins());
        if !refused.is_empty() {
            return Err(SubmitError::Invalid(JobspecError {
                file: source_name.to_string(),
                problems: refused,
            }));
        }
        // The cluster's scheduler places it (on this node, for a lone agent): what a
        // node has or lacks is its to weigh, as in Nomad, and what fits nowhere stays
        // pending with its evaluation saying why.
        let problems = crate::validate::validate_for(
            &job,
            &self.node.drivers,
            &self.node.hooks,
            &self.node.config,
            Some(self.node.csi.catalog.as_ref()),
            &self.node.facts,
            crate::validate::Placing::AnyNode,
        )
        .await;
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

    /// The ports the running allocs hold (static and dynamic), and which alloc holds
    /// each; without the allocs of job `except`, which are about to be replaced.
    pub(super) fn port_holders(&self, except: Option<&str>) -> BTreeMap<u16, String> {
        let mut holders = BTreeMap::new();
        for entry in self.allocs.lock().unwrap().values() {
            if *entry.finished.borrow() || Some(entry.runner.job.name.as_str()) == except {
                continue;
            }
            for number in entry.runner.group.ports.iter().filter_map(|p| p.number) {
                holders.insert(number, entry.runner.name.clone());
            }
        }
        // A resubmit's reservation names the job: it holds the port from before its old
        // allocs stop until its new ones run.
        for (port, job) in self.reserved_ports.lock().unwrap().iter() {
            if Some(job.as_str()) != except {
                holders.insert(*port, format!("job {job:?} (being replaced)"));
            }
        }
        holders
    }

    /// Why `job` cannot be placed here for its static ports: one a running alloc holds,
    /// or one its own allocs would share (`count` > 1). A static port is one alloc's on a
    /// node, as Nomad's scheduler has it. Checked before an older version is stopped.
    pub(super) fn static_port_clash(&self, job: &Job) -> Option<String> {
        let mut holders = self.port_holders(Some(&job.name));
        for group in &job.groups {
            for alloc_index in 0..group.count {
                let name = format!("{}.{}[{alloc_index}]", job.name, group.name);
                for port in &group.ports {
                    let Some(number) = port.number else { continue };
                    if let Some(holder) = holders.insert(number, name.clone()) {
                        return Some(format!(
                            "{name} cannot have static port {number} (port {:?}): {holder} \
                             holds it on this node",
                            port.label
                        ));
                    }
                }
            }
        }
        None
    }
}

/// The `csi_plugin` tasks of `job`, refused unless its submitter `may_run_plugins`: a
/// plugin task sees the volumes it serves and, granted by the operator, mounts on the
/// node, so it needs more than a submit token (Nomad's `csi-register-plugin` capability).
pub(super) fn plugin_tasks_refused(
    job: &jobspec::Job,
    may_run_plugins: bool,
) -> Vec<jobspec::Problem> {
    if may_run_plugins {
        return Vec::new();
    }
    job.groups
        .iter()
        .flat_map(|g| g.tasks.iter().map(move |t| (g, t)))
        .filter(|(_, t)| t.csi_plugin.is_some())
        .map(|(group, task)| jobspec::Problem {
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
