//! Versioned encodings of everything persisted: one format-version byte, then a postcard
//! body; and `Digest`, the fingerprint of a value's encoding that sessions and request
//! records keep. Knows nothing about tables, files or openraft's traits.
//!
//! Format history (every version stays readable):
//! - 1: the first release.
//! - 2: `kv` values carry an expiry (`tables`); snapshot files gained record kinds for the
//!   range's clock, client sessions, request records and rows with an expiry (`snapshot`).
//! - 3: log entries may hold `Command::{FencedMutate, Coordinate, Reclaim}` and request
//!   records `CommandOutcome::Coordinated` and the coordination rejections; the tables
//!   `locks`, `fences`, `idempotency` and `deadlines` and their `sm_meta` counts appeared
//!   (`tables`); snapshot files gained record kinds for locks, fences and idempotency
//!   records (`snapshot`). Enums only gained variants at their end.
//! - 4: ranges split and the meta range holds the cluster's table. `sm_meta` gained each
//!   range's span, epoch, conf_version and counts of keys and bytes (`tables`; a range of an
//!   older file has no span row, so range 1 spans the whole keyspace, and gets its key and
//!   byte counts when the store first opens the file); the `meta` table appeared; log
//!   entries may hold `Command::{Split, Meta}` and request records
//!   `CommandOutcome::{Split, Meta}` and the rejections `KeyOutOfRange`, `EpochMismatch` and
//!   `WrongRangeKind`; snapshot files gained a `Range` record (span, epoch, conf_version)
//!   right after the header and records for the meta range's rows (`snapshot`). A snapshot
//!   file of format 1-3 still installs (with the span its range has without a span row); a
//!   build of format 3 refuses a file of format 4 (`UnknownVersion`), so nodes of both
//!   builds cannot send each other snapshots.
//! - 5: replicas move and nodes come and go. `sm_meta` gained a *removing* marker and a
//!   *removed* tombstone per range (`remove`); the `meta` table gained node states
//!   (`NodeState`, key kind 4); log entries may hold `MetaCommand::SetNodeState` and
//!   outcomes the rejection `MembershipChanging`; snapshot files of the meta range gained a
//!   `MetaNodeState` record. A build of format 4 refuses a file of format 5.
//! - 6: request ids belong to their sender. A `sessions` row gained its owner and a
//!   `requests` row the digest of its request (`tables::{Session, RequestRecord}`; rows of
//!   older formats decode with neither, `session` says how they are treated); the
//!   rejection `RequestIdReused` appeared; `sm_meta` gained each range's count of the bytes
//!   of its `locks`, `fences` and `idempotency` rows (counted when the store first opens an
//!   older file); snapshot files write sessions and request records
//!   as the records `OwnedSession` and `DigestedRequest` (files of older formats keep
//!   `Session` and `Request`). A build of format 5 refuses a file of format 6.
//! - 7: snapshot files are sealed: they end with a `SealedEnd` record (record count and the
//!   SHA-256 of every byte before it) instead of `End`, all their records carry the header's
//!   version and nothing follows the end (`snapshot`); files of older formats still end with
//!   `End` and are checked for framing and count only. Nothing else changed. A build of
//!   format 6 refuses a file of format 7.
//! - 8: ranges keep history. The table `history` appeared and `sm_meta`
//!   gained each range's history floor and the bytes of its events (`tables`; a range of an
//!   older file starts its history at its revision when the store first opens the file); a
//!   `Command::Cleanup` that removes keys now takes a revision (a log written by an older
//!   build replays with its cleanups taking revisions). Snapshot files are unchanged but for
//!   the version byte. A build of format 7 refuses a file of format 8, so it cannot drop
//!   events from a history it does not keep.
//! - 9: reclaims are events. A `history` row holds a `StoredEvent` enum: a key's change (the
//!   format-8 event's fields, after a 0 tag) or a lock or idempotency record a reclaim
//!   removed; rows of format 8 stay and read as key changes. Log entries may hold the
//!   variant `Command::Reclaim`, whose locks take one revision and records the next; the
//!   format-8 variant, now `Command::ReclaimUnrecorded`, still applies from old logs as it
//!   did (no revision). A node of format 8 cannot decode the new variant.
//! - 10: consistency checks. Log entries may hold `Command::Check` and request records never
//!   hold its outcome (`CommandOutcome::Checked`, a check has no request id); log entries may
//!   hold `Command::Hold`, which sets or clears a range's hold (`sm_meta` gained a hold row,
//!   snapshot files a `Hold` record after `Clock` while the range is held), and outcomes the
//!   rejection `RangeHeld`. A node of format 9 cannot decode the new variants, and refuses a
//!   file of format 10.
//! - 11: keys carry etcd's `version` (`KeyValue::version`, the writes since the key was
//!   created). A `kv` row's header, a `history` event's states before and after, and the
//!   key states inside request records (`OpResult::previous`, `ConditionFailed::current`)
//!   gained it; snapshot files write rows as `VersionedRow` and request records as
//!   `VersionedRequest` records. Rows, events and records of older formats decode through
//!   mirror types of their shape (`tables`, `snapshot`, `keel_types::command::legacy`) and
//!   read version 1. Log entries are unchanged (no command holds a key's state). A node of
//!   format 10 refuses a file of format 11.
//! - 12: etcd's leases. Keys carry the lease they are attached to (`KeyValue::lease`, 0 for
//!   none): a `kv` row's header, a `history` event's states and the key states inside
//!   request records gained it; snapshot files write rows as `LeasedRow` and request
//!   records as `LeasedRequest` records. Rows, events and records of older formats decode
//!   through mirror types of their shape (`KvHeaderV11`, `StoredStateV11`,
//!   `RequestRecordV11`, `keel_types::command::legacy::*V11`) and read lease 0. The tables
//!   `leases` and `lease_keys` appeared and `deadlines` rows of kind 3 (a lease's expiry)
//!   (`tables`); snapshot files gained a `Lease` record per lease (`snapshot`); log entries
//!   may hold `Command::{Lease, ExpireLeases}`, and outcomes `CommandOutcome::Leased` and
//!   the rejections `LeaseExists`, `LeaseNotFound`, `LeaseFull` and `KeyNotFound`.
//!   Transactions' puts gained `lease`, `ignore_value` and `ignore_lease` and compares the
//!   target `Lease`: log entries hold them as the new variant `Command::Txn`, and the
//!   variant of format 11 (now `Command::TxnV11`, its puts `legacy::TxnPutV11`) still
//!   decodes and applies as a transaction whose puts attach no lease. A node of format 11
//!   refuses a file of format 12.
//! - 13: the Raft log moved out of the file into the node-wide log (`wal`, the directory
//!   `keel.raft-log/` beside the file); opening a file of format 12 or older moves its
//!   `raft_log` table there. No record changed shape: the version says that a node of
//!   format 12, which would find no log in the file, must refuse it.
//!
//! Every other record has the same shape in every version, and `decode` reads any.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use crate::error::StorageError;

