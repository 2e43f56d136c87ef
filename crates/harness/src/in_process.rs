//! The agent in the test's own process, for the tests that read it directly rather than
//! through its API, and what one alloc runner shares for those that run runners alone.

use std::path::Path;
use std::sync::Arc;

use berth_client::agent::{Agent, AgentOptions, StartError, StateLocation};
use berth_client::alloc_runner::NodeContext;
use berth_client::config::AgentConfig;
use berth_client::driver_set::DriverSet;
use berth_client::hook_set::HookSet;
use berth_state::StateStore;

use crate::cleanup;

/// An agent started in this process on a data dir of its own, with its state in memory.
/// Dropping it removes what its allocs left: an alloc's disk (an image mounted in the
/// data dir) and its cgroups outlive the agent by design.
pub struct InProcessAgent {
    agent: Arc<Agent>,
    dir: tempfile::TempDir,
}

impl InProcessAgent {
    /// Starts an agent with the built-in drivers (loaded with [`crate::runtime`]) and
    /// no hooks. `prefix` names its temp dir after the test.
    pub async fn start(prefix: &str, config: AgentConfig) -> Result<InProcessAgent, StartError> {
        let (drivers, _) = DriverSet::load(&crate::runtime(), None, &Default::default()).await;
        Self::start_with(prefix, config, drivers, HookSet::default()).await
    }

    /// Starts an agent with the given drivers and hooks.
    pub async fn start_with(
        prefix: &str,
        config: AgentConfig,
        drivers: DriverSet,
        hooks: HookSet,
    ) -> Result<InProcessAgent, StartError> {
        // The reader the `berth` binary installs at its start.
        berth_jobspec_hcl::install();
        let dir = tempfile::Builder::new()
            .prefix(prefix)
            .tempdir_in("/tmp")
            .expect("/tmp is writable");
        let agent = Agent::start(AgentOptions {
            data_dir: dir.path().to_path_buf(),
            config,
            drivers,
            hooks,
            state: StateLocation::Memory,
        })
        .await?;
        Ok(InProcessAgent { agent, dir })
    }

    pub fn agent(&self) -> &Arc<Agent> {
        &self.agent
    }

    /// The agent's data dir.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl std::ops::Deref for InProcessAgent {
    type Target = Agent;

    fn deref(&self) -> &Agent {
        &self.agent
    }
}

impl Drop for InProcessAgent {
    fn drop(&mut self) {
        cleanup::remove_alloc_networks(self.dir.path());
        cleanup::unmount_everything_under(self.dir.path());
        cleanup::remove_task_cgroups(self.dir.path());
    }
}

/// What the alloc runners of one node share, for tests and benches that run runners
/// without an agent: the host's cgroups, plain directories for the allocs' disks, no
/// Consul, no hooks, the default dynamic user id range, the node's own facts.
pub fn node_context(
    data_dir: &Path,
    drivers: DriverSet,
    config: Arc<AgentConfig>,
    store: Arc<StateStore>,
    cgroups: &berth_sys::cgroup::Cgroups,
) -> NodeContext {
    let (events, _) = tokio::sync::broadcast::channel(1024);
    NodeContext {
        csi: berth_csi::CsiNode::start(data_dir, store.clone(), Default::default()),
        sys: Arc::new(berth_sys::LinuxSys::new(cgroups.clone())),
        data_dir: data_dir.to_path_buf(),
        drivers,
        hooks: HookSet::default(),
        config,
        store,
        events,
        services: Arc::new(berth_client::consul::ServiceClient::disabled()),
        identities: Arc::new(berth_client::identity::Keyring::detached()),
        dynamic_users: Arc::new(berth_sys::process::dynamic_users::DynamicUsers::new(
            berth_client::config::DEFAULT_DYNAMIC_RANGE,
        )),
        facts: berth_client::node::facts(&Default::default()),
    }
}
