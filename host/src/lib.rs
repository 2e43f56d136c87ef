//! berth: a node agent whose task drivers and lifecycle hooks are WebAssembly
//! components. This package is the top of it: the command line (`cli`), the `berth` and
//! `berth-keeper` binaries, the end-to-end tests and the benches. What it stands on is in
//! `crates/` (the client in `berth-client`, the HTTP API in `berth-api`); see
//! ARCHITECTURE.md for the map.

pub mod cli;
