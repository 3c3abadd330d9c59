//! Locks with fencing tokens, fenced writes and idempotency records: the commands a leader
//! proposes for them, what applying them produced, and the rules every replica and the
//! server read them by. No I/O.
//!
//! A *token* is the revision of the command that granted a lock or started an idempotency
//! record. A range's revision never goes back (a child range inherits its parent's), so a
//! token is strictly greater than every token issued before it for the same name.
//!
//! A lock is *held* until `expires_at_ms`, then *delayed* until `expires_at_ms +
//! lock_delay_ms` (nobody may take it: the last holder may still believe it holds it), then
//! *free*. Releasing it frees it at once. Time is the range clock (see `Mutation::now_ms`).

use serde::{Deserialize, Serialize};

use crate::command::RequestId;

/// A write guarded by a lock: the store keeps, per key, the highest token of `lock` it has
/// accepted and refuses writes with a lower one (`Rejection::FencedOut`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fence {
    #[serde(with = "serde_bytes")]
    pub lock: Vec<u8>,
    pub token: u64,
}

/// Who holds a lock, with which token, until when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockHold {
    #[serde(with = "serde_bytes")]
    pub owner: Vec<u8>,
    pub token: u64,
    /// Unix milliseconds on the range clock.
    pub expires_at_ms: u64,
    /// After an expiry (not a release) nobody may take the lock for this long.
    pub lock_delay_ms: u64,
}

/// Where a lock stands at one instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockPhase {
    /// The holder's TTL has not run out.
    Held,
    /// The holder's TTL ran out; the lock-delay has not.
    Delayed,
    /// Anybody may take it.
    Free,
}

impl LockHold {
    /// The phase of the lock at `now_ms`.
    pub fn phase(&self, now_ms: u64) -> LockPhase {
        if now_ms < self.expires_at_ms {
            LockPhase::Held
        } else if now_ms < self.available_at_ms() {
            LockPhase::Delayed
        } else {
            LockPhase::Free
        }
    }

    /// When the lock becomes free unless it is renewed or released first.
    pub fn available_at_ms(&self) -> u64 {
        self.expires_at_ms.saturating_add(self.lock_delay_ms)
    }
}

/// Someone to grant a lock to: an acquirer, or the first waiter a release hands over to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Acquirer {
    #[serde(with = "serde_bytes")]
    pub owner: Vec<u8>,
    pub ttl_ms: u64,
    pub lock_delay_ms: u64,
}

/// An idempotency record as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum IdempotencyRecord {
    /// `owner` is doing the work under `token` until `expires_at_ms`; after that, a `Begin`
    /// takes the record over with a new token.
    InProgress {
        #[serde(with = "serde_bytes")]
        owner: Vec<u8>,
        token: u64,
        expires_at_ms: u64,
    },
    /// The work is done; `result` is returned to every `Begin` until `expires_at_ms`, when
    /// the record disappears.
    Completed {
        #[serde(with = "serde_bytes")]
        result: Vec<u8>,
        token: u64,
        expires_at_ms: u64,
    },
}

impl IdempotencyRecord {
    pub fn expires_at_ms(&self) -> u64 {
        match self {
            IdempotencyRecord::InProgress { expires_at_ms, .. }
            | IdempotencyRecord::Completed { expires_at_ms, .. } => *expires_at_ms,
        }
    }

    pub fn token(&self) -> u64 {
        match self {
            IdempotencyRecord::InProgress { token, .. }
            | IdempotencyRecord::Completed { token, .. } => *token,
        }
    }

    pub fn is_expired(&self, now_ms: u64) -> bool {
        self.expires_at_ms() <= now_ms
    }
}

/// The stored key of an idempotency record, which is also the key that routes it to a
/// range: `scope`, a zero byte, `id`. Scopes contain no zero byte (`validate`), so the
/// encoding is unambiguous.
pub fn idempotency_key(scope: &[u8], id: &[u8]) -> Vec<u8> {
    let mut key = Vec::with_capacity(scope.len() + 1 + id.len());
    key.extend_from_slice(scope);
    key.push(0);
    key.extend_from_slice(id);
    key
}

/// `(scope, id)` of a stored idempotency key.
pub fn idempotency_key_parts(key: &[u8]) -> (&[u8], &[u8]) {
    let zero = key
        .iter()
        .position(|&byte| byte == 0)
        .expect("an idempotency key holds a zero byte after its scope");
    (&key[..zero], &key[zero + 1..])
}

