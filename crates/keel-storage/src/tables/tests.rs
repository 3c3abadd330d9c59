//! Key layouts sort as scans need them, values of every readable format decode, spans
//! compare and clamp as documented, and `write_kv` keeps its counts in step.

use std::ops::Bound;

use redb::ReadableTable;

use keel_types::{KeyValue, RangeId};

use super::kv::encode_kv;
use super::raft_log::log_key_index;
use super::range_rows::key_range;
use super::*;
use crate::error::StorageError;

#[test]
fn raft_keys_sort_by_range_then_index() {
    let keys = [
        log_key(RangeId(1), 0),
        log_key(RangeId(1), 255),
        log_key(RangeId(1), 256),
        log_key(RangeId(2), 0),
    ];
    assert!(keys.windows(2).all(|pair| pair[0] < pair[1]));
    assert_eq!(log_key_index(&keys[2]), 256);
    assert_eq!(key_range(&keys[3]), RangeId(2));
    assert_eq!(key_range(&meta_key(RangeId(9), RAFT_VOTE)), RangeId(9));
}

#[test]
fn values_of_an_unknown_version_are_errors() {
    let kv = KeyValue {
        key: b"k".to_vec(),
        value: b"v".to_vec(),
        create_revision: 1,
        mod_revision: 2,
        version: 2,
        expires_at_ms: Some(7),
        lease: 0,
    };
    let mut bytes = encode_kv(&kv);
    assert_eq!(decode_kv_expiry(&bytes).unwrap(), Some(7));
    assert_eq!(decode_kv(b"k", &bytes).unwrap(), kv);
    let unknown = crate::codec::FORMAT_VERSION + 1;
    bytes[0] = unknown;
    let error = decode_kv(b"k", &bytes).unwrap_err();
    assert!(
        matches!(error, StorageError::UnknownVersion { version, .. } if version == unknown),
        "{error}"
    );
}

#[test]
fn values_of_format_1_have_no_expiry() {
    let mut bytes = vec![1u8];
    bytes = postcard::to_extend(&(3u64, 5u64), bytes).unwrap();
    bytes.extend_from_slice(b"old");
    let kv = decode_kv(b"k", &bytes).unwrap();
    assert_eq!(
        (kv.value.as_slice(), kv.create_revision, kv.mod_revision),
        (&b"old"[..], 3, 5)
    );
    assert_eq!(kv.expires_at_ms, None);
    assert_eq!(kv.version, 1, "a row of format 1 has no version");
    assert_eq!(decode_kv_expiry(&bytes).unwrap(), None);
}

#[test]
fn values_of_formats_2_to_10_read_version_1() {
    for format in [2u8, 10] {
        // create_revision, mod_revision, expiry: the header of formats 2-10.
        let mut bytes = postcard::to_extend(&(3u64, 5u64, Some(7u64)), vec![format]).unwrap();
        bytes.extend_from_slice(b"old");
        let kv = decode_kv(b"k", &bytes).unwrap();
        let read = (kv.value.as_slice(), kv.create_revision, kv.mod_revision);
        assert_eq!(read, (&b"old"[..], 3, 5), "format {format}");
        assert_eq!(
            (kv.version, kv.expires_at_ms),
            (1, Some(7)),
            "format {format}"
        );
        assert_eq!(decode_kv_value_len(&bytes).unwrap(), 3);
    }
}

#[test]
fn values_of_format_11_keep_their_version_and_read_lease_0() {
    // create_revision, mod_revision, version, expiry, then the value.
    let mut bytes = postcard::to_extend(&(4u64, 9u64, 6u64, Some(8u64)), vec![11]).unwrap();
    bytes.extend_from_slice(b"value");
    let kv = decode_kv(b"k", &bytes).unwrap();
    let read = (kv.value.as_slice(), kv.create_revision, kv.mod_revision);
    assert_eq!(read, (&b"value"[..], 4, 9));
    assert_eq!((kv.version, kv.expires_at_ms, kv.lease), (6, Some(8), 0));
}

