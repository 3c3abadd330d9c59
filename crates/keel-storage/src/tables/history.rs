//! The `history` and `history_keys` tables (format 8): the events of every range of a file.
//! `history` is keyed by (revision, user key) and holds the event (the range clock, the key's
//! state before and after); `history_keys` indexes the same rows by (user key, revision) and
//! holds each event's bytes (`event_bytes`). Both are written only together
//! (`record_event`, `remove_event`).
//!
//! Like `kv` the tables are shared by the ranges of a file: spans are disjoint and a split
//! child inherits its parent's revision counter, so (revision, key) is unique in the file and
//! a split leaves every row where it is. A range's rows are those whose key lies in its span;
//! reading them in revision order skips the rows of other ranges in the same revisions.
//!
//! Each range's `sm_meta` keeps its history floor and the bytes of its events. The floor is
//! the revision at or below which events may be gone (compacted, or older than the replica's
//! history: a snapshot install, a restore or a file of an older format starts it at the
//! range's revision); every event above it is present. Compaction (`compact`) removes whole
//! revisions from the oldest up and raises the floor as it goes; rows at or below the floor
//! that a budget left behind are removed by the next step.

use std::ops::Bound;

use keel_types::{Event, KeyValue, Revision};
use redb::{ReadableTable, Table, TableDefinition};
use serde::{Deserialize, Serialize};

use super::span::KeySpan;
use crate::codec::{decode, encode};
use crate::error::StorageError;

/// Key (revision, user key) → the encoded `StoredEvent`.
pub(crate) const HISTORY: TableDefinition<(u64, &[u8]), &[u8]> = TableDefinition::new("history");
/// Key (user key, revision) → the event's bytes (`event_bytes`).
pub(crate) const HISTORY_KEYS: TableDefinition<(&[u8], u64), u64> =
    TableDefinition::new("history_keys");

/// A key's state as an event stores it (the key is in the row's key).
#[derive(Serialize, Deserialize)]
struct StoredState {
    #[serde(with = "serde_bytes")]
    value: Vec<u8>,
    create_revision: Revision,
    mod_revision: Revision,
    expires_at_ms: Option<u64>,
}

impl StoredState {
    fn of(kv: &KeyValue) -> StoredState {
        StoredState {
            value: kv.value.clone(),
            create_revision: kv.create_revision,
            mod_revision: kv.mod_revision,
            expires_at_ms: kv.expires_at_ms,
        }
    }

    fn into_kv(self, key: &[u8]) -> KeyValue {
        KeyValue {
            key: key.to_vec(),
            value: self.value,
            create_revision: self.create_revision,
            mod_revision: self.mod_revision,
            expires_at_ms: self.expires_at_ms,
        }
    }
}

#[derive(Serialize, Deserialize)]
struct StoredEvent {
    clock_ms: u64,
    before: Option<StoredState>,
    after: Option<StoredState>,
}

impl StoredEvent {
    /// `event_bytes` of the event of `key`.
    fn bytes(&self, key: &[u8]) -> u64 {
        let value = |state: &Option<StoredState>| state.as_ref().map_or(0, |s| s.value.len());
        bytes_of(key, value(&self.before), value(&self.after))
    }
}

/// What an event adds to its range's history bytes: the key (in both tables) and the values
/// before and after.
pub(crate) fn event_bytes(key: &[u8], before: Option<&KeyValue>, after: Option<&KeyValue>) -> u64 {
    let value = |kv: Option<&KeyValue>| kv.map_or(0, |kv| kv.value.len());
    bytes_of(key, value(before), value(after))
}

fn bytes_of(key: &[u8], before_len: usize, after_len: usize) -> u64 {
    (2 * key.len() + before_len + after_len) as u64
}

/// One change of one key, as an apply records it.
pub(crate) struct Change<'a> {
    pub revision: Revision,
    /// The range clock of the write.
    pub clock_ms: u64,
    pub key: &'a [u8],
    pub before: Option<&'a KeyValue>,
    pub after: Option<&'a KeyValue>,
}

