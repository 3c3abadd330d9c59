//! Events of every format decode, their key states with versions (1 before format 11) and
//! leases (0 before format 12).

use keel_types::{Event, EventKind, KeyValue};

use super::{EventRow, StateOf, decode_event};
use crate::codec::encode;

fn kv(value: &str, mod_revision: u64, version: u64) -> KeyValue {
    KeyValue {
        key: b"k".to_vec(),
        value: value.as_bytes().to_vec(),
        create_revision: 2,
        mod_revision,
        version,
        expires_at_ms: None,
        lease: 0,
    }
}

/// A key's state as format 11 wrote it: format 8's with the version before the expiry.
fn state_v11(kv: &KeyValue) -> (Vec<u8>, u64, u64, u64, Option<u64>) {
    (
        kv.value.clone(),
        kv.create_revision,
        kv.mod_revision,
        kv.version,
        kv.expires_at_ms,
    )
}

/// A key's state as formats 8-10 wrote it: value, create and mod revision, expiry.
fn state_v8(kv: &KeyValue) -> (Vec<u8>, u64, u64, Option<u64>) {
    (
        kv.value.clone(),
        kv.create_revision,
        kv.mod_revision,
        kv.expires_at_ms,
    )
}

fn with_format(format: u8, mut bytes: Vec<u8>) -> Vec<u8> {
    bytes[0] = format;
    bytes
}

#[test]
fn key_states_of_every_format_decode_with_versions() {
    let (before, after) = (kv("1", 2, 4), kv("2", 5, 5));
    let clock_ms = 1_000u64;
    // Format 8: clock, before, after. Formats 9-10: the same after the `Key` tag.
    let v8 = (clock_ms, Some(state_v8(&before)), Some(state_v8(&after)));
    let v8 = with_format(8, encode(&v8));
    let v10 = EventRow::Key {
        clock_ms,
        before: Some(state_v8(&before)),
        after: Some(state_v8(&after)),
    };
    let v10 = with_format(10, encode(&v10));
    let v11 = EventRow::Key {
        clock_ms,
        before: Some(state_v11(&before)),
        after: Some(state_v11(&after)),
    };
    let v11 = with_format(11, encode(&v11));
    let leased = KeyValue {
        lease: 7,
        ..after.clone()
    };
    let v12 = EventRow::Key {
        clock_ms,
        before: Some(StateOf::of(&before)),
        after: Some(StateOf::of(&leased)),
    };
    // Format 13 changed no row: a row of 12 and one written now read alike.
    let v12 = with_format(12, encode(&v12));
    let read = |before_version, after_version, lease| Event {
        revision: 5,
        key: b"k".to_vec(),
        after: Some(KeyValue {
            lease,
            ..kv("2", 5, after_version)
        }),
        before: Some(kv("1", 2, before_version)),
        clock_ms,
        kind: EventKind::Key,
    };
    let cases = [
        (v8, read(1, 1, 0)),
        (v10, read(1, 1, 0)),
        (v11, read(4, 5, 0)),
        (v12, read(4, 5, 7)),
    ];
    for (bytes, expected) in cases {
        let event = decode_event(5, b"k", &bytes).unwrap();
        assert_eq!(event, expected, "format {}", bytes[0]);
    }
}
