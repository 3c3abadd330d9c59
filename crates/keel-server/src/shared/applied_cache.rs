//! Per-range values read from a range's applied state, kept while that state stays as it
//! was. A range's state machine changes only by applying (a log entry, a snapshot), which
//! grows its applied index, so a value read when the index was `i` still holds while the
//! index is `i`: the node's periodic tasks (cleanup, split checks, the publisher, heartbeat
//! reports) skip the storage read of a range nothing was applied to since, and an idle range
//! costs them no read. Knows nothing of what the values are.

use std::collections::BTreeMap;

use keel_types::RangeId;

/// Values by range, each with the applied index it was read at.
pub(crate) struct ByApplied<T> {
    entries: BTreeMap<RangeId, (u64, T)>,
}

impl<T> Default for ByApplied<T> {
    fn default() -> Self {
        ByApplied {
            entries: BTreeMap::new(),
        }
    }
}

impl<T> ByApplied<T> {
    /// The value kept for `range` if it was read at applied index `applied`.
    pub fn get(&self, range: RangeId, applied: u64) -> Option<&T> {
        match self.entries.get(&range) {
            Some((at, value)) if *at == applied => Some(value),
            _ => None,
        }
    }

    /// Keeps `value`, read from `range`'s state when its applied index was `applied` (read
    /// before the value: if more was applied meanwhile, the next `get` misses).
    pub fn insert(&mut self, range: RangeId, applied: u64, value: T) {
        self.entries.insert(range, (applied, value));
    }

    pub fn remove(&mut self, range: RangeId) {
        self.entries.remove(&range);
    }

    /// Forgets the ranges `keep` refuses (those the node no longer hosts).
    pub fn retain(&mut self, keep: impl Fn(RangeId) -> bool) {
        self.entries.retain(|range, _| keep(*range));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_holds_only_at_the_index_it_was_read_at() {
        let mut cache = ByApplied::default();
        assert_eq!(cache.get(RangeId(1), 0), None);
        cache.insert(RangeId(1), 7, "seven");
        cache.insert(RangeId(2), 3, "three");
        assert_eq!(cache.get(RangeId(1), 7), Some(&"seven"));
        assert_eq!(cache.get(RangeId(1), 8), None, "applied since");
        assert_eq!(cache.get(RangeId(1), 6), None);
        cache.insert(RangeId(1), 8, "eight");
        assert_eq!(cache.get(RangeId(1), 8), Some(&"eight"));
        cache.retain(|range| range != RangeId(2));
        assert_eq!(cache.get(RangeId(2), 3), None, "no longer hosted");
        cache.remove(RangeId(1));
        assert_eq!(cache.get(RangeId(1), 8), None);
    }
}