#[test]
fn values_of_format_12_and_later_keep_their_version_and_lease() {
    let kv = KeyValue {
        key: b"k".to_vec(),
        value: b"value".to_vec(),
        create_revision: 4,
        mod_revision: 9,
        version: 6,
        expires_at_ms: None,
        lease: 77,
    };
    let bytes = encode_kv(&kv);
    let format = crate::codec::FORMAT_VERSION;
    assert!(bytes[0] == format && format >= 12);
    // create_revision, mod_revision, version, expiry, lease, then the value.
    let header = (4u64, 9u64, 6u64, None::<u64>, 77i64);
    let mut expected = postcard::to_extend(&header, vec![format]).unwrap();
    expected.extend_from_slice(b"value");
    assert_eq!(bytes, expected);
    assert_eq!(decode_kv(b"k", &bytes).unwrap(), kv);
}

#[test]
fn exactly_once_and_ttl_keys_sort_as_scanned() {
    let ttl = [ttl_key(5, b"z"), ttl_key(6, b"a"), ttl_key(256, b"")];
    assert!(ttl.windows(2).all(|pair| pair[0] < pair[1]));
    assert_eq!(ttl_key_parts(&ttl[1]), (6, &b"a"[..]));
    let requests = [
        request_key(RangeId(1), 9, u64::MAX),
        request_key(RangeId(1), 10, 0),
        request_key(RangeId(1), 10, 256),
        request_key(RangeId(2), 0, 0),
    ];
    assert!(requests.windows(2).all(|pair| pair[0] < pair[1]));
    assert_eq!(request_key_parts(&requests[2]), (10, 256));
    assert_eq!(session_key_client(&session_key(RangeId(3), 77)), 77);
    assert_eq!(&requests[2][..16], session_key(RangeId(1), 10).as_slice());
}

#[test]
fn deadline_keys_sort_by_instant_then_kind_and_split_back() {
    let rows = [
        deadline_key(5, DEADLINE_IDEMPOTENCY, b"z"),
        deadline_key(6, DEADLINE_LOCK, b"b"),
        deadline_key(6, DEADLINE_LOCK, b"c"),
        deadline_key(6, DEADLINE_IDEMPOTENCY, b"a"),
        deadline_key(256, DEADLINE_LOCK, b""),
    ];
    assert!(rows.windows(2).all(|pair| pair[0] < pair[1]));
    assert_eq!(
        deadline_key_parts(&rows[3]),
        (6, DEADLINE_IDEMPOTENCY, &b"a"[..])
    );
    assert_eq!(deadline_key_parts(&rows[4]), (256, DEADLINE_LOCK, &b""[..]));
}

fn span(start: &str, end: Option<&str>) -> KeySpan {
    KeySpan {
        start: start.as_bytes().to_vec(),
        end: end.map(|end| end.as_bytes().to_vec()),
    }
}

#[test]
fn spans_overlap_only_when_they_share_a_key() {
    let cases = [
        (span("", None), span("m", Some("n")), true),
        (span("a", Some("m")), span("m", None), false),
        (span("a", Some("m")), span("l", Some("z")), true),
        (span("n", None), span("a", Some("n")), false),
        (span("n", None), span("a", Some("n\0")), true),
        (KeySpan::none(), span("", None), false),
        (span("c", Some("c")), span("a", Some("z")), false),
    ];
    for (one, other, expected) in cases {
        assert_eq!(one.overlaps(&other), expected, "{one:?} {other:?}");
        assert_eq!(other.overlaps(&one), expected, "{other:?} {one:?}");
    }
    assert_eq!(KeySpan::unrecorded(RangeId::FIRST), span("", None));
    assert_eq!(KeySpan::unrecorded(RangeId::META), KeySpan::none());
    assert_eq!(KeySpan::unrecorded(RangeId(7)), KeySpan::none());
    assert!(KeySpan::none().is_empty() && !KeySpan::none().contains(b""));
}

#[test]
fn spans_cover_their_parts() {
    let parent = span("b", Some("p"));
    let cases = [
        (span("b", Some("p")), true),
        (span("c", Some("d")), true),
        (span("a", Some("d")), false),
        (span("c", Some("q")), false),
        (span("c", None), false),
        (KeySpan::none(), true),
    ];
    for (inner, expected) in cases {
        assert_eq!(parent.covers(&inner), expected, "{inner:?}");
    }
    assert!(span("", None).covers(&span("x", None)));
}

