//! The writer ops of a snapshot install (`install`): mark the range as installing, clear its
//! spans in bounded steps, write a batch of the file's records, and record the snapshot's
//! state, each inside the writer's transaction.

use std::ops::{Bound, RangeInclusive};

use keel_types::{Fence, IdempotencyRecord, KeyValue, LockHold, RangeId, Revision, limits};
use redb::{ReadableTable, Table, TableDefinition, WriteTransaction};

use crate::codec::decode;
use crate::error::StorageError;
use crate::meta::{self, MetaRow};
use crate::tables::{
    self, Bytes, DEADLINES, Deadlined, FENCES, IDEMPOTENCY, InstallMarker, KV, KeySpan, KvCounts,
    LEASE_KEYS, LEASES, LOCKS, LeaseRecord, META, REQUESTS, RequestRecord, SESSIONS, SM_INSTALLING,
    SM_META, Session, SmState, TTL, Uncounted,
};

/// Records of a snapshot file written in one install transaction.
#[derive(Debug, Default)]
pub(crate) struct InstallBatch {
    pub rows: Vec<KeyValue>,
    pub sessions: Vec<(u64, Session)>,
    pub requests: Vec<(u64, u64, RequestRecord)>,
    /// Locks by name.
    pub locks: Vec<(Vec<u8>, LockHold)>,
    /// Fences by user key.
    pub fences: Vec<(Vec<u8>, Fence)>,
    /// Idempotency records by key.
    pub records: Vec<(Vec<u8>, IdempotencyRecord)>,
    /// etcd leases by `leases` key.
    pub leases: Vec<(Vec<u8>, LeaseRecord)>,
    /// Rows of the meta range's `meta` table.
    pub meta: Vec<MetaRow>,
    /// Encoded bytes of the file's records in the batch.
    pub bytes: usize,
}