/// One lock or idempotency operation, as the leader proposes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum CoordinationOp {
    /// Grants the lock to `acquirer` if it is free (token = this command's revision). If
    /// `acquirer.owner` holds it already (held phase), keeps its token and sets a new
    /// expiry. Otherwise answers `Busy` and changes nothing.
    Acquire {
        #[serde(with = "serde_bytes")]
        name: Vec<u8>,
        acquirer: Acquirer,
    },
    /// Extends a held lock whose token is `token` to `clock + ttl_ms`.
    Renew {
        #[serde(with = "serde_bytes")]
        name: Vec<u8>,
        token: u64,
        ttl_ms: u64,
    },
    /// Frees the lock whose token is `token` (held or delayed; no lock-delay follows) and,
    /// if `successor` is set, grants it to the successor in the same step.
    Release {
        #[serde(with = "serde_bytes")]
        name: Vec<u8>,
        token: u64,
        successor: Option<Acquirer>,
    },
    /// Starts the idempotency record `key` (see `idempotency_key`) for `owner`, takes over
    /// an expired one, or reports the live one.
    Begin {
        #[serde(with = "serde_bytes")]
        key: Vec<u8>,
        #[serde(with = "serde_bytes")]
        owner: Vec<u8>,
        ttl_ms: u64,
    },
    /// Stores `result` in the record started with `token`; kept `result_ttl_ms`.
    Complete {
        #[serde(with = "serde_bytes")]
        key: Vec<u8>,
        token: u64,
        #[serde(with = "serde_bytes")]
        result: Vec<u8>,
        result_ttl_ms: u64,
    },
    /// Drops the record started with `token`, so the next `Begin` starts afresh.
    Abort {
        #[serde(with = "serde_bytes")]
        key: Vec<u8>,
        token: u64,
    },
}

impl CoordinationOp {
    /// The lock name or idempotency key the operation is on.
    pub fn subject_key(&self) -> &[u8] {
        match self {
            CoordinationOp::Acquire { name, .. }
            | CoordinationOp::Renew { name, .. }
            | CoordinationOp::Release { name, .. } => name,
            CoordinationOp::Begin { key, .. }
            | CoordinationOp::Complete { key, .. }
            | CoordinationOp::Abort { key, .. } => key,
        }
    }
}

/// A lock or idempotency operation as the leader proposes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Coordination {
    /// Deduplicated like `Mutation::request`.
    pub request: Option<RequestId>,
    /// The leader's clock (see `Mutation::now_ms`).
    pub now_ms: u64,
    pub op: CoordinationOp,
}

/// What an applied lock or idempotency operation produced. Refusals for a wrong token are
/// `Rejection`s, not results.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum CoordinationResult {
    /// The acquirer holds the lock (newly, or again with its old token).
    Acquired(LockHold),
    /// Someone else holds the lock, or it is in its lock-delay; nothing changed.
    Busy(LockHold),
    Renewed(LockHold),
    /// The lock was freed, and handed to the successor if the release named one.
    Released {
        successor: Option<LockHold>,
    },
    /// The caller owns the record now, under `token`, until `expires_at_ms`.
    Started {
        token: u64,
        expires_at_ms: u64,
    },
    /// Another owner is doing the work; nothing changed.
    InProgress {
        #[serde(with = "serde_bytes")]
        owner: Vec<u8>,
        expires_at_ms: u64,
    },
    /// The work was done; here is its result (also the answer to a repeated `Complete`
    /// with the same token).
    Completed {
        #[serde(with = "serde_bytes")]
        result: Vec<u8>,
        expires_at_ms: u64,
    },
    Aborted,
}

/// A lock or idempotency record the leader found past its time, as it saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExpiredRecord {
    /// A lock name, or an idempotency key.
    #[serde(with = "serde_bytes")]
    pub key: Vec<u8>,
    /// For a lock, when it became free (`LockHold::available_at_ms`); for an idempotency
    /// record, its expiry.
    pub at_ms: u64,
}

/// Leader-proposed removal of lock records that became free and idempotency records that
/// expired. Applying it checks each again (still stored with that time, and the time has
/// passed at the range clock). As `Command::Reclaim` the locks it removes take one revision
/// and the records the next, each removal an event (`EventKind`); as the format-8
/// `Command::ReclaimUnrecorded` it takes none.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reclaim {
    pub now_ms: u64,
    /// At most `limits::CLEANUP_KEYS_MAX`.
    pub locks: Vec<ExpiredRecord>,
    /// At most `limits::CLEANUP_KEYS_MAX`.
    pub records: Vec<ExpiredRecord>,
}

impl Reclaim {
    pub fn is_empty(&self) -> bool {
        self.locks.is_empty() && self.records.is_empty()
    }
}

/// What a range keeps for locks, fences and idempotency (for status and metrics).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CoordinationCounts {
    pub locks: u64,
    pub fenced_keys: u64,
    pub idempotency_records: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_phases_follow_expiry_then_delay() {
        let hold = LockHold {
            owner: b"a".to_vec(),
            token: 7,
            expires_at_ms: 100,
            lock_delay_ms: 10,
        };
        for (now, phase) in [
            (0, LockPhase::Held),
            (99, LockPhase::Held),
            (100, LockPhase::Delayed),
            (109, LockPhase::Delayed),
            (110, LockPhase::Free),
        ] {
            assert_eq!(hold.phase(now), phase, "at {now}");
        }
        let undelayed = LockHold {
            lock_delay_ms: 0,
            ..hold
        };
        assert_eq!(undelayed.phase(100), LockPhase::Free);
    }

    #[test]
    fn idempotency_keys_split_back() {
        for (scope, id) in [
            (&b"payments"[..], &b"order-1"[..]),
            (b"s", b"\0\0"),
            (b"s", b""),
        ] {
            let key = idempotency_key(scope, id);
            assert_eq!(idempotency_key_parts(&key), (scope, id));
        }
    }
}
