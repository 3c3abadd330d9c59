//! Commands that go through the Raft log, and what applying them produced.
//!
//! A `Command` is what a leader proposes; every replica applies it in log order and gets the
//! same `CommandOutcome`. Encodings of these types are persisted inside Raft log entries, so
//! a change here needs a new format version in `keel-storage`.

use serde::{Deserialize, Serialize};

use crate::check::{Check, Hold};
use crate::coordination::{Coordination, CoordinationOp, CoordinationResult, Fence, Reclaim};
use crate::ids::{RangeId, Revision};
use crate::lease::{ExpireLeases, LeaseMutation, LeaseResult};
use crate::range::{MetaCommand, MetaOutcome, RangeDescriptor, Split};
use crate::txn::{TxnMutation, TxnResult};

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
    /// How many writes the key has had since it was created (etcd's `version`): 1 for the
    /// write that created it (over an absent or expired key), one more for every later put
    /// or increment. A deleted key is absent, which etcd reports as version 0. A key last
    /// written before storage format 11 reads version 1 and counts on from there.
    pub version: u64,
    /// When the key expires (Unix milliseconds, on the clock of the leader that wrote it);
    /// `None` = no TTL. A key is invisible to every read from this instant on.
    pub expires_at_ms: Option<u64>,
    /// The etcd lease the key is attached to (`crate::lease`), 0 for none. Revoking the
    /// lease, or its expiry, deletes the key. A key last written before storage format 12
    /// reads 0.
    pub lease: i64,
}

impl KeyValue {
    /// Whether the key is expired at `now_ms`.
    pub fn is_expired(&self, now_ms: u64) -> bool {
        self.expires_at_ms.is_some_and(|expires| expires <= now_ms)
    }
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
        /// Time to live, from the instant the leader stamped into the command
        /// (`Mutation::now_ms`); `None` = no TTL (a put without a TTL clears the key's TTL).
        ttl_ms: Option<u64>,
    },
    Delete {
        #[serde(with = "serde_bytes")]
        key: Vec<u8>,
        condition: Option<Condition>,
        return_previous: bool,
    },
    /// Adds `delta` to the key's value read as a signed 64-bit decimal integer (an absent or
    /// expired key counts as 0) and stores the sum as decimal text. Keeps the key's TTL.
    /// A value that is not such an integer, or a sum that overflows, rejects the whole
    /// command (`Rejection::NotACounter`, `Rejection::Overflow`).
    Increment {
        #[serde(with = "serde_bytes")]
        key: Vec<u8>,
        delta: i64,
    },
}

impl BatchOp {
    pub fn key(&self) -> &[u8] {
        match self {
            BatchOp::Put { key, .. }
            | BatchOp::Delete { key, .. }
            | BatchOp::Increment { key, .. } => key,
        }
    }

    pub fn condition(&self) -> Option<&Condition> {
        match self {
            BatchOp::Put { condition, .. } | BatchOp::Delete { condition, .. } => {
                condition.as_ref()
            }
            BatchOp::Increment { .. } => None,
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
            BatchOp::Increment { .. } => false,
        }
    }
}

/// Identifies one mutating request of one client, so that a retry of an applied request is
/// answered from the record of its first application instead of being applied again.
///
/// A client first opens a session (`client_id`, `client_started_ms`, both issued by a
/// server), then numbers its requests from 1. A retry reuses the id of its first attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RequestId {
    pub client_id: u64,
    /// When a server opened the client's session (Unix milliseconds, that server's clock).
    pub client_started_ms: u64,
    /// The request's number within the session, from 1.
    pub sequence: u64,
    /// Every request of this session numbered below this has been answered to the client or
    /// abandoned by it: its record may be dropped, and a late copy of it is refused with
    /// `RequestIdExpired`.
    pub completed_below: u64,
}

