//! Example hook: turns the task's `meta` into environment variables.
//!
//! `meta { tier = "gold" }` becomes `APP_TIER=gold`; the prefix comes from the hook's
//! config (`config = { prefix = "APP_" }`, the default).

use berth_plugin_sdk::export_hook;
use berth_plugin_sdk::hook::{self, Hook, PrestartResponse, TaskContext};

struct InjectEnv;

impl Hook for InjectEnv {
    fn prestart(context: TaskContext) -> Result<PrestartResponse, String> {
        let prefix = hook::lookup(&context.hook_config, "prefix").unwrap_or("APP_");
        let mut response = hook::response();
        for (key, value) in &context.meta {
            let name: String = key
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() {
                        c.to_ascii_uppercase()
                    } else {
                        '_'
                    }
                })
                .collect();
            response
                .env
                .push((format!("{prefix}{name}"), value.clone()));
        }
        response.events.push(format!(
            "injected {} variable(s) from meta",
            response.env.len()
        ));
        Ok(response)
    }
}

export_hook!(InjectEnv);
