//! The bottom floor: plain domain types that every other module shares (alloc and task
//! states, task events, driver capabilities and handles, mounts, CSI modes and
//! settings, hook settings, task limits) and the one parser of sizes and durations.
//!
//! **Architecture Invariant:** `model` imports nothing from the rest of the host, and
//! nothing here does I/O, calls a syscall, or knows a wire format (WIT, protobuf): the
//! conversions to those live with the module that speaks them (`runtime`, `csi`). The
//! floors test (`host/tests/floors.rs`) enforces the first half.

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
pub mod text;
pub mod units;
pub mod usage;