/// A client's mutation as the leader proposes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mutation {
    /// `None`: the request is applied without deduplication (a client that sends no id).
    pub request: Option<RequestId>,
    /// The leader's clock when it proposed the command (Unix milliseconds). Replicas apply
    /// with `max(now_ms, the newest now_ms applied before)`, so time never goes back and a
    /// TTL counts from the same instant on every replica.
    pub now_ms: u64,
    /// Applied atomically at one new revision, in order: each op sees the ops before it. If
    /// any condition fails or any op is rejected, nothing is applied.
    pub ops: Vec<BatchOp>,
}

/// A key the leader found expired, as it saw it when proposing its removal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExpiredKey {
    #[serde(with = "serde_bytes")]
    pub key: Vec<u8>,
    pub expires_at_ms: u64,
}

/// Leader-proposed removal of expired keys and idle client sessions. Applying it checks
/// every item again: a key is removed only if it still has that expiry and it has passed;
/// a session only if it has been idle since before `sessions_idle_before_ms`. The keys it
/// removes are removed at one new revision (none if it removes no key).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cleanup {
    /// The leader's clock when it proposed the cleanup (see `Mutation::now_ms`).
    pub now_ms: u64,
    /// At most `limits::CLEANUP_KEYS_MAX`.
    pub keys: Vec<ExpiredKey>,
    /// Client ids of sessions to drop; at most `limits::CLEANUP_SESSIONS_MAX`.
    pub sessions: Vec<u64>,
    pub sessions_idle_before_ms: u64,
}

impl Cleanup {
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty() && self.sessions.is_empty()
    }
}

/// What a leader proposes to a range's Raft log.
///
/// Variants are only ever appended: log entries written by older releases must decode.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// A write of format 1 (before request ids and TTLs); still applied from old logs, never
    /// proposed. Applied like a `Mutation` without a request id, at the replica's last clock.
    Write { ops: Vec<legacy::BatchOpV1> },
    /// A client's mutation.
    Mutate(Mutation),
    /// Removal of expired keys and idle sessions.
    Cleanup(Cleanup),
    /// A client's mutation guarded by a lock: applied only if no key it writes has accepted
    /// a higher token of `fence.lock` (or is fenced by another lock); then every key it
    /// writes records `fence`.
    FencedMutate { fence: Fence, mutation: Mutation },
    /// A lock or idempotency operation.
    Coordinate(Coordination),
    /// Removal of free lock records and expired idempotency records, taking no revision and
    /// recording no event (formats 3-8). Still applied from old logs, never proposed.
    ReclaimUnrecorded(Reclaim),
    /// Split the range at a key (see `Split`).
    Split(Split),
    /// A command of the meta range.
    Meta(MetaCommand),
    /// (format 9) Removal of free lock records and expired idempotency records: the locks it
    /// removes take one revision and the records the next, each removal an event.
    Reclaim(Reclaim),
    /// (format 10) A consistency check: changes nothing; every replica hashes the range's
    /// state as of this entry (`crate::check`).
    Check(Check),
    /// (format 10) Stops (`Some`) or resumes (`None`) serving the range: while it is held,
    /// client commands and splits are refused with `Rejection::RangeHeld` and no replica
    /// serves reads of it. Proposed by the leader after a consistency check.
    Hold(Option<Hold>),
    /// A transaction of format 11, whose puts carry no lease fields; still applied from old
    /// logs (as the `Txn` it converts to), never proposed.
    TxnV11(legacy::TxnMutationV11),
    /// (format 12) A client's operation on an etcd lease (`crate::lease`).
    Lease(LeaseMutation),
    /// (format 12) Revocation of expired leases, proposed by the leader's upkeep.
    ExpireLeases(ExpireLeases),
    /// (format 12) A client's transaction (`crate::txn`): compares, then one branch of
    /// reads, puts, span deletes and nested transactions, at one revision.
    Txn(TxnMutation),
}

