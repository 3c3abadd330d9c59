//! Recent events this node saw (`Events`): splits and replica changes of its local ranges (as
//! its local range table changes) and leader changes of its groups, at most
//! `CONSOLE_EVENTS_MAX`, the oldest dropped first. The range watcher and the quiescence watch
//! feed it; the console reads it. What changed is decided in pure code (`range_changes`).
//! Every replica of a range sees the same split or election, so an event carries what makes
//! it one (`Event::identity`) for the reader to merge. Knows nothing of the network.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Mutex, MutexGuard, PoisonError};

use keel_types::limits::CONSOLE_EVENTS_MAX;
use keel_types::{NodeId, RangeDescriptor, RangeId};
use serde::{Deserialize, Serialize};

/// One thing that happened to a range.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Event {
    /// Unix milliseconds on the node's clock when the node noticed it.
    pub at_ms: u64,
    pub range: RangeId,
    pub what: What,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum What {
    /// The range split at `at`; `other` is the range that took the keys on the other side.
    Split {
        epoch: u64,
        at: Vec<u8>,
        other: RangeId,
    },
    /// The range's voting replicas changed (a move, an added or a removed replica).
    Replicas {
        conf_version: u64,
        before: Vec<NodeId>,
        after: Vec<NodeId>,
    },
    /// `leader` leads the range from `term` on.
    Leader { term: u64, leader: NodeId },
}

/// What makes an event the same one on every node: kind, range and the epoch, conf version
/// or term it happened in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct Identity {
    pub kind: &'static str,
    pub range: RangeId,
    pub version: u64,
}

impl Event {
    pub fn identity(&self) -> Identity {
        let (kind, version) = match &self.what {
            What::Split { epoch, .. } => ("split", *epoch),
            What::Replicas { conf_version, .. } => ("replicas", *conf_version),
            What::Leader { term, .. } => ("leader", *term),
        };
        Identity {
            kind,
            range: self.range,
            version,
        }
    }
}

/// The node's recent events and what it last saw, to tell what changed.
#[derive(Default)]
pub(crate) struct Events {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    ring: VecDeque<Event>,
    /// The local range table as last seen; `None` before the first look.
    ranges: Option<BTreeMap<RangeId, RangeDescriptor>>,
    /// Each local group's leader and term as last seen.
    leaders: BTreeMap<RangeId, (u64, NodeId)>,
}

impl Events {
    /// Takes the local range table at `now_ms` and records its splits and replica changes
    /// since the last one (none at the first look).
    pub fn observe_ranges(&self, now_ms: u64, ranges: &[RangeDescriptor]) {
        let mut inner = self.lock();
        let after: BTreeMap<RangeId, RangeDescriptor> = ranges
            .iter()
            .map(|range| (range.id, range.clone()))
            .collect();
        if let Some(before) = &inner.ranges {
            for (range, what) in range_changes(before, &after) {
                inner.push(Event {
                    at_ms: now_ms,
                    range,
                    what,
                });
            }
        }
        inner.ranges = Some(after);
    }

    /// Takes each local group's `(range, term, leader)` at `now_ms` and records the leaders
    /// that changed; groups not listed are forgotten.
    pub fn observe_leaders(&self, now_ms: u64, leaders: &[(RangeId, u64, NodeId)]) {
        let mut inner = self.lock();
        let mut seen = BTreeMap::new();
        for &(range, term, leader) in leaders {
            if inner.leaders.get(&range) != Some(&(term, leader)) {
                let what = What::Leader { term, leader };
                inner.push(Event {
                    at_ms: now_ms,
                    range,
                    what,
                });
            }
            seen.insert(range, (term, leader));
        }
        inner.leaders = seen;
    }

