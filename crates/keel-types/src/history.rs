//! The changes a range records (`Event`) and a page of one key's changes (`KeyHistory`).
//! Every write of a key (put, delete, increment, and the removal of an expired key) is an
//! event at the revision of the write that made it; each event carries the key's state
//! after it (`None` for a removal) and before it (`None` when the key was absent). So is
//! the removal of a free lock or an expired idempotency record by a reclaim (`EventKind`),
//! whose name routes like a key.

use serde::{Deserialize, Serialize};

use crate::command::KeyValue;
use crate::ids::Revision;

/// One change of one key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    pub revision: Revision,
    #[serde(with = "serde_bytes")]
    pub key: Vec<u8>,
    /// The key's state after the change; `None` = it was removed.
    pub after: Option<KeyValue>,
    /// The key's state before the change; `None` = it was absent.
    pub before: Option<KeyValue>,
    /// The range clock of the write (Unix milliseconds, on the leader's clock).
    pub clock_ms: u64,
    /// What changed: a key, or a lock or idempotency record `key` names.
    pub kind: EventKind,
}

/// What an event changed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum EventKind {
    /// The key `key` (`after` and `before` are its states).
    #[default]
    Key,
    /// A reclaim removed the lock named `key`, free since its last holder's time ran out or
    /// it was released; `token` was its last holder's. `after` and `before` are `None`.
    LockReclaimed { token: u64 },
    /// A reclaim removed the expired idempotency record of `key` (its scope, a 0 byte, its
    /// id); `token` was the record's. `after` and `before` are `None`.
    RecordReclaimed { token: u64 },
}

impl Event {
    /// Whether the change removed what it names (a delete, an expiry or a reclaim).
    pub fn is_removal(&self) -> bool {
        self.after.is_none()
    }

    /// Whether the event is a key's change (not a reclaim).
    pub fn is_key(&self) -> bool {
        self.kind == EventKind::Key
    }
}

/// Where a read of events goes on: the event of `key` at `revision` and every event after
/// it. Within a revision events are in key order, so a cursor can stand inside a revision
/// (a watch resumes there without delivering an event twice).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct EventCursor {
    pub revision: Revision,
    pub key: Vec<u8>,
}

impl EventCursor {
    /// The first event of `revision`.
    pub fn at(revision: Revision) -> EventCursor {
        EventCursor {
            revision,
            key: Vec::new(),
        }
    }

    /// The cursor just after `event`.
    pub fn after(event: &Event) -> EventCursor {
        let mut key = event.key.clone();
        key.push(0);
        EventCursor {
            revision: event.revision,
            key,
        }
    }
}

/// A page of one key's events, oldest first.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct KeyHistory {
    pub events: Vec<Event>,
    /// Events at or below this revision are gone (compacted, or before the replica's history
    /// began); the page is complete above it.
    pub compact_revision: Revision,
    /// The range's revision when the page was read.
    pub revision: Revision,
    /// Where the next page starts, when the page did not reach the range's revision (it
    /// stopped at its limit of events or bytes, or of events of the range it read).
    pub next_revision: Option<Revision>,
}