impl std::fmt::Display for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Command::Write { ops } => write!(f, "write-v1({} ops)", ops.len()),
            Command::Mutate(mutation) => write!(f, "mutate({} ops)", mutation.ops.len()),
            Command::Cleanup(cleanup) => write!(
                f,
                "cleanup({} keys, {} sessions)",
                cleanup.keys.len(),
                cleanup.sessions.len()
            ),
            Command::FencedMutate { mutation, .. } => {
                write!(f, "fenced-mutate({} ops)", mutation.ops.len())
            }
            Command::Coordinate(coordination) => {
                let op = match coordination.op {
                    CoordinationOp::Acquire { .. } => "acquire",
                    CoordinationOp::Renew { .. } => "renew",
                    CoordinationOp::Release { .. } => "release",
                    CoordinationOp::Begin { .. } => "begin",
                    CoordinationOp::Complete { .. } => "complete",
                    CoordinationOp::Abort { .. } => "abort",
                };
                write!(f, "coordinate({op})")
            }
            Command::Reclaim(reclaim) => write!(
                f,
                "reclaim({} locks, {} records)",
                reclaim.locks.len(),
                reclaim.records.len()
            ),
            Command::ReclaimUnrecorded(reclaim) => write!(
                f,
                "reclaim-v8({} locks, {} records)",
                reclaim.locks.len(),
                reclaim.records.len()
            ),
            Command::Check(check) => write!(f, "check(locate {} buckets)", check.locate.len()),
            Command::Hold(Some(hold)) => write!(f, "hold(check at {})", hold.index),
            Command::Hold(None) => write!(f, "release"),
            Command::Txn(mutation) => {
                let (ops, _) = mutation.txn.size();
                write!(
                    f,
                    "txn({} compares, {ops} ops)",
                    mutation.txn.compares.len()
                )
            }
            Command::TxnV11(mutation) => {
                write!(f, "txn-v11({} compares)", mutation.txn.compares.len())
            }
            Command::Lease(lease) => write!(f, "lease({})", lease.op.name()),
            Command::ExpireLeases(expire) => {
                write!(f, "expire-leases({} leases)", expire.leases.len())
            }
            Command::Split(split) => write!(
                f,
                "split(at {}, child {})",
                crate::validate::show_key(&split.at),
                split.child
            ),
            Command::Meta(meta) => match meta {
                MetaCommand::UpdateRanges { ranges } => {
                    write!(f, "meta-update-ranges({})", ranges.len())
                }
                MetaCommand::AllocateRangeIds { count } => {
                    write!(f, "meta-allocate-range-ids({count})")
                }
                MetaCommand::RegisterNode(node) => write!(f, "meta-register-node({})", node.id),
                MetaCommand::SetNodeState { node, state } => {
                    write!(f, "meta-set-node-state({node}, {})", state.name())
                }
            },
        }
    }
}

pub mod legacy;

/// The result of one op of an applied write.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpResult {
    /// The key's state before the op, when the op asked for it.
    pub previous: Option<KeyValue>,
    /// Whether the key existed before the op (for a delete: whether it deleted something).
    pub existed: bool,
    /// For an increment: the key's value after it.
    pub counter: Option<i64>,
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

