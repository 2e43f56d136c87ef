//! The alloc's dynamic workload users: before any hook runs, an alloc whose `exec` tasks
//! name no user takes one uid per such task and one gid for the alloc from the agent's
//! `user { dynamic_range }`, waiting (and saying so in each task's events) while the
//! range has too few free. The ids are recorded with the alloc, so a restarted agent
//! keeps them taken, and they are given back when the alloc is collected (its processes
//! dead, its directory removed): until then files in it are still theirs.

use std::collections::BTreeMap;
use std::ops::RangeInclusive;

use serde::{Deserialize, Serialize};

use super::AllocRunner;
use crate::task_runner::hooks::HookError;
use berth_model::driver::TaskUser;
use berth_model::events::{EventKind, TaskEvent, TaskStateKind};
use berth_state::Commit;
use berth_sys::process::dynamic_users::{Shortage, Want};

/// The hook-state key of an alloc's [`AllocUsers`].
const USERS_KEY: &str = "dynamic_users";

/// The ids an alloc holds: `gid` is every dynamic task's group, and the group of the
/// alloc's shared `data/` and `tmp/`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocUsers {
    pub gid: u32,
    pub tasks: BTreeMap<String, u32>,
}

impl AllocUsers {
    fn ids(&self) -> Vec<u32> {
        std::iter::once(self.gid)
            .chain(self.tasks.values().copied())
            .collect()
    }
}

/// After a restart, an alloc the agent leaves alone (its job is not recorded, or no
/// longer parses, or its record cannot be restored): its tasks may still run as the ids
/// it recorded, which stay out of the pool while this agent runs (second attack
/// review: they were handed out again).
pub fn claim_unmanaged(node: &super::NodeContext, alloc_id: &str, job_id: &str) {
    let Ok(Some(bytes)) = node.store.hook_state(alloc_id, USERS_KEY) else {
        return;
    };
    match serde_json::from_slice::<AllocUsers>(&bytes) {
        Ok(users) => node.dynamic_users.claim(&users.ids(), job_id, alloc_id),
        Err(error) => {
            tracing::error!(alloc = %alloc_id, %error, "the recorded dynamic users are unreadable")
        }
    }
}

/// How taking an alloc's ids ended.
pub(super) enum Taking {
    /// The alloc has its ids (or needs none).
    Taken,
    /// It was told to stop while waiting: its tasks never started.
    Stopped,
    /// It can never have them, or they could not be recorded: its tasks fail with this.
    Failed(String),
}

/// Why an alloc needing more ids than a job may hold fails at once.
fn too_many_message(needed: usize, share: usize, range: &RangeInclusive<u32>) -> String {
    format!(
        "the alloc needs {needed} user ids (one per task naming no user, one for the group) \
         and a job may hold at most {share}, half of user {{ dynamic_range = \"{}-{}\" }}: \
         give some tasks a user, or ask the operator for a wider range",
        range.start(),
        range.end()
    )
}

/// What a task's events say while its alloc waits for ids.
fn waiting_message(shortage: &Shortage, needed: usize, range: &RangeInclusive<u32>) -> String {
    let range = format!(
        "user {{ dynamic_range = \"{}-{}\" }}",
        range.start(),
        range.end()
    );
    match shortage {
        Shortage::Range { free } => format!(
            "Waiting for user ids: the alloc needs {needed} from {range} and {free} are free \
             (other allocs hold them, this agent's or another's on this host); it starts when allocs \
             holding some are collected"
        ),
        Shortage::JobShare { held, share } => format!(
            "Waiting for user ids: the alloc needs {needed} and its job already holds {held} \
             of the {share} a job may hold ({range}, half of it); it starts when the job's \
             other allocs are collected"
        ),
    }
}

impl AllocRunner {
    /// How many ids the alloc takes when it starts (0: none of its tasks is dynamic, or
    /// it has its ids already).
    pub fn dynamic_ids_needed(&self) -> usize {
        if self.users.lock().unwrap().is_some() {
            return 0;
        }
        match self.dynamic_tasks().len() {
            0 => 0,
            tasks => tasks + 1,
        }
    }

    /// The tasks of the group that run as ids of their own.
    fn dynamic_tasks(&self) -> Vec<String> {
        let config = &self.node.config;
        (self.group.tasks.iter())
            .filter(|task| {
                self.node.drivers.get(&task.driver).is_some_and(|driver| {
                    let isolation = driver.capabilities().fs_isolation;
                    crate::validate::wants_dynamic_user(&self.job, task, isolation, config)
                })
            })
            .map(|task| task.name.clone())
            .collect()
    }

    /// The ids `task` runs as, once the alloc took them.
    pub(super) fn dynamic_user(&self, task: &str) -> Option<TaskUser> {
        let users = self.users.lock().unwrap();
        let users = users.as_ref()?;
        let uid = *users.tasks.get(task)?;
        Some(TaskUser {
            uid,
            gid: users.gid,
        })
    }

    /// After an agent restart: the ids the alloc recorded stay taken.
    pub(super) fn restore_users(&self) {
        let users = match self.node.store.hook_state(&self.id, USERS_KEY) {
            Ok(Some(bytes)) => match serde_json::from_slice::<AllocUsers>(&bytes) {
                Ok(users) => users,
                Err(error) => {
                    // Its tasks start with new ids; the old ones stay out of the pool
                    // only while the agent knows them, which it no longer does.
                    tracing::error!(alloc = %self.id, %error, "the recorded dynamic users are unreadable");
                    return;
                }
            },
            Ok(None) => return,
            Err(error) => {
                tracing::error!(alloc = %self.id, %error, "reading the recorded dynamic users");
                return;
            }
        };
        (self.node.dynamic_users).claim(&users.ids(), &self.share_key(), &self.id);
        *self.users.lock().unwrap() = Some(users);
    }