impl InstallBatch {
    fn len(&self) -> usize {
        self.rows.len()
            + self.sessions.len()
            + self.requests.len()
            + self.locks.len()
            + self.fences.len()
            + self.records.len()
            + self.leases.len()
            + self.meta.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn is_full(&self) -> bool {
        self.len() >= limits::SNAPSHOT_INSTALL_ROWS_PER_TXN
            || self.bytes >= limits::SNAPSHOT_INSTALL_BYTES_PER_TXN
    }
}

/// Writer op: marks the range as installing, before anything of it is deleted.
pub(crate) fn begin(
    txn: &WriteTransaction,
    range: RangeId,
    marker: &InstallMarker,
) -> Result<(), StorageError> {
    let mut sm_meta = txn
        .open_table(SM_META)
        .map_err(|e| StorageError::redb("open sm_meta", e))?;
    tables::write_meta(&mut sm_meta, range, SM_INSTALLING, marker)
}

/// Writer op: deletes up to `SNAPSHOT_INSTALL_ROWS_PER_TXN` rows of the range's request
/// records, then its sessions, then the rows of its current span and of `span` (the
/// snapshot's; with their TTL-index and lease-index rows), then the locks, fences,
/// idempotency records and leases of both spans (with their `deadlines` rows), then the
/// events of its current span, then (meta range) the `meta` table; returns whether rows
/// remain.
pub(crate) fn clear(
    txn: &WriteTransaction,
    range: RangeId,
    span: &KeySpan,
) -> Result<bool, StorageError> {
    let (old, events) = {
        let sm_meta = open(txn, SM_META)?;
        let state = tables::read_sm_state(&sm_meta, range)?;
        let old = tables::owned_span(&sm_meta, range)?.unwrap_or_else(KeySpan::none);
        (old, state.history_floor..=state.revision)
    };
    let mut budget = limits::SNAPSHOT_INSTALL_ROWS_PER_TXN;
    let more = clear_exactly_once(txn, range, &mut budget)?
        || clear_kv(txn, &old, &mut budget)?
        || clear_kv(txn, span, &mut budget)?
        || clear_coordination(txn, &old, &mut budget)?
        || clear_coordination(txn, span, &mut budget)?
        || clear_events(txn, &old, events, &mut budget)?
        || (range == RangeId::META && clear_meta(txn, &mut budget)?);
    Ok(more)
}

/// Clears the `meta` table within `budget`; whether rows remain.
fn clear_meta(txn: &WriteTransaction, budget: &mut usize) -> Result<bool, StorageError> {
    let mut meta = open(txn, META)?;
    let bounds = (Bound::Included(&[][..]), Bound::Unbounded);
    Ok(spend(
        clear_rows(&mut meta, bounds, *budget, |_, _| Ok(()))?,
        budget,
    ))
}

/// Clears the range's request records and sessions within `budget`; whether rows remain.
fn clear_exactly_once(
    txn: &WriteTransaction,
    range: RangeId,
    budget: &mut usize,
) -> Result<bool, StorageError> {
    let (start, end) = (
        tables::request_key(range, 0, 0),
        tables::request_key(range, u64::MAX, u64::MAX),
    );
    let mut requests = open(txn, REQUESTS)?;
    let bounds = (Bound::Included(&start[..]), Bound::Included(&end[..]));
    if spend(
        clear_rows(&mut requests, bounds, *budget, |_, _| Ok(()))?,
        budget,
    ) {
        return Ok(true);
    }
    let (start, end) = (
        tables::session_key(range, 0),
        tables::session_key(range, u64::MAX),
    );
    let mut sessions = open(txn, SESSIONS)?;
    let bounds = (Bound::Included(&start[..]), Bound::Included(&end[..]));
    Ok(spend(
        clear_rows(&mut sessions, bounds, *budget, |_, _| Ok(()))?,
        budget,
    ))
}

/// Clears the rows of `span` and their TTL-index rows, then its `lease_keys` rows (which lie
/// in the span), within `budget`; whether rows remain.
fn clear_kv(
    txn: &WriteTransaction,
    span: &KeySpan,
    budget: &mut usize,
) -> Result<bool, StorageError> {
    let (mut kv, mut ttl) = (open(txn, KV)?, open(txn, TTL)?);
    let cleared = clear_rows(&mut kv, span.bounds(), *budget, |key, value| {
        if let Some(expires_at_ms) = tables::decode_kv_expiry(value)? {
            ttl.remove(tables::ttl_key(expires_at_ms, key).as_slice())
                .map_err(|e| StorageError::redb("clear ttl index", e))?;
        }
        Ok(())
    })?;
    if spend(cleared, budget) {
        return Ok(true);
    }
    let mut lease_keys = open(txn, LEASE_KEYS)?;
    let cleared = clear_rows(&mut lease_keys, span.bounds(), *budget, |_, _| Ok(()))?;
    Ok(spend(cleared, budget))
}

/// Clears the locks, fences, idempotency records and leases of `span` and their `deadlines`
/// rows within `budget`; whether rows remain.
fn clear_coordination(
    txn: &WriteTransaction,
    span: &KeySpan,
    budget: &mut usize,
) -> Result<bool, StorageError> {
    let mut deadlines = open(txn, DEADLINES)?;
    if clear_deadlined::<LockHold>(&mut open(txn, LOCKS)?, &mut deadlines, span, budget)? {
        return Ok(true);
    }
    let cleared = clear_rows(&mut open(txn, FENCES)?, span.bounds(), *budget, |_, _| {
        Ok(())
    })?;
    if spend(cleared, budget) {
        return Ok(true);
    }
    let mut records = open(txn, IDEMPOTENCY)?;
    if clear_deadlined::<IdempotencyRecord>(&mut records, &mut deadlines, span, budget)? {
        return Ok(true);
    }
    clear_deadlined::<LeaseRecord>(&mut open(txn, LEASES)?, &mut deadlines, span, budget)
}

/// Clears the events of `span` with revisions in `events` (the range's floor to its revision:
/// the range's events in this file) within `budget`; whether events remain. The snapshot's
/// span holds no other events: only a range with state owns events, and no other range with
/// state overlaps it (`refuse_overlap`).
fn clear_events(
    txn: &WriteTransaction,
    span: &KeySpan,
    events: RangeInclusive<Revision>,
    budget: &mut usize,
) -> Result<bool, StorageError> {
    let mut history = txn
        .open_table(tables::HISTORY)
        .map_err(|e| StorageError::redb("open history for install", e))?;
    let cleared = tables::clear_history(&mut history, span, events, *budget)?;
    *budget -= cleared;
    Ok(*budget == 0)
}

/// Clears the rows of `span` in a table of `T` and their `deadlines` rows within `budget`;
/// whether rows remain.
fn clear_deadlined<T: Deadlined>(
    table: &mut Table<Bytes, Bytes>,
    deadlines: &mut Table<Bytes, Bytes>,
    span: &KeySpan,
    budget: &mut usize,
) -> Result<bool, StorageError> {
    let cleared = clear_rows(table, span.bounds(), *budget, |key, value| {
        let stored: T = decode(T::WHAT, value)?;
        let row = tables::deadline_key(stored.deadline_ms(), T::KIND, key);
        deadlines
            .remove(row.as_slice())
            .map_err(|e| StorageError::redb("clear deadlines index", e))?;
        Ok(())
    })?;
    Ok(spend(cleared, budget))
}

/// Takes what `clear_rows` removed from `budget`; returns whether rows remain.
fn spend((removed, more): (usize, bool), budget: &mut usize) -> bool {
    *budget -= removed;
    more
}

fn open<'txn>(
    txn: &'txn WriteTransaction,
    table: TableDefinition<'static, Bytes, Bytes>,
) -> Result<Table<'txn, Bytes, Bytes>, StorageError> {
    txn.open_table(table)
        .map_err(|e| StorageError::redb("open table for install", e))
}

