//! Conversions between wire messages and `keel-types`. Malformed messages (a condition with
//! no kind, a batch op with no op) become `KvError::InvalidArgument`, as do TTLs and request
//! ids outside their limits.
//!
//! On the wire a key's TTL is both the time it has left (`ttl_remaining_ms`), by the clock of
//! the replica that served it, and its absolute expiry (`expires_at_ms`, on the leader's
//! clock, as Keel keeps it). Only the serving side can count the time left, so `key_value`
//! takes its clock reading; a `KeyValue` decoded from the wire keeps the absolute expiry.

use keel_types::validate::check_fence;
use keel_types::{
    BatchOp, Condition, ConditionFailed, Consistency, Event, EventKind, Fence, KeyValue, KvError,
    LockHold, NodeAddr, RangeDescriptor, RangeId, RequestId, validate,
};

use crate::v1;
use crate::v1::error_detail::Kind;

pub mod txn;

/// `kv` as sent to a client by a replica whose clock reads `now_ms`.
pub fn key_value(kv: KeyValue, now_ms: u64) -> v1::KeyValue {
    v1::KeyValue {
        ttl_remaining_ms: kv
            .expires_at_ms
            .map(|expires| expires.saturating_sub(now_ms).max(1)),
        expires_at_ms: kv.expires_at_ms,
        key: kv.key,
        value: kv.value,
        create_revision: kv.create_revision,
        mod_revision: kv.mod_revision,
        version: kv.version,
        lease: kv.lease,
    }
}

/// `event` as sent to a client: each state's TTL counted from the change (`clock_ms`).
pub fn event(event: Event) -> v1::Event {
    let (kind, token) = match event.kind {
        EventKind::Key => (v1::EventKind::Key, 0),
        EventKind::LockReclaimed { token } => (v1::EventKind::LockReclaimed, token),
        EventKind::RecordReclaimed { token } => (v1::EventKind::IdempotencyRecordReclaimed, token),
    };
    v1::Event {
        revision: event.revision,
        key: event.key,
        kv: event.after.map(|kv| key_value(kv, event.clock_ms)),
        prev_kv: event.before.map(|kv| key_value(kv, event.clock_ms)),
        clock_ms: event.clock_ms,
        kind: kind.into(),
        token,
    }
}

/// An event from the wire. A kind this build does not know reads as a key's change: a
/// server sends kinds other than `Key` only to a watch that asked for them.
impl From<v1::Event> for Event {
    fn from(event: v1::Event) -> Self {
        let kind = match v1::EventKind::try_from(event.kind) {
            Ok(v1::EventKind::LockReclaimed) => EventKind::LockReclaimed { token: event.token },
            Ok(v1::EventKind::IdempotencyRecordReclaimed) => {
                EventKind::RecordReclaimed { token: event.token }
            }
            Ok(v1::EventKind::Key) | Err(_) => EventKind::Key,
        };
        Event {
            revision: event.revision,
            key: event.key,
            after: event.kv.map(KeyValue::from),
            before: event.prev_kv.map(KeyValue::from),
            clock_ms: event.clock_ms,
            kind,
        }
    }
}

/// A key from the wire; a server built before versions sends none, which reads 0.
impl From<v1::KeyValue> for KeyValue {
    fn from(kv: v1::KeyValue) -> Self {
        KeyValue {
            key: kv.key,
            value: kv.value,
            create_revision: kv.create_revision,
            mod_revision: kv.mod_revision,
            version: kv.version,
            expires_at_ms: kv.expires_at_ms,
            lease: kv.lease,
        }
    }
}

impl From<RequestId> for v1::RequestId {
    fn from(id: RequestId) -> Self {
        v1::RequestId {
            client_id: id.client_id,
            client_started_ms: id.client_started_ms,
            sequence: id.sequence,
            completed_below: id.completed_below,
        }
    }
}

/// A wire request id as a `RequestId`. Sequences start at 1, and `completed_below` may not
/// pass the request itself.
pub fn request_id(id: Option<v1::RequestId>) -> Result<Option<RequestId>, KvError> {
    let Some(id) = id else { return Ok(None) };
    if id.sequence == 0 {
        return Err(KvError::invalid(
            "request id has sequence 0; sequences start at 1",
        ));
    }
    if id.completed_below > id.sequence {
        return Err(KvError::invalid(format!(
            "request id has completed_below {} past its own sequence {}",
            id.completed_below, id.sequence
        )));
    }
    Ok(Some(RequestId {
        client_id: id.client_id,
        client_started_ms: id.client_started_ms,
        sequence: id.sequence,
        completed_below: id.completed_below,
    }))
}

