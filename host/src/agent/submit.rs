//! Submitting a job: the checks (who may run what, ports, the jobspec against this
//! node), then its record and its allocs' records in one transaction before any alloc
//! runs.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::{
    Agent, AllocEntry, JobAction, JobEntry, SubmitError, Submitted, Submitter, now_ms, spawn_runner,
};
use crate::alloc_runner::AllocRunner;
use crate::jobspec::{self, Job, JobspecError};
use crate::state::JobRecord;

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
        let placing = if self.cluster.is_some() {
            crate::validate::Placing::AnyNode
        } else {
            crate::validate::Placing::ThisNode
        };
        let problems = crate::validate::validate_for(
            &job,
            &self.node.drivers,
            &self.node.hooks,
            &self.node.config,
            Some(self.node.csi.catalog.as_ref()),
            &self.node.facts,
            placing,
        )
        .await;
        let mut problems = problems;
        if placing == crate::validate::Placing::ThisNode {
            problems.extend(self.disk_problems(&job));
        }
        if !problems.is_empty() {
            return Err(SubmitError::Invalid(JobspecError {
                file: source_name.to_string(),
                problems,
            }));
        }
        if let Some(cluster) = &self.cluster {
            return self
                .submit_to_cluster(cluster, submitter, job, source_name, source, variables)
                .await;
        }
        let _this_job = self.job_locks.lock(&job.name).await;
        // The job's first submitter stays its owner, whoever replaces it.
        let owner = match self.jobs.lock().unwrap().get(&job.name) {
            Some(entry) => {
                let owner = entry.record.owner.clone();
                submitter.may_change(&job.name, owner.as_deref(), JobAction::Replace)?;
                owner
            }
            None => submitter.owner(),
        };
        let places = job.periodic.is_none() && job.parameterized.is_none();
        // Checked, and the new version's static ports reserved, before anything of the
        // old one stops: a refusal leaves it running, and no other job takes its ports
        // while it stops (attack review: a job submitted in that moment took the port,
        // and the resubmit was refused with the old version already dead).
        let _reserved = {
            let _one_at_a_time = self.submitting.lock().await;
            if let Some(why) = places.then(|| self.static_port_clash(&job)).flatten() {
                return Err(SubmitError::Refused(why));
            }
            self.reserve_ports(&job)
        };
        // Under the job's lock only: its old allocs may take their kill timeouts to stop,
        // and other jobs' submissions need not wait for them.
        let replaced = self.stop_allocs_of(&job.name).await;
        self.forget_allocs_of(&job.name);
        let _one_at_a_time = self.submitting.lock().await;
        let record = JobRecord {
            id: job.name.clone(),
            source_name: source_name.to_string(),
            source: source.to_string(),
            variables: variables.clone(),
            submitted_ms: now_ms(),
            stopped: false,
            child_of: None,
            by_operator: job.submitted_by_operator,
            owner,
            last_launch_ms: None,
        };
        let job = Arc::new(job);
        // A periodic or parameterized job places nothing itself: its children do.
        let alloc_ids = if job.periodic.is_some() || job.parameterized.is_some() {
            self.record_job(record, job.clone())?;
            self.index.bump();
            self.publish_job("JobRegistered", &job.name);
            Vec::new()
        } else {
            self.record_and_place(record, job.clone())?
        };
        self.index.bump();
        for alloc in &alloc_ids {
            self.publish_alloc("AllocationUpdated", alloc);
        }
        Ok(Submitted {
            eval_id: String::new(),
            job_id: job.name.clone(),
            alloc_ids,
            replaced,
            warnings: job
                .warnings
                .iter()
                .map(|w| format!("{source_name}:{w}"))
                .collect(),
        })
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

    /// Reserves `job`'s static ports until the guard drops (the caller checked them).
    fn reserve_ports(&self, job: &Job) -> ReservedPorts<'_> {
        let ports: Vec<u16> = (job.groups.iter())
            .flat_map(|group| group.ports.iter().filter_map(|p| p.number))
            .collect();
        let mut reserved = self.reserved_ports.lock().unwrap();
        for port in &ports {
            reserved.insert(*port, job.name.clone());
        }
        ReservedPorts { agent: self, ports }
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

    /// Records the job (durably) and keeps it in the job table.
    pub(super) fn record_job(&self, record: JobRecord, job: Arc<Job>) -> Result<(), SubmitError> {
        self.node.store.put_job(&record)?;
        self.jobs
            .lock()
            .unwrap()
            .insert(record.id.clone(), JobEntry { record, job });
        Ok(())
    }

    /// Records the job and all its allocs in one transaction, then starts the allocs;
    /// their ids. An agent killed in between comes back with the job and every alloc,
    /// or with neither.
    pub(super) fn record_and_place(
        &self,
        record: JobRecord,
        job: Arc<Job>,
    ) -> Result<Vec<String>, SubmitError> {
        // Dynamic ports avoid what running allocs hold and this job's static ports.
        let mut in_use: std::collections::BTreeSet<u16> = self
            .port_holders(None)
            .into_keys()
            .chain(
                job.groups
                    .iter()
                    .flat_map(|g| g.ports.iter().filter_map(|p| p.number)),
            )
            .collect();
        let mut allocs = Vec::new();
        for (group_index, group) in job.groups.iter().enumerate() {
            for alloc_index in 0..group.count {
                let ports = crate::alloc_runner::ports::allocate(&group.ports, &mut in_use)
                    .map_err(|e| SubmitError::Refused(format!("group {:?}: {e}", group.name)))?;
                allocs.push(AllocRunner::new_record(
                    &job,
                    group_index,
                    alloc_index,
                    ports,
                ));
            }
        }
        self.node.store.put_job_and_allocs(&record, &allocs)?;
        let job_id = record.id.clone();
        self.jobs.lock().unwrap().insert(
            record.id.clone(),
            JobEntry {
                record,
                job: job.clone(),
            },
        );
        // The job's registration is told before anything of its allocs: their runners
        // report from the moment they start (and a child job is registered too, as
        // Nomad's periodic and dispatched children are). The index moves once the allocs
        // are listed below: a blocking query it wakes sees them.
        self.publish_job("JobRegistered", &job_id);
        let runners: Vec<Arc<AllocRunner>> = allocs
            .into_iter()
            .map(|alloc| AllocRunner::recorded(job.clone(), alloc, self.node.clone()))
            .collect();
        let alloc_ids = runners.iter().map(|r| r.id.clone()).collect();
        self.make_room(&runners);
        let mut allocs = self.allocs.lock().unwrap();
        for runner in runners {
            let finished = spawn_runner(self, runner.clone());
            allocs.insert(runner.id.clone(), AllocEntry { runner, finished });
        }
        drop(allocs);
        self.index.bump();
        Ok(alloc_ids)
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

/// Static ports a resubmit holds while its job's old allocs stop; given back when it
/// ends, whichever way (its new allocs hold them then).
struct ReservedPorts<'a> {
    agent: &'a Agent,
    ports: Vec<u16>,
}

impl Drop for ReservedPorts<'_> {
    fn drop(&mut self) {
        let mut reserved = self.agent.reserved_ports.lock().unwrap();
        for port in &self.ports {
            reserved.remove(port);
        }
    }
}