    /// The key of the share of the range the alloc's job holds: a periodic or
    /// dispatched child's is its parent's, so launching children does not multiply it.
    pub fn share_key(&self) -> String {
        self.job
            .parent
            .clone()
            .unwrap_or_else(|| self.job.name.clone())
    }

    /// Whether the alloc holds ids of the range (until it is collected).
    pub fn holds_dynamic_ids(&self) -> bool {
        self.users.lock().unwrap().is_some()
    }

    /// Takes the alloc's ids (nothing to take: at once). Waits while the range has too
    /// few free, with an event on every task saying why; [`Taking::Stopped`] when the
    /// alloc was told to stop meanwhile (its tasks are then dead, never started).
    pub(super) async fn take_users(&self) -> Taking {
        if self.users.lock().unwrap().is_some() {
            return Taking::Taken;
        }
        let tasks = self.dynamic_tasks();
        if tasks.is_empty() {
            return Taking::Taken;
        }
        let pool = &self.node.dynamic_users;
        let needed = tasks.len() + 1;
        // More than its job may ever hold: it would wait for good.
        if needed > pool.job_share() {
            return Taking::Failed(too_many_message(needed, pool.job_share(), pool.range()));
        }
        let share_key = self.share_key();
        let mut stop = self.stop.subscribe();
        let mut told = None;
        // Counted while waiting, so the agent collects finished allocs holding ids.
        let mut wanting = None;
        let ids = loop {
            let released = pool.released();
            tokio::pin!(released);
            released.as_mut().enable();
            let shortage = match pool.take(needed, &share_key, &self.id) {
                Ok(ids) => break ids,
                Err(shortage) => shortage,
            };
            // Once per reason, not at every release that was not enough.
            let reason = std::mem::discriminant(&shortage);
            if told != Some(reason) {
                let message = waiting_message(&shortage, needed, pool.range());
                tracing::info!(alloc = %self.id, "{message}");
                for task in &self.group.tasks {
                    self.task_event(&task.name, TaskEvent::new(EventKind::TaskSetup, &message));
                }
                told = Some(reason);
            }
            let want = match shortage {
                Shortage::Range { .. } => Want::Ids(needed),
                Shortage::JobShare { .. } => Want::Share(share_key.clone()),
            };
            if wanting.as_ref().is_none_or(|w: &(Want, _)| w.0 != want) {
                wanting = Some((want.clone(), pool.want(want)));
            }
            if *stop.borrow_and_update() {
                self.never_started();
                return Taking::Stopped;
            }
            // Another agent of this host releasing ids it leased tells this one nothing:
            // tried again now and then.
            tokio::select! {
                () = &mut released => {}
                _ = stop.changed() => {}
                () = tokio::time::sleep(std::time::Duration::from_secs(5)) => {}
            }
        };
        drop(wanting);
        let users = AllocUsers {
            gid: ids[0],
            tasks: tasks.into_iter().zip(ids[1..].iter().copied()).collect(),
        };
        let bytes = serde_json::to_vec(&users).unwrap_or_default();
        // Durable before any task runs as them: a restarted agent must know them taken.
        if let Err(error) =
            (self.node.store).put_hook_state(&self.id, USERS_KEY, &bytes, Commit::Durable)
        {
            tracing::error!(alloc = %self.id, %error, "recording the alloc's dynamic users");
            pool.release(&ids, &share_key, &self.id);
            return Taking::Failed(format!(
                "recording the alloc's user ids failed ({error}); no task runs as ids a \
                 restarted agent would not know"
            ));
        }
        pool.recorded(&ids);
        *self.users.lock().unwrap() = Some(users);
        Taking::Taken
    }

    /// Tasks of an alloc stopped before it could start them: dead, not failed.
    fn never_started(&self) {
        let message = "Stopped before a user id was free; the task never started";
        for task in &self.group.tasks {
            let mut state = self.task_states[&task.name].lock().unwrap();
            state.state = TaskStateKind::Dead;
            state.push_event(TaskEvent::new(EventKind::Killed, message));
        }
    }

    /// Gives the alloc's shared `data/` and `tmp/` to its gid (setgid, so what a task
    /// makes there is the group's; sticky, as before) and closes them to everyone else:
    /// no host user and no other alloc's task can enter. Only when every task of the
    /// group has the gid: a task with a user of its own keeps today's world-writable
    /// directories.
    pub(super) fn share_alloc_dir(&self) -> Result<(), HookError> {
        let Some(gid) = self.users.lock().unwrap().as_ref().map(|u| u.gid) else {
            return Ok(());
        };
        if self.dynamic_tasks().len() != self.group.tasks.len() {
            return Ok(());
        }
        let shared = self.alloc_dir.shared();
        let dirs = [(shared.join("data"), 0o3770), (shared.join("tmp"), 0o3770)];
        let shared_dirs: Vec<_> = dirs.iter().map(|(dir, _)| dir.clone()).collect();
        (self.node.sys)
            .give_dirs(&dirs, TaskUser { uid: 0, gid })
            .and_then(|()| self.node.sys.share_dirs_with_group(&shared_dirs))
            .map_err(|e| HookError {
                hook: "alloc_dir".into(),
                message: format!("giving the alloc's shared directories to gid {gid}: {e}"),
            })
    }

    /// Gives the ids back: the alloc is collected (its processes dead, its directory
    /// removed). Once only: the record is forgotten with them.
    pub fn release_users(&self) {
        if let Some(users) = self.users.lock().unwrap().take() {
            (self.node.dynamic_users).release(&users.ids(), &self.share_key(), &self.id);
        }
    }
}
