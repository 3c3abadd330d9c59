//! The redb tables of a store file, their key layouts and typed accessors. Knows nothing
//! about threads, async or openraft's traits; every function works inside a transaction it
//! is given.
//!
//! | table       | key                                   | value                                  |
//! |-------------|---------------------------------------|----------------------------------------|
//! | `raft_log`  | range id (u64 BE) + log index (u64 BE) | openraft entry                         |
//! | `raft_meta` | range id (u64 BE) + kind (u8)          | vote / committed log id / purged log id |
//! | `sm_meta`   | range id (u64 BE) + kind (u8)          | applied log id / membership / revision / installing marker |
//! | `kv`        | user key                              | create and mod revision, then the raw value |
//!
//! Ranges have disjoint key spans, so all ranges of a file share the one `kv` table and a
//! split changes metadata only. Every value starts with a format-version byte (`codec`).

use std::ops::Bound;

use keel_types::{KeyValue, RangeId, Revision};
use redb::{ReadableTable, Table, TableDefinition};
use serde::{Deserialize, Serialize};

use crate::codec::{decode, decode_with_tail, encode, encode_with_tail};
use crate::error::StorageError;
use crate::raft_types::{Entry, LogId, StoredMembership};

pub(crate) type Bytes = &'static [u8];

pub(crate) const RAFT_LOG: TableDefinition<Bytes, Bytes> = TableDefinition::new("raft_log");
pub(crate) const RAFT_META: TableDefinition<Bytes, Bytes> = TableDefinition::new("raft_meta");
pub(crate) const SM_META: TableDefinition<Bytes, Bytes> = TableDefinition::new("sm_meta");
pub(crate) const KV: TableDefinition<Bytes, Bytes> = TableDefinition::new("kv");

/// Kinds of `raft_meta` rows.
pub(crate) const RAFT_VOTE: u8 = 1;
pub(crate) const RAFT_COMMITTED: u8 = 2;
pub(crate) const RAFT_PURGED: u8 = 3;

/// Kinds of `sm_meta` rows.
pub(crate) const SM_APPLIED: u8 = 1;
pub(crate) const SM_MEMBERSHIP: u8 = 2;
pub(crate) const SM_REVISION: u8 = 3;
pub(crate) const SM_INSTALLING: u8 = 4;

/// Key of one log entry: range id then index, both big-endian, so keys sort by range then
/// index.
pub(crate) fn log_key(range: RangeId, index: u64) -> [u8; 16] {
    let mut key = [0u8; 16];
    key[..8].copy_from_slice(&range.0.to_be_bytes());
    key[8..].copy_from_slice(&index.to_be_bytes());
    key
}

/// The log index stored in a `raft_log` key.
pub(crate) fn log_key_index(key: &[u8]) -> u64 {
    let tail: [u8; 8] = key[8..16].try_into().expect("raft_log keys are 16 bytes");
    u64::from_be_bytes(tail)
}

/// The range id every Raft-table key starts with.
pub(crate) fn key_range(key: &[u8]) -> RangeId {
    let head: [u8; 8] = key[..8].try_into().expect("raft keys start with a u64");
    RangeId(u64::from_be_bytes(head))
}

/// Key of one metadata row (`raft_meta` or `sm_meta`).
pub(crate) fn meta_key(range: RangeId, kind: u8) -> [u8; 9] {
    let mut key = [0u8; 9];
    key[..8].copy_from_slice(&range.0.to_be_bytes());
    key[8] = kind;
    key
}

/// The half-open user-key span `[start, end)` a range owns; `end = None` is unbounded.
/// Until ranges split, every range owns the whole keyspace (`KeySpan::default()`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct KeySpan {
    pub start: Vec<u8>,
    pub end: Option<Vec<u8>>,
}

impl KeySpan {
    pub fn contains(&self, key: &[u8]) -> bool {
        key >= self.start.as_slice() && self.end.as_deref().is_none_or(|end| key < end)
    }

