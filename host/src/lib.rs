//! berth: a node agent whose task drivers and lifecycle hooks are WebAssembly
//! components. See ARCHITECTURE.md for the map.

pub mod agent;
pub mod alloc_runner;
pub mod api;
pub mod builtin;
pub mod catalog;
pub mod cli;
pub mod cluster;
pub mod config;
pub mod consul;
pub mod csi;
pub mod driver_set;
pub mod hook_set;
pub mod node;
pub mod runtime;
pub mod state;
pub mod task_runner;
pub mod telemetry;
pub mod validate;
