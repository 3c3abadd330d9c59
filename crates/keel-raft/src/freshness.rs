//! When a replica was last known current with its range's leader: the start of its last
//! linearizable read barrier that succeeded (`read_bound.rs` says why that start). Plain
//! state: `RaftGroup` holds a `Freshness`; knows nothing of `RaftGroup` or reads.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

/// When this replica was last known current with its leader.
#[derive(Debug, Default)]
pub(crate) struct Freshness {
    current_at: Mutex<Option<Instant>>,
}

impl Freshness {
    /// A linearizable barrier that started at `started` has succeeded.
    pub fn confirmed(&self, started: Instant) {
        let mut current_at = self
            .current_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if current_at.is_none_or(|at| at < started) {
            *current_at = Some(started);
        }
    }

    /// Whether the replica was known current less than `max` ago (never for 0).
    pub fn within(&self, max: Duration) -> bool {
        let current_at = *self
            .current_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        current_at.is_some_and(|at| at.elapsed() < max)
    }
}
