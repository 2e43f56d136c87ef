//! `berth:host/log`: guest messages into the agent's log, within the span of the call
//! that made them (plugin, function, and the alloc and task it is for).

use crate::runtime::bindings::host::log::{Host, Level};
use crate::runtime::sandbox::PluginCtx;

/// Longest message kept; the rest is cut so a guest cannot flood the log with one call.
const MAX_MESSAGE: usize = 4096;

impl Host for PluginCtx {
    async fn log(&mut self, level: Level, message: String) -> wasmtime::Result<()> {
        let message: String = message.chars().take(MAX_MESSAGE).collect();
        // The call's `plugin_call` span names the plugin and the function (and the alloc
        // and task spans around it say what for), so the event carries the message only.
        match level {
            Level::Trace => tracing::trace!(target: "berth::plugin", "{message}"),
            Level::Debug => tracing::debug!(target: "berth::plugin", "{message}"),
            Level::Info => tracing::info!(target: "berth::plugin", "{message}"),
            Level::Warn => tracing::warn!(target: "berth::plugin", "{message}"),
            Level::Error => tracing::error!(target: "berth::plugin", "{message}"),
        }
        Ok(())
    }
}