    /// The events kept, oldest first.
    pub fn recent(&self) -> Vec<Event> {
        self.lock().ring.iter().cloned().collect()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Inner {
    fn push(&mut self, event: Event) {
        if self.ring.len() == CONSOLE_EVENTS_MAX {
            self.ring.pop_front();
        }
        self.ring.push_back(event);
    }
}

/// The splits and replica changes that turn the local table `before` into `after`: a range
/// whose span shrank as a new range appeared inside its old span split there; a range whose
/// voters changed had its replicas changed. Ranges that appear or go otherwise (a replica
/// received or removed) are the replica changes of the range's other members.
pub(crate) fn range_changes(
    before: &BTreeMap<RangeId, RangeDescriptor>,
    after: &BTreeMap<RangeId, RangeDescriptor>,
) -> Vec<(RangeId, What)> {
    let mut changes = Vec::new();
    for (id, now) in after {
        let Some(was) = before.get(id) else {
            continue;
        };
        if was.replicas != now.replicas {
            let what = What::Replicas {
                conf_version: now.conf_version,
                before: was.replicas.clone(),
                after: now.replicas.clone(),
            };
            changes.push((*id, what));
        }
        if was.start == now.start && was.end == now.end {
            continue;
        }
        let new = after
            .values()
            .find(|other| !before.contains_key(&other.id) && was.contains(&other.start));
        if let Some(other) = new {
            let at = if other.start > now.start {
                other.start.clone()
            } else {
                now.start.clone()
            };
            let what = What::Split {
                epoch: now.epoch,
                at,
                other: other.id,
            };
            changes.push((*id, what));
        }
    }
    changes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(
        id: u64,
        start: &str,
        end: Option<&str>,
        epoch: u64,
        replicas: &[u64],
    ) -> RangeDescriptor {
        RangeDescriptor {
            id: RangeId(id),
            start: start.as_bytes().to_vec(),
            end: end.map(|end| end.as_bytes().to_vec()),
            epoch,
            conf_version: replicas.len() as u64,
            replicas: replicas.to_vec(),
        }
    }

    fn table(ranges: &[RangeDescriptor]) -> BTreeMap<RangeId, RangeDescriptor> {
        ranges.iter().map(|r| (r.id, r.clone())).collect()
    }

    #[test]
    fn splits_and_replica_changes_are_told_apart() {
        let whole = range(1, "", None, 1, &[1, 2, 3]);
        let left = range(1, "", Some("m"), 2, &[1, 2, 3]);
        let right = range(4, "m", None, 2, &[1, 2, 3]);
        let moved = range(1, "", None, 1, &[1, 2, 4]);
        let split = What::Split {
            epoch: 2,
            at: b"m".to_vec(),
            other: RangeId(4),
        };
        // (table before, table after, changes)
        type Case = (
            Vec<RangeDescriptor>,
            Vec<RangeDescriptor>,
            Vec<(RangeId, What)>,
        );
        let cases: Vec<Case> = vec![
            (vec![whole.clone()], vec![whole.clone()], vec![]),
            (
                vec![whole.clone()],
                vec![left.clone(), right.clone()],
                vec![(RangeId(1), split)],
            ),
            (
                vec![whole.clone()],
                vec![moved.clone()],
                vec![(
                    RangeId(1),
                    What::Replicas {
                        conf_version: 3,
                        before: vec![1, 2, 3],
                        after: vec![1, 2, 4],
                    },
                )],
            ),
            // A replica received or removed here is nobody's split.
            (
                vec![left.clone()],
                vec![left.clone(), right.clone()],
                vec![],
            ),
            (
                vec![left.clone(), right.clone()],
                vec![left.clone()],
                vec![],
            ),
        ];
        for (before, after, expected) in cases {
            let got = range_changes(&table(&before), &table(&after));
            assert_eq!(got, expected, "{before:?} -> {after:?}");
        }
        // The child that keeps the right half names where it split too.
        let kept_right = range(1, "m", None, 2, &[1, 2, 3]);
        let new_left = range(5, "", Some("m"), 2, &[1, 2, 3]);
        let got = range_changes(&table(&[whole]), &table(&[new_left, kept_right]));
        let expected = What::Split {
            epoch: 2,
            at: b"m".to_vec(),
            other: RangeId(5),
        };
        assert_eq!(got, vec![(RangeId(1), expected)]);
    }

    #[test]
    fn the_first_look_records_nothing_and_changes_are_recorded_once() {
        let events = Events::default();
        let whole = range(1, "", None, 1, &[1, 2, 3]);
        events.observe_ranges(10, std::slice::from_ref(&whole));
        assert!(events.recent().is_empty());
        let parts = [
            range(1, "", Some("m"), 2, &[1, 2, 3]),
            range(2, "m", None, 2, &[1, 2, 3]),
        ];
        events.observe_ranges(20, &parts);
        events.observe_ranges(30, &parts);
        let recent = events.recent();
        assert_eq!(recent.len(), 1, "{recent:?}");
        assert_eq!((recent[0].at_ms, recent[0].range), (20, RangeId(1)));
        assert_eq!(recent[0].identity().kind, "split");
    }

    #[test]
    fn leader_changes_are_recorded_when_leader_or_term_moves() {
        let events = Events::default();
        events.observe_leaders(1, &[(RangeId(1), 1, 1)]);
        events.observe_leaders(2, &[(RangeId(1), 1, 1)]);
        events.observe_leaders(3, &[(RangeId(1), 2, 2)]);
        events.observe_leaders(4, &[(RangeId(1), 3, 2)]);
        let terms: Vec<u64> = events
            .recent()
            .iter()
            .map(|e| e.identity().version)
            .collect();
        assert_eq!(terms, vec![1, 2, 3]);
    }

    #[test]
    fn the_ring_keeps_the_newest() {
        let events = Events::default();
        for term in 0..(CONSOLE_EVENTS_MAX as u64 + 5) {
            events.observe_leaders(term, &[(RangeId(1), term, 1)]);
        }
        let recent = events.recent();
        assert_eq!(recent.len(), CONSOLE_EVENTS_MAX);
        assert_eq!(recent[0].at_ms, 5);
    }
}
