//! Installing a snapshot file into a range: reading it record by record and replacing the
//! range's key span, exactly-once state (sessions, request records) and state-machine
//! metadata (clock included) through the writer thread. Knows nothing about how the file
//! arrived.
//!
//! Crash safety: the install runs in several transactions (at most
//! `SNAPSHOT_INSTALL_ROWS_PER_TXN` records or `SNAPSHOT_INSTALL_BYTES_PER_TXN` bytes each),
//! so a crash can leave it half done. Therefore:
//! 1. the snapshot file is first made the range's current snapshot (fsynced, renamed);
//! 2. a durable commit writes an *installing* marker into `sm_meta`;
//! 3. the range's request records and sessions and the span's rows are cleared (with the
//!    TTL-index rows of those keys), then the file's records are written (with TTL-index
//!    rows rebuilt from the rows' expiry);
//! 4. one durable commit writes the applied log id, membership, revision, clock, session
//!    horizon and counts and removes the marker.
//!
//! While the marker is present, `applied_state` reports nothing applied and the range's data
//! cannot be read or snapshotted. After a crash, openraft sees a current snapshot newer than
//! "nothing applied" and installs it again, which completes the install.

use std::ops::Bound;

use keel_types::{CommandOutcome, KeyValue, RangeId, limits};
use redb::{ReadableTable, Table, WriteTransaction};

use crate::error::StorageError;
use crate::raft_types::SnapshotMeta;
use crate::snapshot::{self, Record, SnapshotFile, SnapshotHeader, SnapshotReader};
use crate::store::Store;
use crate::tables::{
    self, Bytes, InstallMarker, KV, KeySpan, REQUESTS, SESSIONS, SM_INSTALLING, SM_META, Session,
    SmState, TTL,
};
use crate::writer::{Op, Outcome};

/// Records of a snapshot file written in one install transaction.
#[derive(Debug, Default)]
pub(crate) struct InstallBatch {
    pub rows: Vec<KeyValue>,
    pub sessions: Vec<(u64, Session)>,
    pub requests: Vec<(u64, u64, CommandOutcome)>,
    bytes: usize,
}

impl InstallBatch {
    fn is_empty(&self) -> bool {
        self.rows.is_empty() && self.sessions.is_empty() && self.requests.is_empty()
    }

    fn is_full(&self) -> bool {
        let records = self.rows.len() + self.sessions.len() + self.requests.len();
        records >= limits::SNAPSHOT_INSTALL_ROWS_PER_TXN
            || self.bytes >= limits::SNAPSHOT_INSTALL_BYTES_PER_TXN
    }
}

/// Replaces the data and state-machine metadata of `range` (rows in `span`) with the
/// snapshot in `snapshot`, which must match `meta`.
pub(crate) async fn install(
    store: &Store,
    range: RangeId,
    span: &KeySpan,
    meta: &SnapshotMeta,
    snapshot: SnapshotFile,
) -> Result<(), StorageError> {
    let (mut reader, header) = SnapshotReader::open_with_header(snapshot.path()).await?;
    if header.meta() != *meta {
        return Err(StorageError::corrupt(
            "snapshot file",
            format!(
                "its header {:?} does not match the snapshot meta {meta:?}",
                header.meta()
            ),
        ));
    }
    let dir = store.snapshot_dir().to_path_buf();
    let last_log_id = meta.last_log_id;
    tokio::task::spawn_blocking(move || {
        snapshot::adopt(&dir, range, &snapshot, last_log_id.as_ref())
    })
    .await
    .map_err(|e| StorageError::io(store.snapshot_dir(), std::io::Error::other(e)))??;
    let marker = InstallMarker {
        snapshot_last_log_id: meta.last_log_id,
    };
    store.call(Op::InstallBegin { range, marker }).await?;
    let clear = || Op::InstallClear {
        range,
        span: span.clone(),
    };
    while let Outcome::More(true) = store.call(clear()).await? {}
    let state = copy_records(store, range, span, &header, &mut reader).await?;
    store.call(Op::InstallFinish { range, state }).await?;
    tracing::info!(%range, last_log_id = ?meta.last_log_id, "snapshot installed");
    Ok(())
}

/// Writes the records of the file in bounded transactions until its `End` record; returns
/// the range's state-machine metadata as the file describes it.
async fn copy_records(
    store: &Store,
    range: RangeId,
    span: &KeySpan,
    header: &SnapshotHeader,
    reader: &mut SnapshotReader,
) -> Result<SmState, StorageError> {
    let mut state = SmState {
        applied: header.last_log_id,
        membership: header.last_membership.clone(),
        revision: header.revision,
        ..SmState::default()
    };
    let mut batch = InstallBatch::default();
    let mut records = 0u64;
    let mut session_records = 0u64;
    loop {
        let record = reader.next().await?;
        batch.bytes += reader.last_record_bytes();
        match record {
            Record::End { records: expected } if expected == records => break,
            Record::End { records: expected } => {
                return Err(StorageError::corrupt(
                    "snapshot file",
                    format!("it holds {records} records but its End record says {expected}"),
                ));
            }
            Record::Session { session, .. } => session_records += session.records,
            _ => {}
        }
        add_record(record, span, &mut state, &mut batch)?;
        records += 1;
        if batch.is_full() {
            let batch = std::mem::take(&mut batch);
            store.call(Op::InstallRecords { range, batch }).await?;
        }
    }
    if !batch.is_empty() {
        store.call(Op::InstallRecords { range, batch }).await?;
    }
    if session_records != state.requests {
        return Err(StorageError::corrupt(
            "snapshot file",
            format!(
                "its sessions count {session_records} request records but it holds {}",
                state.requests
            ),
        ));
    }
    Ok(state)
}

