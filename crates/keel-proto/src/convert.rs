//! Conversions between wire messages and `keel-types`. Malformed messages (a condition with
//! no kind, a batch op with no op) become `KvError::InvalidArgument`.

use keel_types::{BatchOp, Condition, ConditionFailed, Consistency, KeyValue, KvError, NodeAddr};

use crate::v1;
use crate::v1::error_detail::Kind;

impl From<KeyValue> for v1::KeyValue {
    fn from(kv: KeyValue) -> Self {
        v1::KeyValue {
            key: kv.key,
            value: kv.value,
            create_revision: kv.create_revision,
            mod_revision: kv.mod_revision,
        }
    }
}

impl From<v1::KeyValue> for KeyValue {
    fn from(kv: v1::KeyValue) -> Self {
        KeyValue {
            key: kv.key,
            value: kv.value,
            create_revision: kv.create_revision,
            mod_revision: kv.mod_revision,
        }
    }
}

impl From<Condition> for v1::Condition {
    fn from(condition: Condition) -> Self {
        let kind = match condition {
            Condition::Absent => v1::condition::Kind::ExpectAbsent(true),
            Condition::Revision(revision) => v1::condition::Kind::ExpectRevision(revision),
            Condition::Value(value) => v1::condition::Kind::ExpectValue(value),
        };
        v1::Condition { kind: Some(kind) }
    }
}

/// A wire condition as a `Condition`; a condition message with no kind set is malformed.
pub fn condition(condition: Option<v1::Condition>) -> Result<Option<Condition>, KvError> {
    let Some(condition) = condition else {
        return Ok(None);
    };
    match condition.kind {
        Some(v1::condition::Kind::ExpectAbsent(_)) => Ok(Some(Condition::Absent)),
        Some(v1::condition::Kind::ExpectRevision(revision)) => {
            Ok(Some(Condition::Revision(revision)))
        }
        Some(v1::condition::Kind::ExpectValue(value)) => Ok(Some(Condition::Value(value))),
        None => Err(KvError::invalid(
            "condition has no kind; set one of expect_absent, expect_revision, expect_value",
        )),
    }
}

pub fn consistency(consistency: i32) -> Result<Consistency, KvError> {
    match v1::Consistency::try_from(consistency) {
        Ok(v1::Consistency::Unspecified | v1::Consistency::Linearizable) => {
            Ok(Consistency::Linearizable)
        }
        Ok(v1::Consistency::Lease) => Ok(Consistency::Lease),
        Ok(v1::Consistency::Follower) => Ok(Consistency::Follower),
        Err(_) => Err(KvError::invalid(format!(
            "consistency {consistency} is unknown; use LINEARIZABLE, LEASE or FOLLOWER"
        ))),
    }
}

impl From<Consistency> for v1::Consistency {
    fn from(consistency: Consistency) -> Self {
        match consistency {
            Consistency::Linearizable => v1::Consistency::Linearizable,
            Consistency::Lease => v1::Consistency::Lease,
            Consistency::Follower => v1::Consistency::Follower,
        }
    }
}

impl From<v1::PutRequest> for v1::BatchPut {
    fn from(put: v1::PutRequest) -> Self {
        v1::BatchPut {
            key: put.key,
            value: put.value,
            condition: put.condition,
            return_previous: put.return_previous,
        }
    }
}

/// A wire batch op as a `BatchOp`; an op message with no op set is malformed.
pub fn batch_op(op: v1::BatchOp) -> Result<BatchOp, KvError> {
    match op.op {
        Some(v1::batch_op::Op::Put(put)) => Ok(BatchOp::Put {
            key: put.key,
            value: put.value,
            condition: condition(put.condition)?,
            return_previous: put.return_previous,
        }),
        Some(v1::batch_op::Op::Delete(delete)) => Ok(BatchOp::Delete {
            key: delete.key,
            condition: condition(delete.condition)?,
            return_previous: delete.return_previous,
        }),
        None => Err(KvError::invalid("batch op has no op; set put or delete")),
    }
}

