//! What berth's tests and benches share, and no product crate uses (`cargo tree -e
//! normal` shows none depending on it): fakes of the agent's seams, so the runners'
//! logic is tested without root.
//!
//! - [`fake_sys`]: a `Sys` that records every privileged call instead of making it.

pub mod fake_sys;

pub use fake_sys::FakeSys;