/// The format version this build writes.
pub(crate) const FORMAT_VERSION: u8 = 13;
/// The oldest format version this build reads.
pub(crate) const FORMAT_VERSION_MIN: u8 = 1;

/// `FORMAT_VERSION` followed by the postcard encoding of `value`.
pub(crate) fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    let bytes = vec![FORMAT_VERSION];
    postcard::to_extend(value, bytes).expect("postcard encoding into a Vec cannot fail")
}

/// The length of `encode(value)`, without encoding it.
pub(crate) fn encoded_len<T: Serialize>(value: &T) -> usize {
    let body = postcard::experimental::serialized_size(value)
        .expect("postcard sizing of a value it can encode cannot fail");
    1 + body
}

/// Decodes a record written by `encode` by any readable version. Only for records whose
/// shape is the same in every readable version; `what` names it in errors.
pub(crate) fn decode<T: DeserializeOwned>(
    what: &'static str,
    bytes: &[u8],
) -> Result<T, StorageError> {
    let (_, body) = split_version(what, bytes)?;
    decode_body(what, body)
}

/// Decodes a body (after the version byte) that must hold exactly one `T`.
pub(crate) fn decode_body<T: DeserializeOwned>(
    what: &'static str,
    body: &[u8],
) -> Result<T, StorageError> {
    let (value, rest) =
        postcard::take_from_bytes(body).map_err(|e| StorageError::corrupt(what, e))?;
    if !rest.is_empty() {
        return Err(StorageError::corrupt(
            what,
            format!("{} trailing bytes", rest.len()),
        ));
    }
    Ok(value)
}

