//! Reads at a revision: a key, or a page of keys, as the range was at an earlier revision
//! of its own, rebuilt from its rows now and the history of the changes since (a changed
//! key's row just before its first change after the revision). Only within the replica's
//! history: a revision below its floor is `Compacted`.
//!
//! A key reads as it was stored at the revision, its expiry included: a key whose TTL had
//! run out but whose removal (an event at a later revision) had not been applied yet is
//! part of the state at that revision, so the answer does not depend on when it is asked.

use keel_types::planted::{self, PlantedBug};
use keel_types::{KeyValue, RangeDescriptor, Revision, limits};
use redb::ReadTransaction;

use super::{ScanPage, StateMachine, page_rows, readable_state};
use crate::error::StorageError;
use crate::tables::{self, ChangedSince, HISTORY, KV, KeySpan, SmState};

/// Why a range cannot be read at a revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unreadable {
    /// The key lies outside the range.
    Outside { descriptor: RangeDescriptor },
    /// Changes after the revision may be gone from this replica's history: reads at
    /// `compact_revision` and after are possible.
    Compacted { compact_revision: Revision },
    /// The replica has not applied the revision.
    Future { current: Revision },
    /// More than `limits::REVISION_READ_EXAMINED_MAX` events have been recorded since.
    TooFarBack { current: Revision },
}

/// A read at a revision: what it read, or why it could not.
pub type AtRevision<T> = Result<T, Unreadable>;

impl StateMachine {
    /// `key` as it was at `revision` of the range (`None`: absent then).
    pub async fn read_key_at(
        &self,
        key: &[u8],
        revision: Revision,
    ) -> Result<AtRevision<Option<KeyValue>>, StorageError> {
        let (range, key) = (self.range, key.to_vec());
        self.store
            .read_small(move |txn| {
                let state = readable_state(txn, range)?;
                if !state.span.contains(&key) {
                    let descriptor = state.descriptor(range);
                    return Ok(Err(Unreadable::Outside { descriptor }));
                }
                let span = KeySpan {
                    end: Some([key.as_slice(), &[0]].concat()),
                    start: key.clone(),
                };
                let changed = match changes_since(txn, &state, &span, revision, 1)? {
                    Ok(changed) => changed,
                    Err(unreadable) => return Ok(Err(unreadable)),
                };
                let history = open_history(txn)?;
                // The planted bug reads the row now, whatever changed it since.
                let first = changed.first.get(&key).copied();
                let first = first.filter(|_| !planted::active(PlantedBug::ReadAtIgnoresHistory));
                let kv = match first {
                    Some(first) => tables::state_before(&history, first, &key)?,
                    None => read_current(txn, &key)?,
                };
                Ok(Ok(kv))
            })
            .await
    }

    /// The keys of `[start, end)` (empty `end` = unbounded) inside the range as they were at
    /// `revision`, in key order: at most `limit` rows (0 means `SCAN_LIMIT_DEFAULT`; capped
    /// at `SCAN_LIMIT_MAX`) and about `SCAN_PAGE_BYTES_MAX` bytes. A page ends early, with a
    /// `next_start`, where the keys changed since `revision` outnumber
    /// `REVISION_READ_CHANGED_KEYS_MAX`. The page's `revision` is the one read at.
    pub async fn scan_at(
        &self,
        start: &[u8],
        end: &[u8],
        limit: u32,
        revision: Revision,
    ) -> Result<AtRevision<ScanPage>, StorageError> {
        let keys_max = limits::REVISION_READ_CHANGED_KEYS_MAX;
        self.scan_at_tracking(start, end, (limit, revision), keys_max)
            .await
    }

    /// `scan_at`, tracking at most `keys_max` changed keys.
    pub(crate) async fn scan_at_tracking(
        &self,
        start: &[u8],
        end: &[u8],
        (limit, revision): (u32, Revision),
        keys_max: usize,
    ) -> Result<AtRevision<ScanPage>, StorageError> {
        let limit = page_rows(limit);
        let range = self.range;
        let (start, end) = (start.to_vec(), end.to_vec());
        self.store
            .read_small(move |txn| {
                let state = readable_state(txn, range)?;
                let span = state.span.part(&start, &end);
                let changed = match changes_since(txn, &state, &span, revision, keys_max)? {
                    Ok(changed) => changed,
                    Err(unreadable) => return Ok(Err(unreadable)),
                };
                let page = page_at(txn, &span, &changed, limit)?;
                Ok(Ok(ScanPage {
                    kvs: page.0,
                    revision,
                    next_start: page.1,
                }))
            })
            .await
    }
}

