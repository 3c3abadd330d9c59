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

/// `save_committed` writes nothing and opens no transaction of its own, but answers only
/// after every request queued before it has committed: it paces the Raft loop to the writer.
#[tokio::test]
async fn save_committed_waits_for_the_queue_and_commits_nothing() {
    use openraft::storage::RaftLogStorage;
    let (_dir, store) = open_temp();
    let mut log = store.log_store(RangeId(1));
    let before = store.stats();
    log.save_committed(Some(super::log_id(1, 1, 0)))
        .await
        .unwrap();
    let after = store.stats();
    assert_eq!(after.commits, before.commits, "{after:?}");
    assert_eq!(log.read_committed().await.unwrap(), None);

    let hold = store.hold_writer().await.unwrap();
    let (callback, flushed) = super::flush_signal();
    log.append(vec![blank(1, 0)], callback).await.unwrap();
    let mut pacing = log.clone();
    let saved = tokio::spawn(async move { pacing.save_committed(None).await });
    // One turn of this single-threaded runtime runs the task until it waits for the writer.
    tokio::task::yield_now().await;
    assert!(
        !saved.is_finished(),
        "answered while the append ahead of it was held"
    );
    drop(hold);
    saved.await.unwrap().unwrap();
    assert!(
        flushed.await.is_ok(),
        "the append ahead of it had committed first"
    );
    assert_eq!(store.stats().commits - after.commits, 1);
}

/// With no request outstanding, `save_committed` answers without a trip through the writer's
/// queue: here the writer is held, and it answers all the same.
#[tokio::test]
async fn save_committed_answers_at_once_when_nothing_is_outstanding() {
    let (_dir, store) = open_temp();
    let mut log = store.log_store(RangeId(1));
    super::append(&mut log, vec![blank(1, 0)]).await.unwrap();
    assert!(
        save_committed_answers_while_held(&store, &log).await,
        "waited for the held writer with nothing outstanding"
    );
}

/// An append dropped while it waits for room in a full writer queue never reaches the writer
/// and is not left counted as outstanding: once the queue has drained, `save_committed`
/// answers at once again (the writer held, as above).
#[tokio::test]
async fn an_append_dropped_at_a_full_queue_is_not_left_outstanding() {
    use futures::FutureExt;
    use openraft::storage::RaftLogStorage;
    let (_dir, store) = open_temp();
    let hold = store.hold_writer().await.unwrap();
    let queue_max = keel_types::limits::STORAGE_WRITER_QUEUE_MAX as u64;
    let mut flushed = Vec::new();
    for range in 1..=queue_max {
        let (callback, done) = super::flush_signal();
        let mut log = store.log_store(RangeId(range));
        log.append(vec![blank(1, 0)], callback).await.unwrap();
        flushed.push(done);
    }
    let mut late = store.log_store(RangeId(queue_max + 1));
    let (callback, _never) = super::flush_signal();
    let waiting = late.append(vec![blank(1, 0)], callback).now_or_never();
    assert!(waiting.is_none(), "the queue had room for one more");
    drop(hold);
    for done in flushed {
        done.await.unwrap();
    }
    assert!(
        save_committed_answers_while_held(&store, &late).await,
        "the dropped append was left counted as outstanding"
    );
}

/// Whether `save_committed` answers while the writer is held, within one turn of this
/// single-threaded runtime (it is answered in the end either way).
async fn save_committed_answers_while_held(
    store: &keel_storage::Store,
    log: &keel_storage::LogStore,
) -> bool {
    use openraft::storage::RaftLogStorage;
    let hold = store.hold_writer().await.unwrap();
    let mut pacing = log.clone();
    let saved = tokio::spawn(async move { pacing.save_committed(None).await });
    tokio::task::yield_now().await;
    let answered = saved.is_finished();
    drop(hold);
    saved.await.unwrap().unwrap();
    answered
}

/// openraft replicates what `append` accepted before the flush callback fires; the log must
/// return those entries even though redb has not committed them yet.
#[tokio::test]
async fn appended_entries_are_readable_before_their_commit() {
    use openraft::storage::{RaftLogReader, RaftLogStorage};
    let (_dir, store) = open_temp();
    let mut log = store.log_store(RangeId(1));
    super::append(&mut log, vec![blank(1, 1), blank(1, 2)])
        .await
        .unwrap();
    let hold = store.hold_writer().await.unwrap();
    let (callback, flushed) = super::flush_signal();
    log.append(vec![blank(1, 3), blank(1, 4)], callback)
        .await
        .unwrap();
    let mut reader = log.get_log_reader().await;
    let indexes = |entries: Vec<keel_storage::raft_types::Entry>| -> Vec<u64> {
        entries.iter().map(|entry| entry.log_id.index).collect()
    };
    let before = reader.try_get_log_entries(1..5).await.unwrap();
    assert_eq!(
        indexes(before),
        [1, 2, 3, 4],
        "pending entries are readable"
    );
    let tail = reader.try_get_log_entries(3..).await.unwrap();
    assert_eq!(indexes(tail), [3, 4]);
    let state = log.get_log_state().await.unwrap();
    assert_eq!(state.last_log_id.map(|id| id.index), Some(4));
    drop(hold);
    flushed.await.unwrap();
    let after = reader.try_get_log_entries(2..5).await.unwrap();
    assert_eq!(
        indexes(after),
        [2, 3, 4],
        "committed entries read from disk"
    );
}

/// Counts what the writer tells its commit observer.
#[derive(Default)]
struct Observed(std::sync::Mutex<Vec<keel_storage::Commit>>);

impl keel_storage::CommitObserver for Observed {
    fn committed(&self, commit: &keel_storage::Commit) {
        self.0.lock().unwrap().push(*commit);
    }
}

#[tokio::test]
async fn the_commit_observer_sees_each_commit_with_its_batch() {
    let (dir, store) = open_temp();
    let observed = std::sync::Arc::new(Observed::default());
    assert!(store.observe_commits(observed.clone()));
    assert!(
        !store.observe_commits(std::sync::Arc::new(Observed::default())),
        "one observer per store"
    );
    let hold = store.hold_writer().await.unwrap();
    let mut flushed = Vec::new();
    for range in 1..=3 {
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
    let mut sm = store.state_machine(RangeId(1));
    apply(&mut sm, vec![puts(1, 1, &[(b"k", b"v")])])
        .await
        .unwrap();
    let commits: Vec<(bool, usize)> = observed
        .0
        .lock()
        .unwrap()
        .iter()
        .map(|commit| (commit.durable, commit.requests))
        .collect();
    assert_eq!(commits, vec![(true, 3), (false, 1)]);
    let on_disk = std::fs::metadata(dir.path().join("keel.redb"))
        .unwrap()
        .len();
    assert_eq!(store.file_bytes().unwrap(), on_disk);
    assert!(on_disk > 0);
}
