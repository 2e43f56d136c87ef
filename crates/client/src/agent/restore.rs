//! Bringing the node back after an agent restart: every recorded job and alloc is
//! read from the state file and its runner rebuilt; running tasks are recovered.

use std::sync::Arc;

use tokio::sync::watch;

use super::{Agent, AllocEntry, JobEntry, Notice, NoticeLevel, spawn_runner, store_name};
use crate::alloc_runner::AllocRunner;
use berth_model::status::ClientStatus;
use berth_state::StateError;

impl Agent {
    /// Reads the recorded jobs and allocs. Live allocs are started by `run_restored`.
    pub(super) fn restore(&self) -> Result<Vec<Notice>, StateError> {
        let store = &self.node.store;
        let mut notices = Vec::new();
        let unreadable_notice = |u: berth_state::Unreadable| Notice {
            level: NoticeLevel::Error,
            message: u.to_string(),
        };
        let (records, unreadable) = store.jobs()?;
        notices.extend(unreadable.into_iter().map(unreadable_notice));
        let mut jobs = self.jobs.lock().unwrap();
        for record in records {
            match berth_jobspec::parse_with(&record.source_name, &record.source, &record.variables)
            {
                Ok(mut job) => {
                    job.submitted_by_operator = record.by_operator;
                    let job = match &record.child_of {
                        Some(child) => job.into_child(
                            &record.id,
                            &child.parent,
                            &child.meta,
                            child.payload_bytes(),
                        ),
                        None => job,
                    };
                    jobs.insert(
                        record.id.clone(),
                        JobEntry {
                            record,
                            job: Arc::new(job),
                        },
                    );
                }
                Err(error) => notices.push(Notice {
                    level: NoticeLevel::Error,
                    message: format!(
                        "job {:?} is recorded but no longer parses, so its allocs are left \
                         alone: {error}",
                        record.id
                    ),
                }),
            }
        }
        let (records, unreadable) = store.allocs()?;
        // Only with every alloc record read is an image of no alloc an orphan.
        let sweep_disks = unreadable.is_empty();
        notices.extend(unreadable.into_iter().map(unreadable_notice));
        let known: std::collections::BTreeSet<String> =
            records.iter().map(|r| r.id.clone()).collect();
        let mut allocs = self.allocs.lock().unwrap();
        for record in records {
            let Some(entry) = jobs.get(&record.job_id) else {
                crate::alloc_runner::users::claim_unmanaged(&self.node, &record.id, &record.job_id);
                notices.push(Notice {
                    level: NoticeLevel::Warning,
                    message: format!(
                        "alloc {} belongs to job {:?}, which is not recorded; left alone",
                        record.id, record.job_id
                    ),
                });
                continue;
            };
            let (id, job_id) = (record.id.clone(), record.job_id.clone());
            let terminal = matches!(
                record.client_status,
                ClientStatus::Complete | ClientStatus::Failed
            );
            match AllocRunner::restore(entry.job.clone(), record, self.node.clone()) {
                Ok(runner) => {
                    let (done, finished) = watch::channel(terminal);
                    // A terminal alloc is kept for `alloc status` only.
                    drop(done);
                    allocs.insert(id, AllocEntry { runner, finished });
                }
                Err(error) => {
                    crate::alloc_runner::users::claim_unmanaged(&self.node, &id, &job_id);
                    notices.push(Notice {
                        level: NoticeLevel::Error,
                        message: error.to_string(),
                    })
                }
            }
        }
        drop(allocs);
        if sweep_disks {
            self.sweep_orphan_disks(&known);
        }
        let allocs = self.allocs.lock().unwrap();
        let live = allocs.values().filter(|a| !*a.finished.borrow()).count();
        if live > 0 {
            notices.push(Notice {
                level: NoticeLevel::Info,
                message: format!("restoring {live} alloc(s) from {}", store_name(store)),
            });
        }
        Ok(notices)
    }

    pub(super) fn run_restored(&self) {
        let mut allocs = self.allocs.lock().unwrap();
        // Their services are theirs until they say otherwise: the first sync must not
        // take them for orphans before the restored runners have set them again.
        self.node.services.expect_allocs(
            allocs
                .values()
                .filter(|entry| !*entry.finished.borrow())
                .map(|entry| entry.runner.id.clone()),
        );
        for entry in allocs.values_mut() {
            if !*entry.finished.borrow() {
                entry.finished = spawn_runner(self, entry.runner.clone());
            } else {
                // Finished before the restart with volumes its plugin could not take back.
                entry.runner.give_back_csi();
                // The agent may have died between the alloc's end and its collectors'.
                entry.runner.remove_collectors();
                // Or between its end and its network's removal.
                entry.runner.release_network();
            }
        }
    }
}
