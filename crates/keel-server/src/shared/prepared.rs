//! The empty groups this node prepared for replicas on their way, and when
//! (`ranges/replicas.rs` prepares them and collects the ones that never came). Knows nothing
//! of the network.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use keel_types::RangeId;

/// An empty group prepared for a replica that has not arrived is stopped after this long.
const PREPARED_GRACE_MS: u64 = 120_000;

/// When each empty group of this node was prepared for a replica to come.
#[derive(Default)]
pub(crate) struct Prepared {
    at: Mutex<BTreeMap<RangeId, Instant>>,
}

impl Prepared {
    pub fn mark(&self, range: RangeId) {
        self.lock().insert(range, Instant::now());
    }

    pub fn forget(&self, range: RangeId) {
        self.lock().remove(&range);
    }

    /// Whether `range` was prepared within the grace period.
    pub fn recent(&self, range: RangeId) -> bool {
        let grace = Duration::from_millis(PREPARED_GRACE_MS);
        self.lock()
            .get(&range)
            .is_some_and(|at| at.elapsed() < grace)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<RangeId, Instant>> {
        self.at
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
