//! The `history` table (format 8): the events of every range of a file, keyed by (revision,
//! user key), each holding the range clock and the key's state before and after the write
//! (from format 11 with the key's version, from format 12 its lease; older states read
//! version 1 and lease 0); from format 9 also the locks and idempotency records a reclaim
//! removed, keyed by (revision, name). Names route like keys and a reclaim gives its locks
//! and its records a revision each, so no revision has two rows of one name; the value says
//! which it is. Written only by `record_event` in the apply's transaction, removed by
//! compaction (`compact`) and by the clearing of a span (`clear_history`).
//!
//! Like `kv` the table is shared by the ranges of a file: spans are disjoint and a split
//! child inherits its parent's revision counter, so (revision, key) is unique in the file and
//! a split leaves every row where it is. A range's rows are those whose key lies in its span;
//! every read of them is in revision order from the range's floor and passes over the rows of
//! other ranges in the same revisions (the siblings of a split). There is no index by key: a
//! second table in key order cost every write a random B-tree insert, 25-40 % of the put
//! throughput (docs/BENCHMARKS.md); a key's history is read by the same revision-order scan,
//! bounded per page (`key_events`).
//!
//! Each range's `sm_meta` keeps its history floor and the bytes of its events. The floor is
//! the revision at or below which events may be gone (compacted, or older than the replica's
//! history: a snapshot install, a restore or a file of an older format starts it at the
//! range's revision); every event above it is present. Compaction removes whole revisions
//! from the oldest up and raises the floor as it goes; rows at the floor that a budget left
//! behind are removed by the next step, so every read starts at the floor, inclusive.

use std::collections::BTreeMap;
use std::ops::RangeInclusive;

use keel_types::{Event, EventCursor, EventKind, KeyValue, Revision};
use redb::{ReadableTable, Table, TableDefinition};
use serde::{Deserialize, Serialize};

use super::span::KeySpan;
use crate::codec::{decode_body, encode, split_version};
use crate::error::StorageError;

/// Key (revision, user key) → the encoded `StoredEvent`.
pub(crate) const HISTORY: TableDefinition<(u64, &[u8]), &[u8]> = TableDefinition::new("history");

/// The empty key: the first row of a revision.
const FIRST_KEY: &[u8] = &[];

/// The rows of the revisions in `revisions`.
fn rows_of(revisions: &RangeInclusive<Revision>) -> std::ops::Range<(u64, &'static [u8])> {
    let end = revisions.end().saturating_add(1);
    (*revisions.start(), FIRST_KEY)..(end, FIRST_KEY)
}

/// A key's state as an event stores it (the key is in the row's key), from format 12.
#[derive(Deserialize)]
struct StoredState {
    #[serde(with = "serde_bytes")]
    value: Vec<u8>,
    create_revision: Revision,
    mod_revision: Revision,
    version: u64,
    expires_at_ms: Option<u64>,
    lease: i64,
}

impl StoredState {
    fn into_kv(self, key: &[u8]) -> KeyValue {
        KeyValue {
            key: key.to_vec(),
            value: self.value,
            create_revision: self.create_revision,
            mod_revision: self.mod_revision,
            version: self.version,
            expires_at_ms: self.expires_at_ms,
            lease: self.lease,
        }
    }
}

/// A key's state as format 11 stored it: no lease (it reads lease 0).
#[derive(Deserialize)]
struct StoredStateV11 {
    #[serde(with = "serde_bytes")]
    value: Vec<u8>,
    create_revision: Revision,
    mod_revision: Revision,
    version: u64,
    expires_at_ms: Option<u64>,
}

impl From<StoredStateV11> for StoredState {
    fn from(state: StoredStateV11) -> StoredState {
        StoredState {
            value: state.value,
            create_revision: state.create_revision,
            mod_revision: state.mod_revision,
            version: state.version,
            expires_at_ms: state.expires_at_ms,
            lease: 0,
        }
    }
}

/// A key's state as formats 8-10 stored it: no version (it reads version 1), no lease.
#[derive(Deserialize)]
struct StoredStateV8 {
    #[serde(with = "serde_bytes")]
    value: Vec<u8>,
    create_revision: Revision,
    mod_revision: Revision,
    expires_at_ms: Option<u64>,
}

impl From<StoredStateV8> for StoredState {
    fn from(state: StoredStateV8) -> StoredState {
        StoredState {
            value: state.value,
            create_revision: state.create_revision,
            mod_revision: state.mod_revision,
            version: 1,
            expires_at_ms: state.expires_at_ms,
            lease: 0,
        }
    }
}

