//! The `raft_log` table of format 12 and older: each range's Raft log entries, keyed by range
//! id then log index (both big-endian, so a range's entries sort by index), each value an
//! openraft entry. The log now lives in the node-wide log (`wal`); opening a file moves what
//! this table holds there (`store::migrate_log`).

use std::collections::BTreeMap;
use std::sync::Arc;

use keel_types::RangeId;
use redb::{ReadableTable, TableDefinition};

use super::Bytes;
use crate::codec::decode;
use crate::error::StorageError;
use crate::raft_types::Entry;

pub(crate) const RAFT_LOG: TableDefinition<Bytes, Bytes> = TableDefinition::new("raft_log");

/// Key of one log entry: range id then index, both big-endian, so keys sort by range then
/// index.
#[cfg(test)]
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

/// Every entry of the table, by range, in index order (`store::migrate_log`).
pub(crate) fn read_all_entries<R>(
    log: &R,
) -> Result<BTreeMap<RangeId, Vec<Arc<Entry>>>, StorageError>
where
    R: ReadableTable<Bytes, Bytes>,
{
    let mut by_range: BTreeMap<RangeId, Vec<Arc<Entry>>> = BTreeMap::new();
    for row in log.iter().map_err(|e| StorageError::redb("read log", e))? {
        let (key, value) = row.map_err(|e| StorageError::redb("read log", e))?;
        let range = RangeId(u64::from_be_bytes(
            key.value()[..8]
                .try_into()
                .expect("raft_log keys are 16 bytes"),
        ));
        let entry = decode_entry(key.value(), value.value())?;
        let entries = by_range.entry(range).or_default();
        if let Some(previous) = entries.last()
            && entry.log_id.index != previous.log_id.index + 1
        {
            let detail = format!(
                "range {range}: raft log has a gap after {}",
                previous.log_id.index
            );
            return Err(StorageError::corrupt("raft log entry", detail));
        }
        entries.push(Arc::new(entry));
    }
    Ok(by_range)
}