/// A wire TTL as milliseconds; checked against `limits::TTL_MS_MAX`.
pub fn ttl_ms(key: &[u8], ttl_ms: Option<i64>) -> Result<Option<u64>, KvError> {
    ttl_ms
        .map(|ttl| validate::check_ttl_ms(key, ttl))
        .transpose()
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
            ttl_ms: put.ttl_ms,
        }
    }
}

/// A wire batch op as a `BatchOp`; an op message with no op set is malformed.
pub fn batch_op(op: v1::BatchOp) -> Result<BatchOp, KvError> {
    match op.op {
        Some(v1::batch_op::Op::Put(put)) => Ok(BatchOp::Put {
            ttl_ms: ttl_ms(&put.key, put.ttl_ms)?,
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
        Some(v1::batch_op::Op::Increment(increment)) => Ok(BatchOp::Increment {
            key: increment.key,
            delta: increment.delta,
        }),
        None => Err(KvError::invalid(
            "batch op has no op; set put, delete or increment",
        )),
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
                ttl_ms,
            } => v1::batch_op::Op::Put(v1::BatchPut {
                key,
                value,
                condition: condition.map(Into::into),
                return_previous,
                ttl_ms: ttl_ms.map(|ttl| i64::try_from(ttl).unwrap_or(i64::MAX)),
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
            BatchOp::Increment { key, delta } => {
                v1::batch_op::Op::Increment(v1::BatchIncrement { key, delta })
            }
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
                current: failed.current.map(|kv| v1::KeyValue {
                    ttl_remaining_ms: None,
                    ..key_value(kv, 0)
                }),
                revision: failed.revision,
            }),
            KvError::Unavailable { message } => Kind::Unavailable(v1::Unavailable { message }),
            KvError::Timeout { message } => Kind::Timeout(v1::Timeout { message }),
            KvError::OutcomeUnknown { message } => {
                Kind::OutcomeUnknown(v1::OutcomeUnknown { message })
            }
            KvError::Fatal { message } => Kind::Fatal(v1::Fatal { message }),
            KvError::RequestIdExpired {
                client_id,
                sequence,
            } => Kind::RequestIdExpired(v1::RequestIdExpired {
                client_id,
                sequence,
            }),
            KvError::NotACounter { key } => Kind::NotACounter(v1::NotACounter { key }),
            KvError::Overflow {
                key,
                current,
                delta,
            } => Kind::Overflow(v1::Overflow {
                key,
                current,
                delta,
            }),
            KvError::Overloaded { message } => Kind::Overloaded(v1::Overloaded { message }),
            KvError::FencedOut {
                key,
                lock,
                current_token,
            } => Kind::FencedOut(v1::FencedOut {
                key,
                lock,
                current_token,
            }),
            KvError::LockNotHeld {
                name,
                token,
                current_token,
            } => Kind::LockNotHeld(v1::LockNotHeld {
                name,
                token,
                current_token,
            }),
            KvError::RecordNotOwned {
                scope,
                id,
                token,
                current_token,
            } => Kind::RecordNotOwned(v1::RecordNotOwned {
                scope,
                id,
                token,
                current_token,
            }),
            KvError::KeyOutOfRange { key, range } => Kind::KeyOutOfRange(v1::KeyOutOfRange {
                key,
                range: Some((*range).into()),
            }),
            KvError::EpochMismatch {
                expected_epoch,
                range,
            } => Kind::EpochMismatch(v1::EpochMismatch {
                expected_epoch,
                range: Some((*range).into()),
            }),
            KvError::Unauthenticated { message } => {
                Kind::Unauthenticated(v1::Unauthenticated { message })
            }
            KvError::PermissionDenied { message } => {
                Kind::PermissionDenied(v1::PermissionDenied { message })
            }
            KvError::QuotaExceeded {
                tenant,
                quota,
                limit,
            } => Kind::QuotaExceeded(v1::QuotaExceeded {
                tenant,
                quota,
                limit,
            }),
            KvError::FutureRevision { requested, current } => {
                Kind::FutureRevision(v1::FutureRevision { requested, current })
            }
            KvError::Compacted {
                requested,
                compact_revision,
            } => Kind::Compacted(v1::Compacted {
                requested,
                compact_revision,
            }),
            KvError::LeaseNotFound { id } => Kind::LeaseNotFound(v1::LeaseNotFound { id }),
        };
        v1::ErrorDetail { kind: Some(kind) }
    }
}

