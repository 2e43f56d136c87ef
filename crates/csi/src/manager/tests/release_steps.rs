//! Releasing: NodeUnpublish, then NodeUnstage once no alloc uses the stage, each behind
//! a durable intent, and what a fresh manager does with an intent a crash left.

use super::*;
use crate::fake::Answer;
use crate::manager::volumes::Intent;

/// A node with the volume staged and published to `allocs`, and the fake's record of
/// those calls forgotten.
async fn mounted_for(allocs: &[&str]) -> TestNode {
    let node = TestNode::new(FakeIdentity::staging_node());
    let manager = node.manager();
    for alloc in allocs {
        manager
            .mount_volume(alloc, &volume(), usage())
            .await
            .unwrap();
    }
    node.plugin.take_volume_calls();
    node
}

#[tokio::test]
async fn an_unmount_unpublishes_and_unstages_only_after_the_last_alloc() {
    let node = mounted_for(&["a1", "a2"]).await;
    let manager = node.manager();
    manager.unmount_volume("a1", VOLUME, usage()).await.unwrap();
    assert_eq!(
        node.plugin.take_volume_calls(),
        vec![node.unpublish_call("a1")]
    );
    manager.unmount_volume("a2", VOLUME, usage()).await.unwrap();
    assert_eq!(
        node.plugin.take_volume_calls(),
        vec![node.unpublish_call("a2"), node.unstage_call()]
    );
    // Unmounting again is done already: nothing is called.
    manager.unmount_volume("a2", VOLUME, usage()).await.unwrap();
    assert_eq!(node.plugin.take_volume_calls(), vec![]);
    assert!(node.mounts.mounted().is_empty());
    assert!(node.record(manager).is_none());
}

/// The agent dies while NodeUnpublishVolume is in flight, whether or not the plugin
/// unpublished: the alloc's unmount on the next start unpublishes again (the spec makes
/// it idempotent), then unstages, once each.
#[tokio::test]
async fn an_unpublish_cut_short_is_finished_by_the_next_unmount() {
    for answer in [Answer::Hang, Answer::HangAfterActing] {
        let node = mounted_for(&["a1"]).await;
        node.plugin.script("NodeUnpublishVolume", [answer]);
        let manager = node.manager();
        dies_during(manager.unmount_volume("a1", VOLUME, usage())).await;
        let record = node.record(manager).unwrap();
        assert!(
            matches!(record.pending, Some(Intent::Unpublish { .. })),
            "{answer:?}"
        );
        node.plugin.take_volume_calls();

        let manager = node.manager();
        manager.unmount_volume("a1", VOLUME, usage()).await.unwrap();
        assert_eq!(
            node.plugin.take_volume_calls(),
            vec![node.unpublish_call("a1"), node.unstage_call()],
            "{answer:?}"
        );
        assert!(node.mounts.mounted().is_empty(), "{answer:?}");
        assert!(node.record(manager).is_none(), "{answer:?}");
    }
}

/// The same crash, but the alloc is gone by the next start: the reconcile finishes it.
#[tokio::test]
async fn an_unpublish_cut_short_is_finished_by_the_reconcile() {
    let node = mounted_for(&["a1"]).await;
    node.plugin
        .script("NodeUnpublishVolume", [Answer::HangAfterActing]);
    let manager = node.manager();
    dies_during(manager.unmount_volume("a1", VOLUME, usage())).await;
    drop(manager);
    node.plugin.take_volume_calls();

    let manager = reconcile(&node).await;
    assert_eq!(
        node.plugin.take_volume_calls(),
        vec![node.unpublish_call("a1"), node.unstage_call()]
    );
    assert!(node.mounts.mounted().is_empty());
    assert!(node.record(manager).is_none());
}

/// The agent dies while NodeUnstageVolume is in flight: the reconcile unstages again,
/// and nothing is unpublished or staged.
#[tokio::test]
async fn an_unstage_cut_short_is_finished_by_the_reconcile() {
    for answer in [Answer::Hang, Answer::HangAfterActing] {
        let node = mounted_for(&["a1"]).await;
        node.plugin.script("NodeUnstageVolume", [answer]);
        let manager = node.manager();
        dies_during(manager.unmount_volume("a1", VOLUME, usage())).await;
        let record = node.record(manager).unwrap();
        assert_eq!(record.pending, Some(Intent::Unstage), "{answer:?}");
        assert!(
            record.stages.is_empty(),
            "the unpublish's outcome was recorded"
        );
        node.plugin.take_volume_calls();

        let manager = reconcile(&node).await;
        assert_eq!(
            node.plugin.take_volume_calls(),
            vec![node.unstage_call()],
            "{answer:?}"
        );
        assert!(node.mounts.mounted().is_empty(), "{answer:?}");
        assert!(node.record(manager).is_none(), "{answer:?}");
    }
}

/// A failed unstage keeps the stage recorded; the next reconcile tries it again.
#[tokio::test]
async fn a_failed_unstage_is_retried_by_the_reconcile() {
    let node = mounted_for(&["a1"]).await;
    node.plugin.script(
        "NodeUnstageVolume",
        [Answer::Refuse(tonic::Code::FailedPrecondition)],
    );
    let manager = node.manager();
    manager
        .unmount_volume("a1", VOLUME, usage())
        .await
        .unwrap_err();
    assert_eq!(
        node.plugin.take_volume_calls(),
        vec![node.unpublish_call("a1"), node.unstage_call()]
    );
    let record = node.record(manager).unwrap();
    assert!(record.stages.is_empty());
    assert!(record.staged.is_some() || record.pending.is_some());

    let manager = reconcile(&node).await;
    assert_eq!(node.plugin.take_volume_calls(), vec![node.unstage_call()]);
    assert!(node.mounts.mounted().is_empty());
    assert!(node.record(manager).is_none());
}

/// The plugin answers its unpublish with success but leaves the target mounted (it
/// unpublishes only what it recorded): the agent unmounts the target itself before the
/// unstage, so the stage is not pulled from under a bind.
#[tokio::test]
async fn a_target_the_plugin_left_mounted_is_unmounted_before_the_unstage() {
    let node = mounted_for(&["a1"]).await;
    node.plugin
        .script("NodeUnpublishVolume", [Answer::OkButNoEffect]);
    let manager = node.manager();
    manager.unmount_volume("a1", VOLUME, usage()).await.unwrap();
    assert_eq!(
        node.plugin.take_volume_calls(),
        vec![node.unpublish_call("a1"), node.unstage_call()]
    );
    assert_eq!(node.mounts.unmounted_by_agent(), [node.host_target("a1")]);
    assert!(node.mounts.mounted().is_empty());
    assert!(node.record(manager).is_none());
}
