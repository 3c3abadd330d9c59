//! Errors a Keel client can act on. `keel-server` maps each to a gRPC status in one table
//! (`status.rs`) and `keel-client` maps it back.

use thiserror::Error;

use crate::command::{ConditionFailed, Rejection};
use crate::ids::{NodeAddr, NodeId, RangeId};
use crate::range::RangeDescriptor;

/// The errors of the key-value API. Retry-elsewhere errors (`NotLeader`, `Unavailable`) are
/// kept apart from "this node has stopped" (`Fatal`).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum KvError {
    /// The request is malformed or exceeds a limit; nothing was applied.
    #[error("invalid argument: {message}")]
    InvalidArgument { message: String },

    /// This replica is not the leader of the range. `leader` is a hint, when known.
    #[error("not leader of range {range_id}{}", leader_hint(.leader))]
    NotLeader {
        range_id: RangeId,
        leader: Option<(NodeId, NodeAddr)>,
    },

    /// A condition of a write did not hold; nothing was applied. Boxed, as the key's state
    /// it holds would make every `Result<_, KvError>` large.
    #[error("condition failed on op {} (key {:?})", .0.op_index, String::from_utf8_lossy(&.0.key))]
    ConditionFailed(Box<ConditionFailed>),

    /// The range cannot serve the request now (no leader, no quorum, shutting down). The
    /// request was not applied; it may be retried.
    #[error("unavailable: {message}")]
    Unavailable { message: String },

    /// A read did not finish in time. Reads change nothing, so they may be retried.
    #[error("timed out: {message}")]
    Timeout { message: String },

    /// A write was sent but its result was lost (timeout, connection loss, leader change
    /// after proposing). It may or may not have been applied.
    #[error("outcome unknown: {message}")]
    OutcomeUnknown { message: String },

    /// The node has stopped serving (storage failure). Go to another node.
    #[error("node stopped: {message}")]
    Fatal { message: String },

    /// The request id's record is gone (the session was idle past the dedup window, or the
    /// client had already marked the request completed). The request may have been applied
    /// once; it was not applied now. Do not retry it under a new id unless you know it was
    /// never applied.
    #[error(
        "request id expired: client {client_id:#x} sequence {sequence} is past its dedup record; it may have been applied once and was not applied again"
    )]
    RequestIdExpired { client_id: u64, sequence: u64 },

    /// An increment found a value that is not a signed 64-bit decimal integer; nothing was
    /// applied.
    #[error("value of key {} is not a signed 64-bit decimal integer", crate::validate::show_key(.key))]
    NotACounter { key: Vec<u8> },

    /// An increment would leave the signed 64-bit range; nothing was applied.
    #[error("incrementing key {} ({current}) by {delta} overflows a signed 64-bit integer", crate::validate::show_key(.key))]
    Overflow {
        key: Vec<u8>,
        current: i64,
        delta: i64,
    },

    /// A limit on kept state was reached (client sessions, requests in flight); nothing was
    /// applied. Retry later or with fewer requests in flight.
    #[error("overloaded: {message}")]
    Overloaded { message: String },

    /// A fenced write carried a lower token of the key's lock than the key has accepted (its
    /// lock was taken over), or named another lock than the one fencing the key; nothing
    /// was applied.
    #[error(
        "fenced out: key {} accepts lock {} token {current_token} or higher",
        crate::validate::show_key(.key),
        crate::validate::show_key(.lock)
    )]
    FencedOut {
        key: Vec<u8>,
        lock: Vec<u8>,
        current_token: u64,
    },

    /// The token does not hold the lock (it expired and was taken over, or was released);
    /// nothing was changed.
    #[error(
        "lock {} is not held with token {token}{}",
        crate::validate::show_key(.name),
        holder_token(.current_token)
    )]
    LockNotHeld {
        name: Vec<u8>,
        token: u64,
        current_token: Option<u64>,
    },

    /// The token does not own the idempotency record (it was taken over after expiring,
    /// completed under another token, aborted or dropped); nothing was changed.
    #[error(
        "idempotency record {} of scope {} is not owned by token {token}{}",
        crate::validate::show_key(.id),
        crate::validate::show_key(.scope),
        holder_token(.current_token)
    )]
    RecordNotOwned {
        scope: Vec<u8>,
        id: Vec<u8>,
        token: u64,
        current_token: Option<u64>,
    },

    /// The key does not belong to the range the request reached (it split, or the caller's
    /// range table is stale); nothing was applied. Refresh the range table and retry.
    /// `range`: the descriptor of the range that refused, as it is now.
    #[error("key {} is outside range {range}", crate::validate::show_key(.key))]
    KeyOutOfRange {
        key: Vec<u8>,
        range: Box<RangeDescriptor>,
    },

    /// A split (or another range-table change) named an epoch the range has left behind, or a
    /// split key not strictly inside its span; nothing was changed. `range`: as it is now.
    #[error("range {range} does not match: expected epoch {expected_epoch}")]
    EpochMismatch {
        expected_epoch: u64,
        range: Box<RangeDescriptor>,
    },

    /// The request carries no bearer token, or one the cluster does not know, while
    /// authentication is on; nothing was done.
    #[error("unauthenticated: {message}")]
    Unauthenticated { message: String },

    /// The caller's token does not allow this request (a tenant calling an admin RPC);
    /// nothing was done.
    #[error("permission denied: {message}")]
    PermissionDenied { message: String },

    /// The tenant is at one of its quotas (`quota`: `keys`, `bytes` or `requests_per_sec`,
    /// whose limit is `limit`); nothing was applied. Delete data or ask for a larger quota;
    /// a `requests_per_sec` refusal may be retried after a pause.
    #[error(
        "quota exceeded: tenant {tenant} is at its {quota} quota of {limit}; nothing was applied"
    )]
    QuotaExceeded {
        tenant: String,
        quota: String,
        limit: u64,
    },

    /// A read asked for a range state at or past `requested` (`min_revision`), and the range
    /// is at `current` even after catching up with its leader: no write made that revision
    /// yet. Nothing was read.
    #[error("revision {requested} is ahead of the range, which is at revision {current}")]
    FutureRevision { requested: u64, current: u64 },

    /// A history read or a watch asked for events from revision `requested`, at or below the
    /// serving replica's history floor `compact_revision`, or a read at revision `requested`
    /// (below the floor) needs events after it: some may be gone. Nothing was read.
    #[error(
        "revision {requested} is compacted: the history kept starts after revision {compact_revision}"
    )]
    Compacted {
        requested: u64,
        compact_revision: u64,
    },

    /// The lease a request named does not exist in its namespace: it was never granted, or
    /// it was revoked, or (for a keep-alive or a put attaching a key) it has expired.
    /// Nothing was changed.
    #[error("lease {id} not found (never granted, revoked or expired)")]
    LeaseNotFound { id: i64 },
}

