//! etcd's leases as Keel commands. A lease lives in a *lease namespace*: the start of a
//! pinned span (`crate::pinned`), so a lease and every key attached to it stay in one range.
//! It has an id (etcd's, > 0), a granted TTL, and an expiry on the range clock; keep-alives
//! push the expiry out, and revoking it (by a client, or by the leader's upkeep once it has
//! expired) deletes every key attached to it at one revision. Validation is in
//! `validate::check_lease`; applying is keel-storage's.
//!
//! Encodings of these types are persisted inside Raft log entries and request records
//! (storage format 12): variants and fields are only ever appended.

use serde::{Deserialize, Serialize};

use crate::command::RequestId;
use crate::ids::Revision;

/// One operation on a lease of a namespace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum LeaseOp {
    /// Creates lease `id` (0: the applier picks the smallest free id at or above the range's
    /// next revision) expiring `ttl_ms` after the command's clock. Takes no revision.
    Grant {
        #[serde(with = "serde_bytes")]
        namespace: Vec<u8>,
        id: i64,
        ttl_ms: u64,
    },
    /// Pushes an unexpired lease's expiry to the clock plus its granted TTL. Takes no
    /// revision.
    KeepAlive {
        #[serde(with = "serde_bytes")]
        namespace: Vec<u8>,
        id: i64,
    },
    /// Deletes a lease (expired or not) and every key attached to it, the keys at one new
    /// revision (none when it has no keys).
    Revoke {
        #[serde(with = "serde_bytes")]
        namespace: Vec<u8>,
        id: i64,
    },
}

impl LeaseOp {
    /// The lease namespace the op names.
    pub fn namespace(&self) -> &[u8] {
        match self {
            LeaseOp::Grant { namespace, .. }
            | LeaseOp::KeepAlive { namespace, .. }
            | LeaseOp::Revoke { namespace, .. } => namespace,
        }
    }

    /// The lease id the op names (0 for a grant that lets the applier choose).
    pub fn id(&self) -> i64 {
        match self {
            LeaseOp::Grant { id, .. }
            | LeaseOp::KeepAlive { id, .. }
            | LeaseOp::Revoke { id, .. } => *id,
        }
    }

    /// The op's name, for messages and logs.
    pub fn name(&self) -> &'static str {
        match self {
            LeaseOp::Grant { .. } => "grant",
            LeaseOp::KeepAlive { .. } => "keep-alive",
            LeaseOp::Revoke { .. } => "revoke",
        }
    }
}

/// A client's lease operation as the leader proposes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseMutation {
    /// `None`: applied without deduplication.
    pub request: Option<RequestId>,
    /// The leader's clock when it proposed the command (see `Mutation::now_ms`).
    pub now_ms: u64,
    pub op: LeaseOp,
}

/// What a lease operation did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum LeaseResult {
    Granted {
        id: i64,
        ttl_ms: u64,
    },
    KeptAlive {
        ttl_ms: u64,
    },
    /// `revision`: the one its key deletions took (0: it had no keys).
    Revoked {
        revision: Revision,
        deleted: u64,
    },
}

/// A lease the leader found expired, as it saw it when proposing its revocation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExpiredLease {
    #[serde(with = "serde_bytes")]
    pub namespace: Vec<u8>,
    pub id: i64,
    pub expires_at_ms: u64,
}

/// Leader-proposed revocation of expired leases. Applying it checks every lease again: it is
/// revoked only if it still has that expiry and it has passed at the range clock (a
/// keep-alive in between saves it). Every key it deletes is deleted at one new revision
/// (none if it deletes no key).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExpireLeases {
    /// The leader's clock when it proposed the command (see `Mutation::now_ms`).
    pub now_ms: u64,
    /// At most `limits::CLEANUP_LEASES_MAX`.
    pub leases: Vec<ExpiredLease>,
}

/// A lease as a read reports it (etcd's `LeaseTimeToLive`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseInfo {
    pub id: i64,
    /// The TTL it was granted.
    pub ttl_ms: u64,
    /// When it expires on the range clock (passed, for an expired lease not yet revoked).
    pub expires_at_ms: u64,
    /// The full user keys attached to it, in key order (empty unless asked for).
    pub keys: Vec<Vec<u8>>,
}
