//! The `ttl` table: the index of keys with an expiry, keyed by expiry (u64 big-endian) then
//! user key, with no value. It holds a row `(e, key)` exactly when `kv` holds `key` with
//! expiry `e`, kept in step by every write of `kv` (`write_kv`); like `kv` it is shared by
//! the ranges of a file and filtered by span.

use redb::TableDefinition;

use super::Bytes;

pub(crate) const TTL: TableDefinition<Bytes, Bytes> = TableDefinition::new("ttl");

/// Key of a TTL-index row: the expiry, then the user key, so rows sort by expiry.
pub(crate) fn ttl_key(expires_at_ms: u64, key: &[u8]) -> Vec<u8> {
    let mut row = Vec::with_capacity(8 + key.len());
    row.extend_from_slice(&expires_at_ms.to_be_bytes());
    row.extend_from_slice(key);
    row
}

/// `(expiry, user key)` of a TTL-index row.
pub(crate) fn ttl_key_parts(row: &[u8]) -> (u64, &[u8]) {
    let (head, key) = row.split_at(8);
    let head: [u8; 8] = head.try_into().expect("ttl keys start with a u64");
    (u64::from_be_bytes(head), key)
}
