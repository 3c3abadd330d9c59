//! The `sm_meta` table: each range's state-machine metadata (`SmState`), one row per kind,
//! keyed by range id then kind (`meta_key`): applied log id, membership, revision, clock,
//! session horizon, the counts of its sessions, request records, keys with a TTL, locks,
//! fenced keys and idempotency records, (format 4) span, epoch, conf_version and counts of
//! keys and bytes, (format 6) the bytes of its locks, fences and idempotency records; the
//! installing marker while a snapshot install is under way, and (format 5) the removing
//! marker and removed tombstone of `remove`, and (format 10) the range's hold.
//!
//! A file of an older format lacks some counts until the store opens it
//! (`count_unrecorded_kv`: format 1-3, `count_unrecorded_coordination`: format 1-5), and
//! (format 8) a history floor and the bytes of its events (`start_unrecorded_history`:
//! format 1-7 starts the history at the range's revision).

use keel_types::{Hold, NodeId, RangeDescriptor, RangeId, Revision};
use redb::{ReadableTable, Table, TableDefinition};
use serde::{Deserialize, Serialize};

use super::Bytes;
use super::keyed_rows::{RowCounts, count_rows};
use super::kv::{KvCounts, count_kv_rows};
use super::range_rows::{meta_key, ranges_in, read_meta, remove_meta, write_meta};
use super::span::KeySpan;
use crate::error::StorageError;
use crate::raft_types::{LogId, StoredMembership};

pub(crate) const SM_META: TableDefinition<Bytes, Bytes> = TableDefinition::new("sm_meta");

/// Kinds of `sm_meta` rows.
pub(crate) const SM_APPLIED: u8 = 1;
pub(crate) const SM_MEMBERSHIP: u8 = 2;
pub(crate) const SM_REVISION: u8 = 3;
pub(crate) const SM_INSTALLING: u8 = 4;
pub(crate) const SM_CLOCK: u8 = 5;
pub(crate) const SM_SESSION_HORIZON: u8 = 6;
pub(crate) const SM_SESSIONS: u8 = 7;
pub(crate) const SM_REQUESTS: u8 = 8;
pub(crate) const SM_KEYS_WITH_TTL: u8 = 9;
pub(crate) const SM_LOCKS: u8 = 10;
pub(crate) const SM_FENCED_KEYS: u8 = 11;
pub(crate) const SM_IDEMPOTENCY_RECORDS: u8 = 12;
/// Format 4: the range's `KeySpan`; absent = `KeySpan::unrecorded`.
pub(crate) const SM_SPAN: u8 = 13;
/// Format 4: splits of the range so far.
pub(crate) const SM_EPOCH: u8 = 14;
/// Format 4: membership entries the range applied so far (from format 4 on).
pub(crate) const SM_CONF_VERSION: u8 = 15;
/// Format 4: the range's rows in `kv`; absent in a file of an older format until the store
/// opens it (`count_kv_rows`).
pub(crate) const SM_KEYS: u8 = 16;
/// Format 4: key plus value bytes of the range's rows in `kv`.
pub(crate) const SM_BYTES: u8 = 17;
/// The range's replica is being removed from this file (`remove`); present = listed
/// nowhere, its rows and state are being deleted.
pub(crate) const SM_REMOVING: u8 = 18;
/// The range's replica was removed from this file (a tombstone, the only row left of it).
pub(crate) const SM_REMOVED: u8 = 19;
/// (format 6) Bytes of the range's rows in `locks`, `fences` and `idempotency`: name or key
/// plus the stored value. Missing in older files until the store counts them at open.
pub(crate) const SM_COORDINATION_BYTES: u8 = 20;
/// (format 8) The range's history floor (`history`): events at or below it may be gone.
/// Missing in older files until the store opens them, which starts it at the revision.
pub(crate) const SM_HISTORY_FLOOR: u8 = 21;
/// (format 8) Bytes of the range's events (`history::event_bytes`).
pub(crate) const SM_HISTORY_BYTES: u8 = 22;
/// (format 10) The range is held (`keel_types::Hold`): present = it serves nothing.
pub(crate) const SM_HOLD: u8 = 23;

