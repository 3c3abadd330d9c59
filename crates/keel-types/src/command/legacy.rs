//! Encodings of earlier formats of `command`'s types, kept so that log entries and records
//! written by older releases still decode: each mirrors a type as an older format wrote it
//! and converts into today's.
//!
//! - Format 1: `BatchOpV1` (log entries).
//! - Formats 1-10: `KeyValueV10` and what holds one in a request record (`OpResultV10`,
//!   `ConditionFailedV10`, `CommandOutcomeV10`): a key's state had no version.

use serde::{Deserialize, Serialize};

use super::{BatchOp, CommandOutcome, Condition, ConditionFailed, KeyValue, OpResult, Rejection};
use crate::coordination::CoordinationResult;
use crate::ids::Revision;
use crate::range::{MetaOutcome, RangeDescriptor};

/// `BatchOp` of format 1: no TTL, no increment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum BatchOpV1 {
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

impl From<BatchOpV1> for BatchOp {
    fn from(op: BatchOpV1) -> BatchOp {
        match op {
            BatchOpV1::Put {
                key,
                value,
                condition,
                return_previous,
            } => BatchOp::Put {
                key,
                value,
                condition,
                return_previous,
                ttl_ms: None,
            },
            BatchOpV1::Delete {
                key,
                condition,
                return_previous,
            } => BatchOp::Delete {
                key,
                condition,
                return_previous,
            },
        }
    }
}

/// `KeyValue` of formats 1-10: no version. Such a key reads version 1 (see `KeyValue::version`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyValueV10 {
    #[serde(with = "serde_bytes")]
    pub key: Vec<u8>,
    #[serde(with = "serde_bytes")]
    pub value: Vec<u8>,
    pub create_revision: Revision,
    pub mod_revision: Revision,
    pub expires_at_ms: Option<u64>,
}

impl From<KeyValueV10> for KeyValue {
    fn from(kv: KeyValueV10) -> KeyValue {
        KeyValue {
            key: kv.key,
            value: kv.value,
            create_revision: kv.create_revision,
            mod_revision: kv.mod_revision,
            version: 1,
            expires_at_ms: kv.expires_at_ms,
        }
    }
}

/// `OpResult` of formats 1-10: its previous state has no version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpResultV10 {
    pub previous: Option<KeyValueV10>,
    pub existed: bool,
    pub counter: Option<i64>,
}

impl From<OpResultV10> for OpResult {
    fn from(result: OpResultV10) -> OpResult {
        OpResult {
            previous: result.previous.map(KeyValue::from),
            existed: result.existed,
            counter: result.counter,
        }
    }
}

/// `ConditionFailed` of formats 1-10: its current state has no version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConditionFailedV10 {
    pub op_index: u32,
    #[serde(with = "serde_bytes")]
    pub key: Vec<u8>,
    pub current: Option<KeyValueV10>,
    pub revision: Revision,
}

impl From<ConditionFailedV10> for ConditionFailed {
    fn from(failed: ConditionFailedV10) -> ConditionFailed {
        ConditionFailed {
            op_index: failed.op_index,
            key: failed.key,
            current: failed.current.map(KeyValue::from),
            revision: failed.revision,
        }
    }
}

/// `CommandOutcome` of formats 1-10 (request records): the same variants, its key states
/// without versions. Older formats wrote a prefix of these variants.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum CommandOutcomeV10 {
    Applied {
        revision: Revision,
        results: Vec<OpResultV10>,
    },
    ConditionFailed(ConditionFailedV10),
    Internal,
    Rejected(Rejection),
    Replayed(Box<CommandOutcomeV10>),
    Coordinated {
        revision: Revision,
        result: CoordinationResult,
    },
    Split {
        left: RangeDescriptor,
        right: RangeDescriptor,
    },
    Meta(MetaOutcome),
    Checked {
        index: u64,
    },
}

impl From<CommandOutcomeV10> for CommandOutcome {
    fn from(outcome: CommandOutcomeV10) -> CommandOutcome {
        match outcome {
            CommandOutcomeV10::Applied { revision, results } => CommandOutcome::Applied {
                revision,
                results: results.into_iter().map(OpResult::from).collect(),
            },
            CommandOutcomeV10::ConditionFailed(failed) => {
                CommandOutcome::ConditionFailed(failed.into())
            }
            CommandOutcomeV10::Internal => CommandOutcome::Internal,
            CommandOutcomeV10::Rejected(rejection) => CommandOutcome::Rejected(rejection),
            CommandOutcomeV10::Replayed(first) => {
                CommandOutcome::Replayed(Box::new((*first).into()))
            }
            CommandOutcomeV10::Coordinated { revision, result } => {
                CommandOutcome::Coordinated { revision, result }
            }
            CommandOutcomeV10::Split { left, right } => CommandOutcome::Split { left, right },
            CommandOutcomeV10::Meta(outcome) => CommandOutcome::Meta(outcome),
            CommandOutcomeV10::Checked { index } => CommandOutcome::Checked { index },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv_v10(value: &[u8]) -> KeyValueV10 {
        KeyValueV10 {
            key: b"k".to_vec(),
            value: value.to_vec(),
            create_revision: 2,
            mod_revision: 5,
            expires_at_ms: Some(9),
        }
    }

    fn kv_read(value: &[u8]) -> KeyValue {
        KeyValue {
            key: b"k".to_vec(),
            value: value.to_vec(),
            create_revision: 2,
            mod_revision: 5,
            version: 1,
            expires_at_ms: Some(9),
        }
    }

    #[test]
    fn key_states_of_old_outcomes_read_version_1() {
        let applied = CommandOutcomeV10::Applied {
            revision: 6,
            results: vec![OpResultV10 {
                previous: Some(kv_v10(b"old")),
                existed: true,
                counter: None,
            }],
        };
        let failed = CommandOutcomeV10::ConditionFailed(ConditionFailedV10 {
            op_index: 1,
            key: b"k".to_vec(),
            current: Some(kv_v10(b"now")),
            revision: 5,
        });
        let cases = vec![
            (
                CommandOutcomeV10::Replayed(Box::new(applied)),
                CommandOutcome::Replayed(Box::new(CommandOutcome::Applied {
                    revision: 6,
                    results: vec![OpResult {
                        previous: Some(kv_read(b"old")),
                        existed: true,
                        counter: None,
                    }],
                })),
            ),
            (
                failed,
                CommandOutcome::ConditionFailed(ConditionFailed {
                    op_index: 1,
                    key: b"k".to_vec(),
                    current: Some(kv_read(b"now")),
                    revision: 5,
                }),
            ),
            (
                CommandOutcomeV10::Checked { index: 4 },
                CommandOutcome::Checked { index: 4 },
            ),
        ];
        for (old, expected) in cases {
            assert_eq!(CommandOutcome::from(old.clone()), expected, "{old:?}");
        }
    }
}
