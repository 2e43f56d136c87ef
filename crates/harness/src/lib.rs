//! berth agents for the end-to-end tests and the benches, and no product crate: `cargo
//! tree -e normal` shows none depending on it. It stands on the top of the product (the
//! client and the API), which is why it is not part of [`berth_testkit`]: the testkit's
//! fakes serve the unit tests of the crates below the client, and a crate cannot be
//! both below and above the client.
//!
//! - [`AgentProcess`]: `berth agent` in a process of its own, on a data dir and a port
//!   of its own, driven through the API and the CLI as an operator would.
//! - [`InProcessAgent`]: the agent in the test's own process (state in memory), for
//!   tests that read it directly; [`node_context`] is what an alloc runner of one
//!   shares, for tests and benches that run runners without an agent.
//! - [`binaries`]: where the `berth` and `berth-keeper` binaries that cargo built for
//!   this test or bench are, and the component cache the runs share.
//! - [`cleanup`]: what a killed agent leaves (task processes, cgroups, mounts, user id
//!   leases), found and removed, so a failed test leaks nothing.

mod agent_process;
pub mod binaries;
pub mod cleanup;
mod in_process;

pub use agent_process::AgentProcess;
pub use in_process::{InProcessAgent, node_context};

/// A runtime whose compiled components are cached where every test and bench of this
/// target directory shares them, and whose tasks are started by `berth-keeper`, as the
/// agent's are.
pub fn runtime() -> berth_runtime::Runtime {
    berth_runtime::Runtime::with_processes(
        berth_runtime::RuntimeConfig::new(Some(binaries::component_cache())),
        processes(),
    )
    .expect("the test runtime starts")
}

/// A process table whose tasks are started by `berth-keeper`, as the agent's are.
pub fn processes() -> std::sync::Arc<berth_sys::process::ProcessTable> {
    std::sync::Arc::new(
        berth_sys::process::ProcessTable::default().supervised_by(binaries::berth_keeper()),
    )
}
