//! End-to-end tests: real components built from `drivers/`, real processes, real mount
//! namespaces and bind mounts (the tests run as root), real gRPC where it is compared.
//!
//! One test binary with a module per area, as wasmtime does.

mod fixture_bins;
mod support;

mod agent;
mod agent_limits;
mod alloc_actions;
mod alloc_exec;
mod artifacts;
mod bridge_network;
mod checks;
mod cli;
mod cli_hostile;
mod cluster;
mod cluster_csi;
mod cluster_launched;
mod cluster_reschedule;
mod cluster_secure;
mod cluster_system;
mod confinement;
mod consul;
mod crash_points;
mod csi;
mod csi_client;
mod disk_limits;
mod docker;
mod docker_network;
mod drivers;
mod dynamic_users;
mod evaluations;
mod front_door;
mod group_network;
mod hooks;
mod hostile;
mod hostile_jobspecs;
mod identity;
mod isolation;
mod job_owners;
mod job_shares;
mod jobs;
mod js_driver;
mod launched_jobs;
mod logs;
mod metrics;
mod nomad_api;
mod nomad_cli;
mod nomad_contract;
mod nomad_jobspecs;
mod nomad_streams;
mod one_node_shape;
mod planted_links;
mod plugin_grants;
mod readme_curl;
mod scenarios;
mod sdk_out_of_tree;
mod shutdown;
mod slots;
mod system_jobs;
mod task_users;
mod templates;
mod templates_consul;
mod two_agents;
mod warden_attacks;
