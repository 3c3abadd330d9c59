//! The writer ops of a replica's removal (`remove`): mark the range as being removed, then
//! delete its Raft and state-machine rows and leave the tombstone (the writer drops its
//! entries from the node-wide Raft log once that is durable, `Op::log_change`). Clearing its span in
//! between is an install's op (`install::clear`).

use keel_types::RangeId;
use redb::WriteTransaction;

use crate::error::StorageError;
use crate::tables::{self, RAFT_META, SM_META, SM_REMOVED, SM_REMOVING};

/// Writer op: marks the range as being removed, before anything of it is deleted.
pub(crate) fn begin(txn: &WriteTransaction, range: RangeId) -> Result<(), StorageError> {
    let mut sm_meta = txn
        .open_table(SM_META)
        .map_err(|e| StorageError::redb("open sm_meta", e))?;
    tables::write_meta(&mut sm_meta, range, SM_REMOVING, &true)
}

/// Writer op: deletes every `raft_meta` and `sm_meta` row of the range, the removing marker
/// included, and writes the removed tombstone.
pub(crate) fn finish(txn: &WriteTransaction, range: RangeId) -> Result<(), StorageError> {
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
