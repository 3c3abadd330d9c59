//! The quota decisions for a tenant's requests, as pure functions: how many keys and bytes a
//! write may add at most (`growth`), whether the leader of a range of the tenant's namespace
//! admits it (`judge`), and how many request tokens a call draws from the tenant's bucket
//! (`TokenBucket`). Knows nothing of I/O, gRPC or the clock: `requests/admission.rs` and `access/mod.rs`
//! act on the answers.
//!
//! The rule: a range's leader admits a write when the range's live counts (its state
//! machine), plus the reservations of writes admitted and not yet applied, plus the most
//! the write can add, stay within the range's allowance. A namespace of one range is
//! allowed the whole quota. A namespace of `k` ranges gives each range its count in the
//! node's range table plus a `1/k` share (rounded up) of the room the table leaves, so the
//! ranges together stay within the quota plus `k - 1` as long as the table is current.

use std::time::Instant;

use keel_types::coordination::{Acquirer, CoordinationOp};
use keel_types::txn::{Txn, TxnOp};
use keel_types::{BatchOp, limits};

/// Keys and bytes: counted, reserved or allowed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Amount {
    pub keys: u64,
    pub bytes: u64,
}

impl Amount {
    pub fn plus(self, other: Amount) -> Amount {
        Amount {
            keys: self.keys.saturating_add(other.keys),
            bytes: self.bytes.saturating_add(other.bytes),
        }
    }

    /// `self - other`, for counters that only grow (and may wrap).
    pub fn since(self, earlier: Amount) -> Amount {
        Amount {
            keys: self.keys.wrapping_sub(earlier.keys),
            bytes: self.bytes.wrapping_sub(earlier.bytes),
        }
    }

    pub fn less(self, other: Amount) -> Amount {
        Amount {
            keys: self.keys.saturating_sub(other.keys),
            bytes: self.bytes.saturating_sub(other.bytes),
        }
    }

    pub fn is_zero(self) -> bool {
        self == Amount::default()
    }
}

/// A tenant's keys and bytes quotas; `None` = unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Limits {
    pub keys: Option<u64>,
    pub bytes: Option<u64>,
}

/// What the leader of one range of a tenant's namespace knows when it admits a write.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Standing {
    /// The range's live counts: keys, locks, fenced keys and idempotency records, and their
    /// bytes, as its state machine on this node holds them.
    pub live: Amount,
    /// Writes admitted on this node and not known to be in `live` yet.
    pub reserved: Amount,
    /// This range's counts in the node's range table; `None` when the table lacks it.
    pub reported: Option<Amount>,
    /// The namespace's other ranges in that table: their counts summed, and how many.
    pub others: Amount,
    pub other_ranges: u64,
}

/// Why a write is refused: the quota it would pass, and its limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Refusal {
    pub quota: &'static str,
    pub limit: u64,
}

/// Whether the range's leader admits a write that adds at most `growth`. A write that adds
/// nothing of a kind (a delete, a release) always passes that kind's quota.
pub(crate) fn judge(standing: &Standing, growth: Amount, limits: Limits) -> Result<(), Refusal> {
    let pick_keys = |amount: Amount| amount.keys;
    let pick_bytes = |amount: Amount| amount.bytes;
    check(standing, growth, limits.keys, "keys", pick_keys)?;
    check(standing, growth, limits.bytes, "bytes", pick_bytes)
}

fn check(
    standing: &Standing,
    growth: Amount,
    limit: Option<u64>,
    quota: &'static str,
    pick: impl Fn(Amount) -> u64,
) -> Result<(), Refusal> {
    let (Some(limit), adds) = (limit, pick(growth)) else {
        return Ok(());
    };
    if adds == 0 {
        return Ok(());
    }
    let allowed = allowance(
        limit,
        standing.reported.map_or(0, &pick),
        pick(standing.others),
        standing.other_ranges,
    );
    let after = pick(standing.live)
        .saturating_add(pick(standing.reserved))
        .saturating_add(adds);
    match after <= allowed {
        true => Ok(()),
        false => Err(Refusal { quota, limit }),
    }
}

