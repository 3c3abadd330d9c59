//! The `leases` and `lease_keys` tables (format 12): etcd's leases and the keys attached to
//! each. A lease is keyed by its namespace (the start of a pinned span) then its id
//! (big-endian; ids are > 0, so they sort as numbers), and `lease_keys` by the lease's key
//! then the attached user key without the namespace, so both lie inside the pinned span:
//! ranges of a file share them, a split partitions them by span like every other table, and
//! a lease's keys are one prefix scan. `lease_keys` is an index of `kv`: it holds a row for
//! `(lease, key)` exactly when `kv` holds `key` attached to that lease, kept in step by
//! `write_kv` through `attach`. A lease's expiry is in `deadlines` (kind `DEADLINE_LEASE`),
//! kept in step by `write_deadlined`.

use keel_types::limits;
use keel_types::pinned::pinned_span;
use redb::{ReadableTable, Table, TableDefinition};
use serde::{Deserialize, Serialize};

use super::Bytes;
use super::deadlines::{DEADLINE_LEASE, Deadlined};
use crate::error::StorageError;

pub(crate) const LEASES: TableDefinition<Bytes, Bytes> = TableDefinition::new("leases");
pub(crate) const LEASE_KEYS: TableDefinition<Bytes, Bytes> = TableDefinition::new("lease_keys");

/// A lease as stored: its granted TTL and when it expires on the range clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct LeaseRecord {
    pub ttl_ms: u64,
    pub expires_at_ms: u64,
}

impl LeaseRecord {
    /// Whether the lease has expired at the range clock `clock_ms`.
    pub fn is_expired(&self, clock_ms: u64) -> bool {
        self.expires_at_ms <= clock_ms
    }
}

impl Deadlined for LeaseRecord {
    const KIND: u8 = DEADLINE_LEASE;
    const WHAT: &'static str = "lease";
    fn deadline_ms(&self) -> u64 {
        self.expires_at_ms
    }
}

/// Key of a `leases` row: the namespace, then the id big-endian.
pub(crate) fn lease_key(namespace: &[u8], id: i64) -> Vec<u8> {
    let mut key = Vec::with_capacity(namespace.len() + 8);
    key.extend_from_slice(namespace);
    key.extend_from_slice(&id.to_be_bytes());
    key
}

/// `(namespace, id)` of a `leases` key.
pub(crate) fn lease_key_parts(key: &[u8]) -> (&[u8], i64) {
    let (namespace, id) = key.split_at(key.len() - 8);
    let id: [u8; 8] = id.try_into().expect("leases keys end with an id");
    (namespace, i64::from_be_bytes(id))
}

/// The namespace of the leases `key` may be attached to: the start of its pinned span.
pub(crate) fn lease_namespace(key: &[u8]) -> Option<Vec<u8>> {
    pinned_span(key).map(|(start, _)| start)
}

/// Key of a `lease_keys` row: the lease's key, then `key` without its namespace.
fn attached_key(namespace: &[u8], id: i64, key: &[u8]) -> Vec<u8> {
    let mut row = lease_key(namespace, id);
    row.extend_from_slice(&key[namespace.len()..]);
    row
}

/// Moves `key`'s attachment from lease `before` to lease `after` (0: none) in
/// `lease_keys`. Called by `write_kv` with the row it replaces and the row it writes.
pub(crate) fn attach(
    lease_keys: &mut Table<Bytes, Bytes>,
    key: &[u8],
    before: i64,
    after: i64,
) -> Result<(), StorageError> {
    if before == after {
        return Ok(());
    }
    let namespace = lease_namespace(key);
    let namespace = || {
        namespace
            .as_deref()
            .expect("only a key of a pinned span is attached to a lease")
    };
    if before != 0 {
        let removed = lease_keys
            .remove(attached_key(namespace(), before, key).as_slice())
            .map_err(|e| StorageError::redb("write lease keys", e))?;
        assert!(removed.is_some(), "a key with a lease has a lease_keys row");
    }
    if after != 0 {
        lease_keys
            .insert(
                attached_key(namespace(), after, key).as_slice(),
                [].as_slice(),
            )
            .map_err(|e| StorageError::redb("write lease keys", e))?;
    }
    Ok(())
}

/// The full user keys attached to lease `id` of `namespace`, in key order; at most `max`.
pub(crate) fn attached_keys<R>(
    lease_keys: &R,
    namespace: &[u8],
    id: i64,
    max: usize,
) -> Result<Vec<Vec<u8>>, StorageError>
where
    R: ReadableTable<Bytes, Bytes>,
{
    let prefix = lease_key(namespace, id);
    let mut keys = Vec::new();
    let rows = lease_keys
        .range::<&[u8]>(prefix.as_slice()..)
        .map_err(|e| StorageError::redb("read lease keys", e))?;
    for row in rows {
        let (row, _) = row.map_err(|e| StorageError::redb("read lease keys", e))?;
        let Some(rest) = row.value().strip_prefix(prefix.as_slice()) else {
            break;
        };
        if keys.len() == max {
            break;
        }
        keys.push([namespace, rest].concat());
    }
    Ok(keys)
}

/// How many keys lease `id` of `namespace` holds, counted up to `limits::LEASE_KEYS_MAX`
/// + 1 (a scan of at most that many rows).
pub(crate) fn count_attached<R>(
    lease_keys: &R,
    namespace: &[u8],
    id: i64,
) -> Result<usize, StorageError>
where
    R: ReadableTable<Bytes, Bytes>,
{
    Ok(attached_keys(lease_keys, namespace, id, limits::LEASE_KEYS_MAX + 1)?.len())
}

/// The ids of `namespace`'s leases in id order; at most `max` (the smallest).
pub(crate) fn lease_ids<R>(
    leases: &R,
    namespace: &[u8],
    max: usize,
) -> Result<Vec<i64>, StorageError>
where
    R: ReadableTable<Bytes, Bytes>,
{
    let start = lease_key(namespace, 1);
    let end = lease_key(namespace, i64::MAX);
    let mut ids = Vec::new();
    let rows = leases
        .range::<&[u8]>(start.as_slice()..=end.as_slice())
        .map_err(|e| StorageError::redb("read leases", e))?;
    for row in rows.take(max) {
        let (key, _) = row.map_err(|e| StorageError::redb("read leases", e))?;
        ids.push(lease_key_parts(key.value()).1);
    }
    Ok(ids)
}

/// The smallest id at or above `from` (≥ 1) that no lease of `namespace` holds; `None` when
/// every id from there to `i64::MAX` is held.
pub(crate) fn first_free_id<R>(
    leases: &R,
    namespace: &[u8],
    from: i64,
) -> Result<Option<i64>, StorageError>
where
    R: ReadableTable<Bytes, Bytes>,
{
    let mut candidate = from.max(1);
    let start = lease_key(namespace, candidate);
    let end = lease_key(namespace, i64::MAX);
    let rows = leases
        .range::<&[u8]>(start.as_slice()..=end.as_slice())
        .map_err(|e| StorageError::redb("read leases", e))?;
    for row in rows {
        let (key, _) = row.map_err(|e| StorageError::redb("read leases", e))?;
        if lease_key_parts(key.value()).1 != candidate {
            break;
        }
        let Some(next) = candidate.checked_add(1) else {
            return Ok(None);
        };
        candidate = next;
    }
    Ok(Some(candidate))
}
