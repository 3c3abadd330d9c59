//! The format-13 fixture, `tests/fixtures/v13/`: the v12 state (etcd leases) written by a
//! build whose Raft log is the node-wide log, so the entries are in `keel.raft-log/` and not
//! in the file. `write_v13` made the files; set `KEEL_WRITE_FIXTURES=1` to rewrite them (only
//! ever needed if they are lost). Every later build must read them.

use keel_storage::Store;
use keel_types::RangeId;
use openraft::storage::{RaftLogReader, RaftLogStorage};

use super::fixture::{FIXTURE_STORE_FILE, copy_dir, fixture_dir, open_fixture};
use super::fixture_v12::{check_v12, v12_entries, write_v12};
use super::{log_id, open_in};

/// What every build must read from the v13 fixture: the v12 state, and range 1's log, read
/// from the node-wide log.
async fn check_v13(store: &Store) {
    let mut log = store.log_store(RangeId(1));
    let state = log.get_log_state().await.unwrap();
    assert_eq!(state.last_log_id, Some(log_id(1, 1, 5)));
    let entries = log.try_get_log_entries(0..10).await.unwrap();
    assert_eq!(entries, v12_entries());
    check_v12(store).await;
}

#[tokio::test]
async fn v13_fixture_reads_back() {
    let (dir, store) = open_fixture(13);
    assert!(dir.path().join("keel.raft-log").is_dir());
    check_v13(&store).await;
}

#[tokio::test]
async fn v13_fixture_writer_matches_expectations() {
    let dir = tempfile::tempdir().unwrap();
    write_v12(dir.path()).await;
    if std::env::var_os("KEEL_WRITE_FIXTURES").is_some() {
        let target = fixture_dir(13);
        let _ = std::fs::remove_dir_all(&target);
        copy_dir(dir.path(), &target);
        std::fs::rename(target.join("keel.redb"), target.join(FIXTURE_STORE_FILE)).unwrap();
    }
    let store = open_in(dir.path());
    check_v13(&store).await;
}
