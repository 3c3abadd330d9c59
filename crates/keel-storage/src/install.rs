//! Installing a snapshot file into a range: reading it record by record and replacing the
//! range's key span and state-machine metadata through the writer thread. Knows nothing
//! about how the file arrived.
//!
//! Crash safety: the install runs in several transactions (at most
//! `SNAPSHOT_INSTALL_ROWS_PER_TXN` rows or `SNAPSHOT_INSTALL_BYTES_PER_TXN` bytes each), so a
//! crash can leave it half done. Therefore:
//! 1. the snapshot file is first made the range's current snapshot (fsynced, renamed);
//! 2. a durable commit writes an *installing* marker into `sm_meta`;
//! 3. the span is cleared and the rows are written;
//! 4. one durable commit writes the applied log id, membership and revision and removes the
//!    marker.
//!
//! While the marker is present, `applied_state` reports nothing applied and the range's data
//! cannot be read or snapshotted. After a crash, openraft sees a current snapshot newer than
//! "nothing applied" and installs it again, which completes the install.

use keel_types::{KeyValue, RangeId, limits};
use redb::{ReadableTable, WriteTransaction};

use crate::error::StorageError;
use crate::raft_types::SnapshotMeta;
use crate::snapshot::{self, Record, SnapshotFile, SnapshotReader};
use crate::store::Store;
use crate::tables::{self, InstallMarker, KV, KeySpan, SM_INSTALLING, SM_META, SmState};
use crate::writer::{Op, Outcome};

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
    while let Outcome::More(true) = store.call(Op::InstallClear { span: span.clone() }).await? {}
    copy_rows(store, span, &mut reader).await?;
    let state = SmState {
        applied: header.last_log_id,
        membership: header.last_membership.clone(),
        revision: header.revision,
        installing: None,
    };
    store.call(Op::InstallFinish { range, state }).await?;
    tracing::info!(%range, last_log_id = ?meta.last_log_id, "snapshot installed");
    Ok(())
}

/// Writes the rows of the file in bounded transactions until its `End` record.
async fn copy_rows(
    store: &Store,
    span: &KeySpan,
    reader: &mut SnapshotReader,
) -> Result<(), StorageError> {
    let mut rows: Vec<KeyValue> = Vec::new();
    let mut bytes = 0usize;
    let mut total = 0u64;
    loop {
        match reader.next().await? {
            Record::Row(row) => {
                if !span.contains(&row.key) {
                    return Err(StorageError::corrupt(
                        "snapshot file",
                        "a row lies outside the range",
                    ));
                }
                bytes += row.key.len() + row.value.len();
                rows.push(row);
                total += 1;
                if rows.len() >= limits::SNAPSHOT_INSTALL_ROWS_PER_TXN
                    || bytes >= limits::SNAPSHOT_INSTALL_BYTES_PER_TXN
                {
                    store
                        .call(Op::InstallRows {
                            rows: std::mem::take(&mut rows),
                        })
                        .await?;
                    bytes = 0;
                }
            }
            Record::End { rows: expected } if expected == total => break,
            Record::End { rows: expected } => {
                return Err(StorageError::corrupt(
                    "snapshot file",
                    format!("it holds {total} rows but its End record says {expected}"),
                ));
            }
            Record::Header(_) => {
                return Err(StorageError::corrupt("snapshot file", "a second header"));
            }
        }
    }
    if !rows.is_empty() {
        store.call(Op::InstallRows { rows }).await?;
    }
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

/// Writer op: deletes up to `SNAPSHOT_INSTALL_ROWS_PER_TXN` rows of `span`; returns whether
/// rows remain.
pub(crate) fn clear(txn: &WriteTransaction, span: &KeySpan) -> Result<bool, StorageError> {
    let mut kv = txn
        .open_table(KV)
        .map_err(|e| StorageError::redb("open kv", e))?;
    let (last, more) = {
        let mut rows = kv
            .range::<&[u8]>(span.bounds())
            .map_err(|e| StorageError::redb("read kv", e))?;
        let mut last: Option<Vec<u8>> = None;
        for _ in 0..limits::SNAPSHOT_INSTALL_ROWS_PER_TXN {
            match rows.next() {
                Some(row) => {
                    last = Some(
                        row.map_err(|e| StorageError::redb("read kv", e))?
                            .0
                            .value()
                            .to_vec(),
                    )
                }
                None => break,
            }
        }
        (last, rows.next().is_some())
    };
    if let Some(last) = last {
        kv.retain_in(span.start.as_slice()..=last.as_slice(), |_, _| false)
            .map_err(|e| StorageError::redb("clear kv", e))?;
    }
    Ok(more)
}

/// Writer op: writes snapshot rows.
pub(crate) fn insert_rows(txn: &WriteTransaction, rows: &[KeyValue]) -> Result<(), StorageError> {
    let mut kv = txn
        .open_table(KV)
        .map_err(|e| StorageError::redb("open kv", e))?;
    for row in rows {
        kv.insert(row.key.as_slice(), tables::encode_kv(row).as_slice())
            .map_err(|e| StorageError::redb("write kv", e))?;
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