impl From<BatchOp> for v1::BatchOp {
    fn from(op: BatchOp) -> Self {
        let op = match op {
            BatchOp::Put {
                key,
                value,
                condition,
                return_previous,
            } => v1::batch_op::Op::Put(v1::BatchPut {
                key,
                value,
                condition: condition.map(Into::into),
                return_previous,
            }),
            BatchOp::Delete {
                key,
                condition,
                return_previous,
            } => v1::batch_op::Op::Delete(v1::BatchDelete {
                key,
                condition: condition.map(Into::into),
                return_previous,
            }),
        };
        v1::BatchOp { op: Some(op) }
    }
}

impl From<&KvError> for v1::ErrorDetail {
    fn from(error: &KvError) -> Self {
        let kind = match error.clone() {
            KvError::InvalidArgument { message } => {
                Kind::InvalidArgument(v1::InvalidArgument { message })
            }
            KvError::NotLeader { range_id, leader } => Kind::NotLeader(v1::NotLeader {
                range_id: range_id.0,
                leader_id: leader.as_ref().map(|(id, _)| *id),
                leader_addr: leader.map(|(_, addr)| addr.addr).unwrap_or_default(),
            }),
            KvError::ConditionFailed(failed) => Kind::ConditionFailed(v1::ConditionFailed {
                op_index: failed.op_index,
                key: failed.key,
                current: failed.current.map(Into::into),
                revision: failed.revision,
            }),
            KvError::Unavailable { message } => Kind::Unavailable(v1::Unavailable { message }),
            KvError::Timeout { message } => Kind::Timeout(v1::Timeout { message }),
            KvError::OutcomeUnknown { message } => {
                Kind::OutcomeUnknown(v1::OutcomeUnknown { message })
            }
            KvError::Fatal { message } => Kind::Fatal(v1::Fatal { message }),
        };
        v1::ErrorDetail { kind: Some(kind) }
    }
}

/// The typed error an `ErrorDetail` carries; `None` if it carries none.
pub fn kv_error(detail: v1::ErrorDetail) -> Option<KvError> {
    let error = match detail.kind? {
        Kind::InvalidArgument(e) => KvError::InvalidArgument { message: e.message },
        Kind::NotLeader(e) => KvError::NotLeader {
            range_id: keel_types::RangeId(e.range_id),
            leader: e.leader_id.map(|id| (id, NodeAddr::new(e.leader_addr))),
        },
        Kind::ConditionFailed(e) => KvError::ConditionFailed(ConditionFailed {
            op_index: e.op_index,
            key: e.key,
            current: e.current.map(Into::into),
            revision: e.revision,
        }),
        Kind::Unavailable(e) => KvError::Unavailable { message: e.message },
        Kind::Timeout(e) => KvError::Timeout { message: e.message },
        Kind::OutcomeUnknown(e) => KvError::OutcomeUnknown { message: e.message },
        Kind::Fatal(e) => KvError::Fatal { message: e.message },
    };
    Some(error)
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_types::RangeId;

    #[test]
    fn errors_survive_the_wire() {
        let errors = [
            KvError::invalid("key is empty"),
            KvError::NotLeader {
                range_id: RangeId(1),
                leader: Some((2, NodeAddr::new("127.0.0.1:7002"))),
            },
            KvError::NotLeader {
                range_id: RangeId(1),
                leader: None,
            },
            KvError::ConditionFailed(ConditionFailed {
                op_index: 3,
                key: b"k".to_vec(),
                current: Some(KeyValue {
                    key: b"k".to_vec(),
                    value: b"v".to_vec(),
                    create_revision: 2,
                    mod_revision: 5,
                }),
                revision: 9,
            }),
            KvError::unavailable("no leader"),
            KvError::Timeout {
                message: "read".into(),
            },
            KvError::OutcomeUnknown {
                message: "lost".into(),
            },
            KvError::fatal("disk"),
        ];
        for error in errors {
            assert_eq!(kv_error(v1::ErrorDetail::from(&error)), Some(error));
        }
    }

    #[test]
    fn malformed_messages_are_invalid_arguments() {
        assert!(matches!(
            condition(Some(v1::Condition { kind: None })),
            Err(KvError::InvalidArgument { .. })
        ));
        assert!(matches!(
            batch_op(v1::BatchOp { op: None }),
            Err(KvError::InvalidArgument { .. })
        ));
        assert!(matches!(
            consistency(42),
            Err(KvError::InvalidArgument { .. })
        ));
    }
}
