//! The embedded store answers as etcd does: each case runs against a real etcd and
//! against [`Embedded`], in memory and in a file, and asserts the same answers.

use std::time::Duration;

use super::embedded::Embedded;
use super::etcd::{Change, Condition, Etcd, Write};
use super::etcd_access::EtcdAccess;
use super::store::Store;
use berth_testkit::etcd::EtcdServer;

/// The stores under test: (name, store, what keeps it alive).
fn stores(server: &EtcdServer) -> Vec<(&'static str, Store, Option<tempfile::TempDir>)> {
    let dir = tempfile::tempdir().unwrap();
    let file = Embedded::open(&dir.path().join("cluster.db")).unwrap();
    vec![
        (
            "etcd",
            Store::from(
                Etcd::connect(&EtcdAccess::from_settings(&server.settings("/berth")).unwrap())
                    .unwrap(),
            ),
            None,
        ),
        (
            "memory",
            Store::embedded(Embedded::in_memory()).unwrap(),
            None,
        ),
        ("file", Store::embedded(file).unwrap(), Some(dir)),
    ]
}

/// Runs `case` on each store under test, with its own key prefix (`/<tag>-<store>`), and
/// asserts that each embedded store answers as etcd did: etcd's answer.
fn answered_alike<F, A>(tag: &str, case: F) -> String
where
    F: Fn(Store, String) -> A,
    A: std::future::Future<Output = Result<String, super::etcd::EtcdError>> + Send + 'static,
{
    let server = EtcdServer::start();
    let mut answers: Vec<(&str, String)> = Vec::new();
    for (name, store, _keep) in stores(&server) {
        // A case is a scenario of many calls and watches, not one call: it runs on the
        // store's runtime without `Store::block`'s bound of one call (10 s), which a
        // scenario with three watches passed on a loaded two-core machine.
        let (sender, answered) = std::sync::mpsc::sync_channel(1);
        let case = case(store.clone(), format!("/{tag}-{name}"));
        store.spawn(async move {
            let _ = sender.send(case.await);
        });
        let answer = answered
            .recv_timeout(Duration::from_secs(120))
            .unwrap_or_else(|_| panic!("{name}: the case did not end within 120 s"))
            .unwrap();
        answers.push((name, answer));
    }
    for (name, answer) in &answers[1..] {
        assert_eq!(answer, &answers[0].1, "{name} answers unlike etcd");
    }
    answers.swap_remove(0).1
}

fn put(key: &str, value: &str, lease: i64) -> Write {
    Write::Put {
        key: key.into(),
        value: value.as_bytes().to_vec(),
        lease,
    }
}

/// Revisions seen by a case, made relative to the store's revision at its start.
fn relative(revisions: &[i64], start: i64) -> Vec<i64> {
    revisions.iter().map(|r| r - start).collect()
}

