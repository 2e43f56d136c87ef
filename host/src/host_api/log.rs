//! `berth:host/log`: guest messages into the agent's log, tagged with the plugin.

use crate::runtime::bindings::host::log::{Host, Level};
use crate::runtime::sandbox::PluginCtx;

/// Longest message kept; the rest is cut so a guest cannot flood the log with one call.
const MAX_MESSAGE: usize = 4096;

impl Host for PluginCtx {
    async fn log(&mut self, level: Level, message: String) -> wasmtime::Result<()> {
        let message: String = message.chars().take(MAX_MESSAGE).collect();
        let plugin = &*self.plugin.name;
        match level {
            Level::Trace => tracing::trace!(target: "berth::plugin", plugin, "{message}"),
            Level::Debug => tracing::debug!(target: "berth::plugin", plugin, "{message}"),
            Level::Info => tracing::info!(target: "berth::plugin", plugin, "{message}"),
            Level::Warn => tracing::warn!(target: "berth::plugin", plugin, "{message}"),
            Level::Error => tracing::error!(target: "berth::plugin", plugin, "{message}"),
        }
        Ok(())
    }
}
