//! Group commit: requests queued together share one transaction and one fsync, and
//! state-machine applies alone are not fsynced.

use keel_types::RangeId;

use super::{apply, blank, open_temp, puts};

#[tokio::test]
async fn queued_appends_share_one_durable_commit() {
    let (_dir, store) = open_temp();
    let before = store.stats();
    let hold = store.hold_writer().await.unwrap();
    let mut flushed = Vec::new();
    for range in 1..=64 {
        let mut log = store.log_store(RangeId(range));
        let (callback, done) = super::flush_signal();
        openraft::storage::RaftLogStorage::append(&mut log, vec![blank(1, 0)], callback)
            .await
            .unwrap();
        flushed.push(done);
    }
    drop(hold);
    for rx in flushed {
        rx.await.unwrap();
    }
    let after = store.stats();
    assert_eq!(after.requests - before.requests, 64);
    assert_eq!(after.commits - before.commits, 1, "{after:?}");
    assert_eq!(
        after.durable_commits - before.durable_commits,
        1,
        "{after:?}"
    );
    assert_eq!(store.ranges().unwrap().len(), 64);
}

#[tokio::test]
async fn applies_alone_commit_without_fsync() {
    let (_dir, store) = open_temp();
    let mut sm = store.state_machine(RangeId(1));
    let before = store.stats();
    apply(&mut sm, vec![puts(1, 1, &[(b"k", b"v")])])
        .await
        .unwrap();
    let after = store.stats();
    assert_eq!(after.commits - before.commits, 1);
    assert_eq!(after.durable_commits, before.durable_commits, "{after:?}");
}
