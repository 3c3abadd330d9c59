//! The writer op of history compaction: one bounded step for one range (`tables::compact`),
//! with the range's history floor and bytes written in the same transaction. A step is
//! local to the replica and not fsynced: a crash rolls it back with everything after it.

use keel_types::{RangeId, limits};
use redb::WriteTransaction;

use crate::error::StorageError;
use crate::tables::{
    self, CompactStep, HISTORY, HistoryFacts, Retention, SM_HISTORY_BYTES, SM_HISTORY_FLOOR,
    SM_META,
};

/// Writer op: compacts the history of `range` by one step. A range without applied state,
/// mid-install or being removed is left alone (`Empty`).
pub(crate) fn compact(
    txn: &WriteTransaction,
    range: RangeId,
    retention: Retention,
) -> Result<CompactStep, StorageError> {
    let mut sm_meta = txn
        .open_table(SM_META)
        .map_err(|e| StorageError::redb("open sm_meta", e))?;
    let mut state = tables::read_sm_state(&sm_meta, range)?;
    let idle = state.applied.is_none() || state.installing.is_some();
    if idle || tables::is_removing(&sm_meta, range)? {
        return Ok(CompactStep::Empty);
    }
    let mut history = txn
        .open_table(HISTORY)
        .map_err(|e| StorageError::redb("open history", e))?;
    let before = (state.history_floor, state.history_bytes);
    let facts = HistoryFacts {
        floor: &mut state.history_floor,
        bytes: &mut state.history_bytes,
        revision: state.revision,
    };
    let budget = limits::HISTORY_COMPACT_ROWS_PER_TXN;
    let step = tables::compact(&mut history, facts, &state.span, retention, budget)?;
    if (state.history_floor, state.history_bytes) != before {
        tables::write_meta(&mut sm_meta, range, SM_HISTORY_FLOOR, &state.history_floor)?;
        tables::write_meta(&mut sm_meta, range, SM_HISTORY_BYTES, &state.history_bytes)?;
    }
    Ok(step)
}