/// How much one range of a namespace may hold: all of `limit` when it is the only range;
/// else its `reported` count plus its share (rounded up) of what the table leaves.
fn allowance(limit: u64, reported: u64, others: u64, other_ranges: u64) -> u64 {
    if other_ranges == 0 {
        return limit;
    }
    let room = limit.saturating_sub(reported.saturating_add(others));
    reported.saturating_add(room.div_ceil(other_ranges + 1))
}

/// The most a mutation of `ops` adds: every put and increment a new key (an overwrite is
/// counted as if new), with its key and value bytes; with a fence, a fence row per key.
pub(crate) fn mutation_growth(ops: &[BatchOp], fence_lock: Option<&[u8]>) -> Amount {
    ops.iter().fold(Amount::default(), |sum, op| {
        let (key, value_bytes) = match op {
            BatchOp::Put { key, value, .. } => (key, value.len()),
            BatchOp::Increment { key, .. } => (key, limits::COUNTER_VALUE_BYTES_MAX),
            BatchOp::Delete { .. } => return sum,
        };
        let row = Amount {
            keys: 1,
            bytes: (key.len() + value_bytes) as u64,
        };
        let fence = fence_lock.map_or(Amount::default(), |lock| Amount {
            keys: 1,
            bytes: (key.len() + lock.len() + limits::QUOTA_ROW_OVERHEAD_BYTES) as u64,
        });
        sum.plus(row).plus(fence)
    })
}

/// The most a transaction adds: a row for every put of either branch, nested ones
/// included, as `mutation_growth` counts one.
pub(crate) fn txn_growth(txn: &Txn) -> Amount {
    txn.success
        .iter()
        .chain(&txn.failure)
        .fold(Amount::default(), |sum, op| match op {
            TxnOp::Put(put) => sum.plus(Amount {
                keys: 1,
                bytes: (put.key.len() + put.value.len()) as u64,
            }),
            TxnOp::Txn(nested) => sum.plus(txn_growth(nested)),
            TxnOp::Read(_) | TxnOp::Delete(_) => sum,
        })
}

/// The most a lock or idempotency operation adds: an acquire or begin a new row (name, owner
/// and the row's fixed fields), a complete its result; the others nothing.
pub(crate) fn coordination_growth(op: &CoordinationOp) -> Amount {
    let row = |key: &[u8], owner: &[u8]| Amount {
        keys: 1,
        bytes: (key.len() + owner.len() + limits::QUOTA_ROW_OVERHEAD_BYTES) as u64,
    };
    match op {
        CoordinationOp::Acquire {
            name,
            acquirer: Acquirer { owner, .. },
        } => row(name, owner),
        CoordinationOp::Begin { key, owner, .. } => row(key, owner),
        CoordinationOp::Complete { result, .. } => Amount {
            keys: 0,
            bytes: result.len() as u64,
        },
        _ => Amount::default(),
    }
}

/// What a draw of request tokens found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Draw {
    Taken,
    /// Not enough tokens now; a later call may find them.
    Empty,
    /// More tokens than the bucket ever holds: no call of this size can pass.
    TooLarge,
}

/// Requests a tenant may make on one node: up to its rate per second, bursts of up to one
/// second's worth. Time is given, never read.
#[derive(Debug)]
pub(crate) struct TokenBucket {
    rate: Option<f64>,
    available: f64,
    filled_at: Option<Instant>,
}

impl TokenBucket {
    pub fn new(per_sec: Option<u32>) -> TokenBucket {
        let rate = per_sec.map(f64::from);
        TokenBucket {
            rate,
            available: rate.unwrap_or(0.0),
            filled_at: None,
        }
    }

    /// Takes `tokens` at `now` if there are as many.
    pub fn take(&mut self, tokens: u32, now: Instant) -> Draw {
        let Some(rate) = self.rate else {
            return Draw::Taken;
        };
        if f64::from(tokens) > rate {
            return Draw::TooLarge;
        }
        if let Some(filled_at) = self.filled_at {
            let elapsed = now.saturating_duration_since(filled_at).as_secs_f64();
            self.available = (self.available + elapsed * rate).min(rate);
        }
        self.filled_at = Some(self.filled_at.map_or(now, |filled_at| filled_at.max(now)));
        if self.available >= f64::from(tokens) {
            self.available -= f64::from(tokens);
            return Draw::Taken;
        }
        Draw::Empty
    }
}

#[cfg(test)]
mod tests;
