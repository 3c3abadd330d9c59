//! Since when this node leads the meta range. Knows nothing of what the leader does.

use std::sync::Mutex;
use std::time::Instant;

/// Since when this node leads the meta range (reset on every new term), so that a node it
/// has not heard from yet is not dead before the dead timeout has passed since then.
#[derive(Default)]
pub(crate) struct MetaLeadership {
    since: Mutex<Option<(u64, Instant)>>,
}

impl MetaLeadership {
    /// When this node began leading the meta range in `term`.
    pub fn since(&self, term: u64) -> Instant {
        let mut since = self
            .since
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match *since {
            Some((known, at)) if known == term => at,
            _ => {
                let now = Instant::now();
                *since = Some((term, now));
                now
            }
        }
    }
}