#[test]
fn kv_counts_follow_every_write() {
    let dir = tempfile::tempdir().unwrap();
    let db = redb::Database::create(dir.path().join("t.redb")).unwrap();
    let txn = db.begin_write().unwrap();
    let (mut kv, mut ttl) = (txn.open_table(KV).unwrap(), txn.open_table(TTL).unwrap());
    let mut lease_keys = txn.open_table(LEASE_KEYS).unwrap();
    let mut counts = KvCounts::default();
    let row = |value: &str, expires_at_ms| KeyValue {
        key: b"key".to_vec(),
        value: value.as_bytes().to_vec(),
        create_revision: 1,
        mod_revision: 1,
        version: 1,
        expires_at_ms,
        lease: 0,
    };
    let steps = [
        (Some(row("v", None)), (1, 4, 0)),
        (Some(row("value", Some(9))), (1, 8, 1)),
        (Some(row("", None)), (1, 3, 0)),
        (None, (0, 0, 0)),
        (None, (0, 0, 0)),
    ];
    for (after, (keys, bytes, keys_with_ttl)) in steps {
        let indexes = (&mut ttl, &mut lease_keys);
        write_kv(
            &mut kv,
            indexes.0,
            indexes.1,
            &mut counts,
            b"key",
            after.as_ref(),
        )
        .unwrap();
        let expected = KvCounts {
            keys,
            bytes,
            keys_with_ttl,
        };
        assert_eq!(counts, expected, "after {after:?}");
        assert_eq!(count_kv_rows(&kv, &KeySpan::default()).unwrap(), expected);
    }
}

#[test]
fn span_clamps_scan_bounds() {
    use Bound::{Excluded, Included, Unbounded};
    let all = KeySpan::default();
    assert_eq!(all.clamp(b"a", b""), (Included(&b"a"[..]), Unbounded));
    let span = KeySpan {
        start: b"c".to_vec(),
        end: Some(b"m".to_vec()),
    };
    assert_eq!(
        span.clamp(b"a", b""),
        (Included(&b"c"[..]), Excluded(&b"m"[..]))
    );
    assert_eq!(
        span.clamp(b"d", b"e"),
        (Included(&b"d"[..]), Excluded(&b"e"[..]))
    );
    assert_eq!(
        span.clamp(b"d", b"z"),
        (Included(&b"d"[..]), Excluded(&b"m"[..]))
    );
    assert!(span.contains(b"c") && span.contains(b"lzz"));
    assert!(!span.contains(b"m") && !span.contains(b"b"));
}

