//! The backup file round trip, and every way a damaged file must be refused: flipped bits
//! anywhere, cuts at any length, trailing bytes, missing ranges.

use std::path::{Path, PathBuf};

use keel_types::{RangeDescriptor, RangeId};

use super::*;
use crate::writer::BackupWriter;

fn range(id: u64, start: &str, end: Option<&str>) -> RangeDescriptor {
    RangeDescriptor {
        id: RangeId(id),
        start: start.as_bytes().to_vec(),
        end: end.map(|end| end.as_bytes().to_vec()),
        epoch: 2,
        conf_version: 3,
        replicas: vec![1, 2, 3],
    }
}

fn header() -> BackupHeader {
    BackupHeader {
        created_ms: 1_700_000_000_000,
        keel_version: "0.1.0".to_string(),
        nodes: vec![(1, "127.0.0.1:7001".to_string())],
        listed: 0,
    }
}

/// Snapshot bytes for range `id`: long enough for several chunks when `chunks` > 1.
fn snapshot(id: u64, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u64 * 31 + id) as u8).collect()
}

/// Writes a backup of `ranges`, each with a snapshot of `len` bytes; returns its path.
fn write(dir: &Path, ranges: &[RangeDescriptor], len: usize) -> PathBuf {
    let path = dir.join("cluster.keelbackup");
    let mut writer = BackupWriter::create(&path, header(), ranges).unwrap();
    for (revision, range) in ranges.iter().enumerate() {
        let data = snapshot(range.id.0, len);
        writer
            .begin_range(RangeHeader {
                descriptor: range.clone(),
                revision: revision as u64 + 10,
                applied_index: 40,
                snapshot_bytes: data.len() as u64,
            })
            .unwrap();
        writer.write_snapshot(&data).unwrap();
        writer.end_range().unwrap();
    }
    writer.finish().unwrap();
    path
}

fn two_ranges() -> Vec<RangeDescriptor> {
    vec![range(1, "", Some("m")), range(2, "m", None)]
}

#[test]
fn a_backup_reads_back_as_written() {
    let dir = tempfile::tempdir().unwrap();
    let len = keel_types::limits::SNAPSHOT_CHUNK_BYTES * 2 + 17;
    let path = write(dir.path(), &two_ranges(), len);
    assert!(!dir.path().join("cluster.keelbackup.tmp").exists());

    let mut reader = BackupReader::open(&path).unwrap();
    assert_eq!(reader.header().keel_version, "0.1.0");
    assert_eq!(reader.header().listed, 2);
    assert_eq!(reader.listed(), two_ranges().as_slice());
    let mut seen: Vec<(RangeHeader, Vec<u8>)> = Vec::new();
    let end = loop {
        match reader.next_item().unwrap() {
            Item::Range(header) => seen.push((header, Vec::new())),
            Item::Chunk(data) => seen.last_mut().unwrap().1.extend_from_slice(&data),
            Item::RangeEnd => {}
            Item::End(end) => break end,
        }
    };
    assert_eq!(seen.len(), 2);
    for (header, data) in &seen {
        assert_eq!(*data, snapshot(header.descriptor.id.0, len));
        assert_eq!(header.snapshot_bytes, len as u64);
    }
    assert_eq!(seen[1].0.revision, 11);
    assert_eq!((end.ranges, end.snapshot_bytes), (2, 2 * len as u64));
    // 2 listed + per range: Range, 3 chunks, RangeEnd.
    assert_eq!(end.records, 2 + 2 * 5);

    let summary = verify(&path).unwrap();
    assert_eq!(summary.end, end);
    assert_eq!(summary.ranges[0].descriptor, two_ranges()[0]);
}

#[test]
fn every_flipped_bit_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), &two_ranges(), 300);
    let good = std::fs::read(&path).unwrap();
    let damaged = dir.path().join("damaged");
    for byte in 0..good.len() {
        let mut bytes = good.clone();
        bytes[byte] ^= 1 << (byte % 8);
        std::fs::write(&damaged, &bytes).unwrap();
        let error = verify(&damaged).expect_err("a flipped bit passed");
        assert!(
            matches!(
                error,
                BackupError::Corrupt { .. }
                    | BackupError::NotABackup { .. }
                    | BackupError::Truncated { .. }
            ),
            "byte {byte}: {error}"
        );
    }
}

#[test]
fn every_cut_is_refused_as_truncated() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), &two_ranges(), 300);
    let good = std::fs::read(&path).unwrap();
    let cut = dir.path().join("cut");
    for len in 0..good.len() {
        std::fs::write(&cut, &good[..len]).unwrap();
        let error = verify(&cut).expect_err("a cut file passed");
        let expected = match len < MAGIC.len() {
            true => matches!(error, BackupError::NotABackup { .. }),
            false => matches!(error, BackupError::Truncated { .. }),
        };
        assert!(expected, "cut at {len}: {error}");
    }
}

#[test]
fn bytes_after_the_end_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), &two_ranges(), 10);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes.push(0);
    std::fs::write(&path, &bytes).unwrap();
    let error = verify(&path).unwrap_err();
    assert!(
        error.to_string().contains("follow the End record"),
        "{error}"
    );
}

#[test]
fn an_abandoned_range_leaves_no_trace_and_may_be_written_again() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("b");
    let ranges = two_ranges();
    let mut writer = BackupWriter::create(&path, header(), &ranges).unwrap();
    let announce = |range: &RangeDescriptor, bytes: usize| RangeHeader {
        descriptor: range.clone(),
        revision: 5,
        applied_index: 9,
        snapshot_bytes: bytes as u64,
    };
    let before = writer.bytes_written();
    writer.begin_range(announce(&ranges[0], 100)).unwrap();
    writer.write_snapshot(&[1; 60]).unwrap();
    writer.abandon_range().unwrap();
    assert_eq!(writer.bytes_written(), before);
    // A stream that ends short is cut out too.
    writer.begin_range(announce(&ranges[0], 100)).unwrap();
    writer.write_snapshot(&[1; 60]).unwrap();
    let error = writer.end_range().unwrap_err();
    assert!(
        error.to_string().contains("60 snapshot bytes of 100"),
        "{error}"
    );
    for range in &ranges {
        writer.begin_range(announce(range, 100)).unwrap();
        writer.write_snapshot(&[2; 100]).unwrap();
        writer.end_range().unwrap();
    }
    writer.finish().unwrap();
    let summary = verify(&path).unwrap();
    assert_eq!(summary.ranges.len(), 2);
    assert_eq!(summary.end.snapshot_bytes, 200);
}

#[test]
fn a_backup_missing_part_of_the_keyspace_is_not_finished() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("b");
    let ranges = two_ranges();
    let mut writer = BackupWriter::create(&path, header(), &ranges).unwrap();
    writer
        .begin_range(RangeHeader {
            descriptor: ranges[0].clone(),
            revision: 1,
            applied_index: 1,
            snapshot_bytes: 0,
        })
        .unwrap();
    writer.end_range().unwrap();
    let error = writer.finish().unwrap_err();
    assert!(matches!(error, BackupError::Incomplete { .. }), "{error}");
    assert!(error.to_string().contains("no range covers"), "{error}");
    assert!(!path.exists());
    assert!(
        !dir.path().join("b.tmp").exists(),
        "the temporary file is gone"
    );
}

#[test]
fn a_file_that_is_no_backup_is_named_so() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notes.txt");
    std::fs::write(&path, b"just some text, long enough").unwrap();
    let error = verify(&path).unwrap_err();
    assert!(
        error.to_string().contains("is not a Keel backup file"),
        "{error}"
    );
}