/// A write's fence as the client sent it, checked.
pub fn fence(fence: Option<v1::Fence>) -> Result<Option<Fence>, KvError> {
    let Some(fence) = fence else { return Ok(None) };
    let fence = Fence {
        lock: fence.lock,
        token: fence.token,
    };
    check_fence(&fence)?;
    Ok(Some(fence))
}

/// A lock holder as a client sees it: `ttl_remaining_ms` counted by the serving node's
/// clock `now_ms`.
pub fn lock_holder(hold: LockHold, now_ms: u64) -> v1::LockHolder {
    v1::LockHolder {
        owner: hold.owner,
        token: hold.token,
        ttl_remaining_ms: hold.expires_at_ms.saturating_sub(now_ms),
        expires_at_ms: hold.expires_at_ms,
        lock_delay_ms: hold.lock_delay_ms,
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
        Kind::ConditionFailed(e) => KvError::from(ConditionFailed {
            op_index: e.op_index,
            key: e.key,
            current: e.current.map(Into::into),
            revision: e.revision,
        }),
        Kind::Unavailable(e) => KvError::Unavailable { message: e.message },
        Kind::Timeout(e) => KvError::Timeout { message: e.message },
        Kind::OutcomeUnknown(e) => KvError::OutcomeUnknown { message: e.message },
        Kind::Fatal(e) => KvError::Fatal { message: e.message },
        Kind::RequestIdExpired(e) => KvError::RequestIdExpired {
            client_id: e.client_id,
            sequence: e.sequence,
        },
        Kind::NotACounter(e) => KvError::NotACounter { key: e.key },
        Kind::Overflow(e) => KvError::Overflow {
            key: e.key,
            current: e.current,
            delta: e.delta,
        },
        Kind::Overloaded(e) => KvError::Overloaded { message: e.message },
        Kind::FencedOut(e) => KvError::FencedOut {
            key: e.key,
            lock: e.lock,
            current_token: e.current_token,
        },
        Kind::LockNotHeld(e) => KvError::LockNotHeld {
            name: e.name,
            token: e.token,
            current_token: e.current_token,
        },
        Kind::RecordNotOwned(e) => KvError::RecordNotOwned {
            scope: e.scope,
            id: e.id,
            token: e.token,
            current_token: e.current_token,
        },
        Kind::KeyOutOfRange(e) => KvError::KeyOutOfRange {
            key: e.key,
            range: Box::new(e.range?.into()),
        },
        Kind::EpochMismatch(e) => KvError::EpochMismatch {
            expected_epoch: e.expected_epoch,
            range: Box::new(e.range?.into()),
        },
        Kind::Unauthenticated(e) => KvError::Unauthenticated { message: e.message },
        Kind::PermissionDenied(e) => KvError::PermissionDenied { message: e.message },
        Kind::QuotaExceeded(e) => KvError::QuotaExceeded {
            tenant: e.tenant,
            quota: e.quota,
            limit: e.limit,
        },
        Kind::FutureRevision(e) => KvError::FutureRevision {
            requested: e.requested,
            current: e.current,
        },
        Kind::Compacted(e) => KvError::Compacted {
            requested: e.requested,
            compact_revision: e.compact_revision,
        },
        Kind::LeaseNotFound(e) => KvError::LeaseNotFound { id: e.id },
    };
    Some(error)
}

impl From<RangeDescriptor> for v1::RangeDescriptor {
    fn from(range: RangeDescriptor) -> Self {
        v1::RangeDescriptor {
            range_id: range.id.0,
            start: range.start,
            end: range.end,
            epoch: range.epoch,
            conf_version: range.conf_version,
            replicas: range.replicas,
        }
    }
}

impl From<v1::RangeDescriptor> for RangeDescriptor {
    fn from(range: v1::RangeDescriptor) -> Self {
        RangeDescriptor {
            id: RangeId(range.range_id),
            start: range.start,
            end: range.end,
            epoch: range.epoch,
            conf_version: range.conf_version,
            replicas: range.replicas,
        }
    }
}