#[test]
fn keys_revisions_and_transactions_answer_as_etcd_does() {
    let answer = answered_alike("conf", |s, p| async move {
        let start = s.revision(&p).await?;
        s.put(&format!("{p}/a"), b"1".to_vec(), 0).await?;
        s.put(&format!("{p}/a"), b"2".to_vec(), 0).await?;
        s.put(&format!("{p}/b"), b"x".to_vec(), 0).await?;
        // Outside the prefix: not listed.
        s.put(&format!("{p}c"), b"y".to_vec(), 0).await?;
        let a = s.get(&format!("{p}/a")).await?.unwrap();
        let (listed, at) = s.list(&format!("{p}/")).await?;
        // Create-if-absent holds once; a value condition; a stale revision.
        let created = [
            s.transaction(
                vec![Condition::ModRevision(format!("{p}/n"), 0)],
                vec![put(&format!("{p}/n"), "first", 0)],
            )
            .await?,
            s.transaction(
                vec![Condition::ModRevision(format!("{p}/n"), 0)],
                vec![put(&format!("{p}/n"), "second", 0)],
            )
            .await?,
            s.transaction(
                vec![Condition::ValueIs(format!("{p}/n"), b"first".to_vec())],
                vec![
                    put(&format!("{p}/n"), "third", 0),
                    Write::Delete(format!("{p}/b")),
                ],
            )
            .await?,
            s.transaction(
                vec![Condition::ModRevision(format!("{p}/a"), a.mod_revision - 1)],
                vec![Write::Delete(format!("{p}/a"))],
            )
            .await?,
        ];
        let before_noop = s.revision(&p).await?;
        // Deleting what is not there changes nothing, not even the revision.
        s.delete(&format!("{p}/missing")).await?;
        let after_noop = s.revision(&p).await?;
        let n = s.get(&format!("{p}/n")).await?.unwrap();
        let gone = s.get(&format!("{p}/b")).await?;
        Ok::<_, super::etcd::EtcdError>(format!(
            "a={} mod={:?} create={:?} listed={:?} at={:?} created={created:?} \
             noop_moved={} n={} n_mod={:?} n_create={:?} b={gone:?}",
            String::from_utf8_lossy(&a.value),
            relative(&[a.mod_revision], start),
            relative(&[a.create_revision], start),
            listed
                .iter()
                .map(|e| e.key.trim_start_matches(&p).to_string())
                .collect::<Vec<_>>(),
            relative(&[at], start),
            after_noop != before_noop,
            String::from_utf8_lossy(&n.value),
            relative(&[n.mod_revision], start),
            relative(&[n.create_revision], start),
        ))
    });
    assert!(
        answer.starts_with("a=2 mod=[2] create=[1] listed=[\"/a\", \"/b\"] at=[4]"),
        "{}",
        answer
    );
}

#[test]
fn leased_keys_go_with_their_lease_and_watches_see_it_in_order() {
    let answer = answered_alike("lease", |s, p| async move {
        let start = s.revision(&p).await?;
        s.put(&format!("{p}/before"), b"0".to_vec(), 0).await?;
        let mut live = s.watch(&format!("{p}/"), 0);
        let mut replay = s.watch(&format!("{p}/"), start + 1);
        let lease = s.grant_lease(Duration::from_secs(30)).await?;
        s.put(&format!("{p}/mine"), b"1".to_vec(), lease).await?;
        let alive = s.keep_alive_once(lease).await?;
        let unknown = s.put(&format!("{p}/x"), b"1".to_vec(), lease + 777).await;
        s.revoke_lease(lease).await?;
        let gone = s.get(&format!("{p}/mine")).await?.is_none();
        s.put(&format!("{p}/after"), b"2".to_vec(), 0).await?;
        let mut seen = Vec::new();
        for watch in [&mut live, &mut replay] {
            let mut changes = Vec::new();
            while changes.len() < 4 {
                let next = tokio::time::timeout(Duration::from_secs(5), watch.recv()).await;
                match next {
                    Ok(Some(Change::Put(e))) => {
                        changes.push(format!("put {}", e.key.trim_start_matches(&p)))
                    }
                    Ok(Some(Change::Delete { key, .. })) => {
                        changes.push(format!("delete {}", key.trim_start_matches(&p)))
                    }
                    Ok(Some(Change::Reset)) => changes.push("reset".into()),
                    _ => break,
                }
            }
            seen.push(changes);
        }
        Ok::<_, super::etcd::EtcdError>(format!(
            "alive={alive} unknown_refused={} gone={gone} live={:?} replay={:?}",
            unknown.is_err(),
            seen[0],
            seen[1]
        ))
    });
    assert_eq!(
        answer,
        "alive=true unknown_refused=true gone=true \
         live=[\"put /mine\", \"delete /mine\", \"put /after\"] \
         replay=[\"put /before\", \"put /mine\", \"delete /mine\", \"put /after\"]"
    );
}

