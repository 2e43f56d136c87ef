//! Mounting: NodeStage then NodePublish, each behind a durable intent, and what a fresh
//! manager does with an intent a crash left.

use tonic::Code;

use super::*;
use crate::fake::Answer;
use crate::manager::CsiVolumeError;
use crate::manager::volumes::Intent;

#[tokio::test]
async fn a_mount_stages_once_then_publishes_at_the_plugins_paths_and_records_both() {
    let node = TestNode::new(FakeIdentity::staging_node());
    let manager = node.manager();
    let path = manager
        .mount_volume("a1", &volume(), usage())
        .await
        .unwrap();
    assert_eq!(path, node.host_target("a1"));
    manager
        .mount_volume("a2", &volume(), usage())
        .await
        .unwrap();
    assert_eq!(
        node.plugin.take_volume_calls(),
        vec![
            node.stage_call(),
            node.publish_call("a1"),
            node.publish_call("a2")
        ]
    );
    let record = node.record(manager).unwrap();
    assert!(record.staged.is_some());
    assert!(record.pending.is_none());
    let allocs: Vec<_> = record.stages[&usage().key()]
        .allocs
        .iter()
        .cloned()
        .collect();
    assert_eq!(allocs, ["a1", "a2"]);
}

/// The agent dies while NodeStageVolume is in flight, whether or not the plugin staged.
#[tokio::test]
async fn a_stage_cut_short_is_unstaged_before_the_next_mount_stages_again() {
    for answer in [Answer::Hang, Answer::HangAfterActing] {
        let node = TestNode::new(FakeIdentity::staging_node());
        node.plugin.script("NodeStageVolume", [answer]);
        let manager = node.manager();
        dies_during(manager.mount_volume("a1", &volume(), usage())).await;
        let record = node.record(manager).unwrap();
        assert!(
            matches!(record.pending, Some(Intent::Stage { .. })),
            "{answer:?}"
        );
        assert!(record.staged.is_none());
        node.plugin.take_volume_calls();

        let manager = node.manager();
        manager
            .mount_volume("a1", &volume(), usage())
            .await
            .unwrap();
        assert_eq!(
            node.plugin.take_volume_calls(),
            vec![
                node.unstage_call(),
                node.stage_call(),
                node.publish_call("a1")
            ],
            "{answer:?}: the stage that may have happened is undone first"
        );
        assert_eq!(node.mounts.mounted(), node.staged_and_published("a1"));
        assert!(node.record(manager).unwrap().pending.is_none());
    }
}

/// The agent dies while NodePublishVolume is in flight, and its alloc is not run again:
/// the reconcile unpublishes, then unstages, and forgets the volume.
#[tokio::test]
async fn a_publish_cut_short_is_unpublished_then_unstaged_by_the_reconcile() {
    for answer in [Answer::Hang, Answer::HangAfterActing] {
        let node = TestNode::new(FakeIdentity::staging_node());
        node.plugin.script("NodePublishVolume", [answer]);
        let manager = node.manager();
        dies_during(manager.mount_volume("a1", &volume(), usage())).await;
        let record = node.record(manager).unwrap();
        assert!(
            matches!(record.pending, Some(Intent::Publish { .. })),
            "{answer:?}"
        );
        assert!(record.staged.is_some(), "the stage's outcome was recorded");
        node.plugin.take_volume_calls();

        let manager = reconcile(&node).await;
        assert_eq!(
            node.plugin.take_volume_calls(),
            vec![node.unpublish_call("a1"), node.unstage_call()],
            "{answer:?}"
        );
        assert!(node.mounts.mounted().is_empty(), "{answer:?}");
        assert!(
            node.record(manager).is_none(),
            "{answer:?}: the volume is forgotten"
        );

        // Recovery is done: another restart's reconcile calls nothing.
        let manager = reconcile(&node).await;
        assert_eq!(node.plugin.take_volume_calls(), vec![]);
        drop(manager);
    }
}

/// A publication cut short while another alloc is published from the stage: the
/// reconcile unpublishes it and leaves the stage, which the other alloc still uses.
#[tokio::test]
async fn a_publish_cut_short_never_unstages_under_another_allocs_publication() {
    let node = TestNode::new(FakeIdentity::staging_node());
    let manager = node.manager();
    manager
        .mount_volume("a1", &volume(), usage())
        .await
        .unwrap();
    node.plugin
        .script("NodePublishVolume", [Answer::HangAfterActing]);
    dies_during(manager.mount_volume("a2", &volume(), usage())).await;
    drop(manager);
    node.plugin.take_volume_calls();

    let manager = reconcile(&node).await;
    assert_eq!(
        node.plugin.take_volume_calls(),
        vec![node.unpublish_call("a2")]
    );
    assert_eq!(node.mounts.mounted(), node.staged_and_published("a1"));
    let record = node.record(manager).unwrap();
    assert!(record.pending.is_none());
    assert!(record.staged.is_some());
    let allocs: Vec<_> = record.stages[&usage().key()]
        .allocs
        .iter()
        .cloned()
        .collect();
    assert_eq!(allocs, ["a1"]);
}

