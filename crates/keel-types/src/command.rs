//! Commands that go through the Raft log, and what applying them produced.
//!
//! A `Command` is what a leader proposes; every replica applies it in log order and gets the
//! same `CommandOutcome`. Encodings of these types are persisted inside Raft log entries, so
//! a change here needs a new format version in `keel-storage`.

use serde::{Deserialize, Serialize};

use crate::ids::Revision;

/// A key with its value and revisions, as stored.
///
/// Byte fields use `serde_bytes`: the encoding is the same as a sequence of `u8` in postcard
/// (length, then the bytes), but it is copied at once rather than byte by byte.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyValue {
    #[serde(with = "serde_bytes")]
    pub key: Vec<u8>,
    #[serde(with = "serde_bytes")]
    pub value: Vec<u8>,
    /// Revision of the write that created the key (since it was last absent).
    pub create_revision: Revision,
    /// Revision of the last write to the key.
    pub mod_revision: Revision,
}

/// A precondition on one key, checked when the command is applied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Condition {
    /// The key must not exist.
    Absent,
    /// The key must exist with this `mod_revision`.
    Revision(Revision),
    /// The key must exist with exactly this value.
    Value(#[serde(with = "serde_bytes")] Vec<u8>),
}

impl Condition {
    /// Whether the current state of the key satisfies the condition.
    pub fn holds(&self, current: Option<&KeyValue>) -> bool {
        match (self, current) {
            (Condition::Absent, current) => current.is_none(),
            (Condition::Revision(revision), Some(kv)) => kv.mod_revision == *revision,
            (Condition::Value(value), Some(kv)) => kv.value == *value,
            (_, None) => false,
        }
    }
}

/// One write inside a command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum BatchOp {
    Put {
        #[serde(with = "serde_bytes")]
        key: Vec<u8>,
        #[serde(with = "serde_bytes")]
        value: Vec<u8>,
        condition: Option<Condition>,
        return_previous: bool,
    },
    Delete {
        #[serde(with = "serde_bytes")]
        key: Vec<u8>,
        condition: Option<Condition>,
        return_previous: bool,
    },
}

impl BatchOp {
    pub fn key(&self) -> &[u8] {
        match self {
            BatchOp::Put { key, .. } | BatchOp::Delete { key, .. } => key,
        }
    }

    pub fn condition(&self) -> Option<&Condition> {
        match self {
            BatchOp::Put { condition, .. } | BatchOp::Delete { condition, .. } => {
                condition.as_ref()
            }
        }
    }

    pub fn return_previous(&self) -> bool {
        match self {
            BatchOp::Put {
                return_previous, ..
            }
            | BatchOp::Delete {
                return_previous, ..
            } => *return_previous,
        }
    }
}

/// What a leader proposes to a range's Raft log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// Writes applied atomically at one new revision, in order: each op's condition sees the
    /// effects of the ops before it. If any condition fails, nothing is applied.
    /// A single put or delete is a write of one op.
    Write { ops: Vec<BatchOp> },
}

impl std::fmt::Display for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Command::Write { ops } => write!(f, "write({} ops)", ops.len()),
        }
    }
}

/// The result of one op of an applied write.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpResult {
    /// The key's state before the op, when the op asked for it.
    pub previous: Option<KeyValue>,
    /// Whether the key existed before the op (for a delete: whether it deleted something).
    pub existed: bool,
}

/// Why a conditional write was not applied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConditionFailed {
    /// Position of the failing op in the command (0 for a single put or delete).
    pub op_index: u32,
    #[serde(with = "serde_bytes")]
    pub key: Vec<u8>,
    /// The key's state when the condition was checked; `None` if absent.
    pub current: Option<KeyValue>,
    /// The range's revision when the condition was checked.
    pub revision: Revision,
}

/// What applying one log entry produced. Every replica computes the same outcome.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum CommandOutcome {
    /// The write was applied at `revision`; one result per op, in order.
    Applied {
        revision: Revision,
        results: Vec<OpResult>,
    },
    /// A condition failed; nothing was applied and no revision was used.
    ConditionFailed(ConditionFailed),
    /// The entry was not a client command (a blank or membership entry).
    Internal,
}

/// How a read is made consistent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Consistency {
    /// The leader confirms its leadership with a quorum (ReadIndex) before reading.
    #[default]
    Linearizable,
    /// The leader reads under its leader lease, without a quorum round trip. Correct only
    /// while clocks drift less than the lease allows.
    Lease,
    /// Any replica reads its own applied state; may be stale. The response says which
    /// revision it reflects.
    Follower,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(value: &[u8], mod_revision: Revision) -> KeyValue {
        KeyValue {
            key: b"k".to_vec(),
            value: value.to_vec(),
            create_revision: 1,
            mod_revision,
        }
    }

    #[test]
    fn conditions_hold_only_on_matching_state() {
        let present = kv(b"v", 7);
        let cases: Vec<(Condition, Option<&KeyValue>, bool)> = vec![
            (Condition::Absent, None, true),
            (Condition::Absent, Some(&present), false),
            (Condition::Revision(7), Some(&present), true),
            (Condition::Revision(6), Some(&present), false),
            (Condition::Revision(7), None, false),
            (Condition::Value(b"v".to_vec()), Some(&present), true),
            (Condition::Value(b"w".to_vec()), Some(&present), false),
            (Condition::Value(Vec::new()), None, false),
        ];
        for (condition, current, expected) in cases {
            assert_eq!(
                condition.holds(current),
                expected,
                "{condition:?} on {current:?}"
            );
        }
    }
}