#[test]
fn request_records_of_every_format_decode_with_versions_and_leases() {
    use keel_types::command::legacy::{
        CommandOutcomeV10, CommandOutcomeV11, KeyValueV10, KeyValueV11, OpResultOf, OpResultV10,
    };
    use keel_types::{CommandOutcome, OpResult};

    use crate::codec::{Digest, encode};

    let old = KeyValueV10 {
        key: b"k".to_vec(),
        value: b"v".to_vec(),
        create_revision: 1,
        mod_revision: 3,
        expires_at_ms: None,
    };
    let outcome_v10 = CommandOutcomeV10::Applied {
        revision: 4,
        results: vec![OpResultV10 {
            previous: Some(old.clone()),
            existed: true,
            counter: None,
        }],
    };
    let outcome_v11 = CommandOutcomeV11::Applied {
        revision: 4,
        results: vec![OpResultOf {
            previous: Some(KeyValueV11 {
                key: old.key.clone(),
                value: old.value.clone(),
                create_revision: 1,
                mod_revision: 3,
                version: 4,
                expires_at_ms: None,
            }),
            existed: true,
            counter: None,
        }],
    };
    let outcome = |version, lease| CommandOutcome::Applied {
        revision: 4,
        results: vec![OpResult {
            previous: Some(KeyValue {
                version,
                lease,
                ..KeyValue::from(old.clone())
            }),
            existed: true,
            counter: None,
        }],
    };
    let digest = Some(Digest([7; 16]));
    let with_format = |format: u8, mut bytes: Vec<u8>| {
        bytes[0] = format;
        bytes
    };
    // Formats 1-5: a bare outcome; 6-10: with its request's digest. Neither has versions.
    let bare = with_format(5, encode(&outcome_v10));
    let digested = RequestRecordV6 {
        digest,
        outcome: outcome_v10.clone(),
    };
    let digested = with_format(10, encode(&digested));
    let versioned = RequestRecordV11 {
        digest,
        outcome: outcome_v11,
    };
    let versioned = with_format(11, encode(&versioned));
    let current = RequestRecord {
        digest,
        outcome: outcome(4, 9),
    };
    let cases = [
        (bare, None, outcome(1, 0)),
        (digested, digest, outcome(1, 0)),
        (versioned, digest, outcome(4, 0)),
        (encode(&current), digest, outcome(4, 9)),
    ];
    for (bytes, digest, outcome) in cases {
        let record = RequestRecord::decode(&bytes).unwrap();
        assert_eq!(
            record,
            RequestRecord { digest, outcome },
            "format {}",
            bytes[0]
        );
    }
    // A record of an older format is not read as a format-12 one.
    for format in [10, 11] {
        let misread = RequestRecord::decode(&with_format(format, encode(&current)));
        assert!(misread.is_err(), "format {format}: {misread:?}");
    }
}

/// Whether the range has a `sm_meta` row of `kind`.
fn has_sm_row(sm_meta: &redb::Table<Bytes, Bytes>, range: RangeId, kind: u8) -> bool {
    let key = meta_key(range, kind);
    sm_meta.get(key.as_slice()).unwrap().is_some()
}

/// Runs `test` on the `sm_meta` table of a fresh file, in a write transaction.
fn with_sm_meta(test: impl FnOnce(&mut redb::Table<Bytes, Bytes>)) {
    let dir = tempfile::tempdir().unwrap();
    let db = redb::Database::create(dir.path().join("t.redb")).unwrap();
    let txn = db.begin_write().unwrap();
    test(&mut txn.open_table(SM_META).unwrap());
}

#[test]
fn an_apply_rewrites_only_the_sm_rows_that_changed() {
    let range = RangeId(3);
    with_sm_meta(|sm_meta| {
        let before = SmState {
            applied: Some(crate::test_entries::log_id(1, 4)),
            revision: 4,
            locks: 2,
            ..SmState::default()
        };
        write_sm_state(sm_meta, range, &before).unwrap();
        // Gone behind the state's back: an unchanged row is not written again, so it stays gone.
        remove_meta(sm_meta, range, sm_meta::SM_LOCKS).unwrap();
        let after = SmState {
            applied: Some(crate::test_entries::log_id(1, 5)),
            revision: 5,
            clock_ms: 77,
            ..before.clone()
        };
        write_sm_state_since(sm_meta, range, Some(&before), &after).unwrap();
        assert!(!has_sm_row(sm_meta, range, sm_meta::SM_LOCKS));
        let read = read_sm_state(sm_meta, range).unwrap();
        assert_eq!(
            (read.applied, read.revision, read.clock_ms, read.locks),
            (after.applied, 5, 77, 0)
        );
    });
}

#[test]
fn a_first_apply_writes_every_sm_row() {
    let range = RangeId(3);
    with_sm_meta(|sm_meta| {
        let before = SmState::default();
        let after = SmState {
            applied: Some(crate::test_entries::log_id(1, 1)),
            ..SmState::default()
        };
        write_sm_state_since(sm_meta, range, Some(&before), &after).unwrap();
        // Rows a store of an older format lacks until it counts them: present, though unchanged.
        for kind in [
            sm_meta::SM_COORDINATION_BYTES,
            SM_HISTORY_FLOOR,
            sm_meta::SM_KEYS,
            sm_meta::SM_SPAN,
        ] {
            assert!(has_sm_row(sm_meta, range, kind), "row {kind}");
        }
        assert_eq!(read_sm_state(sm_meta, range).unwrap(), after);
    });
}
