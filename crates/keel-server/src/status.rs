//! The one table from `KvError` to gRPC status, and back for statuses relayed from a leader.
//! Every error status carries an encoded `keel.v1.ErrorDetail` in its details, so clients get
//! the typed error (leader hint, current value) and not only the code.
//!
//! | KvError           | gRPC code           | why                                               |
//! |-------------------|---------------------|---------------------------------------------------|
//! | InvalidArgument   | INVALID_ARGUMENT    | bad input; nothing applied; do not retry as is     |
//! | ConditionFailed   | FAILED_PRECONDITION | the CAS lost; details carry the current value      |
//! | NotLeader         | UNAVAILABLE         | retry elsewhere (the hint); definitely not applied |
//! | Unavailable       | UNAVAILABLE         | no leader / no quorum; not applied; retry          |
//! | Timeout           | DEADLINE_EXCEEDED   | a read ran out of time; reads may be retried       |
//! | OutcomeUnknown    | UNKNOWN             | a write may or may not have been applied           |
//! | Fatal             | INTERNAL            | this node stopped serving; go to another node      |
//! | RequestIdExpired  | FAILED_PRECONDITION | the retry's record is gone; it was not applied now |
//! | NotACounter       | FAILED_PRECONDITION | increment of a non-integer value; nothing applied  |
//! | Overflow          | FAILED_PRECONDITION | increment leaves i64; nothing applied              |
//! | Overloaded        | RESOURCE_EXHAUSTED  | a kept-state limit; nothing applied; retry later   |
//! | FencedOut         | FAILED_PRECONDITION | key fenced by a newer token or another lock        |
//! | LockNotHeld       | FAILED_PRECONDITION | the token lost the lock (expired, taken, released) |
//! | RecordNotOwned    | FAILED_PRECONDITION | the token lost the idempotency record              |
//! | KeyOutOfRange     | FAILED_PRECONDITION | key left the range (split); refresh ranges, retry  |
//! | EpochMismatch     | FAILED_PRECONDITION | the range changed first; refresh ranges, retry     |
//! | Unauthenticated   | UNAUTHENTICATED     | no token or an unknown one; nothing done           |
//! | PermissionDenied  | PERMISSION_DENIED   | the token may not make this call; nothing done     |
//! | QuotaExceeded     | RESOURCE_EXHAUSTED  | the tenant is at a quota; nothing applied          |
//! | FutureRevision    | OUT_OF_RANGE        | a read's min_revision no write has made yet        |
//! | Compacted         | OUT_OF_RANGE        | history asked from a revision no longer kept       |
//! | LeaseNotFound     | NOT_FOUND           | the lease named is gone or never was; nothing done |
//!
//! NotLeader shares UNAVAILABLE with Unavailable because a generic gRPC client should treat
//! both as "not applied, retry (elsewhere)"; Keel's client tells them apart by the detail.
//! KeyOutOfRange and EpochMismatch are FAILED_PRECONDITION: nothing was applied, but the same
//! request to the same place fails again; the detail carries the range as it is now, and a
//! client retries after refreshing its range table.
//! Only this module (and the services) name `tonic::Status`.

use keel_proto::v1;
use keel_types::KvError;
use prost::Message;
use tonic::{Code, Status};

