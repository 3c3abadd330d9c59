//! The writer op of a range's vote (`LogStore::save_vote`), inside the writer's transaction.
//! The log's entries are in the node-wide Raft log (`wal`), not here.

use keel_types::RangeId;
use redb::WriteTransaction;

use crate::error::StorageError;
use crate::raft_types::Vote;
use crate::tables::{self, RAFT_META, RAFT_VOTE};

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