/// Why a mutation was refused when it was applied. Nothing was applied and no revision was
/// used.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Rejection {
    /// The request's record is gone: it is older than the session's `completed_below`, or
    /// its session was dropped after being idle for the dedup window. It may have been
    /// applied once; it is never applied again.
    RequestIdExpired { client_id: u64, sequence: u64 },
    /// An increment found a value that is not a signed 64-bit decimal integer.
    NotACounter {
        op_index: u32,
        #[serde(with = "serde_bytes")]
        key: Vec<u8>,
    },
    /// An increment would leave the signed 64-bit range.
    Overflow {
        op_index: u32,
        #[serde(with = "serde_bytes")]
        key: Vec<u8>,
        current: i64,
        delta: i64,
    },
    /// The client has `limit` requests with records kept already (too many in flight, or it
    /// does not advance `completed_below`).
    TooManyInFlight { client_id: u64, limit: u64 },
    /// The range keeps `limit` client sessions already.
    TooManySessions { limit: u64 },
    /// A fenced write named a lower token of the key's lock than the key has accepted, or
    /// another lock than the one fencing the key. `lock` and `current_token` are the key's.
    FencedOut {
        op_index: u32,
        #[serde(with = "serde_bytes")]
        key: Vec<u8>,
        #[serde(with = "serde_bytes")]
        lock: Vec<u8>,
        current_token: u64,
    },
    /// A renew or release named a token that does not hold the lock (a renew also needs the
    /// lock still in its held phase). `current_token`: the lock's holder, if any.
    LockNotHeld {
        #[serde(with = "serde_bytes")]
        name: Vec<u8>,
        token: u64,
        current_token: Option<u64>,
    },
    /// A complete or abort named a token that does not own the idempotency record (it was
    /// taken over, completed under another token, aborted or dropped). `current_token`: the
    /// record's, if there is one.
    RecordNotOwned {
        #[serde(with = "serde_bytes")]
        key: Vec<u8>,
        token: u64,
        current_token: Option<u64>,
    },
    /// A key (or lock name, or idempotency key) of the command lies outside the range's
    /// span: the range split (or the request was routed on a stale table) before the command
    /// was applied. `range` is the range's descriptor when it refused.
    KeyOutOfRange {
        #[serde(with = "serde_bytes")]
        key: Vec<u8>,
        range: RangeDescriptor,
    },
    /// A split named an epoch the range has left behind, or a split key not strictly inside
    /// its span; `range` is the range's descriptor when it refused.
    EpochMismatch {
        expected_epoch: u64,
        range: RangeDescriptor,
    },
    /// A meta command reached a range that is not the meta range, or a data command reached
    /// the meta range.
    WrongRangeKind { range: RangeId },
    /// A meta command outside its limits (too many descriptors, an id count out of bounds).
    InvalidMetaCommand { message: String },
    /// A split reached a range whose membership is changing (it has learners, or a joint
    /// configuration): the child would inherit a half-done change. `range` is the range's
    /// descriptor when it refused.
    MembershipChanging { range: RangeDescriptor },
    /// Format 6: the request id is taken by another request: its session belongs to another
    /// tenant or another client start, or its record is of a different request (a retry
    /// must repeat its request exactly). Nothing was applied and the session is unchanged.
    RequestIdReused { client_id: u64, sequence: u64 },
    /// Format 10: the range is held (`Command::Hold`): its replicas disagree with no
    /// majority. Nothing was applied and no trace was left (no record, no session change).
    RangeHeld { range: RangeId, hold: Hold },
    /// Format 11: a transaction's compares, reads and deletes cover more than
    /// `limits::TXN_ROWS_MAX` live rows, or its reads and deletes would return more than
    /// `limits::TXN_RESULT_BYTES_MAX`; `key` starts the span where the limit was passed.
    TxnTooLarge {
        #[serde(with = "serde_bytes")]
        key: Vec<u8>,
    },
    /// Format 12: a grant named a lease id that a lease of its namespace holds (expired or
    /// not, until it is revoked).
    LeaseExists { id: i64 },
    /// Format 12: the lease does not exist, or (for a keep-alive or a put attaching a key)
    /// has expired at the range clock.
    LeaseNotFound { id: i64 },
    /// Format 12: attaching the transaction's keys would give the lease more than `max`
    /// keys (`limits::LEASE_KEYS_MAX`).
    LeaseFull { id: i64, max: u64 },
    /// Format 12: a transaction's put asked to keep the value or lease of a key that is
    /// absent (etcd's "key not found").
    KeyNotFound {
        #[serde(with = "serde_bytes")]
        key: Vec<u8>,
    },
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
    /// The entry was not a client command (a blank or membership entry, or a cleanup).
    Internal,
    /// The mutation was refused; nothing was applied.
    Rejected(Rejection),
    /// The request had been applied before: this is the outcome of its first application
    /// (never itself `Replayed`), and nothing was applied now.
    Replayed(Box<CommandOutcome>),
    /// A lock or idempotency operation was applied. `revision`: the range's revision after
    /// it (a new one if it changed anything; a granted lock's token is that revision).
    Coordinated {
        revision: Revision,
        result: CoordinationResult,
    },
    /// A split was applied: the parent now spans `left`, the new child `right`.
    Split {
        left: RangeDescriptor,
        right: RangeDescriptor,
    },
    /// A meta command was applied.
    Meta(MetaOutcome),
    /// (format 10) A consistency check was applied at this log index: every replica hashes
    /// the range's state as of it.
    Checked { index: u64 },
    /// (format 11) A transaction ran: `revision` is the range's revision after it (a new one
    /// if its branch wrote anything).
    Transacted {
        revision: Revision,
        result: TxnResult,
    },
    /// (format 12) A lease operation was applied.
    Leased(LeaseResult),
}

