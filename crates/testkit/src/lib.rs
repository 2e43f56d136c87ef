//! What berth's tests and benches share, and no product crate uses (`cargo tree -e
//! normal` shows none depending on it): fakes of the agent's seams, so the runners'
//! logic is tested without root, and harnesses of the real peers the tests start.
//!
//! - [`fake_sys`]: a `Sys` that records every privileged call instead of making it.
//! - [`etcd`]: a real etcd on loopback, plain or secured (TLS, client certificates,
//!   auth) as an operator would, which can be stopped, restarted and frozen.
//! - [`consul`]: a double of Consul's HTTP API (Consul cannot be installed here), as
//!   strict as the real one: its refusals and its ACL filtering included.
//! - [`file_server`]: a loopback HTTP server of fixed answers (artifacts).
//! - [`net`]: the host's address, and an HTTP GET to a forwarded port.
//! - [`registry`]: a real OCI registry on loopback, and images built and pushed with
//!   `umoci` and `skopeo`.
//! - [`nomad_fixtures`]: Nomad's documented JSON shapes and the comparison that holds
//!   berth's answers and types to them.

pub mod consul;
pub mod etcd;
pub mod fake_sys;
pub mod file_server;
pub mod net;
pub mod nomad_fixtures;
pub mod registry;

pub use fake_sys::FakeSys;
