//! The node-wide Raft log: what a reopen replays (appends, truncations, purges, removals of
//! several ranges), what it does with a torn last write and with damage, segments deleted
//! once purged, and writes lost when a lossy log is not synced.

use std::path::Path;
use std::sync::Arc;

use keel_types::RangeId;

use super::record::{self, Read};
use super::{Change, Wal};
use crate::error::StorageError;
use crate::raft_types::Entry;
use crate::test_entries::{entries, log_id};

const A: RangeId = RangeId(1);
const B: RangeId = RangeId(7);

fn append(wal: &Wal, range: RangeId, entries: &[Arc<Entry>]) {
    wal.write(&[Change::Append { range, entries }]).unwrap();
    wal.sync().unwrap();
}

/// The indexes (and terms) `range` reads back, all of them.
fn read(wal: &Wal, range: RangeId) -> Vec<(u64, u64)> {
    let entries = wal.read(range, 0, None).unwrap();
    entries
        .iter()
        .map(|entry| (entry.log_id.index, entry.log_id.leader_id.term))
        .collect()
}

fn span(term: u64, first: u64, last: u64) -> Vec<(u64, u64)> {
    (first..=last).map(|index| (index, term)).collect()
}

/// Where the records of the segment at `path` end (zeros follow).
fn records_end(path: &Path) -> usize {
    let bytes = std::fs::read(path).unwrap();
    let mut at = 0;
    while let Read::Frame(_, len) = record::read(&bytes[at..]) {
        at += len;
    }
    at
}

/// Zeros `len` bytes of the file at `path` from `at`, or flips them.
fn damage(path: &Path, at: usize, len: usize, flip: bool) {
    let mut bytes = std::fs::read(path).unwrap();
    for byte in &mut bytes[at..at + len] {
        *byte = if flip { !*byte } else { 0 };
    }
    std::fs::write(path, &bytes).unwrap();
}