/// The gRPC code of each error; see the table in the module doc.
pub fn code(error: &KvError) -> Code {
    match error {
        KvError::InvalidArgument { .. } => Code::InvalidArgument,
        KvError::ConditionFailed(_) => Code::FailedPrecondition,
        KvError::NotLeader { .. } => Code::Unavailable,
        KvError::Unavailable { .. } => Code::Unavailable,
        KvError::Timeout { .. } => Code::DeadlineExceeded,
        KvError::OutcomeUnknown { .. } => Code::Unknown,
        KvError::Fatal { .. } => Code::Internal,
        KvError::RequestIdExpired { .. }
        | KvError::NotACounter { .. }
        | KvError::Overflow { .. } => Code::FailedPrecondition,
        KvError::Overloaded { .. } => Code::ResourceExhausted,
        KvError::FencedOut { .. }
        | KvError::LockNotHeld { .. }
        | KvError::RecordNotOwned { .. } => Code::FailedPrecondition,
        KvError::KeyOutOfRange { .. } | KvError::EpochMismatch { .. } => Code::FailedPrecondition,
        KvError::Unauthenticated { .. } => Code::Unauthenticated,
        KvError::PermissionDenied { .. } => Code::PermissionDenied,
        KvError::QuotaExceeded { .. } => Code::ResourceExhausted,
        KvError::FutureRevision { .. } | KvError::Compacted { .. } => Code::OutOfRange,
        KvError::LeaseNotFound { .. } => Code::NotFound,
    }
}

/// A gRPC code's name in snake case, for metrics (`unavailable`, `failed_precondition`).
pub fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "ok",
        Code::Cancelled => "cancelled",
        Code::Unknown => "unknown",
        Code::InvalidArgument => "invalid_argument",
        Code::DeadlineExceeded => "deadline_exceeded",
        Code::NotFound => "not_found",
        Code::AlreadyExists => "already_exists",
        Code::PermissionDenied => "permission_denied",
        Code::ResourceExhausted => "resource_exhausted",
        Code::FailedPrecondition => "failed_precondition",
        Code::Aborted => "aborted",
        Code::OutOfRange => "out_of_range",
        Code::Unimplemented => "unimplemented",
        Code::Internal => "internal",
        Code::Unavailable => "unavailable",
        Code::DataLoss => "data_loss",
        Code::Unauthenticated => "unauthenticated",
    }
}

/// The status a client receives for `error`: code, message, and the encoded detail.
pub fn to_status(error: &KvError) -> Status {
    let detail = v1::ErrorDetail::from(error).encode_to_vec();
    Status::with_details(code(error), error.to_string(), detail.into())
}

/// The typed error a status carries in its details; `None` when it carries none (a status
/// made by the transport, not by a Keel node).
pub fn kv_error(status: &Status) -> Option<KvError> {
    if status.details().is_empty() {
        return None;
    }
    let detail = v1::ErrorDetail::decode(status.details()).ok()?;
    keel_proto::convert::kv_error(detail)
}