/// The state-machine metadata of one range.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct SmState {
    pub applied: Option<LogId>,
    pub membership: StoredMembership,
    pub revision: Revision,
    /// Set while a snapshot install is under way (see `state_machine`): the data is partial.
    pub installing: Option<InstallMarker>,
    /// The newest command time applied (`Mutation::now_ms`, `Cleanup::now_ms`); never goes
    /// back. Expiry and sessions are judged by it.
    pub clock_ms: u64,
    /// Sessions that started at or before this instant are gone or were never admitted: a
    /// request of such a session without a session record is refused (`session`).
    pub session_horizon_ms: u64,
    /// Rows of this range in `sessions`.
    pub sessions: u64,
    /// Rows of this range in `requests`.
    pub requests: u64,
    /// The key span the range owns (`KeySpan::unrecorded` without a span row).
    pub span: KeySpan,
    /// Grows by one on every split of the range.
    pub epoch: u64,
    /// Grows by one on every membership entry the range applies.
    pub conf_version: u64,
    /// The range's rows in `kv`: keys, bytes, keys with a TTL.
    pub kv: KvCounts,
    /// Rows of this range in `locks`, free ones not yet reclaimed included.
    pub locks: u64,
    /// Rows of this range in `fences`.
    pub fenced_keys: u64,
    /// Rows of this range in `idempotency`, expired ones not yet reclaimed included.
    pub idempotency_records: u64,
    /// Bytes of this range's rows in `locks`, `fences` and `idempotency` (`row_bytes`).
    pub coordination_bytes: u64,
    /// Events at or below this revision may be gone; every event above it is recorded.
    pub history_floor: Revision,
    /// Bytes of the range's events (`history::event_bytes`).
    pub history_bytes: u64,
    /// Set while the range is held (`Command::Hold`); written by `write_hold` only.
    pub hold: Option<Hold>,
}

impl SmState {
    /// The range's descriptor: its span, epoch, conf_version and voters.
    pub fn descriptor(&self, range: RangeId) -> RangeDescriptor {
        let mut replicas: Vec<NodeId> = self.membership.voter_ids().collect();
        replicas.sort_unstable();
        replicas.dedup();
        self.span
            .descriptor(range, self.epoch, self.conf_version, replicas)
    }

    /// The counts a write of a `locks` row keeps in step.
    pub fn lock_counts(&mut self) -> RowCounts<'_> {
        RowCounts {
            rows: &mut self.locks,
            bytes: &mut self.coordination_bytes,
        }
    }

    /// The counts a write of a `fences` row keeps in step.
    pub fn fence_counts(&mut self) -> RowCounts<'_> {
        RowCounts {
            rows: &mut self.fenced_keys,
            bytes: &mut self.coordination_bytes,
        }
    }

    /// The counts a write of an `idempotency` row keeps in step.
    pub fn record_counts(&mut self) -> RowCounts<'_> {
        RowCounts {
            rows: &mut self.idempotency_records,
            bytes: &mut self.coordination_bytes,
        }
    }

    /// Moves the clock to `now_ms` if that is later, and returns it.
    pub fn advance_clock(&mut self, now_ms: u64) -> u64 {
        self.clock_ms = self.clock_ms.max(now_ms);
        self.clock_ms
    }
}

/// Written before a snapshot install deletes anything; cleared by the commit that finishes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct InstallMarker {
    pub snapshot_last_log_id: Option<LogId>,
}

/// The state-machine metadata of a range.
pub(crate) fn read_sm_state<R>(sm_meta: &R, range: RangeId) -> Result<SmState, StorageError>
where
    R: ReadableTable<Bytes, Bytes>,
{
    let count = |kind, what| -> Result<u64, StorageError> {
        Ok(read_meta(sm_meta, range, kind, what)?.unwrap_or(0))
    };
    Ok(SmState {
        applied: read_meta(sm_meta, range, SM_APPLIED, "applied log id")?,
        membership: read_meta(sm_meta, range, SM_MEMBERSHIP, "membership")?.unwrap_or_default(),
        revision: count(SM_REVISION, "revision")?,
        installing: read_meta(sm_meta, range, SM_INSTALLING, "install marker")?,
        clock_ms: count(SM_CLOCK, "clock")?,
        session_horizon_ms: count(SM_SESSION_HORIZON, "session horizon")?,
        sessions: count(SM_SESSIONS, "session count")?,
        requests: count(SM_REQUESTS, "request count")?,
        span: read_meta(sm_meta, range, SM_SPAN, "key span")?
            .unwrap_or_else(|| KeySpan::unrecorded(range)),
        epoch: count(SM_EPOCH, "epoch")?,
        conf_version: count(SM_CONF_VERSION, "conf version")?,
        kv: KvCounts {
            keys: count(SM_KEYS, "key count")?,
            bytes: count(SM_BYTES, "byte count")?,
            keys_with_ttl: count(SM_KEYS_WITH_TTL, "TTL key count")?,
        },
        locks: count(SM_LOCKS, "lock count")?,
        fenced_keys: count(SM_FENCED_KEYS, "fenced key count")?,
        idempotency_records: count(SM_IDEMPOTENCY_RECORDS, "record count")?,
        coordination_bytes: count(SM_COORDINATION_BYTES, "coordination byte count")?,
        history_floor: count(SM_HISTORY_FLOOR, "history floor")?,
        history_bytes: count(SM_HISTORY_BYTES, "history byte count")?,
        hold: read_meta(sm_meta, range, SM_HOLD, "hold")?,
    })
}

