//! The writer ops of a replica's removal (`remove`): mark the range as being removed, then
//! delete its Raft and state-machine rows and leave the tombstone. Clearing its span in
//! between is an install's op (`install::clear`).

use keel_types::RangeId;
use redb::WriteTransaction;

use crate::error::StorageError;
use crate::tables::{self, RAFT_LOG, RAFT_META, SM_META, SM_REMOVED, SM_REMOVING};

/// Writer op: marks the range as being removed, before anything of it is deleted.
pub(crate) fn begin(txn: &WriteTransaction, range: RangeId) -> Result<(), StorageError> {
    let mut sm_meta = txn
        .open_table(SM_META)
        .map_err(|e| StorageError::redb("open sm_meta", e))?;
    tables::write_meta(&mut sm_meta, range, SM_REMOVING, &true)
}

/// Writer op: deletes the range's log entries and every `raft_meta` and `sm_meta` row of
/// it, the removing marker included, and writes the removed tombstone.
pub(crate) fn finish(txn: &WriteTransaction, range: RangeId) -> Result<(), StorageError> {
    let mut log = txn
        .open_table(RAFT_LOG)
        .map_err(|e| StorageError::redb("open raft_log", e))?;
    let (lower, upper) = (tables::log_key(range, 0), tables::log_key(range, u64::MAX));
    log.retain_in(lower.as_slice()..=upper.as_slice(), |_, _| false)
        .map_err(|e| StorageError::redb("remove log", e))?;
    for table in [RAFT_META, SM_META] {
        let mut meta = txn
            .open_table(table)
            .map_err(|e| StorageError::redb("open meta for removal", e))?;
        let (lower, upper) = (tables::meta_key(range, 0), tables::meta_key(range, u8::MAX));
        meta.retain_in(lower.as_slice()..=upper.as_slice(), |_, _| false)
            .map_err(|e| StorageError::redb("remove range meta", e))?;
    }
    let mut sm_meta = txn
        .open_table(SM_META)
        .map_err(|e| StorageError::redb("open sm_meta", e))?;
    tables::write_meta(&mut sm_meta, range, SM_REMOVED, &true)
}
