//! The controller's part of a mount: ControllerPublish before the node's steps and
//! ControllerUnpublish after them, each behind a durable intent.

use super::*;
use crate::fake::Answer;
use crate::manager::volumes::Intent;

fn controller_publish() -> Call {
    Call::ControllerPublish {
        volume: EXTERNAL.into(),
        node_id: "fake-node".into(),
    }
}

fn controller_unpublish() -> Call {
    Call::ControllerUnpublish {
        volume: EXTERNAL.into(),
        node_id: "fake-node".into(),
    }
}

fn attached() -> Vec<(String, String)> {
    vec![(EXTERNAL.into(), "fake-node".into())]
}

#[tokio::test]
async fn a_mount_and_unmount_walk_controller_then_node_steps_and_back() {
    let node = TestNode::new(FakeIdentity::with_controller());
    let manager = node.manager();
    manager
        .mount_volume("a1", &volume(), usage())
        .await
        .unwrap();
    assert_eq!(node.plugin.attached(), attached());
    manager.unmount_volume("a1", VOLUME, usage()).await.unwrap();
    assert_eq!(
        node.plugin.take_volume_calls(),
        vec![
            controller_publish(),
            node.stage_call(),
            node.publish_call("a1"),
            node.unpublish_call("a1"),
            node.unstage_call(),
            controller_unpublish(),
        ]
    );
    assert!(node.plugin.attached().is_empty());
    assert!(node.record(manager).is_none());
}

/// The agent dies while ControllerPublishVolume is in flight: its publish context is
/// lost with it, so the next mount unpublishes at the controller and publishes again.
#[tokio::test]
async fn a_controller_publish_cut_short_is_unpublished_before_the_next_mount() {
    for answer in [Answer::Hang, Answer::HangAfterActing] {
        let node = TestNode::new(FakeIdentity::with_controller());
        node.plugin.script("ControllerPublishVolume", [answer]);
        let manager = node.manager();
        dies_during(manager.mount_volume("a1", &volume(), usage())).await;
        let record = node.record(manager).unwrap();
        assert!(
            matches!(record.pending, Some(Intent::ControllerPublish { .. })),
            "{answer:?}"
        );
        node.plugin.take_volume_calls();

        let manager = node.manager();
        manager
            .mount_volume("a1", &volume(), usage())
            .await
            .unwrap();
        assert_eq!(
            node.plugin.take_volume_calls(),
            vec![
                controller_unpublish(),
                controller_publish(),
                node.stage_call(),
                node.publish_call("a1")
            ],
            "{answer:?}"
        );
        assert_eq!(node.plugin.attached(), attached());
        let record = node.record(manager).unwrap();
        assert!(record.controller_published.is_some());
        assert!(record.pending.is_none());
    }
}

/// A stage cut short on a controller-published volume: the reconcile unstages, then,
/// with no stage left, unpublishes at the controller, in that order.
#[tokio::test]
async fn a_stage_cut_short_is_unstaged_then_controller_unpublished_by_the_reconcile() {
    let node = TestNode::new(FakeIdentity::with_controller());
    node.plugin
        .script("NodeStageVolume", [Answer::HangAfterActing]);
    let manager = node.manager();
    dies_during(manager.mount_volume("a1", &volume(), usage())).await;
    drop(manager);
    node.plugin.take_volume_calls();

    let manager = reconcile(&node).await;
    assert_eq!(
        node.plugin.take_volume_calls(),
        vec![node.unstage_call(), controller_unpublish()]
    );
    assert!(node.mounts.mounted().is_empty());
    assert!(node.plugin.attached().is_empty());
    assert!(node.record(manager).is_none());
}

/// The agent dies while ControllerUnpublishVolume is in flight: the reconcile
/// unpublishes at the controller again and forgets the volume; no node step is redone.
#[tokio::test]
async fn a_controller_unpublish_cut_short_is_finished_by_the_reconcile() {
    for answer in [Answer::Hang, Answer::HangAfterActing] {
        let node = TestNode::new(FakeIdentity::with_controller());
        let manager = node.manager();
        manager
            .mount_volume("a1", &volume(), usage())
            .await
            .unwrap();
        node.plugin.script("ControllerUnpublishVolume", [answer]);
        dies_during(manager.unmount_volume("a1", VOLUME, usage())).await;
        let record = node.record(manager).unwrap();
        assert_eq!(
            record.pending,
            Some(Intent::ControllerUnpublish),
            "{answer:?}"
        );
        node.plugin.take_volume_calls();

        let manager = reconcile(&node).await;
        assert_eq!(
            node.plugin.take_volume_calls(),
            vec![controller_unpublish()],
            "{answer:?}"
        );
        assert!(node.plugin.attached().is_empty(), "{answer:?}");
        assert!(node.record(manager).is_none(), "{answer:?}");
    }
}