/// A consistency check's report as `Cluster.Check` and `Cluster.Status` answer it.
impl From<&keel_types::CheckReport> for v1::RangeCheck {
    fn from(report: &keel_types::CheckReport) -> v1::RangeCheck {
        let replica = |replica: &keel_types::ReplicaCheck| v1::ReplicaCheck {
            node_id: replica.node,
            hash: replica.hash.map(|hash| hash.to_vec()).unwrap_or_default(),
            problem: replica.problem.clone().unwrap_or_default(),
            rows: replica.rows.iter().map(ToString::to_string).collect(),
            buckets_differing: replica.buckets_differing,
        };
        v1::RangeCheck {
            range_id: report.range.0,
            index: report.index,
            verdict: report.verdict.name().to_string(),
            replicas: report.replicas.iter().map(replica).collect(),
            divergent: report.divergent.clone(),
            checked_at_ms: report.checked_at_ms,
            rows: report.rows,
            error: String::new(),
            leader: report.leader,
            repaired: report.repaired.clone(),
            repair: report.repair_note.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            KvError::from(ConditionFailed {
                op_index: 3,
                key: b"k".to_vec(),
                current: Some(KeyValue {
                    key: b"k".to_vec(),
                    value: b"v".to_vec(),
                    create_revision: 2,
                    mod_revision: 5,
                    version: 3,
                    expires_at_ms: None,
                    lease: 0,
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
            KvError::RequestIdExpired {
                client_id: 7,
                sequence: 3,
            },
            KvError::NotACounter { key: b"n".to_vec() },
            KvError::FutureRevision {
                requested: 12,
                current: 9,
            },
            KvError::Compacted {
                requested: 3,
                compact_revision: 7,
            },
            KvError::LeaseNotFound { id: 9 },
            KvError::Overflow {
                key: b"n".to_vec(),
                current: i64::MAX,
                delta: 1,
            },
            KvError::Overloaded {
                message: "sessions".into(),
            },
            KvError::FencedOut {
                key: b"k".to_vec(),
                lock: b"l".to_vec(),
                current_token: 12,
            },
            KvError::LockNotHeld {
                name: b"l".to_vec(),
                token: 3,
                current_token: None,
            },
            KvError::RecordNotOwned {
                scope: b"s".to_vec(),
                id: b"i".to_vec(),
                token: 3,
                current_token: Some(4),
            },
            KvError::KeyOutOfRange {
                key: b"q".to_vec(),
                range: Box::new(RangeDescriptor {
                    id: RangeId(3),
                    start: b"a".to_vec(),
                    end: Some(b"m".to_vec()),
                    epoch: 4,
                    conf_version: 2,
                    replicas: vec![1, 2, 3],
                }),
            },
            KvError::EpochMismatch {
                expected_epoch: 3,
                range: Box::new(RangeDescriptor {
                    id: RangeId(3),
                    start: Vec::new(),
                    end: None,
                    epoch: 4,
                    conf_version: 0,
                    replicas: vec![2],
                }),
            },
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
        let id = |sequence, completed_below| v1::RequestId {
            client_id: 1,
            client_started_ms: 2,
            sequence,
            completed_below,
        };
        assert!(request_id(Some(id(0, 0))).is_err());
        assert!(request_id(Some(id(3, 4))).is_err());
        assert_eq!(request_id(Some(id(3, 3))).unwrap().unwrap().sequence, 3);
        assert!(ttl_ms(b"k", Some(-1)).is_err());
        assert_eq!(ttl_ms(b"k", None), Ok(None));
    }

    #[test]
    fn keys_survive_the_wire_with_their_version() {
        let kv = KeyValue {
            key: b"k".to_vec(),
            value: b"v".to_vec(),
            create_revision: 3,
            mod_revision: 8,
            version: 4,
            expires_at_ms: Some(10_000),
            lease: 7,
        };
        let sent = key_value(kv.clone(), 4_000);
        assert_eq!(sent.version, 4);
        assert_eq!(KeyValue::from(sent), kv);
        // A server built before versions sends none.
        let old = v1::KeyValue {
            version: 0,
            ..key_value(kv, 4_000)
        };
        assert_eq!(KeyValue::from(old).version, 0);
    }

    #[test]
    fn remaining_ttl_is_counted_by_the_serving_clock() {
        let kv = KeyValue {
            key: b"k".to_vec(),
            value: Vec::new(),
            create_revision: 1,
            mod_revision: 1,
            version: 1,
            expires_at_ms: Some(10_000),
            lease: 0,
        };
        assert_eq!(key_value(kv.clone(), 4_000).ttl_remaining_ms, Some(6_000));
        assert_eq!(
            key_value(
                KeyValue {
                    expires_at_ms: None,
                    ..kv
                },
                4_000
            )
            .ttl_remaining_ms,
            None
        );
    }
}