/// The scheduler's leader plans only whole transactions (a job with its evaluation):
/// its watch ends each revision's changes with [`Change::Revision`], live and replayed
/// (also when etcd hands several revisions in one response), on etcd as on the embedded
/// store; a plain watch has none.
#[test]
fn a_watch_of_whole_revisions_ends_each_transaction_with_its_revision() {
    let answer = answered_alike("whole", |s, p| async move {
        let start = s.revision(&p).await?;
        // Live watches, made before the writes from the next revision on: a watch "from
        // now" (revision 0) is made on etcd's side a moment after the call returns, so
        // it may miss writes made at once (as the agent's callers know: they all watch
        // from a revision they read).
        let mut whole = s.watch_whole_revisions(&format!("{p}/"), start + 1);
        let mut plain = s.watch(&format!("{p}/"), start + 1);
        // One transaction of three keys, one of them outside the prefix (in
        // key order: etcd tells a transaction's changes in the order written,
        // the embedded store in key order).
        s.transaction(
            Vec::new(),
            vec![
                put(&format!("{p}/eval"), "e", 0),
                put(&format!("{p}/job"), "j", 0),
                put(&format!("{p}-other"), "o", 0),
            ],
        )
        .await?;
        s.put(&format!("{p}/report"), b"r".to_vec(), 0).await?;
        // Outside the prefix alone: no revision told.
        s.put(&format!("{p}-other"), b"o2".to_vec(), 0).await?;
        s.delete(&format!("{p}/job")).await?;
        // Made after the writes, from before them: etcd hands a lagging watcher several
        // revisions in one response, and each still ends with its own marker.
        let mut late = s.watch_whole_revisions(&format!("{p}/"), start + 1);
        let mut seen = Vec::new();
        for (watch, count) in [(&mut whole, 7), (&mut plain, 4), (&mut late, 7)] {
            let mut changes = Vec::new();
            while changes.len() < count {
                let next = tokio::time::timeout(Duration::from_secs(5), watch.recv()).await;
                match next {
                    Ok(Some(Change::Put(e))) => changes.push(format!(
                        "put {}@{}",
                        e.key.trim_start_matches(&p),
                        e.mod_revision - start
                    )),
                    Ok(Some(Change::Delete { key, mod_revision })) => changes.push(format!(
                        "delete {}@{}",
                        key.trim_start_matches(&p),
                        mod_revision - start
                    )),
                    Ok(Some(Change::Revision(r))) => changes.push(format!("whole@{}", r - start)),
                    Ok(Some(Change::Reset)) => changes.push("reset".into()),
                    _ => break,
                }
            }
            // Nothing more comes: a plain watch is told no revision after all.
            if tokio::time::timeout(Duration::from_millis(200), watch.recv())
                .await
                .is_ok()
            {
                changes.push("more".into());
            }
            seen.push(changes);
        }
        Ok::<_, super::etcd::EtcdError>(format!(
            "whole={:?} plain={:?} late={:?}",
            seen[0], seen[1], seen[2]
        ))
    });
    assert_eq!(
        answer,
        "whole=[\"put /eval@1\", \"put /job@1\", \"whole@1\", \"put /report@2\", \"whole@2\", \
         \"delete /job@4\", \"whole@4\"] \
         plain=[\"put /eval@1\", \"put /job@1\", \"put /report@2\", \"delete /job@4\"] \
         late=[\"put /eval@1\", \"put /job@1\", \"whole@1\", \"put /report@2\", \"whole@2\", \
         \"delete /job@4\", \"whole@4\"]"
    );
}

