//! Snapshots: build on one store, stream in chunks, install on another; crash safety of a
//! half-done install.
//!
//! Bounded memory holds by construction: the builder writes rows from a redb range iterator
//! through a 64 KiB `BufWriter`, the installer reads one length-prefixed record at a time
//! through a 64 KiB `BufReader` and commits at most `SNAPSHOT_INSTALL_ROWS_PER_TXN` rows per
//! transaction, and here the file is streamed in `SNAPSHOT_CHUNK_BYTES` chunks. These tests
//! check that what goes through that path arrives whole.

use keel_storage::{StateMachine, Store};
use keel_types::{KeyValue, RangeId, limits};
use openraft::storage::{RaftSnapshotBuilder, RaftStateMachine};
use tokio::io::AsyncReadExt;

use super::{apply, log_id, open_temp, puts};

const ROWS: usize = 50_000;
const ROWS_PER_ENTRY: usize = 1_000;

/// Fills range 1 with `ROWS` rows of about 80 bytes each, at revisions 1..=50.
async fn fill(sm: &mut StateMachine) {
    let value = [b'v'; 64];
    for entry in 0..ROWS / ROWS_PER_ENTRY {
        let keys: Vec<Vec<u8>> = (0..ROWS_PER_ENTRY)
            .map(|row| format!("key-{:08}", entry * ROWS_PER_ENTRY + row).into_bytes())
            .collect();
        let pairs: Vec<(&[u8], &[u8])> = keys
            .iter()
            .map(|key| (key.as_slice(), &value[..]))
            .collect();
        apply(sm, vec![puts(1, entry as u64 + 1, &pairs)])
            .await
            .unwrap();
    }
}

/// Every row of a state machine, page by page.
/// Builds a snapshot of `sm` now.
async fn build(sm: &mut StateMachine) -> keel_storage::raft_types::Snapshot {
    sm.get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap()
}

async fn all_rows(sm: &StateMachine) -> Vec<KeyValue> {
    let mut rows = Vec::new();
    let mut start = Vec::new();
    loop {
        let page = sm
            .scan(&start, &[], limits::SCAN_LIMIT_MAX, 0)
            .await
            .unwrap();
        rows.extend(page.kvs);
        match page.next_start {
            Some(next) => start = next,
            None => return rows,
        }
    }
}

/// Streams a snapshot file into `target`'s incoming snapshot in chunks, like the network.
async fn transfer(file: &keel_storage::SnapshotFile, target: &Store) -> keel_storage::SnapshotFile {
    let mut reader = file.open_reader().await.unwrap();
    let mut incoming = target.incoming_snapshot(RangeId(1)).await.unwrap();
    let mut chunk = vec![0u8; limits::SNAPSHOT_CHUNK_BYTES];
    loop {
        let read = reader.read(&mut chunk).await.unwrap();
        if read == 0 {
            break;
        }
        incoming.write_chunk(&chunk[..read]).await.unwrap();
    }
    incoming.finish().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_snapshot_round_trip() {
    let (_dir_a, store_a) = open_temp();
    let mut sm_a = store_a.state_machine(RangeId(1));
    fill(&mut sm_a).await;
    let snapshot = build(&mut sm_a).await;
    assert!(
        snapshot.snapshot.len_bytes() > 3_000_000,
        "{}",
        snapshot.snapshot.len_bytes()
    );
    assert_eq!(snapshot.meta.last_log_id, Some(log_id(1, 1, 50)));

    let (_dir_b, store_b) = open_temp();
    let mut sm_b = store_b.state_machine(RangeId(1));
    // B holds rows the snapshot must replace.
    apply(
        &mut sm_b,
        vec![puts(1, 1, &[(b"stale", b"x"), (b"key-00000001", b"old")])],
    )
    .await
    .unwrap();
    let received = transfer(&snapshot.snapshot, &store_b).await;
    sm_b.install_snapshot(&snapshot.meta, received)
        .await
        .unwrap();

    assert_eq!(sm_b.applied().await.unwrap(), sm_a.applied().await.unwrap());
    assert_eq!(sm_b.applied().await.unwrap().0, 50);
    let (rows_a, rows_b) = (all_rows(&sm_a).await, all_rows(&sm_b).await);
    assert_eq!(rows_a.len(), ROWS);
    assert!(
        rows_a == rows_b,
        "installed rows differ from the snapshot's source"
    );
    let current = sm_b
        .get_current_snapshot()
        .await
        .unwrap()
        .expect("installed snapshot is current");
    assert_eq!(current.meta, snapshot.meta);
    // A still has its own snapshot.
    assert!(sm_a.get_current_snapshot().await.unwrap().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_during_install_is_completed_by_installing_again() {
    let (_dir_a, store_a) = open_temp();
    let mut sm_a = store_a.state_machine(RangeId(1));
    fill(&mut sm_a).await;
    let snapshot = build(&mut sm_a).await;

    let dir_b = tempfile::tempdir().unwrap();
    {
        let store_b = super::open_in(dir_b.path());
        let mut sm_b = store_b.state_machine(RangeId(1));
        let received = transfer(&snapshot.snapshot, &store_b).await;
        // Commits: install marker, clearing, first rows; the second batch of rows fails.
        store_b.inject_commit_failure_after(3);
        let error = sm_b
            .install_snapshot(&snapshot.meta, received)
            .await
            .unwrap_err();
        assert!(error.to_string().contains("injected"), "{error}");
        store_b.shutdown();
    }
    let store_b = super::open_in(dir_b.path());
    let mut sm_b = store_b.state_machine(RangeId(1));
    let (applied, membership) = sm_b.applied_state().await.unwrap();
    assert_eq!(
        applied, None,
        "a half-installed range reports nothing applied"
    );
    assert_eq!(membership, Default::default());
    let error = sm_b.get(b"key-00000001", 0).await.unwrap_err();
    assert!(
        matches!(error, keel_storage::StorageError::SnapshotInstalling { .. }),
        "{error}"
    );

    // What openraft does on startup: install the current snapshot, newer than "nothing".
    let current = sm_b
        .get_current_snapshot()
        .await
        .unwrap()
        .expect("snapshot was kept");
    assert_eq!(current.meta, snapshot.meta);
    sm_b.install_snapshot(&current.meta, current.snapshot)
        .await
        .unwrap();
    assert_eq!(
        sm_b.applied_state().await.unwrap().0,
        snapshot.meta.last_log_id
    );
    assert!(all_rows(&sm_b).await == all_rows(&sm_a).await);
}

#[tokio::test]
async fn snapshot_with_wrong_meta_is_refused() {
    let (_dir, store) = open_temp();
    let mut sm = store.state_machine(RangeId(1));
    apply(&mut sm, vec![puts(1, 1, &[(b"k", b"v")])])
        .await
        .unwrap();
    let snapshot = build(&mut sm).await;
    let mut wrong = snapshot.meta.clone();
    wrong.last_log_id = Some(log_id(1, 1, 2));
    let (_dir_b, store_b) = open_temp();
    let error = store_b
        .state_machine(RangeId(1))
        .install_snapshot(&wrong, snapshot.snapshot)
        .await
        .unwrap_err();
    assert_eq!(error.kind(), std::io::ErrorKind::InvalidData, "{error}");
}
