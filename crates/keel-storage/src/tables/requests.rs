//! The `requests` table: the first outcome of each request of a range's client sessions
//! (`RequestRecord`, from format 6 with the request's digest, from format 11 with versions
//! in its key states, from format 12 with leases), keyed by range id, client id, then
//! sequence, so a session's records sort together by sequence. `sm_meta` counts the range's
//! records.

use std::ops::RangeInclusive;

use keel_types::command::legacy::{CommandOutcomeOf, CommandOutcomeV10, KeyValueV10, KeyValueV11};
use keel_types::{CommandOutcome, RangeId};
use redb::{ReadableTable, Table, TableDefinition};
use serde::{Deserialize, Serialize};

use super::Bytes;
use super::sessions::session_key;
use crate::codec::{Digest, decode_body, encode, split_version};
use crate::error::StorageError;

pub(crate) const REQUESTS: TableDefinition<Bytes, Bytes> = TableDefinition::new("requests");

/// Key of a request record: range id, client id, then sequence, so a session's records sort
/// together by sequence.
pub(crate) fn request_key(range: RangeId, client_id: u64, sequence: u64) -> [u8; 24] {
    let mut key = [0u8; 24];
    key[..16].copy_from_slice(&session_key(range, client_id));
    key[16..].copy_from_slice(&sequence.to_be_bytes());
    key
}

/// `(client id, sequence)` of a `requests` key.
pub(crate) fn request_key_parts(key: &[u8]) -> (u64, u64) {
    let client: [u8; 8] = key[8..16].try_into().expect("requests keys are 24 bytes");
    let sequence: [u8; 8] = key[16..24].try_into().expect("requests keys are 24 bytes");
    (u64::from_be_bytes(client), u64::from_be_bytes(sequence))
}

/// A request record: what the request asked and its first outcome.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct RequestRecord {
    /// `session::request_digest` of the request; `None` in a record written before format 6.
    pub digest: Option<Digest>,
    pub outcome: CommandOutcome,
}

impl RequestRecord {
    /// Decodes a record of any readable format: a bare outcome before format 6, a
    /// `RequestRecordV6` in formats 6-10 (whose key states read version 1), a
    /// `RequestRecordV11` in format 11 (whose key states read lease 0), else a
    /// `RequestRecord`.
    pub fn decode(bytes: &[u8]) -> Result<RequestRecord, StorageError> {
        const WHAT: &str = "request record";
        match split_version(WHAT, bytes)? {
            (..=5, body) => {
                let outcome: CommandOutcomeV10 = decode_body(WHAT, body)?;
                Ok(RequestRecord {
                    digest: None,
                    outcome: outcome.into(),
                })
            }
            (6..=10, body) => Ok(decode_body::<RequestRecordV6>(WHAT, body)?.into()),
            (11, body) => Ok(decode_body::<RequestRecordV11>(WHAT, body)?.into()),
            (_, body) => decode_body(WHAT, body),
        }
    }
}

/// A request record of an older format, whose outcome holds key states `K`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct RequestRecordOf<K> {
    pub digest: Option<Digest>,
    pub outcome: CommandOutcomeOf<K>,
}

/// A request record of formats 6-10: its outcome's key states have no version.
pub(crate) type RequestRecordV6 = RequestRecordOf<KeyValueV10>;
/// A request record of format 11: its outcome's key states have no lease.
pub(crate) type RequestRecordV11 = RequestRecordOf<KeyValueV11>;

impl<K: Into<keel_types::KeyValue>> From<RequestRecordOf<K>> for RequestRecord {
    fn from(record: RequestRecordOf<K>) -> RequestRecord {
        RequestRecord {
            digest: record.digest,
            outcome: record.outcome.into(),
        }
    }
}

/// The record of a request, if it has one.
pub(crate) fn read_request<R>(
    requests: &R,
    range: RangeId,
    client_id: u64,
    sequence: u64,
) -> Result<Option<RequestRecord>, StorageError>
where
    R: ReadableTable<Bytes, Bytes>,
{
    let key = request_key(range, client_id, sequence);
    let row = requests
        .get(key.as_slice())
        .map_err(|e| StorageError::redb("read request record", e))?;
    row.map(|value| RequestRecord::decode(value.value()))
        .transpose()
}

pub(crate) fn write_request(
    requests: &mut Table<Bytes, Bytes>,
    range: RangeId,
    client_id: u64,
    sequence: u64,
    record: &RequestRecord,
) -> Result<(), StorageError> {
    let key = request_key(range, client_id, sequence);
    requests
        .insert(key.as_slice(), encode(record).as_slice())
        .map_err(|e| StorageError::redb("write request record", e))?;
    Ok(())
}

/// Records of one session with a sequence in `sequences`.
pub(crate) fn count_requests<R>(
    requests: &R,
    range: RangeId,
    client_id: u64,
    sequences: RangeInclusive<u64>,
) -> Result<u64, StorageError>
where
    R: ReadableTable<Bytes, Bytes>,
{
    let start = request_key(range, client_id, *sequences.start());
    let end = request_key(range, client_id, *sequences.end());
    let rows = requests
        .range(start.as_slice()..=end.as_slice())
        .map_err(|e| StorageError::redb("read request records", e))?;
    let mut count = 0;
    for row in rows {
        row.map_err(|e| StorageError::redb("read request records", e))?;
        count += 1;
    }
    Ok(count)
}

/// Deletes the records of one session with a sequence in `sequences`.
pub(crate) fn remove_requests(
    requests: &mut Table<Bytes, Bytes>,
    range: RangeId,
    client_id: u64,
    sequences: RangeInclusive<u64>,
) -> Result<(), StorageError> {
    let start = request_key(range, client_id, *sequences.start());
    let end = request_key(range, client_id, *sequences.end());
    requests
        .retain_in(start.as_slice()..=end.as_slice(), |_, _| false)
        .map_err(|e| StorageError::redb("remove request records", e))
}