impl From<ConditionFailed> for KvError {
    fn from(failed: ConditionFailed) -> KvError {
        KvError::ConditionFailed(Box::new(failed))
    }
}

impl From<Rejection> for KvError {
    fn from(rejection: Rejection) -> KvError {
        match rejection {
            Rejection::RequestIdExpired {
                client_id,
                sequence,
            } => KvError::RequestIdExpired {
                client_id,
                sequence,
            },
            Rejection::NotACounter { key, .. } => KvError::NotACounter { key },
            Rejection::Overflow {
                key,
                current,
                delta,
                ..
            } => KvError::Overflow {
                key,
                current,
                delta,
            },
            Rejection::TooManyInFlight { client_id, limit } => KvError::Overloaded {
                message: format!(
                    "client {client_id:#x} has {limit} requests with kept records; limit is {limit}"
                ),
            },
            Rejection::TooManySessions { limit } => KvError::Overloaded {
                message: format!("the range keeps {limit} client sessions; limit is {limit}"),
            },
            Rejection::FencedOut {
                key,
                lock,
                current_token,
                ..
            } => KvError::FencedOut {
                key,
                lock,
                current_token,
            },
            Rejection::LockNotHeld {
                name,
                token,
                current_token,
            } => KvError::LockNotHeld {
                name,
                token,
                current_token,
            },
            Rejection::RecordNotOwned {
                key,
                token,
                current_token,
            } => {
                let (scope, id) = crate::coordination::idempotency_key_parts(&key);
                KvError::RecordNotOwned {
                    scope: scope.to_vec(),
                    id: id.to_vec(),
                    token,
                    current_token,
                }
            }
            Rejection::RangeHeld { range, hold } => KvError::range_held(range, &hold),
            Rejection::KeyOutOfRange { key, range } => KvError::KeyOutOfRange {
                key,
                range: Box::new(range),
            },
            Rejection::EpochMismatch {
                expected_epoch,
                range,
            } => KvError::EpochMismatch {
                expected_epoch,
                range: Box::new(range),
            },
            Rejection::InvalidMetaCommand { message } => KvError::invalid(message),
            Rejection::MembershipChanging { range } => KvError::unavailable(format!(
                "range {range} is changing its replicas; split it once that is done"
            )),
            Rejection::RequestIdReused {
                client_id,
                sequence,
            } => KvError::invalid(request_id_reused(client_id, sequence)),
            Rejection::TxnTooLarge { key } => KvError::invalid(format!(
                "transaction covers more than {} live rows or returns more than {} (span from key {}); split it into smaller spans",
                crate::limits::TXN_ROWS_MAX,
                crate::limits::human_bytes(crate::limits::TXN_RESULT_BYTES_MAX),
                crate::validate::show_key(&key)
            )),
            Rejection::LeaseExists { id } => {
                KvError::invalid(format!("lease {id} already exists in its namespace"))
            }
            Rejection::LeaseNotFound { id } => KvError::LeaseNotFound { id },
            Rejection::LeaseFull { id, max } => KvError::invalid(format!(
                "lease {id} would hold more than {max} keys; limit is {max}"
            )),
            Rejection::KeyNotFound { key } => KvError::invalid(format!(
                "key {} not found: a put that keeps the value or lease needs the key to exist",
                crate::validate::show_key(&key)
            )),
            Rejection::WrongRangeKind { range } => KvError::invalid(format!(
                "range {range} cannot apply this command: meta commands go to the meta range, data commands to data ranges"
            )),
        }
    }
}

