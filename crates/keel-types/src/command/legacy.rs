//! Encodings of earlier formats of `command`'s types, kept so that log entries and records
//! written by older releases still decode: each mirrors a type as an older format wrote it
//! and converts into today's.
//!
//! - Format 1: `BatchOpV1` (log entries).
//! - Formats 1-10: `KeyValueV10` and what holds one in a request record (`OpResultV10`,
//!   `ConditionFailedV10`, `CommandOutcomeV10`): a key's state had no version.
//! - Format 11: `KeyValueV11` and what holds one in a request record (`CommandOutcomeV11`,
//!   with transactions' results): a key's state had no lease. The mirrors of what holds a
//!   key state are generic over it (`*Of<K>`), so both formats share them. Also
//!   `TxnMutationV11` and what holds a `TxnPutV11` (log entries of `Command::TxnV11`): a
//!   transaction's put had no lease fields.

use serde::{Deserialize, Serialize};

use super::RequestId;
use super::{BatchOp, CommandOutcome, Condition, ConditionFailed, KeyValue, OpResult, Rejection};
use crate::coordination::CoordinationResult;
use crate::ids::Revision;
use crate::range::{MetaOutcome, RangeDescriptor};
use crate::txn::{
    Compare, ReadResult, Txn, TxnDelete, TxnMutation, TxnOp, TxnOpResult, TxnPut, TxnRead,
    TxnResult,
};

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

/// `KeyValue` of formats 1-10: no version, no lease. Such a key reads version 1 (see
/// `KeyValue::version`) and lease 0.
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
            lease: 0,
        }
    }
}

/// `KeyValue` of format 11: a version, no lease. Such a key reads lease 0 (see
/// `KeyValue::lease`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyValueV11 {
    #[serde(with = "serde_bytes")]
    pub key: Vec<u8>,
    #[serde(with = "serde_bytes")]
    pub value: Vec<u8>,
    pub create_revision: Revision,
    pub mod_revision: Revision,
    pub version: u64,
    pub expires_at_ms: Option<u64>,
}

impl From<KeyValueV11> for KeyValue {
    fn from(kv: KeyValueV11) -> KeyValue {
        KeyValue {
            key: kv.key,
            value: kv.value,
            create_revision: kv.create_revision,
            mod_revision: kv.mod_revision,
            version: kv.version,
            expires_at_ms: kv.expires_at_ms,
            lease: 0,
        }
    }
}

/// `OpResult` whose previous state is an older format's key state `K`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpResultOf<K> {
    pub previous: Option<K>,
    pub existed: bool,
    pub counter: Option<i64>,
}

/// `OpResult` of formats 1-10: its previous state has no version.
pub type OpResultV10 = OpResultOf<KeyValueV10>;

impl<K: Into<KeyValue>> From<OpResultOf<K>> for OpResult {
    fn from(result: OpResultOf<K>) -> OpResult {
        OpResult {
            previous: result.previous.map(Into::into),
            existed: result.existed,
            counter: result.counter,
        }
    }
}

/// `ConditionFailed` whose current state is an older format's key state `K`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConditionFailedOf<K> {
    pub op_index: u32,
    #[serde(with = "serde_bytes")]
    pub key: Vec<u8>,
    pub current: Option<K>,
    pub revision: Revision,
}

/// `ConditionFailed` of formats 1-10: its current state has no version.
pub type ConditionFailedV10 = ConditionFailedOf<KeyValueV10>;

impl<K: Into<KeyValue>> From<ConditionFailedOf<K>> for ConditionFailed {
    fn from(failed: ConditionFailedOf<K>) -> ConditionFailed {
        ConditionFailed {
            op_index: failed.op_index,
            key: failed.key,
            current: failed.current.map(Into::into),
            revision: failed.revision,
        }
    }
}

/// `ReadResult` whose rows are an older format's key states `K`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadResultOf<K> {
    pub kvs: Vec<K>,
    pub count: u64,
    pub more: bool,
}

/// `TxnOpResult` holding an older format's key states `K`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum TxnOpResultOf<K> {
    Read(ReadResultOf<K>),
    Put { previous: Option<K> },
    Delete { deleted: u64, previous: Vec<K> },
    Txn(TxnResultOf<K>),
}

/// `TxnResult` holding an older format's key states `K`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TxnResultOf<K> {
    pub succeeded: bool,
    pub results: Vec<TxnOpResultOf<K>>,
}

