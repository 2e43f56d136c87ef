//! What can go wrong with a driver, phrased for the person reading it.

use std::time::Duration;

use crate::sandbox::Fault;

/// A driver component could not be loaded. Names the file (or "built-in").
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{origin}: cannot read the driver: {source}")]
    Read {
        origin: String,
        source: std::io::Error,
    },
    #[error("{origin}: not a valid WebAssembly component: {reason}")]
    Invalid { origin: String, reason: String },
    #[error("{origin}: not a berth task driver: {reason}")]
    WrongWorld { origin: String, reason: String },
    /// Refused before it was compiled: what it imports or exports is not what this agent
    /// offers a task driver.
    #[error("{origin}: {mismatch}")]
    Mismatch {
        origin: String,
        mismatch: crate::component_check::Mismatch,
    },
    #[error("{origin}: {source}")]
    Call {
        origin: String,
        source: Box<DriverError>,
    },
    #[error("{origin}: the driver reported an unusable {problem}")]
    Nonsense { origin: String, problem: String },
    #[error(
        "{origin}: driver {name:?} is pinned to sha256 {pinned}, but this file is sha256 \
         {actual}: refused (update the pin if the new file is approved)"
    )]
    DigestMismatch {
        origin: String,
        name: String,
        pinned: String,
        actual: String,
    },
    #[error(
        "{origin}: sha256 {actual} is not pinned by any plugin block, and require_pinned = true \
         refuses unpinned components: add plugin \"<name>\" {{ sha256 = \"{actual}\" }} if it \
         is approved"
    )]
    Unpinned { origin: String, actual: String },
    #[error(
        "{origin}: this file's digest is pinned for driver {pinned_as:?}, but it calls itself \
         {name:?}: refused"
    )]
    PinnedUnderOtherName {
        origin: String,
        name: String,
        pinned_as: String,
    },
}

/// A call into a loaded driver failed. `driver` reads `driver "name" (origin)`.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    /// The guest itself returned an error: its message is for the user.
    #[error("{driver}: {call}: {message}")]
    Refused {
        driver: String,
        call: &'static str,
        message: String,
    },
    /// The sandbox stopped the guest.
    #[error("{driver} {fault} (during {call})")]
    Fault {
        driver: String,
        call: &'static str,
        fault: Fault,
    },
    /// The guest asked the host for something it may not have.
    #[error("{driver} was refused during {call}: {violation}")]
    Violation {
        driver: String,
        call: &'static str,
        violation: String,
    },
    /// The guest returned something the host cannot use.
    #[error("{driver} returned {problem} from {call}")]
    Nonsense {
        driver: String,
        call: &'static str,
        problem: String,
    },
    #[error("{driver} did not finish {call} within {limit:?}")]
    WallTimeout {
        driver: String,
        call: &'static str,
        limit: Duration,
    },
}