/// Deletes up to `max` rows of `table` within `bounds` (whose start is included), showing
/// each to `seen` first; returns how many were deleted and whether rows remain.
fn clear_rows(
    table: &mut Table<Bytes, Bytes>,
    bounds: (Bound<&[u8]>, Bound<&[u8]>),
    max: usize,
    mut seen: impl FnMut(&[u8], &[u8]) -> Result<(), StorageError>,
) -> Result<(usize, bool), StorageError> {
    let Bound::Included(start) = bounds.0 else {
        unreachable!("clear bounds start with an included key")
    };
    let (last, removed, more) = {
        let mut rows = table
            .range::<&[u8]>(bounds)
            .map_err(|e| StorageError::redb("read for clear", e))?;
        let mut last: Option<Vec<u8>> = None;
        let mut removed = 0;
        while removed < max {
            let Some(row) = rows.next() else { break };
            let (key, value) = row.map_err(|e| StorageError::redb("read for clear", e))?;
            seen(key.value(), value.value())?;
            last = Some(key.value().to_vec());
            removed += 1;
        }
        (last, removed, rows.next().is_some())
    };
    if let Some(last) = last {
        table
            .retain_in(start..=last.as_slice(), |_, _| false)
            .map_err(|e| StorageError::redb("clear", e))?;
    }
    Ok((removed, more))
}

/// Writer op: writes snapshot records: rows (with their TTL-index and lease-index rows),
/// sessions, request records, locks, idempotency records and leases (with their `deadlines`
/// rows) and fences.
pub(crate) fn insert_records(
    txn: &WriteTransaction,
    range: RangeId,
    batch: &InstallBatch,
) -> Result<(), StorageError> {
    let (mut kv, mut ttl) = (open(txn, KV)?, open(txn, TTL)?);
    let mut lease_keys = open(txn, LEASE_KEYS)?;
    // The install counts rows from the file (`add_record`); the counts these writes keep
    // are dropped.
    let mut uncounted = Uncounted::default();
    let mut uncounted_kv = KvCounts::default();
    for row in &batch.rows {
        let (kv, ttl, counts) = (&mut kv, &mut ttl, &mut uncounted_kv);
        tables::write_kv(kv, ttl, &mut lease_keys, counts, &row.key, Some(row))?;
    }
    let mut sessions = open(txn, SESSIONS)?;
    for (client_id, session) in &batch.sessions {
        tables::write_session(&mut sessions, range, *client_id, session)?;
    }
    let mut requests = open(txn, REQUESTS)?;
    for (client_id, sequence, record) in &batch.requests {
        tables::write_request(&mut requests, range, *client_id, *sequence, record)?;
    }
    let (mut locks, mut deadlines) = (open(txn, LOCKS)?, open(txn, DEADLINES)?);
    for (name, hold) in &batch.locks {
        tables::write_deadlined(
            &mut locks,
            &mut deadlines,
            uncounted.counts(),
            name,
            Some(hold),
        )?;
    }
    let mut records = open(txn, IDEMPOTENCY)?;
    for (key, record) in &batch.records {
        let (table, index) = (&mut records, &mut deadlines);
        tables::write_deadlined(table, index, uncounted.counts(), key, Some(record))?;
    }
    let mut leases = open(txn, LEASES)?;
    for (key, lease) in &batch.leases {
        let (table, index) = (&mut leases, &mut deadlines);
        tables::write_indexed(table, index, key, Some(lease))?;
    }
    let mut fences = open(txn, FENCES)?;
    for (key, fence) in &batch.fences {
        tables::write_fence(&mut fences, uncounted.counts(), key, Some(fence))?;
    }
    let mut meta = open(txn, META)?;
    for row in &batch.meta {
        meta::write_row(&mut meta, row)?;
    }
    Ok(())
}

/// Writer op: records the snapshot's state and removes the installing marker.
pub(crate) fn finish(
    txn: &WriteTransaction,
    range: RangeId,
    state: &SmState,
) -> Result<(), StorageError> {
    let mut sm_meta = txn
        .open_table(SM_META)
        .map_err(|e| StorageError::redb("open sm_meta", e))?;
    tables::write_sm_state(&mut sm_meta, range, state)?;
    tables::write_hold(&mut sm_meta, range, state.hold.as_ref())?;
    tables::remove_meta(&mut sm_meta, range, SM_INSTALLING)
}
