//! `berth:host/log`: guest messages into the agent's log, within the span of the call
//! that made them (plugin, function, and the alloc and task it is for).

use crate::bindings::host::log::{Host, Level};
use crate::sandbox::PluginCtx;

/// Longest message kept; the rest is cut so a guest cannot flood the log with one call.
const MAX_MESSAGE: usize = 4096;
/// The most messages one call logs, and the most bytes of them: past either the rest are
/// dropped and counted (one warning says how many, when the call ends). One call used to
/// write 833 MB of agent log in 5 s.
pub const MAX_MESSAGES_PER_CALL: u32 = 1000;
pub const MAX_LOG_BYTES_PER_CALL: usize = 1 << 20;

/// What one call may still log, and what it dropped.
#[derive(Debug)]
pub struct LogBudget {
    messages: u32,
    bytes: usize,
    dropped: u64,
    plugin: std::sync::Arc<str>,
    /// Where the drops are counted per plugin, for `berth driver list`, `berth hook list`
    /// and `/v1/metrics`.
    metrics: berth_telemetry::Metrics,
}

impl LogBudget {
    pub fn new(plugin: std::sync::Arc<str>, metrics: berth_telemetry::Metrics) -> LogBudget {
        LogBudget {
            messages: MAX_MESSAGES_PER_CALL,
            bytes: MAX_LOG_BYTES_PER_CALL,
            dropped: 0,
            plugin,
            metrics,
        }
    }

    /// Whether a message of `len` bytes may still be logged; counts it either way.
    fn take(&mut self, len: usize) -> bool {
        if self.messages == 0 || len > self.bytes {
            self.dropped += 1;
            return false;
        }
        self.messages -= 1;
        self.bytes -= len;
        true
    }

    pub fn dropped(&self) -> u64 {
        self.dropped
    }
}

impl Drop for LogBudget {
    /// The call is over (its store is dropped): one line for what was dropped.
    fn drop(&mut self) {
        if self.dropped > 0 {
            self.metrics.log_dropped(&self.plugin, self.dropped);
            tracing::warn!(target: "berth::plugin", plugin = %self.plugin, dropped = self.dropped,
                "the plugin logged past its budget of {MAX_MESSAGES_PER_CALL} messages and \
                 {MAX_LOG_BYTES_PER_CALL} bytes in one call; the rest was dropped");
        }
    }
}

impl Host for PluginCtx {
    async fn log(&mut self, level: Level, message: String) -> wasmtime::Result<()> {
        let message: String = message.chars().take(MAX_MESSAGE).collect();
        if !self.log.take(message.len()) {
            return Ok(());
        }
        // One line each: a line break in a guest's message would forge the next line.
        let message = berth_model::text::one_line(&message);
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