/// The `history` table as a read transaction sees it.
type History = redb::ReadOnlyTable<(u64, &'static [u8]), &'static [u8]>;

fn open_history(txn: &ReadTransaction) -> Result<History, StorageError> {
    txn.open_table(HISTORY)
        .map_err(|e| StorageError::redb("open history", e))
}

/// The keys of `span` changed after `revision`, or why the range cannot be read at it.
fn changes_since(
    txn: &ReadTransaction,
    state: &SmState,
    span: &KeySpan,
    revision: Revision,
    keys_max: usize,
) -> Result<AtRevision<ChangedSince>, StorageError> {
    let current = state.revision;
    if revision > current {
        return Ok(Err(Unreadable::Future { current }));
    }
    if revision < state.history_floor {
        return Ok(Err(Unreadable::Compacted {
            compact_revision: state.history_floor,
        }));
    }
    let history = open_history(txn)?;
    let bounds = (keys_max, limits::REVISION_READ_EXAMINED_MAX);
    Ok(
        match tables::changed_since(&history, span, revision + 1..=current, bounds)? {
            Some(changed) => Ok(changed),
            None => Err(Unreadable::TooFarBack { current }),
        },
    )
}

fn read_current(txn: &ReadTransaction, key: &[u8]) -> Result<Option<KeyValue>, StorageError> {
    let kv = txn
        .open_table(KV)
        .map_err(|e| StorageError::redb("open kv", e))?;
    crate::apply::read_kv(&kv, key)
}

/// The rows of `span` at the read's revision: a row now, unless its key changed since (then
/// its state before that change), and the keys changed since that are gone now. Ends at
/// `limit` rows, at about `SCAN_PAGE_BYTES_MAX` bytes or at `changed.cut`, with where the
/// next page starts.
fn page_at(
    txn: &ReadTransaction,
    span: &KeySpan,
    changed: &ChangedSince,
    limit: usize,
) -> Result<(Vec<KeyValue>, Option<Vec<u8>>), StorageError> {
    let kv = txn
        .open_table(KV)
        .map_err(|e| StorageError::redb("open kv", e))?;
    let history = open_history(txn)?;
    let mut rows = kv
        .range::<&[u8]>(span.bounds())
        .map_err(|e| StorageError::redb("scan kv", e))?;
    let mut next_row = || -> Result<Option<KeyValue>, StorageError> {
        match rows.next() {
            None => Ok(None),
            Some(row) => {
                let (key, value) = row.map_err(|e| StorageError::redb("scan kv", e))?;
                tables::decode_kv(key.value(), value.value()).map(Some)
            }
        }
    };
    let mut changes = changed.first.iter().peekable();
    let mut row = next_row()?;
    let mut kvs: Vec<KeyValue> = Vec::new();
    let mut bytes = 0usize;
    let before_cut = |key: &[u8]| changed.cut.as_deref().is_none_or(|cut| key < cut);
    loop {
        let change_key = changes.peek().map(|(key, _)| key.as_slice());
        let row_key = row.as_ref().map(|kv| kv.key.as_slice());
        let row_key = row_key.filter(|key| before_cut(key));
        let key = match (row_key, change_key) {
            (None, None) => return Ok((kvs, changed.cut.clone())),
            (Some(row_key), Some(change_key)) => row_key.min(change_key),
            (Some(key), None) | (None, Some(key)) => key,
        };
        if kvs.len() == limit {
            return Ok((kvs, Some(key.to_vec())));
        }
        let (row_is_next, change_is_next) = (row_key == Some(key), change_key == Some(key));
        let row_now = match row_is_next {
            true => std::mem::replace(&mut row, next_row()?),
            false => None,
        };
        let state = match changes.next_if(|_| change_is_next) {
            Some((key, &first)) => tables::state_before(&history, first, key)?,
            None => row_now,
        };
        let Some(state) = state else { continue };
        let row_bytes = state.key.len() + state.value.len();
        if !kvs.is_empty() && bytes + row_bytes > limits::SCAN_PAGE_BYTES_MAX {
            return Ok((kvs, Some(state.key)));
        }
        bytes += row_bytes;
        kvs.push(state);
    }
}