/// A refusal (FAILED_PRECONDITION) says the plugin did nothing: nothing is undone, the
/// intent is dropped, and the next mount tries the stage again.
#[tokio::test]
async fn a_refused_stage_is_not_undone_and_the_next_mount_stages_again() {
    let node = TestNode::new(FakeIdentity::staging_node());
    node.plugin.script(
        "NodeStageVolume",
        [Answer::Refuse(Code::FailedPrecondition)],
    );
    let manager = node.manager();
    let error = manager
        .mount_volume("a1", &volume(), usage())
        .await
        .unwrap_err();
    assert!(
        matches!(&error, CsiVolumeError::Rpc(e) if e.code == Code::FailedPrecondition),
        "{error}"
    );
    assert_eq!(node.plugin.take_volume_calls(), vec![node.stage_call()]);

    manager
        .mount_volume("a1", &volume(), usage())
        .await
        .unwrap();
    assert_eq!(
        node.plugin.take_volume_calls(),
        vec![node.stage_call(), node.publish_call("a1")]
    );
    assert!(node.record(manager).unwrap().pending.is_none());
}

/// A publish whose answer was lost (DEADLINE_EXCEEDED) may have happened: the mount
/// fails, and what it did is undone, publication first, then the stage it made.
#[tokio::test]
async fn a_publish_whose_answer_was_lost_is_undone_as_one_that_may_have_happened() {
    let node = TestNode::new(FakeIdentity::staging_node());
    node.plugin
        .script("NodePublishVolume", [Answer::LostAfterActing]);
    let manager = node.manager();
    let error = manager
        .mount_volume("a1", &volume(), usage())
        .await
        .unwrap_err();
    assert!(
        matches!(&error, CsiVolumeError::Rpc(e) if e.outcome_unknown()),
        "{error}"
    );
    assert_eq!(
        node.plugin.take_volume_calls(),
        vec![
            node.stage_call(),
            node.publish_call("a1"),
            node.unpublish_call("a1"),
            node.unstage_call()
        ]
    );
    assert!(node.mounts.mounted().is_empty());
    assert!(node.record(manager).is_none());
}

/// The undo of a lost publish fails too (the plugin went away): the intent stays, the
/// stage is kept (the publication may be there), and the reconcile finishes the undo.
#[tokio::test]
async fn an_undo_that_fails_is_retried_by_the_reconcile() {
    let node = TestNode::new(FakeIdentity::staging_node());
    node.plugin
        .script("NodePublishVolume", [Answer::LostAfterActing]);
    node.plugin
        .script("NodeUnpublishVolume", [Answer::Refuse(Code::Unavailable)]);
    let manager = node.manager();
    manager
        .mount_volume("a1", &volume(), usage())
        .await
        .unwrap_err();
    assert_eq!(
        node.plugin.take_volume_calls(),
        vec![
            node.stage_call(),
            node.publish_call("a1"),
            node.unpublish_call("a1")
        ],
        "no unstage under a publication that may be there"
    );
    let record = node.record(manager).unwrap();
    assert!(matches!(record.pending, Some(Intent::Publish { .. })));
    assert!(record.staged.is_some());

    let manager = reconcile(&node).await;
    assert_eq!(
        node.plugin.take_volume_calls(),
        vec![node.unpublish_call("a1"), node.unstage_call()]
    );
    assert!(node.mounts.mounted().is_empty());
    assert!(node.record(manager).is_none());
}

/// The plugin says it published, but nothing is mounted at the target on the host (its
/// mounts do not propagate): the mount is refused with the reason, and undone.
#[tokio::test]
async fn a_publish_the_host_does_not_see_is_refused_and_undone() {
    let node = TestNode::new(FakeIdentity::staging_node());
    node.plugin
        .script("NodePublishVolume", [Answer::OkButNoEffect]);
    let manager = node.manager();
    let error = manager
        .mount_volume("a1", &volume(), usage())
        .await
        .unwrap_err();
    assert!(
        matches!(error, CsiVolumeError::NotPropagated { .. }),
        "{error}"
    );
    assert_eq!(
        node.plugin.take_volume_calls(),
        vec![
            node.stage_call(),
            node.publish_call("a1"),
            node.unpublish_call("a1"),
            node.unstage_call()
        ]
    );
    assert!(node.record(manager).is_none());
}

/// Recorded as staged, but the host rebooted and the stage is gone: staged again
/// (NodeStageVolume is idempotent) before the publish.
#[tokio::test]
async fn a_stage_the_host_lost_is_made_again() {
    let node = TestNode::new(FakeIdentity::staging_node());
    let manager = node.manager();
    manager
        .mount_volume("a1", &volume(), usage())
        .await
        .unwrap();
    drop(manager);
    node.mounts.clear();
    node.plugin.take_volume_calls();

    let manager = node.manager();
    manager
        .mount_volume("a1", &volume(), usage())
        .await
        .unwrap();
    assert_eq!(
        node.plugin.take_volume_calls(),
        vec![node.stage_call(), node.publish_call("a1")]
    );
    assert_eq!(node.mounts.mounted(), node.staged_and_published("a1"));
    drop(manager);
}