/// `FORMAT_VERSION`, the postcard encoding of `header`, then `tail` verbatim. Used for user
/// values, so a value of a megabyte is not encoded byte by byte.
pub(crate) fn encode_with_tail<T: Serialize>(header: &T, tail: &[u8]) -> Vec<u8> {
    let mut bytes = encode(header);
    bytes.extend_from_slice(tail);
    bytes
}

/// Decodes the header of a body written by `encode_with_tail`; returns it and the raw tail.
pub(crate) fn decode_body_with_tail<'a, T: DeserializeOwned>(
    what: &'static str,
    body: &'a [u8],
) -> Result<(T, &'a [u8]), StorageError> {
    postcard::take_from_bytes(body).map_err(|e| StorageError::corrupt(what, e))
}

/// The format version of a record and its body; an error for a version this build does not
/// read.
pub(crate) fn split_version<'a>(
    what: &'static str,
    bytes: &'a [u8],
) -> Result<(u8, &'a [u8]), StorageError> {
    match bytes.split_first() {
        None => Err(StorageError::corrupt(what, "empty record")),
        Some((&version, body)) if (FORMAT_VERSION_MIN..=FORMAT_VERSION).contains(&version) => {
            Ok((version, body))
        }
        Some((&version, _)) => Err(StorageError::UnknownVersion {
            what,
            version,
            known: FORMAT_VERSION,
        }),
    }
}

/// A fingerprint: the first 16 bytes of a SHA-256.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub(crate) struct Digest(pub [u8; 16]);

impl Digest {
    /// The digest of `value`'s postcard encoding (self-delimiting, so no two values share
    /// one), hashed as it is encoded: nothing is copied.
    pub fn of<T: Serialize + ?Sized>(value: &T) -> Digest {
        let hasher = postcard::serialize_with_flavor(value, Hashing(Sha256::new()))
            .expect("hashing a postcard encoding cannot fail");
        let mut digest = [0; 16];
        digest.copy_from_slice(&hasher.finalize()[..16]);
        Digest(digest)
    }
}

/// A postcard flavor that feeds what it encodes to a SHA-256.
struct Hashing(Sha256);

impl postcard::ser_flavors::Flavor for Hashing {
    type Output = Sha256;

    fn try_extend(&mut self, data: &[u8]) -> postcard::Result<()> {
        self.0.update(data);
        Ok(())
    }

    fn try_push(&mut self, data: u8) -> postcard::Result<()> {
        self.0.update([data]);
        Ok(())
    }

    fn finalize(self) -> postcard::Result<Sha256> {
        Ok(self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_version_checks() {
        let bytes = encode(&(7u64, "seven".to_string()));
        assert_eq!(bytes[0], FORMAT_VERSION);
        let value: (u64, String) = decode("pair", &bytes).unwrap();
        assert_eq!(value, (7, "seven".to_string()));

        let mut older = bytes.clone();
        older[0] = FORMAT_VERSION_MIN;
        let value: (u64, String) = decode("pair", &older).unwrap();
        assert_eq!(value.0, 7, "records of one shape decode from every version");

        for version in [0, FORMAT_VERSION + 1] {
            let mut unknown = bytes.clone();
            unknown[0] = version;
            let error = decode::<(u64, String)>("pair", &unknown).unwrap_err();
            assert!(
                matches!(error, StorageError::UnknownVersion { version: v, .. } if v == version),
                "{error}"
            );
        }

        assert!(matches!(
            decode::<u64>("empty", &[]),
            Err(StorageError::Corrupt { .. })
        ));
        let mut long = encode(&1u64);
        long.push(0);
        assert!(matches!(
            decode::<u64>("long", &long),
            Err(StorageError::Corrupt { .. })
        ));
    }

    #[test]
    fn tail_is_kept_verbatim() {
        let bytes = encode_with_tail(&(3u64, 4u64), b"value bytes");
        let (version, body) = split_version("kv", &bytes).unwrap();
        assert_eq!(version, FORMAT_VERSION);
        let (header, tail): ((u64, u64), &[u8]) = decode_body_with_tail("kv", body).unwrap();
        assert_eq!(header, (3, 4));
        assert_eq!(tail, b"value bytes");
    }
}