/// An event as format 8 stored it: a key's change.
#[derive(Deserialize)]
struct StoredEventV8 {
    clock_ms: u64,
    before: Option<StoredStateV8>,
    after: Option<StoredStateV8>,
}

/// An event as stored from format 9 on: a key's change (its states `S`), or a lock or
/// idempotency record a reclaim removed. `Key` is the first variant, so a key's event starts
/// its body with a 0 byte (`is_key_row`). Read with `StoredState`s (`StoredStateV8`s in
/// formats 9 and 10, `StoredStateV11`s in format 11), written with `StateOf`s (the encoding
/// of `StoredState`).
#[derive(Serialize, Deserialize)]
enum EventRow<S> {
    Key {
        clock_ms: u64,
        before: Option<S>,
        after: Option<S>,
    },
    LockReclaimed {
        clock_ms: u64,
        token: u64,
    },
    RecordReclaimed {
        clock_ms: u64,
        token: u64,
    },
}

/// An event as read.
type StoredEvent = EventRow<StoredState>;

impl<S> EventRow<S> {
    /// The same event with its key states converted by `convert`.
    fn map_states<T>(self, convert: impl Fn(S) -> T) -> EventRow<T> {
        match self {
            EventRow::Key {
                clock_ms,
                before,
                after,
            } => EventRow::Key {
                clock_ms,
                before: before.map(&convert),
                after: after.map(&convert),
            },
            EventRow::LockReclaimed { clock_ms, token } => {
                EventRow::LockReclaimed { clock_ms, token }
            }
            EventRow::RecordReclaimed { clock_ms, token } => {
                EventRow::RecordReclaimed { clock_ms, token }
            }
        }
    }
}

/// The postcard tag of `StoredEvent::Key`.
const KEY_TAG: u8 = 0;

impl StoredEvent {
    /// Decodes a row of any format that has events; the key states of formats 8-10 read
    /// version 1, and those of formats 8-11 lease 0.
    fn decode(bytes: &[u8]) -> Result<StoredEvent, StorageError> {
        let what = "history event";
        let (version, body) = split_version(what, bytes)?;
        match version {
            ..=8 => {
                let StoredEventV8 {
                    clock_ms,
                    before,
                    after,
                } = decode_body(what, body)?;
                let row = EventRow::Key {
                    clock_ms,
                    before,
                    after,
                };
                Ok(row.map_states(StoredState::from))
            }
            9..=10 => {
                let row: EventRow<StoredStateV8> = decode_body(what, body)?;
                Ok(row.map_states(StoredState::from))
            }
            11 => {
                let row: EventRow<StoredStateV11> = decode_body(what, body)?;
                Ok(row.map_states(StoredState::from))
            }
            _ => decode_body(what, body),
        }
    }

    fn clock_ms(&self) -> u64 {
        match self {
            StoredEvent::Key { clock_ms, .. }
            | StoredEvent::LockReclaimed { clock_ms, .. }
            | StoredEvent::RecordReclaimed { clock_ms, .. } => *clock_ms,
        }
    }

    /// `event_bytes` of the event of `key`.
    fn bytes(&self, key: &[u8]) -> u64 {
        let value = |state: &Option<StoredState>| state.as_ref().map_or(0, |s| s.value.len());
        match self {
            StoredEvent::Key { before, after, .. } => bytes_of(key, value(before), value(after)),
            StoredEvent::LockReclaimed { .. } | StoredEvent::RecordReclaimed { .. } => {
                bytes_of(key, 0, 0)
            }
        }
    }
}

/// Whether a row holds a key's event (not a reclaim), read from its first bytes alone.
fn is_key_row(bytes: &[u8]) -> Result<bool, StorageError> {
    let (version, body) = split_version("history event", bytes)?;
    Ok(version <= 8 || body.first() == Some(&KEY_TAG))
}

/// `StoredState` as an apply writes it, borrowed from the key's row (the same encoding).
#[derive(Serialize)]
struct StateOf<'a> {
    #[serde(with = "serde_bytes")]
    value: &'a [u8],
    create_revision: Revision,
    mod_revision: Revision,
    version: u64,
    expires_at_ms: Option<u64>,
    lease: i64,
}