/// Adds one record (not `End`) to the batch and the counts of `state`.
fn add_record(
    record: Record,
    span: &KeySpan,
    state: &mut SmState,
    batch: &mut InstallBatch,
) -> Result<(), StorageError> {
    let (row, expires_at_ms) = match record {
        Record::Row(row) => (row, None),
        Record::ExpiringRow { row, expires_at_ms } => (row, Some(expires_at_ms)),
        Record::Clock {
            clock_ms,
            session_horizon_ms,
        } => {
            state.clock_ms = clock_ms;
            state.session_horizon_ms = session_horizon_ms;
            return Ok(());
        }
        Record::Session { client_id, session } => {
            state.sessions += 1;
            batch.sessions.push((client_id, session));
            return Ok(());
        }
        Record::Request {
            client_id,
            sequence,
            outcome,
        } => {
            state.requests += 1;
            batch.requests.push((client_id, sequence, outcome));
            return Ok(());
        }
        Record::Header(_) => return Err(StorageError::corrupt("snapshot file", "a second header")),
        Record::End { .. } => unreachable!("the caller handles End"),
    };
    if !span.contains(&row.key) {
        return Err(StorageError::corrupt(
            "snapshot file",
            "a row lies outside the range",
        ));
    }
    if expires_at_ms.is_some() {
        state.keys_with_ttl += 1;
    }
    batch.rows.push(row.into_key_value(expires_at_ms));
    Ok(())
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
/// records, then its sessions, then the rows of `span` (with their TTL-index rows); returns
/// whether rows remain.
pub(crate) fn clear(
    txn: &WriteTransaction,
    range: RangeId,
    span: &KeySpan,
) -> Result<bool, StorageError> {
    let open = |table, name| {
        txn.open_table(table)
            .map_err(|e| StorageError::redb(name, e))
    };
    let mut budget = limits::SNAPSHOT_INSTALL_ROWS_PER_TXN;
    let (start, end) = (
        tables::request_key(range, 0, 0),
        tables::request_key(range, u64::MAX, u64::MAX),
    );
    let mut requests = open(REQUESTS, "open requests")?;
    let bounds = (Bound::Included(&start[..]), Bound::Included(&end[..]));
    match clear_rows(&mut requests, bounds, budget, |_, _| Ok(()))? {
        (_, true) => return Ok(true),
        (removed, false) => budget -= removed,
    }
    let (start, end) = (
        tables::session_key(range, 0),
        tables::session_key(range, u64::MAX),
    );
    let mut sessions = open(SESSIONS, "open sessions")?;
    let bounds = (Bound::Included(&start[..]), Bound::Included(&end[..]));
    match clear_rows(&mut sessions, bounds, budget, |_, _| Ok(()))? {
        (_, true) => return Ok(true),
        (removed, false) => budget -= removed,
    }
    let (mut kv, mut ttl) = (open(KV, "open kv")?, open(TTL, "open ttl")?);
    let (_, more) = clear_rows(&mut kv, span.bounds(), budget, |key, value| {
        if let Some(expires_at_ms) = tables::decode_kv_expiry(value)? {
            ttl.remove(tables::ttl_key(expires_at_ms, key).as_slice())
                .map_err(|e| StorageError::redb("clear ttl index", e))?;
        }
        Ok(())
    })?;
    Ok(more)
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

/// Writer op: writes snapshot records: rows (with their TTL-index rows), sessions and
/// request records.
pub(crate) fn insert_records(
    txn: &WriteTransaction,
    range: RangeId,
    batch: &InstallBatch,
) -> Result<(), StorageError> {
    let open = |table, name| {
        txn.open_table(table)
            .map_err(|e| StorageError::redb(name, e))
    };
    let (mut kv, mut ttl) = (open(KV, "open kv")?, open(TTL, "open ttl")?);
    // The install counts keys with a TTL from the file; this count is not kept.
    let mut keys_with_ttl = 0;
    for row in &batch.rows {
        tables::write_kv(&mut kv, &mut ttl, &mut keys_with_ttl, &row.key, Some(row))?;
    }
    let mut sessions = open(SESSIONS, "open sessions")?;
    for (client_id, session) in &batch.sessions {
        tables::write_session(&mut sessions, range, *client_id, session)?;
    }
    let mut requests = open(REQUESTS, "open requests")?;
    for (client_id, sequence, outcome) in &batch.requests {
        tables::write_request(&mut requests, range, *client_id, *sequence, outcome)?;
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
    tables::remove_meta(&mut sm_meta, range, SM_INSTALLING)
}
