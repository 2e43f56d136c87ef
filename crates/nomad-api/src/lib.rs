//! Nomad's HTTP API shapes, one Rust type per struct of Nomad's Go `api` package that
//! berth answers with, with Nomad's field names (PascalCase, `ID`, `JobID`, …) and
//! JSON types. The handlers in `berth-api` build these, the CLI reads them, and a test
//! here holds them against the contract fixtures (`tests/fixtures/nomad/`).
//!
//! Every type serializes every field, as Nomad's Go structs do: what berth has no
//! value for is Nomad's empty value (`""`, `0`, `{}`, `[]` or `null`), never invented.
//! Every type reads leniently, as Go's decoder does: a field an older or newer Nomad
//! leaves out reads as empty (`#[serde(default)]`), a list or map Go wrote as `null`
//! reads as empty ([`null_as_empty`]), and a field these types do not name is ignored.
//!
//! The types hold no berth logic: turning berth's own records into them is the
//! handlers' work (`berth-api`'s `nomad/shapes.rs`).

pub mod agent;
pub mod allocs;
pub mod csi;
pub mod evals;
pub mod exec;
pub mod jobs;
pub mod nodes;
pub mod services;
pub mod stats;

/// The namespace every object is in: berth has one.
pub const NAMESPACE: &str = "default";
/// The region every object is in: berth's cluster is one region.
pub const REGION: &str = "global";

/// Free-form maps (meta, env, a driver's config keys) keep their keys sorted.
pub type Map<V> = std::collections::BTreeMap<String, V>;

/// Reads a list or map that Go wrote as `null` (a nil slice or map) as empty: Nomad's
/// answers and requests are full of them.
pub(crate) fn null_as_empty<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Default + serde::Deserialize<'de>,
{
    use serde::Deserialize as _;
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

/// The fields Nomad's server adds to the body of an answer (`structs.QueryMeta`):
/// the index it was answered at, and that the agent knows its leader.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct QueryMeta {
    pub index: u64,
    pub last_contact: u64,
    pub known_leader: bool,
}

impl QueryMeta {
    /// A write answered at `index`.
    pub fn at(index: u64) -> QueryMeta {
        QueryMeta {
            index,
            last_contact: 0,
            known_leader: true,
        }
    }
}

/// An answer with no fields (`{}`), as Nomad gives to a delete or a client action.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Empty {}

#[cfg(test)]
mod fixtures;