fn segments(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|item| item.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn reopen_replays_every_range_change() {
    let dir = tempfile::tempdir().unwrap();
    {
        let wal = Wal::open(dir.path(), false).unwrap();
        append(&wal, A, &entries(1, 1, 10, 16));
        append(&wal, B, &entries(1, 5, 8, 16));
        // openraft's truncate-then-append: a new leader's entries replace 8..=10.
        wal.write(&[
            Change::Truncate {
                range: A,
                first_removed: 8,
            },
            Change::Append {
                range: A,
                entries: &entries(2, 8, 9, 16),
            },
            Change::Purge {
                range: B,
                upto: log_id(1, 6),
            },
        ])
        .unwrap();
        wal.sync().unwrap();
        let expected_a = [span(1, 1, 7), span(2, 8, 9)].concat();
        assert_eq!(read(&wal, A), expected_a);
        assert_eq!(read(&wal, B), span(1, 7, 8));
    }
    let wal = Wal::open(dir.path(), false).unwrap();
    assert_eq!(read(&wal, A), [span(1, 1, 7), span(2, 8, 9)].concat());
    assert_eq!(read(&wal, B), span(1, 7, 8));
    assert_eq!(wal.state(A), (None, Some(log_id(2, 9))));
    assert_eq!(wal.state(B), (Some(log_id(1, 6)), Some(log_id(1, 8))));
    let middle: Vec<u64> = wal
        .read(A, 3, Some(5))
        .unwrap()
        .iter()
        .map(|entry| entry.log_id.index)
        .collect();
    assert_eq!(middle, vec![3, 4]);
    assert_eq!(wal.ranges(), vec![A, B]);
}

#[test]
fn a_purge_past_the_last_entry_leaves_the_purged_id_as_last() {
    let dir = tempfile::tempdir().unwrap();
    let wal = Wal::open(dir.path(), false).unwrap();
    append(&wal, A, &entries(1, 1, 3, 16));
    // A snapshot installed past the log: the next entry follows the snapshot.
    wal.write(&[Change::Purge {
        range: A,
        upto: log_id(3, 50),
    }])
    .unwrap();
    append(&wal, A, &entries(3, 51, 52, 16));
    drop(wal);
    let wal = Wal::open(dir.path(), false).unwrap();
    assert_eq!(read(&wal, A), span(3, 51, 52));
    assert_eq!(wal.state(A), (Some(log_id(3, 50)), Some(log_id(3, 52))));
}

#[test]
#[should_panic(expected = "appended log index is not last + 1")]
fn an_append_that_skips_an_index_is_a_bug() {
    let dir = tempfile::tempdir().unwrap();
    let wal = Wal::open(dir.path(), false).unwrap();
    append(&wal, A, &entries(1, 1, 3, 16));
    append(&wal, A, &entries(1, 5, 5, 16));
}

#[test]
fn a_dropped_range_is_forgotten_and_may_come_back() {
    let dir = tempfile::tempdir().unwrap();
    {
        let wal = Wal::open(dir.path(), false).unwrap();
        append(&wal, A, &entries(1, 1, 3, 16));
        append(&wal, B, &entries(1, 1, 3, 16));
        wal.write(&[Change::Drop { range: A }]).unwrap();
        wal.sync().unwrap();
        assert_eq!(read(&wal, A), Vec::new());
    }
    let wal = Wal::open(dir.path(), false).unwrap();
    assert_eq!(wal.ranges(), vec![B]);
    assert_eq!(wal.state(A), (None, None));
    // The replica added again starts from a snapshot: any index.
    append(&wal, A, &entries(4, 90, 91, 16));
    assert_eq!(read(&wal, A), span(4, 90, 91));
}

#[test]
fn a_torn_last_write_is_cut_off_and_the_rest_kept() {
    let dir = tempfile::tempdir().unwrap();
    {
        let wal = Wal::open(dir.path(), false).unwrap();
        append(&wal, A, &entries(1, 1, 40, 64));
        append(&wal, A, &entries(1, 41, 48, 64));
    }
    let path = dir.path().join(segments(dir.path()).pop().unwrap());
    // The last write reached the disk only in part: its last sector is zeros.
    let end = records_end(&path);
    let sector = (end - 1) / 512 * 512;
    damage(&path, sector, end - sector, false);
    let wal = Wal::open(dir.path(), false).unwrap();
    let kept = read(&wal, A);
    let last = kept.last().unwrap().0;
    assert!((35..48).contains(&last), "kept up to {last}");
    assert_eq!(kept, span(1, 1, last));
    // Appends go on after the cut, and the cut is not met again.
    append(&wal, A, &entries(2, last + 1, last + 1, 64));
    drop(wal);
    let wal = Wal::open(dir.path(), false).unwrap();
    assert_eq!(
        read(&wal, A),
        [span(1, 1, last), span(2, last + 1, last + 1)].concat()
    );
}

#[test]
fn a_flipped_byte_in_the_last_segment_refuses_the_open() {
    let dir = tempfile::tempdir().unwrap();
    {
        let wal = Wal::open(dir.path(), false).unwrap();
        append(&wal, A, &entries(1, 1, 4, 64));
    }
    let path = dir.path().join(segments(dir.path()).pop().unwrap());
    // Not a torn write (no zeroed sector): damage, even in the last write.
    damage(&path, records_end(&path) - 10, 1, true);
    match Wal::open(dir.path(), false) {
        Err(StorageError::Damaged { detail, .. }) => assert!(detail.contains("checksum")),
        other => panic!("expected Damaged, got {:?}", other.map(|_| ())),
    }
}

/// A log of range A's entries 1..=20 over many small segments, and the segments' names.
fn many_segments() -> (tempfile::TempDir, Vec<String>) {
    let dir = tempfile::tempdir().unwrap();
    {
        let wal = Wal::open_sized(dir.path(), false, 1024).unwrap();
        for index in 1..=20 {
            append(&wal, A, &entries(1, index, index, 200));
        }
    }
    let names = segments(dir.path());
    (dir, names)
}

#[test]
fn damage_before_the_last_segment_refuses_the_open() {
    let (dir, names) = many_segments();
    assert!(names.len() > 2, "{names:?}");
    let path = dir.path().join(&names[1]);
    damage(&path, records_end(&path) / 2, 1, true);
    match Wal::open(dir.path(), false) {
        Err(StorageError::Damaged { detail, .. }) => assert!(detail.contains("record at offset")),
        other => panic!("expected Damaged, got {:?}", other.map(|_| ())),
    }
}

#[test]
fn a_missing_segment_refuses_the_open() {
    let (dir, names) = many_segments();
    std::fs::remove_file(dir.path().join(&names[2])).unwrap();
    match Wal::open(dir.path(), false) {
        Err(StorageError::Damaged { detail, .. }) => {
            assert!(detail.contains("are missing"), "{detail}")
        }
        other => panic!("expected Damaged, got {:?}", other.map(|_| ())),
    }
}

#[test]
fn purged_segments_are_deleted_and_the_purges_survive_them() {
    let dir = tempfile::tempdir().unwrap();
    let wal = Wal::open_sized(dir.path(), false, 1024).unwrap();
    for index in 1..=30 {
        append(&wal, A, &entries(1, index, index, 200));
        append(&wal, B, &entries(1, index, index, 200));
    }
    let before = segments(dir.path()).len();
    wal.collect_garbage().unwrap();
    assert_eq!(segments(dir.path()).len(), before, "nothing purged yet");
    for range in [A, B] {
        let upto = log_id(1, 25);
        wal.write(&[Change::Purge { range, upto }]).unwrap();
    }
    wal.sync().unwrap();
    wal.collect_garbage().unwrap();
    let after = segments(dir.path()).len();
    assert!(after < before / 2, "{before} segments, then {after}");
    drop(wal);
    let wal = Wal::open(dir.path(), false).unwrap();
    for range in [A, B] {
        assert_eq!(read(&wal, range), span(1, 26, 30));
        assert_eq!(wal.state(range), (Some(log_id(1, 25)), Some(log_id(1, 30))));
    }
}

#[test]
fn a_lossy_log_loses_what_was_not_synced() {
    let dir = tempfile::tempdir().unwrap();
    {
        let wal = Wal::open(dir.path(), true).unwrap();
        append(&wal, A, &entries(1, 1, 3, 16));
        wal.write(&[Change::Append {
            range: A,
            entries: &entries(1, 4, 6, 16),
        }])
        .unwrap();
        // Readable before the sync, from memory.
        assert_eq!(read(&wal, A), span(1, 1, 6));
    }
    let wal = Wal::open(dir.path(), true).unwrap();
    assert_eq!(read(&wal, A), span(1, 1, 3));
}

#[test]
fn record_ref_encodes_as_record() {
    use super::record::{Record, RecordRef};
    let entry = entries(3, 9, 9, 8).pop().unwrap();
    let purged = [(A, log_id(1, 4)), (B, log_id(2, 6))];
    let written = [
        RecordRef::Checkpoint { purged: &purged },
        RecordRef::Entry {
            range: B,
            entry: &entry,
        },
        RecordRef::Truncate {
            range: A,
            first_removed: 5,
        },
        RecordRef::Purge {
            range: B,
            upto: log_id(2, 6),
        },
        RecordRef::Drop { range: A },
    ];
    for record in written {
        let mut bytes = Vec::new();
        let len = record::frame(&record, &mut bytes);
        let Read::Frame(read, read_len) = record::read(&bytes) else {
            panic!("{record:?} does not read back");
        };
        assert_eq!(read_len, len);
        let same = match (&record, &read) {
            (RecordRef::Checkpoint { purged }, Record::Checkpoint { purged: read }) => {
                *purged == read.as_slice()
            }
            (RecordRef::Entry { range, entry }, Record::Entry { range: r, entry: e }) => {
                range == r && entry.log_id == e.log_id
            }
            (
                RecordRef::Truncate {
                    range,
                    first_removed,
                },
                Record::Truncate {
                    range: r,
                    first_removed: f,
                },
            ) => range == r && first_removed == f,
            (RecordRef::Purge { range, upto }, Record::Purge { range: r, upto: u }) => {
                range == r && upto == u
            }
            (RecordRef::Drop { range }, Record::Drop { range: r }) => range == r,
            _ => false,
        };
        assert!(same, "{record:?} read back as {read:?}");
    }
}
