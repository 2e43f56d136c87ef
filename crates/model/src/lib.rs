//! Under every floor: plain domain types that every other berth crate shares (alloc and task
//! states, task events, driver capabilities and handles, mounts, CSI modes and
//! settings, hook settings, task limits) and the one parser of sizes and durations.
//!
//! **Architecture Invariant:** `model` depends on no other berth crate, and
//! nothing here does I/O, calls a syscall, or knows a wire format (WIT, protobuf): the
//! conversions to those live with the crate that speaks them (`berth-runtime`, `berth-csi`). Its
//! manifest enforces the first half and what it gives out: it depends on no other berth
//! crate, and on no crate but serde, serde_json, sha2 and thiserror, so no public item of it can
//! name a type of rustix, tonic or wasmtime (and Rust allows no inherent method on its
//! types outside it).

pub mod cluster;
pub mod csi;
pub mod driver;
pub mod events;
pub mod hook;
pub mod hook_resources;
pub mod limits;
pub mod mount;
pub mod pins;
pub mod status;
pub mod task_env;
pub mod text;
pub mod units;
pub mod usage;
