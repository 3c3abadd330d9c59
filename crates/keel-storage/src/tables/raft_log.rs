//! The `raft_log` table: each range's Raft log entries, keyed by range id then log index
//! (both big-endian, so a range's entries sort by index), each value an openraft entry.

use keel_types::RangeId;
use redb::{ReadableTable, TableDefinition};

use super::Bytes;
use super::raft_meta::RAFT_PURGED;
use super::range_rows::read_meta;
use crate::codec::decode;
use crate::error::StorageError;
use crate::raft_types::{Entry, LogId};

pub(crate) const RAFT_LOG: TableDefinition<Bytes, Bytes> = TableDefinition::new("raft_log");

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
