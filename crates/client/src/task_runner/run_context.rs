//! What a command run inside the running task gets (a template's change script): the
//! environment and user the run started with. Kept in the agent's hook state, so that
//! an agent restarted while the task runs enters it as its start did, not with what
//! the job and the config would give it now.

use serde::{Deserialize, Serialize};

use berth_model::driver::TaskUser;
use berth_state::{Commit, StateStore};

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct RunContext {
    pub env: Vec<(String, String)>,
    pub user: Option<TaskUser>,
}

fn key(task: &str) -> String {
    format!("run:{task}")
}

impl RunContext {
    /// Records it for `task` of `alloc_id` (lazily: lost with the machine, the command
    /// gets the task's user as the config gives it and an empty environment).
    pub fn record(&self, store: &StateStore, alloc_id: &str, task: &str) {
        let Ok(bytes) = serde_json::to_vec(self) else {
            return;
        };
        if let Err(error) = store.put_hook_state(alloc_id, &key(task), &bytes, Commit::Lazy) {
            tracing::warn!(alloc = %alloc_id, task, %error, "recording the run's environment");
        }
    }

    /// What was recorded for `task` of `alloc_id`, if anything (readable).
    pub fn recorded(store: &StateStore, alloc_id: &str, task: &str) -> Option<RunContext> {
        let bytes = store.hook_state(alloc_id, &key(task)).ok()??;
        serde_json::from_slice(&bytes).ok()
    }
}
