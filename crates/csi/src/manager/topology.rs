//! Where a volume can be used: CSI topologies.

use std::collections::BTreeMap;

/// Whether a volume accessible from `accessible` (any one of them; none: anywhere) can be
/// used on a node at `node` (CSI: a topology matches when all its segments do).
pub(super) fn accessible_from(
    accessible: &[BTreeMap<String, String>],
    node: &BTreeMap<String, String>,
) -> bool {
    accessible.is_empty()
        || accessible
            .iter()
            .any(|topology| topology.iter().all(|(k, v)| node.get(k) == Some(v)))
}

/// `{zone=a, rack=r1}`; `{}` for none.
pub(super) fn segments(topology: &BTreeMap<String, String>) -> String {
    let pairs: Vec<String> = topology.iter().map(|(k, v)| format!("{k}={v}")).collect();
    format!("{{{}}}", pairs.join(", "))
}