impl<K: Into<KeyValue>> From<TxnResultOf<K>> for TxnResult {
    fn from(result: TxnResultOf<K>) -> TxnResult {
        let states = |kvs: Vec<K>| kvs.into_iter().map(Into::into).collect();
        let op = |op| match op {
            TxnOpResultOf::Read(read) => TxnOpResult::Read(ReadResult {
                kvs: states(read.kvs),
                count: read.count,
                more: read.more,
            }),
            TxnOpResultOf::Put { previous } => TxnOpResult::Put {
                previous: previous.map(Into::into),
            },
            TxnOpResultOf::Delete { deleted, previous } => TxnOpResult::Delete {
                deleted,
                previous: states(previous),
            },
            TxnOpResultOf::Txn(nested) => TxnOpResult::Txn(nested.into()),
        };
        TxnResult {
            succeeded: result.succeeded,
            results: result.results.into_iter().map(op).collect(),
        }
    }
}

/// `CommandOutcome` (request records) whose key states are an older format's `K`: the same
/// variants. Older formats wrote a prefix of these variants (format 11 added `Transacted`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum CommandOutcomeOf<K> {
    Applied {
        revision: Revision,
        results: Vec<OpResultOf<K>>,
    },
    ConditionFailed(ConditionFailedOf<K>),
    Internal,
    Rejected(Rejection),
    Replayed(Box<CommandOutcomeOf<K>>),
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
    Transacted {
        revision: Revision,
        result: TxnResultOf<K>,
    },
}

/// `CommandOutcome` of formats 1-10: its key states have no version.
pub type CommandOutcomeV10 = CommandOutcomeOf<KeyValueV10>;
/// `CommandOutcome` of format 11: its key states have no lease.
pub type CommandOutcomeV11 = CommandOutcomeOf<KeyValueV11>;

impl<K: Into<KeyValue>> From<CommandOutcomeOf<K>> for CommandOutcome {
    fn from(outcome: CommandOutcomeOf<K>) -> CommandOutcome {
        match outcome {
            CommandOutcomeOf::Applied { revision, results } => CommandOutcome::Applied {
                revision,
                results: results.into_iter().map(OpResult::from).collect(),
            },
            CommandOutcomeOf::ConditionFailed(failed) => {
                CommandOutcome::ConditionFailed(failed.into())
            }
            CommandOutcomeOf::Internal => CommandOutcome::Internal,
            CommandOutcomeOf::Rejected(rejection) => CommandOutcome::Rejected(rejection),
            CommandOutcomeOf::Replayed(first) => {
                CommandOutcome::Replayed(Box::new((*first).into()))
            }
            CommandOutcomeOf::Coordinated { revision, result } => {
                CommandOutcome::Coordinated { revision, result }
            }
            CommandOutcomeOf::Split { left, right } => CommandOutcome::Split { left, right },
            CommandOutcomeOf::Meta(outcome) => CommandOutcome::Meta(outcome),
            CommandOutcomeOf::Checked { index } => CommandOutcome::Checked { index },
            CommandOutcomeOf::Transacted { revision, result } => CommandOutcome::Transacted {
                revision,
                result: result.into(),
            },
        }
    }
}

/// `TxnPut` of format 11: no lease, `ignore_value` or `ignore_lease` (log entries of
/// `Command::TxnV11`). Such a put detaches the key from any lease, as the puts of format 12
/// that name none; no key had one then.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TxnPutV11 {
    #[serde(with = "serde_bytes")]
    pub key: Vec<u8>,
    #[serde(with = "serde_bytes")]
    pub value: Vec<u8>,
    pub ttl_ms: Option<u64>,
    pub previous: bool,
}

/// `TxnOp` of format 11: its puts are `TxnPutV11`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum TxnOpV11 {
    Read(TxnRead),
    Put(TxnPutV11),
    Delete(TxnDelete),
    Txn(Box<TxnV11>),
}

/// `Txn` of format 11: its ops are `TxnOpV11`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TxnV11 {
    pub compares: Vec<Compare>,
    pub success: Vec<TxnOpV11>,
    pub failure: Vec<TxnOpV11>,
}

/// `TxnMutation` of format 11 (`Command::TxnV11`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TxnMutationV11 {
    pub request: Option<RequestId>,
    pub now_ms: u64,
    pub txn: TxnV11,
}

