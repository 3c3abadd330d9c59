//! `Op`: a write the writer thread executes, what executing it produces (`Outcome`), what
//! each op changes in the node-wide Raft log (`Op::log_change`) and what it does to redb's
//! tables inside the writer's transaction (`execute`): the vote, and the ops of a snapshot
//! install, of a restore, of a removal and of history compaction are in `log`, `install`,
//! `restore`, `remove` and `history`; an apply is `apply`'s. Knows nothing about threads,
//! async, commits or the callbacks fired after them (`writer`).

mod history;
mod install;
mod log;
mod remove;
mod restore;

use std::sync::Arc;

use keel_types::{CommandOutcome, RangeId};
use redb::WriteTransaction;

use crate::apply;
use crate::error::StorageError;
use crate::meta::MetaRow;
use crate::raft_types::{Entry, LogId, Vote};
use crate::tables::{CompactStep, InstallMarker, KeySpan, Retention, SmState};
use crate::wal::Change;

pub(crate) use install::InstallBatch;

/// A write for the writer thread: to the node-wide Raft log, to redb's tables, or both.
pub(crate) enum Op {
    /// Log only.
    Append {
        range: RangeId,
        /// Shared with the log store's recent entries.
        entries: Vec<Arc<Entry>>,
    },
    SaveVote {
        range: RangeId,
        vote: Vote,
    },
    /// Executes nothing: answered once every request queued before it has committed. A batch
    /// of barriers alone opens no transaction. `Store::barrier` sends one only while requests
    /// are outstanding.
    Barrier,
    /// Log only.
    TruncateAfter {
        range: RangeId,
        last: Option<LogId>,
    },
    /// Log only; written once the state machine's commits so far are durable.
    Purge {
        range: RangeId,
        upto: LogId,
    },
    Apply {
        range: RangeId,
        entries: Vec<Entry>,
    },
    InstallBegin {
        range: RangeId,
        marker: InstallMarker,
    },
    InstallClear {
        range: RangeId,
        /// The snapshot's span; the range's current span is cleared too.
        span: KeySpan,
    },
    InstallRecords {
        range: RangeId,
        batch: InstallBatch,
    },
    InstallFinish {
        range: RangeId,
        state: SmState,
    },
    /// `restore`: commits a restored range's state and its Raft state at the initial log id.
    RestoreFinish {
        range: RangeId,
        state: SmState,
    },
    /// `restore`: writes the new cluster's meta range (state, table rows, Raft state).
    RestoreMeta {
        state: SmState,
        rows: Vec<MetaRow>,
    },
    RemoveBegin {
        range: RangeId,
    },
    /// Also drops the range from the log, once its redb commit is durable.
    RemoveFinish {
        range: RangeId,
    },
    /// One bounded step of the compaction of a range's history (`history`).
    CompactHistory {
        range: RangeId,
        retention: Retention,
    },
    /// Test fault: flips the last byte of `key`'s stored `kv` row, bypassing the log, so this
    /// replica silently differs (`Store::corrupt_row`).
    #[cfg(any(test, feature = "fault-injection"))]
    CorruptRow {
        key: Vec<u8>,
    },
}

impl Op {
    /// Whether redb's commit must be durable before the caller is told. State-machine
    /// applies need not: the log keeps what they applied until a durable commit holds it
    /// (`Purge` makes redb durable first), and replays it after a crash. The log's own ops
    /// are made durable in the log.
    pub fn needs_durability(&self) -> bool {
        !matches!(
            self,
            Op::Apply { .. }
                | Op::Barrier
                | Op::Append { .. }
                | Op::TruncateAfter { .. }
                | Op::InstallClear { .. }
                | Op::InstallRecords { .. }
                | Op::CompactHistory { .. }
        )
    }