    /// The part of `[start, end)` (empty `end` = unbounded) inside this span, as redb bounds.
    pub fn clamp<'a>(
        &'a self,
        start: &'a [u8],
        end: &'a [u8],
    ) -> (Bound<&'a [u8]>, Bound<&'a [u8]>) {
        let lower = start.max(self.start.as_slice());
        let upper = match (end.is_empty(), self.end.as_deref()) {
            (true, None) => Bound::Unbounded,
            (true, Some(own)) => Bound::Excluded(own),
            (false, None) => Bound::Excluded(end),
            (false, Some(own)) => Bound::Excluded(end.min(own)),
        };
        (Bound::Included(lower), upper)
    }

    /// The whole span as redb bounds.
    pub fn bounds(&self) -> (Bound<&[u8]>, Bound<&[u8]>) {
        self.clamp(&self.start, &[])
    }
}

/// The state-machine metadata of one range.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct SmState {
    pub applied: Option<LogId>,
    pub membership: StoredMembership,
    pub revision: Revision,
    /// Set while a snapshot install is under way (see `state_machine`): the data is partial.
    pub installing: Option<InstallMarker>,
}

/// Written before a snapshot install deletes anything; cleared by the commit that finishes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct InstallMarker {
    pub snapshot_last_log_id: Option<LogId>,
}

/// Header of a `kv` value; the raw user value follows it.
#[derive(Serialize, Deserialize)]
struct KvHeader {
    create_revision: Revision,
    mod_revision: Revision,
}

pub(crate) fn encode_kv(kv: &KeyValue) -> Vec<u8> {
    let header = KvHeader {
        create_revision: kv.create_revision,
        mod_revision: kv.mod_revision,
    };
    encode_with_tail(&header, &kv.value)
}

pub(crate) fn decode_kv(key: &[u8], bytes: &[u8]) -> Result<KeyValue, StorageError> {
    let (header, value): (KvHeader, &[u8]) = decode_with_tail("kv value", bytes)?;
    Ok(KeyValue {
        key: key.to_vec(),
        value: value.to_vec(),
        create_revision: header.create_revision,
        mod_revision: header.mod_revision,
    })
}

/// Reads and decodes one metadata row.
pub(crate) fn read_meta<T, R>(
    table: &R,
    range: RangeId,
    kind: u8,
    what: &'static str,
) -> Result<Option<T>, StorageError>
where
    T: serde::de::DeserializeOwned,
    R: ReadableTable<Bytes, Bytes>,
{
    let key = meta_key(range, kind);
    let row = table
        .get(key.as_slice())
        .map_err(|e| StorageError::redb("read meta", e))?;
    row.map(|value| decode(what, value.value())).transpose()
}

/// Encodes and writes one metadata row.
pub(crate) fn write_meta<T: Serialize>(
    table: &mut Table<Bytes, Bytes>,
    range: RangeId,
    kind: u8,
    value: &T,
) -> Result<(), StorageError> {
    let key = meta_key(range, kind);
    table
        .insert(key.as_slice(), encode(value).as_slice())
        .map_err(|e| StorageError::redb("write meta", e))?;
    Ok(())
}

pub(crate) fn remove_meta(
    table: &mut Table<Bytes, Bytes>,
    range: RangeId,
    kind: u8,
) -> Result<(), StorageError> {
    let key = meta_key(range, kind);
    table
        .remove(key.as_slice())
        .map_err(|e| StorageError::redb("remove meta", e))?;
    Ok(())
}

/// Decodes one log entry and checks it sits under the key it was read from.
pub(crate) fn decode_entry(key: &[u8], bytes: &[u8]) -> Result<Entry, StorageError> {
    let entry: Entry = decode("raft log entry", bytes)?;
    assert_eq!(
        entry.log_id.index,
        log_key_index(key),
        "raft log entry stored under the wrong index"
    );
    Ok(entry)
}