impl From<TxnV11> for Txn {
    fn from(txn: TxnV11) -> Txn {
        let op = |op| match op {
            TxnOpV11::Read(read) => TxnOp::Read(read),
            TxnOpV11::Put(put) => TxnOp::Put(TxnPut {
                key: put.key,
                value: put.value,
                ttl_ms: put.ttl_ms,
                previous: put.previous,
                lease: 0,
                ignore_value: false,
                ignore_lease: false,
            }),
            TxnOpV11::Delete(delete) => TxnOp::Delete(delete),
            TxnOpV11::Txn(nested) => TxnOp::Txn(Box::new((*nested).into())),
        };
        Txn {
            compares: txn.compares,
            success: txn.success.into_iter().map(op).collect(),
            failure: txn.failure.into_iter().map(op).collect(),
        }
    }
}

impl From<TxnMutationV11> for TxnMutation {
    fn from(mutation: TxnMutationV11) -> TxnMutation {
        TxnMutation {
            request: mutation.request,
            now_ms: mutation.now_ms,
            txn: mutation.txn.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::Command;

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
            lease: 0,
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

    #[test]
    fn key_states_of_format_11_outcomes_read_lease_0() {
        let v11 = KeyValueV11 {
            key: b"k".to_vec(),
            value: b"v".to_vec(),
            create_revision: 2,
            mod_revision: 5,
            version: 3,
            expires_at_ms: None,
        };
        let read = KeyValue {
            key: b"k".to_vec(),
            value: b"v".to_vec(),
            create_revision: 2,
            mod_revision: 5,
            version: 3,
            expires_at_ms: None,
            lease: 0,
        };
        let nested = TxnResultOf {
            succeeded: false,
            results: vec![TxnOpResultOf::Delete {
                deleted: 1,
                previous: vec![v11.clone()],
            }],
        };
        let old = CommandOutcomeV11::Transacted {
            revision: 6,
            result: TxnResultOf {
                succeeded: true,
                results: vec![
                    TxnOpResultOf::Read(ReadResultOf {
                        kvs: vec![v11.clone()],
                        count: 1,
                        more: false,
                    }),
                    TxnOpResultOf::Put {
                        previous: Some(v11),
                    },
                    TxnOpResultOf::Txn(nested),
                ],
            },
        };
        let expected = CommandOutcome::Transacted {
            revision: 6,
            result: TxnResult {
                succeeded: true,
                results: vec![
                    TxnOpResult::Read(ReadResult {
                        kvs: vec![read.clone()],
                        count: 1,
                        more: false,
                    }),
                    TxnOpResult::Put {
                        previous: Some(read.clone()),
                    },
                    TxnOpResult::Txn(TxnResult {
                        succeeded: false,
                        results: vec![TxnOpResult::Delete {
                            deleted: 1,
                            previous: vec![read],
                        }],
                    }),
                ],
            },
        };
        assert_eq!(CommandOutcome::from(old), expected);
    }

    #[test]
    fn transactions_of_format_11_decode_and_detach_their_puts() {
        let put = TxnPutV11 {
            key: b"etcd/k".to_vec(),
            value: b"v".to_vec(),
            ttl_ms: Some(5),
            previous: true,
        };
        let nested = TxnV11 {
            compares: Vec::new(),
            success: vec![TxnOpV11::Put(put.clone())],
            failure: Vec::new(),
        };
        let old = TxnMutationV11 {
            request: None,
            now_ms: 9,
            txn: TxnV11 {
                compares: Vec::new(),
                success: vec![TxnOpV11::Put(put), TxnOpV11::Txn(Box::new(nested))],
                failure: Vec::new(),
            },
        };
        // A log entry of format 11 holds the transaction at the variant `TxnV11` took over.
        let bytes = postcard::to_allocvec(&Command::TxnV11(old.clone())).unwrap();
        assert_eq!(bytes[0], 11, "Command::Txn was variant 11 in format 11");
        let decoded: Command = postcard::from_bytes(&bytes).unwrap();
        assert_eq!(decoded, Command::TxnV11(old.clone()));
        let put = TxnOp::Put(TxnPut {
            key: b"etcd/k".to_vec(),
            value: b"v".to_vec(),
            ttl_ms: Some(5),
            previous: true,
            lease: 0,
            ignore_value: false,
            ignore_lease: false,
        });
        let nested = Txn {
            compares: Vec::new(),
            success: vec![put.clone()],
            failure: Vec::new(),
        };
        let expected = TxnMutation {
            request: None,
            now_ms: 9,
            txn: Txn {
                compares: Vec::new(),
                success: vec![put, TxnOp::Txn(Box::new(nested))],
                failure: Vec::new(),
            },
        };
        assert_eq!(TxnMutation::from(old), expected);
    }
}
