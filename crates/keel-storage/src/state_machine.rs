//! `StateMachine`: one range's key-value data as openraft's `RaftStateMachine`, plus the
//! reads the server serves from it. Knows nothing about gRPC, routing or the network.
//!
//! Applies run on the writer thread, in the same transaction as the applied log id,
//! membership and revision (`Durability::None`: log and data share the file, so a crash
//! rolls both back together). Reads run redb read transactions on blocking threads.

use std::io;

use futures::{Stream, StreamExt};
use keel_types::{KeyValue, RangeId, Revision, limits};
use openraft::OptionalSend;
use openraft::storage::RaftStateMachine;
use redb::{ReadTransaction, ReadableTable};
use tokio::sync::oneshot;

use crate::error::StorageError;
use crate::raft_types::{
    EntryResponder, LogId, Snapshot, SnapshotMeta, StoredMembership, TypeConfig,
};
use crate::snapshot::{self, SnapshotBuilder, SnapshotFile};
use crate::store::Store;
use crate::tables::{self, KV, KeySpan, SM_META, SmState};
use crate::writer::{Done, Op};
use crate::{apply, install};

/// One page of a scan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScanPage {
    pub kvs: Vec<KeyValue>,
    /// The range's applied revision the page was read at.
    pub revision: Revision,
    /// `Some(key)`: more rows remain; the next page starts at `key`.
    pub next_start: Option<Vec<u8>>,
}

/// The state machine of one range. Cheap to clone.
#[derive(Clone)]
pub struct StateMachine {
    store: Store,
    range: RangeId,
    span: KeySpan,
}

impl StateMachine {
    pub(crate) fn new(store: Store, range: RangeId, span: KeySpan) -> StateMachine {
        StateMachine { store, range, span }
    }

    /// The range this state machine belongs to.
    pub fn range(&self) -> RangeId {
        self.range
    }

    /// The key and the range's applied revision, read in one consistent read transaction.
    pub async fn get(&self, key: &[u8]) -> Result<(Option<KeyValue>, Revision), StorageError> {
        let (range, span, key) = (self.range, self.span.clone(), key.to_vec());
        self.store
            .read(move |txn| {
                let state = readable_state(txn, range)?;
                if !span.contains(&key) {
                    return Ok((None, state.revision));
                }
                let kv = txn
                    .open_table(KV)
                    .map_err(|e| StorageError::redb("open kv", e))?;
                Ok((apply::read_kv(&kv, &key)?, state.revision))
            })
            .await
    }

    /// Keys of `[start, end)` (empty `end` = unbounded) inside the range, in key order: at
    /// most `limit` rows (0 means `SCAN_LIMIT_DEFAULT`; capped at `SCAN_LIMIT_MAX`) and about
    /// `SCAN_PAGE_BYTES_MAX` bytes (a page always holds at least one row).
    pub async fn scan(
        &self,
        start: &[u8],
        end: &[u8],
        limit: u32,
    ) -> Result<ScanPage, StorageError> {
        let limit = match limit {
            0 => limits::SCAN_LIMIT_DEFAULT,
            limit => limit.min(limits::SCAN_LIMIT_MAX),
        } as usize;
        let (range, span) = (self.range, self.span.clone());
        let (start, end) = (start.to_vec(), end.to_vec());
        self.store
            .read(move |txn| {
                let state = readable_state(txn, range)?;
                let kv = txn
                    .open_table(KV)
                    .map_err(|e| StorageError::redb("open kv", e))?;
                scan_page(&kv, span.clamp(&start, &end), limit, state.revision)
            })
            .await
    }

    /// The applied revision and applied log id; `(0, None)` while a snapshot install is
    /// unfinished.
    pub async fn applied(&self) -> Result<(Revision, Option<LogId>), StorageError> {
        let range = self.range;
        let state = self.store.read(move |txn| read_state(txn, range)).await?;
        match state.installing {
            Some(_) => Ok((0, None)),
            None => Ok((state.revision, state.applied)),
        }
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotData = SnapshotFile;
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), io::Error> {
        let range = self.range;
        let state = self.store.read(move |txn| read_state(txn, range)).await?;
        match state.installing {
            Some(_) => Ok((None, StoredMembership::default())),
            None => Ok((state.applied, state.membership)),
        }
    }

    async fn apply<Strm>(&mut self, entries: Strm) -> Result<(), io::Error>
    where
        Strm: Stream<Item = Result<EntryResponder, io::Error>> + Unpin + OptionalSend,
    {
        let items: Vec<EntryResponder> = entries
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .collect::<Result<_, _>>()?;
        if items.is_empty() {
            return Ok(());
        }
        let (entries, responders) = items.into_iter().unzip();
        let (reply, applied) = oneshot::channel();
        let op = Op::Apply {
            range: self.range,
            entries,
        };
        self.store
            .submit(op, Done::Applied { reply, responders })
            .await?;
        self.store.wait(applied).await?;
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> SnapshotBuilder {
        SnapshotBuilder {
            store: self.store.clone(),
            range: self.range,
            span: self.span.clone(),
        }
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: SnapshotFile,
    ) -> Result<(), io::Error> {
        install::install(&self.store, self.range, &self.span, meta, snapshot).await?;
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, io::Error> {
        self.store.check()?;
        Ok(snapshot::current(self.store.snapshot_dir(), self.range).await?)
    }
}

fn read_state(txn: &ReadTransaction, range: RangeId) -> Result<SmState, StorageError> {
    let sm_meta = txn
        .open_table(SM_META)
        .map_err(|e| StorageError::redb("open sm_meta", e))?;
    tables::read_sm_state(&sm_meta, range)
}

/// The state of a range whose data may be read: not in the middle of a snapshot install.
fn readable_state(txn: &ReadTransaction, range: RangeId) -> Result<SmState, StorageError> {
    let state = read_state(txn, range)?;
    match state.installing {
        Some(_) => Err(StorageError::SnapshotInstalling { range }),
        None => Ok(state),
    }
}

fn scan_page<R>(
    kv: &R,
    bounds: (std::ops::Bound<&[u8]>, std::ops::Bound<&[u8]>),
    limit: usize,
    revision: Revision,
) -> Result<ScanPage, StorageError>
where
    R: ReadableTable<tables::Bytes, tables::Bytes>,
{
    let mut rows = kv
        .range::<&[u8]>(bounds)
        .map_err(|e| StorageError::redb("scan kv", e))?;
    let mut kvs: Vec<KeyValue> = Vec::new();
    let mut bytes = 0usize;
    let more = loop {
        let Some(row) = rows.next() else { break false };
        if kvs.len() == limit {
            break true;
        }
        let (key, value) = row.map_err(|e| StorageError::redb("scan kv", e))?;
        let row_bytes = key.value().len() + value.value().len();
        if !kvs.is_empty() && bytes + row_bytes > limits::SCAN_PAGE_BYTES_MAX {
            break true;
        }
        bytes += row_bytes;
        kvs.push(tables::decode_kv(key.value(), value.value())?);
    };
    let next_start = match kvs.last() {
        Some(last) if more => {
            let mut next = last.key.clone();
            next.push(0);
            Some(next)
        }
        _ => None,
    };
    Ok(ScanPage {
        kvs,
        revision,
        next_start,
    })
}

#[cfg(test)]
#[path = "state_machine_tests.rs"]
mod tests;