/// Whether a failed call certainly never reached the peer: the connection could not be made.
pub fn never_sent(status: &Status) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(status);
    while let Some(error) = source {
        if error.is::<tonic::ConnectError>() {
            return true;
        }
        source = error.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use keel_types::{ConditionFailed, NodeAddr, RangeId};

    use super::*;

    fn check(error: KvError, expected: Code) {
        let status = to_status(&error);
        assert_eq!(status.code(), expected, "{error:?}");
        assert_eq!(status.message(), error.to_string());
        let kind = error.kind();
        assert!(
            !kind.is_empty() && kind.chars().all(|c| c.is_ascii_lowercase() || c == '_'),
            "{kind:?}"
        );
        assert_eq!(kv_error(&status), Some(error));
    }

    #[test]
    fn code_names_are_snake_case_and_distinct() {
        let names: std::collections::BTreeSet<&str> = (0..=16)
            .map(|code| code_name(Code::from(code)))
            .inspect(|name| assert!(name.chars().all(|c| c.is_ascii_lowercase() || c == '_')))
            .collect();
        assert_eq!(names.len(), 17);
        assert_eq!(code_name(Code::FailedPrecondition), "failed_precondition");
    }

    #[test]
    fn every_error_has_its_code_and_detail() {
        check(KvError::invalid("key is empty"), Code::InvalidArgument);
        check(
            KvError::from(ConditionFailed {
                op_index: 0,
                key: b"k".to_vec(),
                current: None,
                revision: 4,
            }),
            Code::FailedPrecondition,
        );
        check(
            KvError::NotLeader {
                range_id: RangeId::FIRST,
                leader: Some((2, NodeAddr::new("127.0.0.1:7002"))),
            },
            Code::Unavailable,
        );
        check(KvError::unavailable("no leader"), Code::Unavailable);
        check(
            KvError::Timeout {
                message: "read".into(),
            },
            Code::DeadlineExceeded,
        );
        check(
            KvError::OutcomeUnknown {
                message: "lost".into(),
            },
            Code::Unknown,
        );
        check(KvError::fatal("disk"), Code::Internal);
        check(
            KvError::RequestIdExpired {
                client_id: 9,
                sequence: 4,
            },
            Code::FailedPrecondition,
        );
        check(
            KvError::NotACounter { key: b"n".to_vec() },
            Code::FailedPrecondition,
        );
        check(
            KvError::Overflow {
                key: b"n".to_vec(),
                current: i64::MAX,
                delta: 1,
            },
            Code::FailedPrecondition,
        );
        check(
            KvError::Overloaded {
                message: "sessions".into(),
            },
            Code::ResourceExhausted,
        );
    }

    #[test]
    fn access_errors_have_their_codes() {
        check(
            KvError::Unauthenticated {
                message: "no token".into(),
            },
            Code::Unauthenticated,
        );
        check(
            KvError::PermissionDenied {
                message: "admin only".into(),
            },
            Code::PermissionDenied,
        );
        check(
            KvError::QuotaExceeded {
                tenant: "acme".into(),
                quota: "keys".into(),
                limit: 10,
            },
            Code::ResourceExhausted,
        );
    }

    #[test]
    fn a_missing_lease_is_not_found() {
        check(KvError::LeaseNotFound { id: 7 }, Code::NotFound);
    }

    #[test]
    fn a_compacted_revision_is_out_of_range() {
        check(
            KvError::Compacted {
                requested: 2,
                compact_revision: 5,
            },
            Code::OutOfRange,
        );
    }

    #[test]
    fn a_revision_ahead_of_the_range_is_out_of_range() {
        check(
            KvError::FutureRevision {
                requested: 12,
                current: 9,
            },
            Code::OutOfRange,
        );
    }

    #[test]
    fn lock_and_fence_errors_are_failed_preconditions() {
        check(
            KvError::FencedOut {
                key: b"k".to_vec(),
                lock: b"l".to_vec(),
                current_token: 12,
            },
            Code::FailedPrecondition,
        );
        check(
            KvError::LockNotHeld {
                name: b"l".to_vec(),
                token: 3,
                current_token: Some(5),
            },
            Code::FailedPrecondition,
        );
        check(
            KvError::LockNotHeld {
                name: b"l".to_vec(),
                token: 3,
                current_token: None,
            },
            Code::FailedPrecondition,
        );
        check(
            KvError::RecordNotOwned {
                scope: b"s".to_vec(),
                id: b"i".to_vec(),
                token: 3,
                current_token: Some(4),
            },
            Code::FailedPrecondition,
        );
    }

    #[test]
    fn range_errors_are_failed_preconditions_with_the_range() {
        let range = keel_types::RangeDescriptor {
            id: RangeId(4),
            start: b"m".to_vec(),
            end: None,
            epoch: 3,
            conf_version: 1,
            replicas: vec![1, 2, 3],
        };
        check(
            KvError::KeyOutOfRange {
                key: b"a".to_vec(),
                range: Box::new(range.clone()),
            },
            Code::FailedPrecondition,
        );
        check(
            KvError::EpochMismatch {
                expected_epoch: 2,
                range: Box::new(range),
            },
            Code::FailedPrecondition,
        );
    }

    #[test]
    fn statuses_without_detail_carry_no_error() {
        assert_eq!(kv_error(&Status::unavailable("connection reset")), None);
        assert!(!never_sent(&Status::unavailable("connection reset")));
    }
}
