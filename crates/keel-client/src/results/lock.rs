//! What the lock calls return, and their conversion from wire responses.

use std::time::Duration;

use keel_proto::v1;
use keel_types::{KvError, NodeId, Revision};

use super::header;

/// Who holds a lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockHolder {
    pub owner: Vec<u8>,
    /// The fencing token: strictly greater than every token issued before for this lock.
    pub token: u64,
    /// Time the holder's TTL has left, by the serving node's clock when it answered (zero if
    /// it has run out).
    pub ttl_remaining: Duration,
    /// When the TTL runs out, in Unix milliseconds on the range clock.
    pub expires_at_ms: u64,
    /// After an expiry (not a release) nobody may take the lock for this long.
    pub lock_delay: Duration,
}

/// The answer to an acquire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcquireResult {
    /// Whether the caller holds the lock now.
    pub acquired: bool,
    /// When acquired, the caller (always set); otherwise the current holder, unset when the
    /// lock is in its lock-delay with nobody holding it.
    pub holder: Option<LockHolder>,
    /// When not acquired: time until the lock becomes free unless renewed or released.
    pub available_in: Duration,
    /// The revision of the write that granted or refreshed the lock (when acquired).
    pub revision: Revision,
    /// The acquire had been applied by an earlier attempt; this is that attempt's answer.
    pub replayed: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenewResult {
    /// The caller, with its new TTL.
    pub holder: LockHolder,
    pub revision: Revision,
    pub replayed: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReleaseResult {
    /// The waiter the lock was handed to, if any.
    pub successor: Option<LockHolder>,
    pub revision: Revision,
    pub replayed: bool,
}

/// A read of a lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InspectResult {
    /// Unset when nobody holds the lock.
    pub holder: Option<LockHolder>,
    /// Time until the lock becomes free unless renewed or released (zero: free now).
    pub available_in: Duration,
    /// The range's applied revision the read reflects.
    pub revision: Revision,
    pub served_by: NodeId,
}

impl From<v1::LockHolder> for LockHolder {
    fn from(holder: v1::LockHolder) -> Self {
        LockHolder {
            owner: holder.owner,
            token: holder.token,
            ttl_remaining: Duration::from_millis(holder.ttl_remaining_ms),
            expires_at_ms: holder.expires_at_ms,
            lock_delay: Duration::from_millis(holder.lock_delay_ms),
        }
    }
}

pub(crate) fn acquire(response: v1::AcquireResponse) -> Result<AcquireResult, KvError> {
    let header = header(response.header, true)?;
    if response.acquired && response.holder.is_none() {
        return Err(KvError::OutcomeUnknown {
            message: "the server granted the lock but named no holder".to_string(),
        });
    }
    Ok(AcquireResult {
        acquired: response.acquired,
        holder: response.holder.map(Into::into),
        available_in: Duration::from_millis(response.available_in_ms),
        revision: header.revision,
        replayed: header.replayed,
    })
}

pub(crate) fn renew(response: v1::RenewResponse) -> Result<RenewResult, KvError> {
    let header = header(response.header, true)?;
    let Some(holder) = response.holder else {
        return Err(KvError::OutcomeUnknown {
            message: "the server renewed the lock but named no holder".to_string(),
        });
    };
    Ok(RenewResult {
        holder: holder.into(),
        revision: header.revision,
        replayed: header.replayed,
    })
}

pub(crate) fn release(response: v1::ReleaseResponse) -> Result<ReleaseResult, KvError> {
    let header = header(response.header, true)?;
    Ok(ReleaseResult {
        successor: response.successor.map(Into::into),
        revision: header.revision,
        replayed: header.replayed,
    })
}

pub(crate) fn inspect(response: v1::InspectResponse) -> Result<InspectResult, KvError> {
    let header = header(response.header, false)?;
    Ok(InspectResult {
        holder: response.holder.map(Into::into),
        available_in: Duration::from_millis(response.available_in_ms),
        revision: header.revision,
        served_by: header.served_by,
    })
}
