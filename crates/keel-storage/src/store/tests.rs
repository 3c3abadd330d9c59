//! Opening a store: the log entries of a replica whose removal a crash cut short (after the
//! removal's durable commit, before its range left the log) are dropped.

use keel_types::RangeId;
use openraft::storage::RaftLogStorage;

use super::{Store, log_dir};
use crate::wal::{Change, Wal};

#[tokio::test]
async fn a_removed_replica_left_in_the_log_is_dropped_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keel.redb");
    let snapshots = dir.path().join("snapshots");
    let (removed, kept) = (RangeId(3), RangeId(4));
    let store = Store::open(&path, &snapshots).unwrap();
    for range in [removed, kept] {
        let vote = crate::raft_types::Vote::new_committed(1, 1);
        store.log_store(range).save_vote(&vote).await.unwrap();
    }
    store.remove_range(removed).await.unwrap();
    store.shutdown();
    {
        // The removal's last step lost: the log still holds entries of the range.
        let wal = Wal::open(&log_dir(&path), false).unwrap();
        let entry = openraft::testing::blank_ent::<crate::raft_types::TypeConfig>(1, 1, 5);
        let entries = [std::sync::Arc::new(entry)];
        let appends = [removed, kept].map(|range| Change::Append {
            range,
            entries: &entries,
        });
        wal.write(&appends).unwrap();
        wal.sync().unwrap();
    }
    let store = Store::open(&path, &snapshots).unwrap();
    assert_eq!(store.ranges().unwrap(), vec![kept]);
    assert_eq!(store.wal().ranges(), vec![kept]);
}
