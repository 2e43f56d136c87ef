//! The state store: round trips, lazy and durable commits, unreadable records kept.

use super::*;
use berth_model::events::{EventKind, TaskEvent};

fn alloc(id: &str) -> AllocRecord {
    AllocRecord {
        id: id.to_string(),
        job_id: "web".to_string(),
        group_index: 0,
        alloc_index: 0,
        name: "web.g[0]".to_string(),
        desired_status: DesiredStatus::Run,
        client_status: ClientStatus::Running,
        ports: Default::default(),
    }
}

#[test]
fn records_survive_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    {
        let (store, outcome) = StateStore::open(&path).unwrap();
        assert_eq!(outcome, OpenOutcome::Created);
        store.put_alloc(&alloc("a1")).unwrap();
        let mut state = TaskState::default();
        state.events.push(TaskEvent::new(EventKind::Started, "go"));
        store
            .put_task_state("a1", "t", &state, Commit::Durable)
            .unwrap();
        let handle = StoredHandle {
            driver: "exec".into(),
            handle: TaskHandle {
                id: "a1/t".into(),
                driver_state: vec![1, 2, 3],
                spawned: Vec::new(),
                ends_with: None,
                ends_at_ms: Some(1_700_000_000_000),
            },
        };
        store
            .put_task_handle("a1", "t", &handle, Commit::Lazy)
            .unwrap();
        store
            .put_hook_state("a1", "csi", b"opaque", Commit::Lazy)
            .unwrap();
        // A lazy commit reaches the disk with the next durable one.
        store.put_alloc(&alloc("a2")).unwrap();
    }
    let (store, outcome) = StateStore::open(&path).unwrap();
    assert_eq!(outcome, OpenOutcome::Opened);
    let (allocs, unreadable) = store.allocs().unwrap();
    assert_eq!(allocs, vec![alloc("a1"), alloc("a2")]);
    assert!(unreadable.is_empty());
    let (states, _) = store.task_states("a1").unwrap();
    assert_eq!(states.len(), 1);
    assert_eq!(states[0].0, "t");
    assert_eq!(states[0].1.events[0].message, "go");
    let handle = store.task_handle("a1", "t").unwrap().unwrap();
    assert_eq!(handle.handle.driver_state, vec![1, 2, 3]);
    assert_eq!(
        store.hook_state("a1", "csi").unwrap().as_deref(),
        Some(&b"opaque"[..])
    );
}

#[test]
fn prefixes_do_not_leak_between_allocs() {
    let store = StateStore::in_memory();
    for id in ["a1", "a10", "a2"] {
        store.put_alloc(&alloc(id)).unwrap();
        store
            .put_task_state(id, "t", &TaskState::default(), Commit::Durable)
            .unwrap();
    }
    assert_eq!(store.task_states("a1").unwrap().0.len(), 1);
    store.remove_alloc("a1").unwrap();
    let ids: Vec<String> = store
        .allocs()
        .unwrap()
        .0
        .into_iter()
        .map(|a| a.id)
        .collect();
    assert_eq!(ids, vec!["a10", "a2"]);
    assert!(store.task_states("a1").unwrap().0.is_empty());
    assert_eq!(store.task_states("a10").unwrap().0.len(), 1);
}

#[test]
fn an_unreadable_record_is_reported_and_kept() {
    let store = StateStore::in_memory();
    store.put_alloc(&alloc("good")).unwrap();
    let txn = store.db.begin_write().unwrap();
    txn.open_table(ALLOCS)
        .unwrap()
        .insert("bad", &b"{not json"[..])
        .unwrap();
    txn.commit().unwrap();
    let (allocs, unreadable) = store.allocs().unwrap();
    assert_eq!(allocs.len(), 1);
    assert_eq!(unreadable.len(), 1);
    assert_eq!(unreadable[0].key, "bad");
    assert!(unreadable[0].to_string().contains("kept as is"));
    // Still there for a later, fixed agent.
    assert!(store.get_bytes(ALLOCS, "bad").unwrap().is_some());
}

#[test]
fn a_garbage_file_is_moved_aside_not_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let garbage = vec![0x5a_u8; 64 * 1024];
    std::fs::write(&path, &garbage).unwrap();
    let (store, outcome) = StateStore::open(&path).unwrap();
    let OpenOutcome::MovedAside { reason, moved_to } = outcome else {
        panic!("expected the file to be moved aside, got {outcome:?}");
    };
    assert!(reason.contains("not a readable state database"), "{reason}");
    assert_eq!(std::fs::read(&moved_to).unwrap(), garbage);
    store.put_alloc(&alloc("fresh")).unwrap();
    assert_eq!(store.allocs().unwrap().0.len(), 1);
}

#[test]
fn a_second_opener_is_told_the_file_is_in_use() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let (_first, _) = StateStore::open(&path).unwrap();
    let error = StateStore::open(&path).unwrap_err();
    assert!(matches!(error, StateError::InUse { .. }), "{error}");
    assert!(error.to_string().contains("another berth agent"));
}
