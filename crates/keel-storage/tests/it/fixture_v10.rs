//! The format-10 fixture, `tests/fixtures/v10/`: a range whose log holds a consistency
//! check. Range 1 puts `a` (revision 1) and applies a check (index 3) that locates bucket 5.
//! `write_v10` made the files; set `KEEL_WRITE_FIXTURES=1` to rewrite them (only ever needed
//! if they are lost). Every later build must read them.

use std::path::Path;

use keel_storage::Store;
use keel_storage::raft_types::{Entry, Vote};
use keel_types::{Check, Command, RangeId};
use openraft::entry::RaftEntry;
use openraft::storage::RaftLogReader;

use super::fixture::persist_range_1;
use super::fixture::{FIXTURE_STORE_FILE, copy_dir, fixture_dir, membership, open_fixture};
use super::{blank, log_id, open_in, puts};

fn v10_entries() -> Vec<Entry> {
    let check = Command::Check(Check { locate: vec![5] });
    vec![
        blank(1, 0),
        Entry::new_membership(log_id(1, 1, 1), membership()),
        puts(1, 2, &[(b"a", b"v")]),
        Entry::new_normal(log_id(1, 1, 3), check),
    ]
}

async fn write_v10(dir: &Path) {
    let store = open_in(dir);
    let mut log = store.log_store(RangeId(1));
    let (vote, committed) = (Vote::new_committed(1, 1), log_id(1, 1, 3));
    persist_range_1(&store, &mut log, v10_entries(), vote, committed).await;
    store.shutdown();
}

/// What every build must read from the v10 fixture.
async fn check_v10(store: &Store) {
    let sm = store.state_machine(RangeId(1));
    assert_eq!(sm.applied().await.unwrap(), (1, Some(log_id(1, 1, 3))));
    let mut log = store.log_store(RangeId(1));
    let entries = log.try_get_log_entries(0..10).await.unwrap();
    assert_eq!(entries, v10_entries());
    // A row of format 10 has no version: it reads 1.
    let a = sm.get(b"a", 0).await.unwrap().0.expect("a is stored");
    assert_eq!((a.value.as_slice(), a.version), (&b"v"[..], 1));
}

#[tokio::test]
async fn v10_fixture_reads_back() {
    let (_dir, store) = open_fixture(10);
    check_v10(&store).await;
}

#[tokio::test]
async fn v10_fixture_writer_matches_expectations() {
    let dir = tempfile::tempdir().unwrap();
    write_v10(dir.path()).await;
    if std::env::var_os("KEEL_WRITE_FIXTURES").is_some() {
        let target = fixture_dir(10);
        let _ = std::fs::remove_dir_all(&target);
        copy_dir(dir.path(), &target);
        std::fs::rename(target.join("keel.redb"), target.join(FIXTURE_STORE_FILE)).unwrap();
    }
    let store = open_in(dir.path());
    check_v10(&store).await;
}