/// The message of a request id used for another request. The same for every cause, so it
/// tells a caller nothing about whose the id is.
pub fn request_id_reused(client_id: u64, sequence: u64) -> String {
    format!(
        "request id (client {client_id:#x}, sequence {sequence}) was used for a different request; a retry must repeat its request exactly, and a new request needs a new sequence"
    )
}

fn holder_token(current: &Option<u64>) -> String {
    match current {
        Some(token) => format!(" (current token is {token})"),
        None => " (nobody holds it)".to_string(),
    }
}

fn leader_hint(leader: &Option<(NodeId, NodeAddr)>) -> String {
    match leader {
        Some((id, addr)) => format!("; leader is node {id} at {addr}"),
        None => "; leader unknown".to_string(),
    }
}

impl KvError {
    pub fn invalid(message: impl Into<String>) -> Self {
        KvError::InvalidArgument {
            message: message.into(),
        }
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        KvError::Unavailable {
            message: message.into(),
        }
    }

    /// A range that stopped serving because its replicas disagree with no majority
    /// (`crate::check::Hold`). Unavailable: nothing was applied, and the same request
    /// succeeds once the range serves again.
    pub fn range_held(range: RangeId, hold: &crate::check::Hold) -> Self {
        KvError::unavailable(format!("range {range} is held: {hold}"))
    }

    pub fn fatal(message: impl Into<String>) -> Self {
        KvError::Fatal {
            message: message.into(),
        }
    }

    /// The variant's name in snake case, for metrics and logs (`not_leader`, `fenced_out`).
    pub fn kind(&self) -> &'static str {
        match self {
            KvError::InvalidArgument { .. } => "invalid_argument",
            KvError::NotLeader { .. } => "not_leader",
            KvError::ConditionFailed(_) => "condition_failed",
            KvError::Unavailable { .. } => "unavailable",
            KvError::Timeout { .. } => "timeout",
            KvError::OutcomeUnknown { .. } => "outcome_unknown",
            KvError::Fatal { .. } => "fatal",
            KvError::RequestIdExpired { .. } => "request_id_expired",
            KvError::NotACounter { .. } => "not_a_counter",
            KvError::Overflow { .. } => "overflow",
            KvError::Overloaded { .. } => "overloaded",
            KvError::FencedOut { .. } => "fenced_out",
            KvError::LockNotHeld { .. } => "lock_not_held",
            KvError::RecordNotOwned { .. } => "record_not_owned",
            KvError::KeyOutOfRange { .. } => "key_out_of_range",
            KvError::EpochMismatch { .. } => "epoch_mismatch",
            KvError::Unauthenticated { .. } => "unauthenticated",
            KvError::PermissionDenied { .. } => "permission_denied",
            KvError::QuotaExceeded { .. } => "quota_exceeded",
            KvError::FutureRevision { .. } => "future_revision",
            KvError::Compacted { .. } => "compacted",
            KvError::LeaseNotFound { .. } => "lease_not_found",
        }
    }
}
