//! The berth client: what runs a node's workloads, as a Nomad client does. The agent
//! (`agent`) is a member of a cluster (`berth-cluster`: etcd's, or its own one-node cluster on
//! the embedded store) and runs the allocs placed on its node through alloc and task
//! runners (`alloc_runner`, `task_runner`) and their hooks, with task drivers and hooks
//! that are WebAssembly components (loaded by `berth-runtime`, held in `driver_set` and
//! `hook_set`), CSI volumes (through `berth-csi`, with the catalog of `berth-state`),
//! Consul services (`consul`), its state file (`berth-state`) and its config (`config`).
//!
//! Its modules stand on floors, drawn in ARCHITECTURE.md and held by
//! `host/tests/floors.rs`: a module imports only from floors below its own.

pub mod agent;
pub mod alloc_runner;
pub mod checks;
pub mod config;
pub mod consul;
pub mod driver_set;
pub mod hook_set;
pub mod identity;
pub mod images;
pub mod node;
pub mod task_runner;
pub mod validate;
