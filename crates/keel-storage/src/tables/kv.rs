//! The `kv` table: every range's user rows, keyed by user key alone. Ranges of a file own
//! disjoint spans, so they share the table and a split changes metadata only. A value is a
//! header (create and mod revision, from format 2 the expiry, from format 11 the key's
//! version, from format 12 its lease) followed by the raw user value. Every write goes
//! through `write_kv`, which keeps the `ttl` index, the `lease_keys` index and the range's
//! `KvCounts` (recorded in `sm_meta`) in step with the row it replaces.

use keel_types::{KeyValue, Revision};
use redb::{ReadableTable, Table, TableDefinition};
use serde::{Deserialize, Serialize};

use super::Bytes;
use super::leases::attach;
use super::span::KeySpan;
use super::ttl::ttl_key;
use crate::codec::{decode_body_with_tail, encode_with_tail, split_version};
use crate::error::StorageError;

pub(crate) const KV: TableDefinition<Bytes, Bytes> = TableDefinition::new("kv");

/// Live rows of a range in `kv` (expired ones not yet cleaned up included): how many, how
/// many bytes of key and value, and how many have an expiry.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct KvCounts {
    pub keys: u64,
    /// Key plus value lengths.
    pub bytes: u64,
    /// Rows of this range in `ttl`.
    pub keys_with_ttl: u64,
}

impl KvCounts {
    /// Counts `row` in (`sign` true) or out.
    pub fn count(&mut self, key: &[u8], value_len: usize, expiring: bool, sign: bool) {
        let bytes = (key.len() + value_len) as u64;
        let change = |count: &mut u64, by: u64, what: &str| {
            *count = if sign {
                *count + by
            } else {
                count
                    .checked_sub(by)
                    .unwrap_or_else(|| panic!("the range's count of {what} covers its rows"))
            }
        };
        change(&mut self.keys, 1, "keys");
        change(&mut self.bytes, bytes, "bytes");
        if expiring {
            change(&mut self.keys_with_ttl, 1, "keys with a TTL");
        }
    }

    /// The counts of `self` without those of `part`, which it includes.
    pub fn without(self, part: KvCounts) -> KvCounts {
        let less = |all: u64, some: u64| {
            all.checked_sub(some)
                .expect("a range's kv counts cover every part of it")
        };
        KvCounts {
            keys: less(self.keys, part.keys),
            bytes: less(self.bytes, part.bytes),
            keys_with_ttl: less(self.keys_with_ttl, part.keys_with_ttl),
        }
    }
}

/// Header of a `kv` value of format 12; the raw user value follows it.
#[derive(Serialize, Deserialize)]
struct KvHeader {
    create_revision: Revision,
    mod_revision: Revision,
    version: u64,
    expires_at_ms: Option<u64>,
    lease: i64,
}

/// Header of a `kv` value of format 11: no lease (the key reads lease 0).
#[derive(Serialize, Deserialize)]
struct KvHeaderV11 {
    create_revision: Revision,
    mod_revision: Revision,
    version: u64,
    expires_at_ms: Option<u64>,
}

/// Header of a `kv` value of formats 2-10: no version (the key reads version 1).
#[derive(Serialize, Deserialize)]
struct KvHeaderV2 {
    create_revision: Revision,
    mod_revision: Revision,
    expires_at_ms: Option<u64>,
}

/// Header of a `kv` value of format 1: no expiry, no version.
#[derive(Serialize, Deserialize)]
struct KvHeaderV1 {
    create_revision: Revision,
    mod_revision: Revision,
}

pub(crate) fn encode_kv(kv: &KeyValue) -> Vec<u8> {
    let header = KvHeader {
        create_revision: kv.create_revision,
        mod_revision: kv.mod_revision,
        version: kv.version,
        expires_at_ms: kv.expires_at_ms,
        lease: kv.lease,
    };
    encode_with_tail(&header, &kv.value)
}

pub(crate) fn decode_kv(key: &[u8], bytes: &[u8]) -> Result<KeyValue, StorageError> {
    let (header, value) = decode_kv_header(bytes)?;
    Ok(KeyValue {
        key: key.to_vec(),
        value: value.to_vec(),
        create_revision: header.create_revision,
        mod_revision: header.mod_revision,
        version: header.version,
        expires_at_ms: header.expires_at_ms,
        lease: header.lease,
    })
}

/// The length of the user value of a stored `kv` value, without copying it.
pub(crate) fn decode_kv_value_len(bytes: &[u8]) -> Result<usize, StorageError> {
    Ok(decode_kv_header(bytes)?.1.len())
}