impl CommandOutcome {
    /// The variant's name, for messages that must not show what the outcome holds.
    pub fn kind(&self) -> &'static str {
        match self {
            CommandOutcome::Applied { .. } => "Applied",
            CommandOutcome::ConditionFailed(_) => "ConditionFailed",
            CommandOutcome::Internal => "Internal",
            CommandOutcome::Rejected(_) => "Rejected",
            CommandOutcome::Replayed(_) => "Replayed",
            CommandOutcome::Coordinated { .. } => "Coordinated",
            CommandOutcome::Split { .. } => "Split",
            CommandOutcome::Meta(_) => "Meta",
            CommandOutcome::Checked { .. } => "Checked",
            CommandOutcome::Transacted { .. } => "Transacted",
            CommandOutcome::Leased(_) => "Leased",
        }
    }
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

/// What a read asks of the state it reads besides its consistency: a replica known current
/// with its leader at most `max_staleness_ms` ago, and one that has applied its range up to
/// `min_revision` (read-your-writes on any replica). `None` = no bound. Linearizable and
/// lease reads are current, so they meet any staleness bound; `min_revision` holds for every
/// consistency.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReadBound {
    pub max_staleness_ms: Option<u64>,
    pub min_revision: Option<Revision>,
}

impl ReadBound {
    /// No bound: what a read without `max_staleness_ms` and `min_revision` asks.
    pub fn is_none(&self) -> bool {
        self.max_staleness_ms.is_none() && self.min_revision.is_none()
    }
}

/// Reads a stored value as a counter: a signed 64-bit decimal integer (ASCII, an optional
/// leading `-`, no spaces). `None` if it is not one.
pub fn parse_counter(value: &[u8]) -> Option<i64> {
    std::str::from_utf8(value)
        .ok()?
        .parse::<i64>()
        .ok()
        .filter(|_| {
            // `parse` accepts a leading `+`; a stored counter never has one.
            value.first() != Some(&b'+')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_parse_only_plain_decimal() {
        let cases: Vec<(&[u8], Option<i64>)> = vec![
            (b"0", Some(0)),
            (b"-17", Some(-17)),
            (b"9223372036854775807", Some(i64::MAX)),
            (b"-9223372036854775808", Some(i64::MIN)),
            (b"9223372036854775808", None),
            (b"+1", None),
            (b" 1", None),
            (b"", None),
            (b"1.0", None),
            (b"\xff", None),
        ];
        for (value, expected) in cases {
            assert_eq!(parse_counter(value), expected, "{value:?}");
        }
    }

    fn kv(value: &[u8], mod_revision: Revision) -> KeyValue {
        KeyValue {
            key: b"k".to_vec(),
            value: value.to_vec(),
            create_revision: 1,
            mod_revision,
            version: 1,
            expires_at_ms: None,
            lease: 0,
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