/// Writes the range's hold row: present while it is held (`Some`), else removed.
pub(crate) fn write_hold(
    sm_meta: &mut Table<Bytes, Bytes>,
    range: RangeId,
    hold: Option<&Hold>,
) -> Result<(), StorageError> {
    match hold {
        Some(hold) => write_meta(sm_meta, range, SM_HOLD, hold),
        None => remove_meta(sm_meta, range, SM_HOLD),
    }
}

/// Writes applied log id, membership, revision, clock, session horizon, span, epoch,
/// conf_version and counts (not the install marker, nor the hold: `write_hold`).
pub(crate) fn write_sm_state(
    sm_meta: &mut Table<Bytes, Bytes>,
    range: RangeId,
    state: &SmState,
) -> Result<(), StorageError> {
    write_sm_state_since(sm_meta, range, None, state)
}

/// One number of `SmState`, as `write_sm_state_since` compares and writes it.
type Field = fn(&SmState) -> u64;

/// `write_sm_state`, but only the rows whose value differs from `before`, the state as read
/// in this transaction (every row with `None`, or when `before` has applied nothing: a
/// range's first apply writes every row, so that none is left absent; absent rows of files
/// of older formats are filled in when the store opens them, before anything applies).
pub(crate) fn write_sm_state_since(
    sm_meta: &mut Table<Bytes, Bytes>,
    range: RangeId,
    before: Option<&SmState>,
    state: &SmState,
) -> Result<(), StorageError> {
    let before = before.filter(|before| before.applied.is_some());
    // Whether a row must be written: there is no `before`, or its value differs there.
    let changed = |same: &dyn Fn(&SmState) -> bool| before.is_none_or(|b| !same(b));
    if changed(&|b| b.applied == state.applied) {
        match &state.applied {
            Some(applied) => write_meta(sm_meta, range, SM_APPLIED, applied)?,
            None => remove_meta(sm_meta, range, SM_APPLIED)?,
        }
    }
    if changed(&|b| b.membership == state.membership) {
        write_meta(sm_meta, range, SM_MEMBERSHIP, &state.membership)?;
    }
    if changed(&|b| b.span == state.span) {
        write_meta(sm_meta, range, SM_SPAN, &state.span)?;
    }
    let numbers: [(u8, Field); 16] = [
        (SM_REVISION, |s| s.revision),
        (SM_CLOCK, |s| s.clock_ms),
        (SM_SESSION_HORIZON, |s| s.session_horizon_ms),
        (SM_SESSIONS, |s| s.sessions),
        (SM_REQUESTS, |s| s.requests),
        (SM_EPOCH, |s| s.epoch),
        (SM_CONF_VERSION, |s| s.conf_version),
        (SM_KEYS, |s| s.kv.keys),
        (SM_BYTES, |s| s.kv.bytes),
        (SM_KEYS_WITH_TTL, |s| s.kv.keys_with_ttl),
        (SM_LOCKS, |s| s.locks),
        (SM_FENCED_KEYS, |s| s.fenced_keys),
        (SM_IDEMPOTENCY_RECORDS, |s| s.idempotency_records),
        (SM_COORDINATION_BYTES, |s| s.coordination_bytes),
        (SM_HISTORY_FLOOR, |s| s.history_floor),
        (SM_HISTORY_BYTES, |s| s.history_bytes),
    ];
    for (kind, value) in numbers {
        if changed(&|b| value(b) == value(state)) {
            write_meta(sm_meta, range, kind, &value(state))?;
        }
    }
    Ok(())
}

/// Whether the range's replica is being removed from this file.
pub(crate) fn is_removing<R>(sm_meta: &R, range: RangeId) -> Result<bool, StorageError>
where
    R: ReadableTable<Bytes, Bytes>,
{
    let marker: Option<bool> = read_meta(sm_meta, range, SM_REMOVING, "removing marker")?;
    Ok(marker.is_some())
}