/// The expiry of a stored `kv` value, without copying the value.
pub(crate) fn decode_kv_expiry(bytes: &[u8]) -> Result<Option<u64>, StorageError> {
    Ok(decode_kv_header(bytes)?.0.expires_at_ms)
}

/// The header of a stored `kv` value of any format, as format 12 has it: a row written
/// before format 11 has no version and reads version 1 (a key last written before the
/// upgrade counts on from 1); a row written before format 12 has no lease and reads 0.
fn decode_kv_header(bytes: &[u8]) -> Result<(KvHeader, &[u8]), StorageError> {
    const WHAT: &str = "kv value";
    match split_version(WHAT, bytes)? {
        (1, body) => {
            let (v1, value): (KvHeaderV1, &[u8]) = decode_body_with_tail(WHAT, body)?;
            let header = KvHeader {
                create_revision: v1.create_revision,
                mod_revision: v1.mod_revision,
                version: 1,
                expires_at_ms: None,
                lease: 0,
            };
            Ok((header, value))
        }
        (2..=10, body) => {
            let (v2, value): (KvHeaderV2, &[u8]) = decode_body_with_tail(WHAT, body)?;
            let header = KvHeader {
                create_revision: v2.create_revision,
                mod_revision: v2.mod_revision,
                version: 1,
                expires_at_ms: v2.expires_at_ms,
                lease: 0,
            };
            Ok((header, value))
        }
        (11, body) => {
            let (v11, value): (KvHeaderV11, &[u8]) = decode_body_with_tail(WHAT, body)?;
            let header = KvHeader {
                create_revision: v11.create_revision,
                mod_revision: v11.mod_revision,
                version: v11.version,
                expires_at_ms: v11.expires_at_ms,
                lease: 0,
            };
            Ok((header, value))
        }
        (_, body) => decode_body_with_tail(WHAT, body),
    }
}

/// Counts the rows of `kv` within `span`: keys, key plus value bytes, keys with an expiry.
pub(crate) fn count_kv_rows<R>(kv: &R, span: &KeySpan) -> Result<KvCounts, StorageError>
where
    R: ReadableTable<Bytes, Bytes>,
{
    let mut counts = KvCounts::default();
    for row in kv
        .range::<&[u8]>(span.bounds())
        .map_err(|e| StorageError::redb("count kv rows", e))?
    {
        let (key, value) = row.map_err(|e| StorageError::redb("count kv rows", e))?;
        let (header, value) = decode_kv_header(value.value())?;
        let expiring = header.expires_at_ms.is_some();
        counts.count(key.value(), value.len(), expiring, true);
    }
    Ok(counts)
}

/// Writes a `kv` row (or removes it, for `None`) and keeps the TTL index, the lease index
/// (`lease_keys`) and the range's counts of keys, bytes and keys with a TTL in step with
/// the row it replaces, which it returns.
pub(crate) fn write_kv(
    kv: &mut Table<Bytes, Bytes>,
    ttl: &mut Table<Bytes, Bytes>,
    lease_keys: &mut Table<Bytes, Bytes>,
    counts: &mut KvCounts,
    key: &[u8],
    after: Option<&KeyValue>,
) -> Result<Option<KeyValue>, StorageError> {
    let before = match after {
        Some(value) => kv.insert(key, encode_kv(value).as_slice()),
        None => kv.remove(key),
    }
    .map_err(|e| StorageError::redb("write kv", e))?
    .map(|old| decode_kv(key, old.value()))
    .transpose()?;
    if let Some(before) = &before {
        counts.count(
            key,
            before.value.len(),
            before.expires_at_ms.is_some(),
            false,
        );
    }
    if let Some(after) = after {
        counts.count(key, after.value.len(), after.expires_at_ms.is_some(), true);
    }
    let lease_of = |row: Option<&KeyValue>| row.map_or(0, |row| row.lease);
    attach(lease_keys, key, lease_of(before.as_ref()), lease_of(after))?;
    let expiry_before = before.as_ref().and_then(|value| value.expires_at_ms);
    let expiry_after = after.and_then(|value| value.expires_at_ms);
    if expiry_before != expiry_after {
        if let Some(expires_at_ms) = expiry_before {
            let removed = ttl
                .remove(ttl_key(expires_at_ms, key).as_slice())
                .map_err(|e| StorageError::redb("write ttl index", e))?;
            assert!(
                removed.is_some(),
                "a kv row with an expiry has a ttl index row"
            );
        }
        if let Some(expires_at_ms) = expiry_after {
            ttl.insert(ttl_key(expires_at_ms, key).as_slice(), [].as_slice())
                .map_err(|e| StorageError::redb("write ttl index", e))?;
        }
    }
    Ok(before)
}
