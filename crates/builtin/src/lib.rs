//! The first-party drivers, compiled from `drivers/` by the build script and embedded,
//! so the agent works with no configuration.

mod guests {
    include!(concat!(env!("OUT_DIR"), "/guests.rs"));
}

#[doc(hidden)]
pub use guests::test_components;

/// Where the build script wrote `guests.rs`: `host/tests/floors.rs` reads the included
/// module from there, so that no code of this crate goes unchecked.
#[doc(hidden)]
pub const OUT_DIR: &str = env!("OUT_DIR");

/// The embedded drivers, by the name they are expected to report.
pub const DRIVERS: &[(&str, &[u8])] = &[
    ("exec", guests::EXEC),
    ("raw_exec", guests::RAW_EXEC),
    ("docker", guests::DOCKER),
    ("mock", guests::MOCK),
];
