//! Reopening a store file: log, vote and applied data survive (the committed log id is not
//! stored: openraft starts from the applied one).

use keel_storage::raft_types::Vote;
use keel_types::RangeId;
use openraft::storage::{RaftLogReader, RaftLogStorage, RaftStateMachine};

use super::{append, apply, blank, log_id, open_in, puts};

#[tokio::test]
async fn log_vote_and_applied_data_survive_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let vote = Vote::new_committed(3, 1);
    {
        let store = open_in(dir.path());
        let mut log = store.log_store(RangeId(1));
        let entries = vec![
            blank(1, 0),
            puts(1, 1, &[(b"a", b"1")]),
            puts(3, 2, &[(b"b", b"2")]),
        ];
        append(&mut log, entries.clone()).await.unwrap();
        log.save_vote(&vote).await.unwrap();
        log.save_committed(Some(log_id(3, 1, 2))).await.unwrap();
        append(&mut store.log_store(RangeId(9)), vec![blank(1, 0)])
            .await
            .unwrap();
        let mut sm = store.state_machine(RangeId(1));
        apply(&mut sm, entries).await.unwrap();
        // Applies commit with Durability::None; a later durable commit (this vote) makes them
        // durable, and a clean shutdown closes the file.
        store.shutdown();
        assert!(store.health().is_err(), "a shut-down store reports it");
    }
    let store = open_in(dir.path());
    assert_eq!(store.ranges().unwrap(), vec![RangeId(1), RangeId(9)]);
    let mut log = store.log_store(RangeId(1));
    assert_eq!(log.read_vote().await.unwrap(), Some(vote));
    assert_eq!(log.read_committed().await.unwrap(), None);
    let state = log.get_log_state().await.unwrap();
    assert_eq!(state.last_log_id, Some(log_id(3, 1, 2)));
    assert_eq!(log.try_get_log_entries(0..).await.unwrap().len(), 3);

    let mut sm = store.state_machine(RangeId(1));
    assert_eq!(sm.applied_state().await.unwrap().0, Some(log_id(3, 1, 2)));
    let (kv, revision) = sm.get(b"b", 0).await.unwrap();
    assert_eq!(revision, 2);
    let kv = kv.expect("b survives");
    assert_eq!(
        (kv.value.as_slice(), kv.create_revision, kv.mod_revision),
        (&b"2"[..], 2, 2)
    );
    assert_eq!(sm.applied().await.unwrap(), (2, Some(log_id(3, 1, 2))));
}

#[tokio::test]
async fn calls_after_shutdown_fail_with_closed() {
    let (_dir, store) = super::open_temp();
    store.shutdown();
    let error = store
        .state_machine(RangeId(1))
        .get(b"k", 0)
        .await
        .unwrap_err();
    assert!(
        matches!(error, keel_storage::StorageError::Closed),
        "{error}"
    );
    let error = store
        .log_store(RangeId(1))
        .save_vote(&Vote::new(1, 1))
        .await
        .unwrap_err();
    assert!(error.to_string().contains("closed"), "{error}");
}
