//! The descriptors this node last published to the meta range (`ranges/publisher.rs`
//! publishes). Knows nothing of the meta range.

use std::collections::BTreeMap;
use std::sync::Mutex;

use keel_types::{RangeDescriptor, RangeId};

/// What this node last published successfully, by range.
#[derive(Default)]
pub(crate) struct Published {
    ranges: Mutex<BTreeMap<RangeId, RangeDescriptor>>,
}

impl Published {
    /// Whether `range` differs from what was last published of it.
    pub fn changed(&self, range: &RangeDescriptor) -> bool {
        self.lock().get(&range.id) != Some(range)
    }

    pub fn record(&self, ranges: &[RangeDescriptor]) {
        let mut published = self.lock();
        for range in ranges {
            published.insert(range.id, range.clone());
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<RangeId, RangeDescriptor>> {
        self.ranges
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