    /// What the op changes in the node-wide Raft log.
    pub fn log_change(&self) -> Option<Change<'_>> {
        match self {
            Op::Append { range, entries } => Some(Change::Append {
                range: *range,
                entries,
            }),
            Op::TruncateAfter { range, last } => Some(Change::Truncate {
                range: *range,
                first_removed: last.map_or(0, |last| last.index + 1),
            }),
            Op::Purge { range, upto } => Some(Change::Purge {
                range: *range,
                upto: *upto,
            }),
            Op::RemoveFinish { range } => Some(Change::Drop { range: *range }),
            _ => None,
        }
    }

    /// Whether the op's log change forgets entries the state machine may have to apply
    /// again after a crash: it is written only after redb's commit is durable.
    pub fn forgets_log(&self) -> bool {
        matches!(self, Op::Purge { .. } | Op::RemoveFinish { .. })
    }

    /// Whether the op changes the log and nothing in redb.
    pub fn is_log_only(&self) -> bool {
        matches!(
            self,
            Op::Append { .. } | Op::TruncateAfter { .. } | Op::Purge { .. } | Op::Barrier
        )
    }
}

/// What executing an op produced.
pub(crate) enum Outcome {
    Done,
    /// `InstallClear`: whether rows of the span remain.
    More(bool),
    Compacted(CompactStep),
    Applied(Vec<CommandOutcome>),
}

/// Executes the redb part of `op` inside `txn`.
pub(crate) fn execute(txn: &WriteTransaction, op: &Op) -> Result<Outcome, StorageError> {
    let done = |result: Result<(), StorageError>| result.map(|()| Outcome::Done);
    match op {
        Op::Append { .. } | Op::TruncateAfter { .. } | Op::Purge { .. } | Op::Barrier => {
            Ok(Outcome::Done)
        }
        Op::SaveVote { range, vote } => done(log::save_vote(txn, *range, vote)),
        Op::Apply { range, entries } => {
            apply::apply_entries(txn, *range, entries).map(Outcome::Applied)
        }
        Op::InstallBegin { range, marker } => done(install::begin(txn, *range, marker)),
        Op::InstallClear { range, span } => install::clear(txn, *range, span).map(Outcome::More),
        Op::InstallRecords { range, batch } => done(install::insert_records(txn, *range, batch)),
        Op::InstallFinish { range, state } => done(install::finish(txn, *range, state)),
        Op::RestoreFinish { range, state } => done(restore::finish(txn, *range, state)),
        Op::RestoreMeta { state, rows } => done(restore::write_meta(txn, state, rows)),
        Op::RemoveBegin { range } => done(remove::begin(txn, *range)),
        Op::RemoveFinish { range } => done(remove::finish(txn, *range)),
        Op::CompactHistory { range, retention } => {
            history::compact(txn, *range, *retention).map(Outcome::Compacted)
        }
        #[cfg(any(test, feature = "fault-injection"))]
        Op::CorruptRow { key } => done(corrupt_row(txn, key)),
    }
}

/// Flips the top bit of the last byte of `key`'s `kv` row (in a row of an empty value, the
/// header's last varint then promises a byte that is not there); `Corrupt` if there is none.
#[cfg(any(test, feature = "fault-injection"))]
fn corrupt_row(txn: &WriteTransaction, key: &[u8]) -> Result<(), StorageError> {
    use redb::ReadableTable;
    let mut kv = txn
        .open_table(crate::tables::KV)
        .map_err(|e| StorageError::redb("open kv", e))?;
    let stored = kv.get(key).map_err(|e| StorageError::redb("read kv", e))?;
    let mut row = stored
        .map(|row| row.value().to_vec())
        .ok_or(StorageError::Corrupt {
            what: "corrupt_row fault",
            detail: "no such key".to_string(),
        })?;
    if let Some(last) = row.last_mut() {
        *last ^= 0x80;
    }
    kv.insert(key, row.as_slice())
        .map_err(|e| StorageError::redb("write kv", e))?;
    Ok(())
}
