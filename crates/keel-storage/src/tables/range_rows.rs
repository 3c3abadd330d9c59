//! What the tables keyed by range id first share (`raft_log`, `raft_meta`, `sm_meta`,
//! `sessions`, `requests`): the range of a key, the ranges a table holds rows of, and the
//! metadata rows of `raft_meta` and `sm_meta`, keyed by range id then a kind byte.

use keel_types::RangeId;
use redb::{ReadableTable, Table};
use serde::Serialize;

use super::Bytes;
use crate::codec::{decode, encode};
use crate::error::StorageError;

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
