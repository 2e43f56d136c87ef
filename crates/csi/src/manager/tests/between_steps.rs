//! A crash between two steps: the last step's outcome is recorded and the next step's
//! intent is not written yet, so no intent is pending. The state file is rewritten to
//! what such a crash leaves (the fake cannot stop the manager between two of its own
//! writes), and the plugin's mounts to what the plugin had done by then.

use super::*;

fn controller_unpublish() -> Call {
    Call::ControllerUnpublish {
        volume: EXTERNAL.into(),
        node_id: "fake-node".into(),
    }
}

/// A node where the volume was controller-published and staged, and the agent died
/// before it wrote the publish's intent.
async fn staged_not_yet_published() -> TestNode {
    let node = TestNode::new(FakeIdentity::with_controller());
    let manager = node.manager();
    manager
        .mount_volume("a1", &volume(), usage())
        .await
        .unwrap();
    drop(manager);
    node.rewrite_record(|record| record.stages.clear());
    node.mounts.unmount(&node.host_target("a1"));
    node.plugin.take_volume_calls();
    node
}

#[tokio::test]
async fn a_stage_no_publish_followed_is_unstaged_then_controller_unpublished_by_the_reconcile() {
    let node = staged_not_yet_published().await;
    let manager = reconcile(&node).await;
    assert_eq!(
        node.plugin.take_volume_calls(),
        vec![node.unstage_call(), controller_unpublish()]
    );
    assert!(node.mounts.mounted().is_empty());
    assert!(node.plugin.attached().is_empty());
    assert!(node.record(manager).is_none());
}

/// The alloc's mount runs again instead: the stage and the controller's publication
/// are kept and reused, and only the publish is made.
#[tokio::test]
async fn a_stage_no_publish_followed_is_reused_by_the_next_mount() {
    let node = staged_not_yet_published().await;
    let manager = node.manager();
    manager
        .mount_volume("a1", &volume(), usage())
        .await
        .unwrap();
    assert_eq!(
        node.plugin.take_volume_calls(),
        vec![node.publish_call("a1")]
    );
    assert_eq!(node.mounts.mounted(), node.staged_and_published("a1"));
    let record = node.record(manager).unwrap();
    assert!(record.pending.is_none());
    assert!(record.controller_published.is_some());
}

/// Controller-published, and the agent died before the stage's intent: the reconcile
/// unpublishes at the controller and calls nothing on the node.
#[tokio::test]
async fn a_controller_publication_no_stage_followed_is_unpublished_by_the_reconcile() {
    let node = staged_not_yet_published().await;
    node.rewrite_record(|record| record.staged = None);
    node.mounts.clear();
    let manager = reconcile(&node).await;
    assert_eq!(
        node.plugin.take_volume_calls(),
        vec![controller_unpublish()]
    );
    assert!(node.plugin.attached().is_empty());
    assert!(node.record(manager).is_none());
}