impl<'a> StateOf<'a> {
    fn of(kv: &'a KeyValue) -> StateOf<'a> {
        StateOf {
            value: &kv.value,
            create_revision: kv.create_revision,
            mod_revision: kv.mod_revision,
            version: kv.version,
            expires_at_ms: kv.expires_at_ms,
            lease: kv.lease,
        }
    }
}

/// What an event adds to its range's history bytes: the key and the values before and after.
pub(crate) fn event_bytes(key: &[u8], before: Option<&KeyValue>, after: Option<&KeyValue>) -> u64 {
    let value = |kv: Option<&KeyValue>| kv.map_or(0, |kv| kv.value.len());
    bytes_of(key, value(before), value(after))
}

fn bytes_of(key: &[u8], before_len: usize, after_len: usize) -> u64 {
    (key.len() + before_len + after_len) as u64
}

/// One change, as an apply records it.
pub(crate) struct Change<'a> {
    pub revision: Revision,
    /// The range clock of the write.
    pub clock_ms: u64,
    /// A key, or the name of what a reclaim removed.
    pub key: &'a [u8],
    pub what: Changed<'a>,
}

/// What a `Change` changed.
pub(crate) enum Changed<'a> {
    /// The key, from state `before` to state `after` (`None`: absent).
    Key {
        before: Option<&'a KeyValue>,
        after: Option<&'a KeyValue>,
    },
    /// A reclaim removed the lock `key` names, last granted with `token`.
    LockReclaimed { token: u64 },
    /// A reclaim removed the idempotency record of `key`, of `token`.
    RecordReclaimed { token: u64 },
}

/// Records `change` as an event, counting its bytes into `bytes`.
pub(crate) fn record_event(
    history: &mut Table<(u64, &[u8]), &[u8]>,
    bytes: &mut u64,
    change: Change,
) -> Result<(), StorageError> {
    let Change {
        revision,
        clock_ms,
        key,
        what,
    } = change;
    let (event, size) = match what {
        Changed::Key { before, after } => {
            let event = EventRow::Key {
                clock_ms,
                before: before.map(StateOf::of),
                after: after.map(StateOf::of),
            };
            (event, event_bytes(key, before, after))
        }
        Changed::LockReclaimed { token } => (
            EventRow::LockReclaimed { clock_ms, token },
            event_bytes(key, None, None),
        ),
        Changed::RecordReclaimed { token } => (
            EventRow::RecordReclaimed { clock_ms, token },
            event_bytes(key, None, None),
        ),
    };
    history
        .insert((revision, key), encode(&event).as_slice())
        .map_err(|e| StorageError::redb("write history", e))?;
    *bytes += size;
    Ok(())
}

/// The event of `key` at `revision` as readers see it. An event stores the key's row before
/// the change as it was, expired or not (a read at a revision needs it); a write that met an
/// expired row created the key anew, so its event shows no state before.
fn decode_event(revision: Revision, key: &[u8], bytes: &[u8]) -> Result<Event, StorageError> {
    let reclaimed = |clock_ms, kind| Event {
        revision,
        key: key.to_vec(),
        after: None,
        before: None,
        clock_ms,
        kind,
    };
    let (clock_ms, before, after) = match StoredEvent::decode(bytes)? {
        StoredEvent::Key {
            clock_ms,
            before,
            after,
        } => (clock_ms, before, after),
        StoredEvent::LockReclaimed { clock_ms, token } => {
            return Ok(reclaimed(clock_ms, EventKind::LockReclaimed { token }));
        }
        StoredEvent::RecordReclaimed { clock_ms, token } => {
            return Ok(reclaimed(clock_ms, EventKind::RecordReclaimed { token }));
        }
    };
    let created_anew = |before: &StoredState| {
        after.is_some() && before.expires_at_ms.is_some_and(|at| at <= clock_ms)
    };
    let before = before.filter(|before| !created_anew(before));
    Ok(Event {
        revision,
        key: key.to_vec(),
        after: after.map(|state| state.into_kv(key)),
        before: before.map(|state| state.into_kv(key)),
        clock_ms,
        kind: EventKind::Key,
    })
}

/// The keys of a span changed after a read's revision, each with the revision of its first
/// change after it (`changed_since`).
#[derive(Debug, Default)]
pub(crate) struct ChangedSince {
    pub first: BTreeMap<Vec<u8>, Revision>,
    /// Keys at and after this one were left out to keep `first` within its bound: only the
    /// keys before it may be read from these changes.
    pub cut: Option<Vec<u8>>,
}