/// The last entry of a range's log, if any.
pub(crate) fn last_entry<R>(log: &R, range: RangeId) -> Result<Option<Entry>, StorageError>
where
    R: ReadableTable<Bytes, Bytes>,
{
    let (start, end) = (log_key(range, 0), log_key(range, u64::MAX));
    let mut rows = log
        .range(start.as_slice()..=end.as_slice())
        .map_err(|e| StorageError::redb("read log", e))?;
    match rows.next_back() {
        None => Ok(None),
        Some(row) => {
            let (key, value) = row.map_err(|e| StorageError::redb("read log", e))?;
            decode_entry(key.value(), value.value()).map(Some)
        }
    }
}

/// `(last purged log id, last log id)` of a range; the last log id is the purged one when no
/// entry is left.
pub(crate) fn log_state<L, M>(
    log: &L,
    meta: &M,
    range: RangeId,
) -> Result<(Option<LogId>, Option<LogId>), StorageError>
where
    L: ReadableTable<Bytes, Bytes>,
    M: ReadableTable<Bytes, Bytes>,
{
    let purged: Option<LogId> = read_meta(meta, range, RAFT_PURGED, "purged log id")?;
    let last = last_entry(log, range)?.map(|entry| entry.log_id);
    let last = match (last, &purged) {
        (Some(last), Some(purged)) if purged.index >= last.index => Some(*purged),
        (Some(last), _) => Some(last),
        (None, purged) => *purged,
    };
    Ok((purged, last))
}

/// The state-machine metadata of a range.
pub(crate) fn read_sm_state<R>(sm_meta: &R, range: RangeId) -> Result<SmState, StorageError>
where
    R: ReadableTable<Bytes, Bytes>,
{
    Ok(SmState {
        applied: read_meta(sm_meta, range, SM_APPLIED, "applied log id")?,
        membership: read_meta(sm_meta, range, SM_MEMBERSHIP, "membership")?.unwrap_or_default(),
        revision: read_meta(sm_meta, range, SM_REVISION, "revision")?.unwrap_or(0),
        installing: read_meta(sm_meta, range, SM_INSTALLING, "install marker")?,
    })
}

/// Writes applied log id, membership and revision (not the install marker).
pub(crate) fn write_sm_state(
    sm_meta: &mut Table<Bytes, Bytes>,
    range: RangeId,
    state: &SmState,
) -> Result<(), StorageError> {
    match &state.applied {
        Some(applied) => write_meta(sm_meta, range, SM_APPLIED, applied)?,
        None => remove_meta(sm_meta, range, SM_APPLIED)?,
    }
    write_meta(sm_meta, range, SM_MEMBERSHIP, &state.membership)?;
    write_meta(sm_meta, range, SM_REVISION, &state.revision)
}

/// Distinct range ids with at least one row in a Raft table, found by skipping from one
/// range's first key to the next range's.
pub(crate) fn ranges_in<R>(table: &R) -> Result<Vec<RangeId>, StorageError>
where
    R: ReadableTable<Bytes, Bytes>,
{
    let mut found = Vec::new();
    let mut next = Some(0u64);
    while let Some(from) = next {
        let start = from.to_be_bytes();
        let mut rows = table
            .range::<&[u8]>(start.as_slice()..)
            .map_err(|e| StorageError::redb("list ranges", e))?;
        let Some(row) = rows.next() else { break };
        let (key, _) = row.map_err(|e| StorageError::redb("list ranges", e))?;
        let range = key_range(key.value());
        found.push(range);
        next = range.0.checked_add(1);
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

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
        };
        let mut bytes = encode_kv(&kv);
        assert_eq!(decode_kv(b"k", &bytes).unwrap(), kv);
        bytes[0] = 9;
        let error = decode_kv(b"k", &bytes).unwrap_err();
        assert!(
            matches!(error, StorageError::UnknownVersion { version: 9, .. }),
            "{error}"
        );
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
}
