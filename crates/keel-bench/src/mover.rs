//! `--move-leader-every`: while the load runs, hands the leadership of every data range to
//! the next of its voters at a steady pace, as the rebalancer and load splits do in a
//! running cluster, and notes when each round of hand-overs started. The driver sorts every
//! operation by whether it completed within `limits::AFTER_MOVE` of such a start, so the
//! report shows what a move costs callers (errors, latency) next to the steady state.
//! Keel only; the moves go through keel-client's Cluster calls, whatever the route.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use keel_client::{Client, RangeInfo};
use keel_types::NodeId;
use tokio::time::Instant;

use crate::limits;

/// When the rounds of hand-overs started, and how they went. Shared by the mover and the
/// tasks of a run.
pub struct Moves {
    origin: Instant,
    /// Start of the latest round, in ms after `origin`, plus 1 (0: no round yet).
    latest_ms: AtomicU64,
    done: AtomicU64,
    refused: AtomicU64,
    first_refusal: Mutex<Option<String>>,
}

/// What the moves of a run came to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MoveCounts {
    /// Hand-overs the leader accepted.
    pub done: u64,
    /// Hand-overs (or range table reads) refused.
    pub refused: u64,
    pub first_refusal: Option<String>,
}

impl Moves {
    pub fn new() -> Arc<Moves> {
        Arc::new(Moves {
            origin: Instant::now(),
            latest_ms: AtomicU64::new(0),
            done: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            first_refusal: Mutex::new(None),
        })
    }

    /// Notes that a round of hand-overs starts at `at`.
    pub fn start_round(&self, at: Instant) {
        let ms = at.saturating_duration_since(self.origin).as_millis();
        let ms = u64::try_from(ms).unwrap_or(u64::MAX - 1);
        self.latest_ms.fetch_max(ms + 1, Ordering::Relaxed);
    }

    /// Whether `at` falls within `limits::AFTER_MOVE` after the start of the latest round
    /// that began at or before it.
    pub fn soon_after_move(&self, at: Instant) -> bool {
        let latest = self.latest_ms.load(Ordering::Relaxed);
        if latest == 0 {
            return false;
        }
        let started = self.origin + Duration::from_millis(latest - 1);
        at >= started && at - started < limits::AFTER_MOVE
    }

    fn moved(&self) {
        self.done.fetch_add(1, Ordering::Relaxed);
    }

    fn refused(&self, why: String) {
        self.refused.fetch_add(1, Ordering::Relaxed);
        let mut first = self
            .first_refusal
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        first.get_or_insert(why);
    }

    pub fn counts(&self) -> MoveCounts {
        MoveCounts {
            done: self.done.load(Ordering::Relaxed),
            refused: self.refused.load(Ordering::Relaxed),
            first_refusal: self
                .first_refusal
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone(),
        }
    }
}

/// Every `every` from `start` until `end`, hands every data range's leadership to its next
/// voter. Bounded by `end` and by `limits::MOVE_ROUNDS_MAX`.
pub async fn run(client: Client, every: Duration, start: Instant, end: Instant, moves: Arc<Moves>) {
    let mut tick = tokio::time::interval_at(start + every, every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    for _ in 0..limits::MOVE_ROUNDS_MAX {
        tick.tick().await;
        if Instant::now() >= end {
            break;
        }
        round(&client, &moves).await;
    }
}

async fn round(client: &Client, moves: &Moves) {
    let ranges = match client.ranges().await {
        Ok(ranges) => ranges,
        Err(error) => return moves.refused(format!("Cluster.Ranges: {error}")),
    };
    moves.start_round(Instant::now());
    for range in ranges.iter().take(limits::MOVE_RANGES_MAX) {
        let Some(to) = next_leader(range) else {
            continue;
        };
        let id = range.descriptor.id;
        match client.transfer_leader(id, to).await {
            Ok(()) => moves.moved(),
            Err(error) => moves.refused(format!("range {id} to node {to}: {error}")),
        }
    }
}

/// The voter after the range's leader in id order, wrapping; none without a known leader
/// or another voter.
pub fn next_leader(range: &RangeInfo) -> Option<NodeId> {
    let leader = range.leader?;
    let mut voters = range.descriptor.replicas.clone();
    voters.sort_unstable();
    let after = voters.iter().copied().find(|voter| *voter > leader);
    after
        .or_else(|| voters.first().copied())
        .filter(|to| *to != leader)
}

#[cfg(test)]
mod tests;
