//! The WASM lifecycle hooks the operator declared in the agent config, loaded once. A
//! hook that fails to load is refused with its reason and everything else keeps
//! working; a job that names it fails validation with that reason.

use std::sync::Arc;

use berth_jobspec::Task;
use berth_model::hook::HookSpec;
use berth_runtime::Runtime;
use berth_runtime::hook::Hook;

#[derive(Clone, Default)]
pub struct HookSet {
    loaded: Arc<Vec<Arc<Hook>>>,
    refused: Arc<Vec<(HookSpec, String)>>,
}

impl HookSet {
    /// Loads every declared hook; with `require_pinned`, only those with a `sha256` pin.
    /// A hook that does not load is kept with why ([`HookSet::refused`]), for the caller
    /// to say once (the CLI prints each as a warning), not logged here too.
    pub async fn load(runtime: &Runtime, specs: &[HookSpec], require_pinned: bool) -> HookSet {
        let mut loaded = Vec::new();
        let mut refused = Vec::new();
        for spec in specs {
            match Hook::load(runtime, spec.clone(), require_pinned).await {
                Ok(hook) => loaded.push(Arc::new(hook)),
                Err(error) => refused.push((spec.clone(), error.to_string())),
            }
        }
        HookSet {
            loaded: Arc::new(loaded),
            refused: Arc::new(refused),
        }
    }

    pub fn loaded(&self) -> &[Arc<Hook>] {
        &self.loaded
    }

    /// Hooks that did not load, with why.
    pub fn refused(&self) -> &[(HookSpec, String)] {
        &self.refused
    }

    pub fn get(&self, name: &str) -> Option<&Arc<Hook>> {
        self.loaded.iter().find(|h| h.name() == name)
    }

    /// Why a declared hook is not usable, or a list of what is, for a name nobody
    /// declared. `None` when the hook is loaded.
    pub fn problem_with(&self, name: &str) -> Option<String> {
        if self.get(name).is_some() {
            return None;
        }
        if let Some((_, reason)) = self.refused.iter().find(|(spec, _)| spec.name == name) {
            return Some(format!(
                "hook {name:?} did not load on this agent: {reason}"
            ));
        }
        let names: Vec<&str> = self.loaded.iter().map(|h| h.name()).collect();
        Some(format!(
            "unknown hook {name:?} ({})",
            if names.is_empty() {
                "this agent loads no hooks".to_string()
            } else {
                format!("this agent has: {}", names.join(", "))
            }
        ))
    }

    /// The hooks that run for `task`, in order: the operator's `all_tasks` hooks, then
    /// the ones the task names; each once.
    pub fn for_task(&self, task: &Task) -> Vec<Arc<Hook>> {
        let mut hooks: Vec<Arc<Hook>> = self
            .loaded
            .iter()
            .filter(|h| h.spec().all_tasks)
            .cloned()
            .collect();
        for name in &task.hooks {
            if let Some(hook) = self.get(name)
                && !hooks.iter().any(|h| h.name() == name)
            {
                hooks.push(hook.clone());
            }
        }
        hooks
    }
}
