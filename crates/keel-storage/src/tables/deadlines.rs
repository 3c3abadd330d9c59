//! The `deadlines` table (format 3): when each lock becomes free (`LockHold::available_at_ms`,
//! kind 1), each idempotency record expires (kind 2) and (format 12) each etcd lease expires
//! (kind 3), keyed by instant (u64 big-endian), kind, then lock name, idempotency key or
//! lease key, with no value, so a reclaim plan reads it in time
//! order. It holds `(at, kind, key)` exactly when the table of that kind holds `key` with
//! that instant, kept in step by `write_deadlined`.

use redb::{Table, TableDefinition};
use serde::Serialize;

use super::Bytes;
use super::keyed_rows::RowCounts;
use crate::codec::{decode, encode};
use crate::error::StorageError;

pub(crate) const DEADLINES: TableDefinition<Bytes, Bytes> = TableDefinition::new("deadlines");

/// Kinds of `deadlines` rows: which table the row's key is in.
pub(crate) const DEADLINE_LOCK: u8 = 1;
pub(crate) const DEADLINE_IDEMPOTENCY: u8 = 2;
/// (format 12) When an etcd lease expires (`leases`).
pub(crate) const DEADLINE_LEASE: u8 = 3;

/// Key of a `deadlines` row: the instant, the kind of record (`DEADLINE_*`), then its key
/// (a lock name or an idempotency key), so rows sort by instant.
pub(crate) fn deadline_key(at_ms: u64, kind: u8, key: &[u8]) -> Vec<u8> {
    let mut row = Vec::with_capacity(9 + key.len());
    row.extend_from_slice(&at_ms.to_be_bytes());
    row.push(kind);
    row.extend_from_slice(key);
    row
}

/// `(instant, kind, key)` of a `deadlines` row.
pub(crate) fn deadline_key_parts(row: &[u8]) -> (u64, u8, &[u8]) {
    let (head, rest) = row.split_at(8);
    let head: [u8; 8] = head.try_into().expect("deadlines keys start with a u64");
    let (&kind, key) = rest.split_first().expect("deadlines keys hold a kind byte");
    (u64::from_be_bytes(head), kind, key)
}

/// A record kept with a `deadlines` row: a lock (due when it becomes free) or an
/// idempotency record (due when it expires).
pub(crate) trait Deadlined: Serialize + serde::de::DeserializeOwned {
    /// The `DEADLINE_*` kind of its index rows.
    const KIND: u8;
    /// Names the record in errors.
    const WHAT: &'static str;
    /// When a `Reclaim` may delete it.
    fn deadline_ms(&self) -> u64;
}

/// Writes a lock or idempotency row (or removes it, for `None`) and keeps its `deadlines`
/// row and the range's counts (`counts`) in step with the row it replaces.
pub(crate) fn write_deadlined<T: Deadlined>(
    table: &mut Table<Bytes, Bytes>,
    deadlines: &mut Table<Bytes, Bytes>,
    mut counts: RowCounts,
    key: &[u8],
    after: Option<&T>,
) -> Result<(), StorageError> {
    let (before_len, after_len) = write_indexed(table, deadlines, key, after)?;
    counts.replace(key, before_len, after_len, T::WHAT);
    Ok(())
}

/// Writes a row of a table indexed by `deadlines` (or removes it, for `None`) and keeps its
/// `deadlines` row in step with the row it replaces, counting nothing (etcd leases, which
/// `sm_meta` does not count); returns the stored lengths before and after.
pub(crate) fn write_indexed<T: Deadlined>(
    table: &mut Table<Bytes, Bytes>,
    deadlines: &mut Table<Bytes, Bytes>,
    key: &[u8],
    after: Option<&T>,
) -> Result<(Option<usize>, Option<usize>), StorageError> {
    let encoded = after.map(encode);
    let old = match &encoded {
        Some(value) => table.insert(key, value.as_slice()),
        None => table.remove(key),
    }
    .map_err(|e| StorageError::redb("write deadlined row", e))?;
    let old_len = old.as_ref().map(|old| old.value().len());
    let before: Option<T> = old.map(|old| decode(T::WHAT, old.value())).transpose()?;
    if let Some(before) = &before {
        let removed = deadlines
            .remove(deadline_key(before.deadline_ms(), T::KIND, key).as_slice())
            .map_err(|e| StorageError::redb("write deadlines index", e))?;
        assert!(
            removed.is_some(),
            "a stored {} has a deadlines index row",
            T::WHAT
        );
    }
    if let Some(after) = after {
        deadlines
            .insert(
                deadline_key(after.deadline_ms(), T::KIND, key).as_slice(),
                [].as_slice(),
            )
            .map_err(|e| StorageError::redb("write deadlines index", e))?;
    }
    Ok((old_len, encoded.as_ref().map(Vec::len)))
}