/// Records `change` as an event, counting its bytes into `bytes`.
pub(crate) fn record_event(
    history: &mut Table<(u64, &[u8]), &[u8]>,
    keys: &mut Table<(&[u8], u64), u64>,
    bytes: &mut u64,
    change: Change,
) -> Result<(), StorageError> {
    let Change {
        revision,
        clock_ms,
        key,
        before,
        after,
    } = change;
    let event = StoredEvent {
        clock_ms,
        before: before.map(StoredState::of),
        after: after.map(StoredState::of),
    };
    let size = event_bytes(key, before, after);
    history
        .insert((revision, key), encode(&event).as_slice())
        .map_err(|e| StorageError::redb("write history", e))?;
    keys.insert((key, revision), size)
        .map_err(|e| StorageError::redb("write history index", e))?;
    *bytes += size;
    Ok(())
}

/// Removes the event of `key` at `revision` from both tables; the bytes it counted.
fn remove_event(
    history: &mut Table<(u64, &[u8]), &[u8]>,
    keys: &mut Table<(&[u8], u64), u64>,
    revision: Revision,
    key: &[u8],
) -> Result<u64, StorageError> {
    history
        .remove((revision, key))
        .map_err(|e| StorageError::redb("remove history", e))?;
    let size = keys
        .remove((key, revision))
        .map_err(|e| StorageError::redb("remove history index", e))?
        .map(|size| size.value());
    Ok(size.expect("every history row has its index row"))
}

fn decode_event(revision: Revision, key: &[u8], bytes: &[u8]) -> Result<Event, StorageError> {
    let stored: StoredEvent = decode("history event", bytes)?;
    Ok(Event {
        revision,
        key: key.to_vec(),
        after: stored.after.map(|state| state.into_kv(key)),
        before: stored.before.map(|state| state.into_kv(key)),
        clock_ms: stored.clock_ms,
    })
}

/// Events of `key` with a revision of at least `from`, oldest first: at most `limit`, and
/// no more once they hold `max_bytes` (`event_bytes`; at least one); and whether more follow.
pub(crate) fn key_events<H, K>(
    history: &H,
    keys: &K,
    key: &[u8],
    from: Revision,
    limit: usize,
    max_bytes: u64,
) -> Result<(Vec<Event>, bool), StorageError>
where
    H: ReadableTable<(u64, &'static [u8]), &'static [u8]>,
    K: ReadableTable<(&'static [u8], u64), u64>,
{
    let mut events = Vec::new();
    let mut bytes = 0;
    let rows = keys
        .range((key, from)..=(key, u64::MAX))
        .map_err(|e| StorageError::redb("read history index", e))?;
    for row in rows {
        let (index, size) = row.map_err(|e| StorageError::redb("read history index", e))?;
        if events.len() == limit || (!events.is_empty() && bytes + size.value() > max_bytes) {
            return Ok((events, true));
        }
        bytes += size.value();
        let revision = index.value().1;
        let stored = history
            .get((revision, key))
            .map_err(|e| StorageError::redb("read history", e))?
            .ok_or_else(|| {
                StorageError::corrupt(
                    "history index",
                    format!("no event at revision {revision} for an index row"),
                )
            })?;
        events.push(decode_event(revision, key, stored.value())?);
    }
    Ok((events, false))
}

/// The bytes of the events of `span` (from the index, without reading the events).
pub(crate) fn count_history<K>(keys: &K, span: &KeySpan) -> Result<u64, StorageError>
where
    K: ReadableTable<(&'static [u8], u64), u64>,
{
    let mut bytes = 0;
    for row in keys
        .range(index_bounds(span))
        .map_err(|e| StorageError::redb("count history", e))?
    {
        let (_, size) = row.map_err(|e| StorageError::redb("count history", e))?;
        bytes += size.value();
    }
    Ok(bytes)
}

/// A bound of a read of `history_keys`.
type IndexBound<'a> = Bound<(&'a [u8], u64)>;

/// The index rows of every key in `span`.
fn index_bounds(span: &KeySpan) -> (IndexBound<'_>, IndexBound<'_>) {
    let upper = match span.end.as_deref() {
        None => Bound::Unbounded,
        Some(end) => Bound::Excluded((end, 0)),
    };
    (Bound::Included((span.start.as_slice(), 0)), upper)
}

/// Removes up to `budget` events of `span` (both tables); how many it removed.
pub(crate) fn clear_history(
    history: &mut Table<(u64, &[u8]), &[u8]>,
    keys: &mut Table<(&[u8], u64), u64>,
    span: &KeySpan,
    budget: usize,
) -> Result<usize, StorageError> {
    let mut doomed = Vec::new();
    for row in keys
        .range(index_bounds(span))
        .map_err(|e| StorageError::redb("read history index", e))?
        .take(budget)
    {
        let (index, _) = row.map_err(|e| StorageError::redb("read history index", e))?;
        let (key, revision) = index.value();
        doomed.push((key.to_vec(), revision));
    }
    for (key, revision) in &doomed {
        remove_event(history, keys, *revision, key)?;
    }
    Ok(doomed.len())
}

/// What a compaction step may remove of a range's history.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Retention {
    /// Events written (by the range clock) before this instant go.
    pub before_ms: u64,
    /// The oldest events go while the range's events hold more bytes than this.
    pub max_bytes: u64,
}

/// The history facts of a range that compaction keeps in step.
#[derive(Debug)]
pub(crate) struct HistoryFacts<'a> {
    pub floor: &'a mut Revision,
    pub bytes: &'a mut u64,
}

