//! The client error contract of DESIGN §7 as one table: what a keel-client error means for
//! the `ok` field of a history record. Knows nothing of workloads or files.

use keel_types::KvError;

use crate::history::Status;

/// The outcome of a write that returned `error`: `Fail` when the client knows it was not
/// applied, `Info` (indeterminate) otherwise.
///
/// keel-client returns `NotLeader`, `Unavailable`, `Overloaded` and the refusals at the door
/// (`Unauthenticated`, `PermissionDenied`, `QuotaExceeded`) only when no attempt of the
/// write can have been applied (otherwise it answers `OutcomeUnknown`); `ConditionFailed`,
/// `InvalidArgument`, `NotACounter`, `Overflow`, `FencedOut`, `LockNotHeld` and
/// `RecordNotOwned` are the server's final word that nothing was applied, as are
/// `KeyOutOfRange` and `EpochMismatch` (refused before anything was stored; keel-client
/// retries a write they refuse on the right range, so they reach here only from a split). `RequestIdExpired`
/// says the write may have been applied once under its old id, so it is indeterminate, as
/// are timeouts, lost answers and a stopped node.
pub fn write_status(error: &KvError) -> Status {
    match error {
        KvError::InvalidArgument { .. }
        | KvError::ConditionFailed(_)
        | KvError::NotLeader { .. }
        | KvError::Unavailable { .. }
        | KvError::Overloaded { .. }
        | KvError::NotACounter { .. }
        | KvError::Overflow { .. }
        | KvError::FencedOut { .. }
        | KvError::LockNotHeld { .. }
        | KvError::RecordNotOwned { .. }
        | KvError::KeyOutOfRange { .. }
        | KvError::EpochMismatch { .. }
        | KvError::Unauthenticated { .. }
        | KvError::PermissionDenied { .. }
        | KvError::QuotaExceeded { .. }
        | KvError::FutureRevision { .. }
        | KvError::Compacted { .. }
        | KvError::LeaseNotFound { .. } => Status::Fail,
        KvError::OutcomeUnknown { .. }
        | KvError::Timeout { .. }
        | KvError::Fatal { .. }
        | KvError::RequestIdExpired { .. } => Status::Info,
    }
}

/// The outcome of a read that returned `error`: always `Fail`, since a read changes nothing
/// (DESIGN §7: reads that error are `fail`).
pub fn read_status(_error: &KvError) -> Status {
    Status::Fail
}

/// A short name of the error, for the `error` field of records that keep it (fencing).
pub fn error_name(error: &KvError) -> &'static str {
    match error {
        KvError::InvalidArgument { .. } => "invalid-argument",
        KvError::NotLeader { .. } => "not-leader",
        KvError::ConditionFailed(_) => "condition-failed",
        KvError::Unavailable { .. } => "unavailable",
        KvError::Timeout { .. } => "timeout",
        KvError::OutcomeUnknown { .. } => "outcome-unknown",
        KvError::Fatal { .. } => "fatal",
        KvError::RequestIdExpired { .. } => "request-id-expired",
        KvError::NotACounter { .. } => "not-a-counter",
        KvError::Overflow { .. } => "overflow",
        KvError::Overloaded { .. } => "overloaded",
        KvError::FencedOut { .. } => "fenced-out",
        KvError::LockNotHeld { .. } => "lock-not-held",
        KvError::RecordNotOwned { .. } => "record-not-owned",
        KvError::KeyOutOfRange { .. } => "key-out-of-range",
        KvError::EpochMismatch { .. } => "epoch-mismatch",
        KvError::Unauthenticated { .. } => "unauthenticated",
        KvError::PermissionDenied { .. } => "permission-denied",
        KvError::QuotaExceeded { .. } => "quota-exceeded",
        KvError::FutureRevision { .. } => "future-revision",
        KvError::Compacted { .. } => "compacted",
        KvError::LeaseNotFound { .. } => "lease-not-found",
    }
}

/// The `ok` field of a record with this status.
pub fn ok_field(status: Status) -> Option<bool> {
    match status {
        Status::Ok => Some(true),
        Status::Fail => Some(false),
        Status::Info => None,
    }
}
