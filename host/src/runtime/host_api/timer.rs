//! `berth:host/timer`: sleeping that does not count against the call's deadline.

use std::time::Duration;

use crate::runtime::bindings::host::timer::Host;
use crate::runtime::sandbox::PluginCtx;

const MAX_SLEEP: Duration = Duration::from_secs(3600);

impl Host for PluginCtx {
    async fn sleep(&mut self, millis: u64) -> wasmtime::Result<()> {
        let duration = Duration::from_millis(millis).min(MAX_SLEEP);
        self.clock.exempt(tokio::time::sleep(duration)).await;
        Ok(())
    }
}
