//! Example hook: a policy that refuses tasks using a denied driver.
//!
//! `config = { deny_drivers = "raw_exec,docker" }`. A refused task fails before it
//! starts, with the policy's reason in its Setup Failure event.

use berth_plugin_sdk::export_hook;
use berth_plugin_sdk::hook::{self, Hook, PrestartResponse, TaskContext};

struct DenyPolicy;

impl Hook for DenyPolicy {
    fn prestart(context: TaskContext) -> Result<PrestartResponse, String> {
        let denied = hook::lookup(&context.hook_config, "deny_drivers").unwrap_or("");
        let mut denied = denied.split(',').map(str::trim).filter(|d| !d.is_empty());
        if denied.any(|d| d == context.driver) {
            return Err(format!(
                "task {:?} uses driver {:?}, which this node's policy denies",
                context.task_name, context.driver
            ));
        }
        Ok(hook::response())
    }
}

export_hook!(DenyPolicy);
