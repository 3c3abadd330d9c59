//! The writer ops of a restore (`restore`): a restored range's state and Raft state, and the
//! new cluster's meta range.

use keel_types::RangeId;
use redb::WriteTransaction;

use crate::error::StorageError;
use crate::meta::{self, MetaRow};
use crate::split::start_raft_state;
use crate::tables::{self, SM_META, SmState};

/// Writer op: the restored range's state (as an install finishes) and its Raft state.
pub(crate) fn finish(
    txn: &WriteTransaction,
    range: RangeId,
    state: &SmState,
) -> Result<(), StorageError> {
    super::install::finish(txn, range, state)?;
    start_raft_state(txn, range)
}

/// Writer op: the meta range's table rows, state and Raft state.
pub(crate) fn write_meta(
    txn: &WriteTransaction,
    state: &SmState,
    rows: &[MetaRow],
) -> Result<(), StorageError> {
    let mut table = txn
        .open_table(tables::META)
        .map_err(|e| StorageError::redb("open meta", e))?;
    for row in rows {
        meta::write_row(&mut table, row)?;
    }
    let mut sm_meta = txn
        .open_table(SM_META)
        .map_err(|e| StorageError::redb("open sm_meta", e))?;
    tables::write_sm_state(&mut sm_meta, RangeId::META, state)?;
    start_raft_state(txn, RangeId::META)
}
