//! berth: a node agent whose task drivers and lifecycle hooks are WebAssembly
//! components. See ARCHITECTURE.md for the map.

pub mod builtin;
pub mod cli;
pub mod driver_set;
pub mod host_api;
pub mod mount;
pub mod process;
pub mod runtime;