/// Where a compaction step stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CompactStep {
    /// It read its budget of rows: more may go.
    Budget,
    /// At the range's oldest event the retention keeps, written at this range clock.
    Kept { clock_ms: u64 },
    /// The range has no events left.
    Empty,
}

/// One bounded step of compaction of the range with `span`: reads at most `budget` rows of
/// `history` from the floor up (rows of other ranges included) and removes the range's
/// events the retention lets go, whole revisions at a time, raising the floor to each
/// revision it starts removing.
pub(crate) fn compact(
    history: &mut Table<(u64, &[u8]), &[u8]>,
    keys: &mut Table<(&[u8], u64), u64>,
    facts: HistoryFacts,
    span: &KeySpan,
    retention: Retention,
    budget: usize,
) -> Result<CompactStep, StorageError> {
    let mut doomed = Vec::new();
    let mut pending_bytes = *facts.bytes;
    let mut floor = *facts.floor;
    let mut step = CompactStep::Empty;
    let start: &[u8] = &[];
    let rows = history
        .range((floor, start)..)
        .map_err(|e| StorageError::redb("read history", e))?;
    for (read, row) in rows.enumerate() {
        if read == budget {
            step = CompactStep::Budget;
            break;
        }
        let (id, value) = row.map_err(|e| StorageError::redb("read history", e))?;
        let (revision, key) = id.value();
        if !span.contains(key) {
            continue;
        }
        let stored: StoredEvent = decode("history event", value.value())?;
        if revision > floor {
            // A revision not yet begun goes whole if the retention lets its first event go.
            let old = stored.clock_ms < retention.before_ms;
            if !old && pending_bytes <= retention.max_bytes {
                step = CompactStep::Kept {
                    clock_ms: stored.clock_ms,
                };
                break;
            }
            floor = revision;
        }
        pending_bytes = pending_bytes.saturating_sub(stored.bytes(key));
        doomed.push((revision, key.to_vec()));
    }
    for (revision, key) in &doomed {
        let size = remove_event(history, keys, *revision, key)?;
        *facts.bytes = facts
            .bytes
            .checked_sub(size)
            .expect("the range's history bytes cover its events");
    }
    *facts.floor = floor;
    Ok(step)
}
