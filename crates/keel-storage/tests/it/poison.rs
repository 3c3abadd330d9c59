//! After a failed commit the store is poisoned: the failing batch, every pending and every
//! later request fail, and `health()` says so.

use keel_storage::StorageError;
use keel_storage::raft_types::Vote;
use keel_types::RangeId;
use openraft::storage::{RaftLogReader, RaftLogStorage, RaftStateMachine};

use super::{append, apply, blank, open_temp, puts};

#[tokio::test]
async fn failed_commit_poisons_every_later_request() {
    let (_dir, store) = open_temp();
    let mut log = store.log_store(RangeId(1));
    append(&mut log, vec![blank(1, 0)]).await.unwrap();
    assert!(store.health().is_ok());

    store.inject_commit_failure();
    let error = append(&mut log, vec![blank(1, 1)]).await.unwrap_err();
    assert!(
        error.to_string().contains("injected commit failure"),
        "{error}"
    );

    assert!(matches!(store.health(), Err(StorageError::Poisoned { .. })));
    assert!(log.save_vote(&Vote::new(2, 1)).await.is_err());
    assert!(log.read_vote().await.is_err());
    assert!(log.get_log_state().await.is_err());
    assert!(append(&mut log, vec![blank(1, 1)]).await.is_err());
    let mut sm = store.state_machine(RangeId(1));
    assert!(
        apply(&mut sm, vec![puts(1, 1, &[(b"k", b"v")])])
            .await
            .is_err()
    );
    assert!(matches!(
        sm.get(b"k", 0).await,
        Err(StorageError::Poisoned { .. })
    ));
    assert!(sm.applied_state().await.is_err());
    assert!(store.incoming_snapshot(RangeId(1)).await.is_err());
}

#[tokio::test]
async fn requests_queued_behind_a_failed_commit_fail_too() {
    let (_dir, store) = open_temp();
    store.inject_commit_failure();
    let hold = store.hold_writer().await.unwrap();
    let mut receivers = Vec::new();
    for range in 1..=5 {
        let mut log = store.log_store(RangeId(range));
        let (callback, done) = super::flush_signal();
        log.append(vec![blank(1, 0)], callback).await.unwrap();
        receivers.push(done);
    }
    drop(hold);
    for rx in receivers {
        assert!(rx.await.is_err(), "queued append must fail");
    }
    assert!(store.health().is_err());
    // Nothing of the failed batch reached the file.
    let ranges = store.ranges();
    assert!(
        ranges.is_err(),
        "reads fail on a poisoned store: {ranges:?}"
    );
}

#[tokio::test]
async fn append_with_a_gap_stops_the_store() {
    let (_dir, store) = open_temp();
    let mut log = store.log_store(RangeId(1));
    append(&mut log, vec![blank(1, 0)]).await.unwrap();
    // Index 5 after 0 breaks a persisted invariant: the writer asserts and the store stops.
    assert!(append(&mut log, vec![blank(1, 5)]).await.is_err());
    let health = store.health();
    assert!(
        matches!(&health, Err(StorageError::Poisoned { cause }) if cause.contains("panicked")),
        "{health:?}"
    );
    assert!(log.read_vote().await.is_err());
}
