//! Placement of groups that use CSI volumes: only where the volume's plugin has a
//! healthy node part, and a clear reason per node otherwise.

use super::tests::tests_support::*;
use super::*;
use crate::state::CsiView;

const USES_SHARED: &str = "volume \"v\" {\n      type   = \"csi\"\n      source = \"shared\"\n      access_mode = \"single-node-writer\"\n      attachment_mode = \"file-system\"\n    }";

fn csi(nodes: &[(&str, bool)]) -> CsiView {
    let mut view = CsiView::default();
    view.volume_plugins
        .insert("shared".into(), "hostpath".into());
    view.node_plugins.insert(
        "hostpath".into(),
        nodes
            .iter()
            .map(|(node, healthy)| (node.to_string(), *healthy))
            .collect(),
    );
    view
}

#[test]
fn a_group_with_a_csi_volume_goes_only_where_its_plugin_has_a_healthy_node_part() {
    let snapshot = Snapshot {
        jobs: vec![job("writer", 1, USES_SHARED)],
        nodes: vec![
            node("a", 4000, 4096),
            node("b", 4000, 4096),
            node("c", 4000, 4096),
        ],
        csi: csi(&[("b", true), ("c", false)]),
        ..Snapshot::default()
    };
    let planned = plan(&snapshot, 1);
    assert_eq!(planned.place.len(), 1, "{planned:#?}");
    assert_eq!(planned.place[0].node_id, "id-b");

    // Nowhere healthy: blocked, with each node's reason in Nomad's words.
    let snapshot = Snapshot {
        csi: csi(&[("c", false)]),
        ..snapshot
    };
    let planned = plan(&snapshot, 1);
    assert!(planned.place.is_empty(), "{planned:#?}");
    let why = &planned.blocked[0].why;
    assert!(
        why.contains("CSI plugin \"hostpath\" is missing from client (2)")
            && why.contains("CSI plugin \"hostpath\" is unhealthy on client (1)"),
        "{why}"
    );

    // A volume the cluster does not know rules out every node.
    let snapshot = Snapshot {
        csi: CsiView::default(),
        ..snapshot
    };
    let planned = plan(&snapshot, 1);
    assert!(
        planned.blocked[0]
            .why
            .contains("missing CSI Volume \"shared\" (3)"),
        "{}",
        planned.blocked[0].why
    );
}