/// The keys of `span` with an event in `revisions`, each with its first event's revision:
/// at most `keys_max` keys, the smallest (`cut` says where the rest begin). `None` when the
/// read would pass over more than `examined_max` rows (of any range). Reclaims change no
/// key and are passed over.
pub(crate) fn changed_since<H>(
    history: &H,
    span: &KeySpan,
    revisions: RangeInclusive<Revision>,
    (keys_max, examined_max): (usize, usize),
) -> Result<Option<ChangedSince>, StorageError>
where
    H: ReadableTable<(u64, &'static [u8]), &'static [u8]>,
{
    let mut changed = ChangedSince::default();
    let rows = history
        .range(rows_of(&revisions))
        .map_err(|e| StorageError::redb("read history", e))?;
    for (examined, row) in rows.enumerate() {
        if examined == examined_max {
            return Ok(None);
        }
        let (id, value) = row.map_err(|e| StorageError::redb("read history", e))?;
        let (revision, key) = id.value();
        let past_cut = changed.cut.as_deref().is_some_and(|cut| key >= cut);
        if !span.contains(key) || past_cut || changed.first.contains_key(key) {
            continue;
        }
        if !is_key_row(value.value())? {
            continue;
        }
        changed.first.insert(key.to_vec(), revision);
        if changed.first.len() > keys_max {
            changed.cut = changed.first.pop_last().map(|(key, _)| key);
        }
    }
    Ok(Some(changed))
}

/// The row of `key` just before its event at `revision`, as it was stored (`None`: absent).
pub(crate) fn state_before<H>(
    history: &H,
    revision: Revision,
    key: &[u8],
) -> Result<Option<KeyValue>, StorageError>
where
    H: ReadableTable<(u64, &'static [u8]), &'static [u8]>,
{
    let row = history
        .get((revision, key))
        .map_err(|e| StorageError::redb("read history", e))?
        .ok_or_else(|| StorageError::Corrupt {
            what: "history event",
            detail: format!("no event at revision {revision} that a read found"),
        })?;
    match StoredEvent::decode(row.value())? {
        StoredEvent::Key { before, .. } => Ok(before.map(|state| state.into_kv(key))),
        _ => Err(StorageError::Corrupt {
            what: "history event",
            detail: format!("the event at revision {revision} that a read found is a reclaim"),
        }),
    }
}

/// How much one read of events may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct EventBounds {
    /// Events returned.
    pub limit: usize,
    /// Bytes of the events returned (`event_bytes`); a read returns at least one event.
    pub max_bytes: u64,
    /// Rows read, of any key and range.
    pub examined: usize,
}

/// A read of events (`span_events`).
#[derive(Debug, Default)]
pub(crate) struct SpanEvents {
    pub events: Vec<Event>,
    /// Where the next read starts; `None` when this one reached the last revision asked for.
    pub next: Option<EventCursor>,
}

/// Events of `span` from `from` on up to revision `through`, in revision order (key order
/// within a revision), within `bounds`. A read may stop inside a revision, and may come back
/// short, even empty, with the cursor to go on from.
pub(crate) fn span_events<H>(
    history: &H,
    span: &KeySpan,
    from: &EventCursor,
    through: Revision,
    bounds: EventBounds,
) -> Result<SpanEvents, StorageError>
where
    H: ReadableTable<(u64, &'static [u8]), &'static [u8]>,
{
    let mut read = SpanEvents::default();
    if from.revision > through {
        return Ok(read);
    }
    let mut bytes = 0;
    let rows = history
        .range((from.revision, from.key.as_slice())..(through.saturating_add(1), FIRST_KEY))
        .map_err(|e| StorageError::redb("read history", e))?;
    for (examined, row) in rows.enumerate() {
        let (id, value) = row.map_err(|e| StorageError::redb("read history", e))?;
        let (revision, key) = id.value();
        let full = read.events.len() == bounds.limit
            || (!read.events.is_empty() && bytes >= bounds.max_bytes);
        if examined == bounds.examined || full {
            read.next = Some(EventCursor {
                revision,
                key: key.to_vec(),
            });
            return Ok(read);
        }
        if !span.contains(key) {
            continue;
        }
        let event = decode_event(revision, key, value.value())?;
        bytes += event_bytes(key, event.before.as_ref(), event.after.as_ref());
        read.events.push(event);
    }
    Ok(read)
}

/// A page of one key's events (`key_events`).
#[derive(Debug, Default)]
pub(crate) struct KeyEvents {
    pub events: Vec<Event>,
    /// Where the next page starts; `None` when the page reached the range's last event.
    pub next: Option<Revision>,
}

/// Events of `key` with a revision in `revisions`, oldest first (`span_events` over the key
/// alone, reclaims of a lock or record of the same name left out), so a page may come back
/// short, even empty, with a `next` revision to go on from.
pub(crate) fn key_events<H>(
    history: &H,
    key: &[u8],
    revisions: RangeInclusive<Revision>,
    bounds: EventBounds,
) -> Result<KeyEvents, StorageError>
where
    H: ReadableTable<(u64, &'static [u8]), &'static [u8]>,
{
    let mut after_key = key.to_vec();
    after_key.push(0);
    let span = KeySpan {
        start: key.to_vec(),
        end: Some(after_key),
    };
    let from = EventCursor::at(*revisions.start());
    let read = span_events(history, &span, &from, *revisions.end(), bounds)?;
    // A key has one row per revision at most: a cursor past it has passed its revision.
    let next = read.next.map(|cursor| match cursor.key.as_slice() > key {
        true => cursor.revision + 1,
        false => cursor.revision,
    });
    let mut events = read.events;
    events.retain(Event::is_key);
    Ok(KeyEvents { events, next })
}

/// The bytes of the events of `span` with a revision in `revisions` (rows of other ranges
/// passed over).
pub(crate) fn count_history<H>(
    history: &H,
    span: &KeySpan,
    revisions: RangeInclusive<Revision>,
) -> Result<u64, StorageError>
where
    H: ReadableTable<(u64, &'static [u8]), &'static [u8]>,
{
    let mut bytes = 0;
    for row in history
        .range(rows_of(&revisions))
        .map_err(|e| StorageError::redb("count history", e))?
    {
        let (id, value) = row.map_err(|e| StorageError::redb("count history", e))?;
        let key = id.value().1;
        if span.contains(key) {
            bytes += StoredEvent::decode(value.value())?.bytes(key);
        }
    }
    Ok(bytes)
}

/// Removes up to `budget` events of `span` with a revision in `revisions` (rows of other
/// ranges are passed over, however many); how many it removed.
pub(crate) fn clear_history(
    history: &mut Table<(u64, &[u8]), &[u8]>,
    span: &KeySpan,
    revisions: RangeInclusive<Revision>,
    budget: usize,
) -> Result<usize, StorageError> {
    let mut doomed = Vec::new();
    for row in history
        .range(rows_of(&revisions))
        .map_err(|e| StorageError::redb("read history", e))?
    {
        if doomed.len() == budget {
            break;
        }
        let (id, _) = row.map_err(|e| StorageError::redb("read history", e))?;
        let (revision, key) = id.value();
        if span.contains(key) {
            doomed.push((revision, key.to_vec()));
        }
    }
    for (revision, key) in &doomed {
        history
            .remove((*revision, key.as_slice()))
            .map_err(|e| StorageError::redb("remove history", e))?;
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

/// The history facts of a range that compaction keeps in step, and its revision.
#[derive(Debug)]
pub(crate) struct HistoryFacts<'a> {
    pub floor: &'a mut Revision,
    pub bytes: &'a mut u64,
    pub revision: Revision,
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
/// `history` from the floor up to the range's revision (rows of other ranges included) and removes the range's
/// events the retention lets go, whole revisions at a time, raising the floor to each
/// revision it starts removing.
pub(crate) fn compact(
    history: &mut Table<(u64, &[u8]), &[u8]>,
    facts: HistoryFacts,
    span: &KeySpan,
    retention: Retention,
    budget: usize,
) -> Result<CompactStep, StorageError> {
    let mut doomed = Vec::new();
    let mut pending_bytes = *facts.bytes;
    let mut floor = *facts.floor;
    let mut step = CompactStep::Empty;
    let rows = history
        .range(rows_of(&(floor..=facts.revision)))
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
        let stored = StoredEvent::decode(value.value())?;
        if revision > floor {
            // A revision not yet begun goes whole if the retention lets its first event go.
            let old = stored.clock_ms() < retention.before_ms;
            if !old && pending_bytes <= retention.max_bytes {
                step = CompactStep::Kept {
                    clock_ms: stored.clock_ms(),
                };
                break;
            }
            floor = revision;
        }
        let size = stored.bytes(key);
        pending_bytes = pending_bytes.saturating_sub(size);
        doomed.push((revision, key.to_vec(), size));
    }
    for (revision, key, size) in &doomed {
        history
            .remove((*revision, key.as_slice()))
            .map_err(|e| StorageError::redb("remove history", e))?;
        *facts.bytes = facts
            .bytes
            .checked_sub(*size)
            .expect("the range's history bytes cover its events");
    }
    *facts.floor = floor;
    Ok(step)
}

#[cfg(test)]
mod tests;