/// Whether the range has state-machine state in this file: an applied log id or an
/// unfinished install.
pub(crate) fn has_sm_state<R>(sm_meta: &R, range: RangeId) -> Result<bool, StorageError>
where
    R: ReadableTable<Bytes, Bytes>,
{
    for kind in [SM_APPLIED, SM_INSTALLING] {
        let key = meta_key(range, kind);
        let row = sm_meta
            .get(key.as_slice())
            .map_err(|e| StorageError::redb("read meta", e))?;
        if row.is_some() {
            return Ok(true);
        }
    }
    Ok(false)
}

/// The span whose rows belong to the range in this file: its span row, else (an applied
/// range of format 1-3) `KeySpan::unrecorded`; `None` for a range that has never applied
/// anything here, whose unrecorded span is no claim on the rows.
pub(crate) fn owned_span<R>(sm_meta: &R, range: RangeId) -> Result<Option<KeySpan>, StorageError>
where
    R: ReadableTable<Bytes, Bytes>,
{
    if let Some(span) = read_meta(sm_meta, range, SM_SPAN, "key span")? {
        return Ok(Some(span));
    }
    let applied: Option<LogId> = read_meta(sm_meta, range, SM_APPLIED, "applied log id")?;
    Ok(applied.map(|_| KeySpan::unrecorded(range)))
}

/// Writes the coordination byte count of every range with applied state that has none (a
/// file of format 1-5), counted from its rows in `tables`. A range in the middle of an
/// install is left alone: finishing the install writes its counts.
pub(crate) fn count_unrecorded_coordination(
    sm_meta: &mut Table<Bytes, Bytes>,
    tables: [&Table<Bytes, Bytes>; 3],
) -> Result<(), StorageError> {
    for range in ranges_in(sm_meta)? {
        let recorded: Option<u64> = read_meta(
            sm_meta,
            range,
            SM_COORDINATION_BYTES,
            "coordination byte count",
        )?;
        let state = read_sm_state(sm_meta, range)?;
        if recorded.is_some() || state.applied.is_none() || state.installing.is_some() {
            continue;
        }
        let mut bytes = 0;
        for table in tables {
            bytes += count_rows(table, &state.span)?.1;
        }
        write_meta(sm_meta, range, SM_COORDINATION_BYTES, &bytes)?;
    }
    Ok(())
}

/// Writes the key and byte counts of every range with applied state that has none (a file
/// of format 1-3), counted from its rows. A range in the middle of an install is left alone:
/// finishing the install writes its counts. Returns the ranges it counted.
pub(crate) fn count_unrecorded_kv(
    sm_meta: &mut Table<Bytes, Bytes>,
    kv: &Table<Bytes, Bytes>,
) -> Result<Vec<RangeId>, StorageError> {
    let mut counted = Vec::new();
    for range in ranges_in(sm_meta)? {
        let recorded: Option<u64> = read_meta(sm_meta, range, SM_KEYS, "key count")?;
        let state = read_sm_state(sm_meta, range)?;
        if recorded.is_some() || state.applied.is_none() || state.installing.is_some() {
            continue;
        }
        let counts = count_kv_rows(kv, &state.span)?;
        assert_eq!(
            counts.keys_with_ttl, state.kv.keys_with_ttl,
            "range {range}: the count of keys with a TTL matches its rows"
        );
        write_meta(sm_meta, range, SM_KEYS, &counts.keys)?;
        write_meta(sm_meta, range, SM_BYTES, &counts.bytes)?;
        counted.push(range);
    }
    Ok(counted)
}

/// Starts the history of every range with applied state that has no history floor (a file
/// of format 1-7) at its revision: its events before are not recorded. A range in the
/// middle of an install is left alone: finishing the install starts its history.
pub(crate) fn start_unrecorded_history(
    sm_meta: &mut Table<Bytes, Bytes>,
) -> Result<(), StorageError> {
    for range in ranges_in(sm_meta)? {
        let recorded: Option<u64> = read_meta(sm_meta, range, SM_HISTORY_FLOOR, "history floor")?;
        let state = read_sm_state(sm_meta, range)?;
        if recorded.is_some() || state.applied.is_none() || state.installing.is_some() {
            continue;
        }
        write_meta(sm_meta, range, SM_HISTORY_FLOOR, &state.revision)?;
    }
    Ok(())
}
