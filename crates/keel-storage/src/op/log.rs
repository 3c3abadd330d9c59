//! The writer ops of a range's Raft log (`LogStore`): append entries, save the vote,
//! truncate and purge, each inside the writer's transaction.

use std::sync::Arc;

use keel_types::RangeId;
use redb::WriteTransaction;

use crate::codec::encode;
use crate::error::StorageError;
use crate::raft_types::{Entry, LogId, Vote};
use crate::tables::{self, RAFT_LOG, RAFT_META, RAFT_PURGED, RAFT_VOTE};

/// Writer op: appends entries that must directly follow the range's last log id.
pub(crate) fn append_entries(
    txn: &WriteTransaction,
    range: RangeId,
    entries: &[Arc<Entry>],
) -> Result<(), StorageError> {
    let mut log = txn
        .open_table(RAFT_LOG)
        .map_err(|e| StorageError::redb("open raft_log", e))?;
    let meta = txn
        .open_table(RAFT_META)
        .map_err(|e| StorageError::redb("open raft_meta", e))?;
    let (_, last) = tables::log_state(&log, &meta, range)?;
    let mut expected = last.map(|last| last.index + 1);
    for entry in entries {
        let index = entry.log_id.index;
        if let Some(expected) = expected {
            assert_eq!(
                index, expected,
                "range {range}: appended log index is not last + 1"
            );
        }
        let key = tables::log_key(range, index);
        let value = encode(entry.as_ref());
        log.insert(key.as_slice(), value.as_slice())
            .map_err(|e| StorageError::redb("append log", e))?;
        expected = Some(index + 1);
    }
    Ok(())
}

pub(crate) fn save_vote(
    txn: &WriteTransaction,
    range: RangeId,
    vote: &Vote,
) -> Result<(), StorageError> {
    let mut meta = txn
        .open_table(RAFT_META)
        .map_err(|e| StorageError::redb("open raft_meta", e))?;
    tables::write_meta(&mut meta, range, RAFT_VOTE, vote)
}

pub(crate) fn truncate_after(
    txn: &WriteTransaction,
    range: RangeId,
    last: Option<&LogId>,
) -> Result<(), StorageError> {
    let mut log = txn
        .open_table(RAFT_LOG)
        .map_err(|e| StorageError::redb("open raft_log", e))?;
    let start = last.map_or(0, |last| last.index + 1);
    let lower = tables::log_key(range, start);
    let upper = tables::log_key(range, u64::MAX);
    log.retain_in(lower.as_slice()..=upper.as_slice(), |_, _| false)
        .map_err(|e| StorageError::redb("truncate log", e))
}

pub(crate) fn purge(
    txn: &WriteTransaction,
    range: RangeId,
    upto: &LogId,
) -> Result<(), StorageError> {
    let mut log = txn
        .open_table(RAFT_LOG)
        .map_err(|e| StorageError::redb("open raft_log", e))?;
    let mut meta = txn
        .open_table(RAFT_META)
        .map_err(|e| StorageError::redb("open raft_meta", e))?;
    let purged: Option<LogId> = tables::read_meta(&meta, range, RAFT_PURGED, "purged log id")?;
    if purged
        .as_ref()
        .is_some_and(|purged| purged.index >= upto.index)
    {
        return Ok(());
    }
    let lower = tables::log_key(range, 0);
    let upper = tables::log_key(range, upto.index);
    log.retain_in(lower.as_slice()..=upper.as_slice(), |_, _| false)
        .map_err(|e| StorageError::redb("purge log", e))?;
    tables::write_meta(&mut meta, range, RAFT_PURGED, upto)
}