#[test]
fn one_leader_at_a_time_and_the_next_one_after_it_resigns() {
    let server = EtcdServer::start();
    for (name, store, _keep) in stores(&server) {
        let s = store.clone();
        let answer = store
            .block(async move {
                let election = format!("/elect-{name}");
                let (first_lease, second_lease) = (
                    s.grant_lease(Duration::from_secs(30)).await?,
                    s.grant_lease(Duration::from_secs(30)).await?,
                );
                let first = s.campaign(&election, first_lease, "one").await?;
                // A write guarded by the leader key's revision holds while it leads.
                let guard = || {
                    vec![Condition::ModRevision(
                        String::from_utf8_lossy(&first.key).into_owned(),
                        first.rev,
                    )]
                };
                let while_leading = s
                    .transaction(guard(), vec![put(&format!("{election}-x"), "1", 0)])
                    .await?;
                let waiting = tokio::spawn({
                    let (s, election) = (s.clone(), election.clone());
                    async move { s.campaign(&election, second_lease, "two").await }
                });
                tokio::time::sleep(Duration::from_millis(300)).await;
                let while_first = (s.leader(&election).await?, waiting.is_finished());
                s.resign(first.clone()).await?;
                let after_resigning = s
                    .transaction(guard(), vec![put(&format!("{election}-x"), "2", 0)])
                    .await?;
                let second = tokio::time::timeout(Duration::from_secs(5), waiting).await;
                let elected = matches!(second, Ok(Ok(Ok(_))));
                let after = s.leader(&election).await?;
                Ok::<_, super::etcd::EtcdError>(format!(
                    "{while_first:?} guarded={while_leading}/{after_resigning} \
                     elected={elected} after={after:?}"
                ))
            })
            .unwrap();
        assert_eq!(
            answer, "(Some(\"one\"), false) guarded=true/false elected=true after=Some(\"two\")",
            "{name}"
        );
    }
}

#[test]
fn the_file_keeps_its_keys_and_revision_and_no_lease_outlives_the_process() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cluster.db");
    let revision = {
        let store = Store::embedded(Embedded::open(&path).unwrap()).unwrap();
        let s = store.clone();
        store
            .block(async move {
                let lease = s.grant_lease(Duration::from_secs(10)).await?;
                s.put("/p/kept", b"1".to_vec(), 0).await?;
                s.put("/p/leased", b"2".to_vec(), lease).await?;
                s.revision("/p").await
            })
            .unwrap()
    };
    let store = Store::embedded(Embedded::open(&path).unwrap()).unwrap();
    let s = store.clone();
    let (kept, leased, again) = store
        .block(async move {
            Ok::<_, super::etcd::EtcdError>((
                s.get("/p/kept").await?,
                s.get("/p/leased").await?,
                s.revision("/p").await?,
            ))
        })
        .unwrap();
    assert_eq!(kept.map(|e| e.value), Some(b"1".to_vec()));
    assert_eq!(leased, None, "a leased key outlived its process");
    // The leased key's removal is a revision of its own.
    assert_eq!(again, revision + 1);
    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
}

#[test]
fn a_watcher_too_slow_to_keep_up_is_reset_and_then_follows_again() {
    let store = Store::embedded(Embedded::in_memory()).unwrap();
    let s = store.clone();
    let seen = store
        .block(async move {
            let mut slow = s.watch("/w/", 0);
            for i in 0..1100 {
                s.put(&format!("/w/{i}"), b"x".to_vec(), 0).await?;
            }
            let mut resets = 0;
            let mut puts = 0;
            // Drain what was queued, then one more change must still arrive.
            while let Ok(Some(change)) =
                tokio::time::timeout(Duration::from_millis(300), slow.recv()).await
            {
                match change {
                    Change::Reset => resets += 1,
                    _ => puts += 1,
                }
            }
            s.put("/w/last", b"x".to_vec(), 0).await?;
            let last = tokio::time::timeout(Duration::from_secs(2), slow.recv()).await;
            Ok::<_, super::etcd::EtcdError>((
                resets,
                puts,
                matches!(last, Ok(Some(Change::Put(_)))),
            ))
        })
        .unwrap();
    assert_eq!(seen.0, 1, "one reset: {seen:?}");
    assert!(seen.1 >= 1024 && seen.1 < 1100, "{seen:?}");
    assert!(seen.2, "the watch went quiet after its reset");
}
