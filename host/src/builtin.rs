//! The first-party drivers, compiled from `drivers/` by the build script and embedded,
//! so the agent works with no configuration.

mod guests {
    include!(concat!(env!("OUT_DIR"), "/guests.rs"));
}

#[doc(hidden)]
pub use guests::test_components;

/// The embedded drivers, by the name they are expected to report.
pub const DRIVERS: &[(&str, &[u8])] = &[
    ("exec", guests::EXEC),
    ("raw_exec", guests::RAW_EXEC),
    ("mock", guests::MOCK),
];
