//! The range table: the descriptors of the data ranges a node knows, keyed by start key, for
//! routing a key to its range. A cache of the truth (each range's own state machine), fed
//! from the meta range and from the node's local ranges. Knows nothing of Raft or storage.
//!
//! Newer wins. For one range, "newer" is `RangeDescriptor::supersedes`. Across ranges whose
//! spans overlap, it is the higher epoch: a split raises the parent's epoch and gives the child
//! that same epoch, so the epoch of whatever range covers a given key only grows. One of two
//! overlapping descriptors is therefore stale, and it is the one with the lower epoch.

use std::cmp::Reverse;
use std::collections::{BTreeMap, HashMap};
use std::ops::Bound;

use keel_types::{RangeDescriptor, RangeId};
use thiserror::Error;

/// Descriptors of data ranges by start key, with no two spans overlapping. The meta range
/// (which owns no key) and descriptors with an empty span are never recorded.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RangeTable {
    by_start: BTreeMap<Vec<u8>, RangeDescriptor>,
    /// Start key of each recorded range.
    starts: HashMap<RangeId, Vec<u8>>,
}

/// Why a set of descriptors does not cover the keyspace exactly once.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum CoverageError {
    /// No range owns the keys `[start, end)` (`end = None`: to the end of the keyspace).
    #[error("keys {} belong to no range", span_text(start, end.as_deref()))]
    Gap {
        start: Vec<u8>,
        end: Option<Vec<u8>>,
    },
    /// Two ranges own some of the same keys.
    #[error("ranges {left} and {right} overlap")]
    Overlap {
        left: Box<RangeDescriptor>,
        right: Box<RangeDescriptor>,
    },
    /// A data range owns no key at all (`start >= end`).
    #[error("range {0} has an empty span")]
    EmptySpan(Box<RangeDescriptor>),
}

impl RangeTable {
    pub fn new() -> RangeTable {
        RangeTable::default()
    }

    /// The table of `descriptors`, newest first: the result does not depend on their order,
    /// and stale or duplicate descriptors (as the meta range may hold next to the newer
    /// descriptors of a split) are left out.
    pub fn from_descriptors(mut descriptors: Vec<RangeDescriptor>) -> RangeTable {
        descriptors.sort_by_key(|d| Reverse((d.epoch, d.conf_version, d.id)));
        let mut table = RangeTable::new();
        for descriptor in descriptors {
            table.update(descriptor);
        }
        table
    }

    /// The range owning `key`, if the table knows it.
    pub fn lookup(&self, key: &[u8]) -> Option<&RangeDescriptor> {
        let below = (Bound::Unbounded, Bound::Included(key));
        let (_, descriptor) = self.by_start.range::<[u8], _>(below).next_back()?;
        descriptor.contains(key).then_some(descriptor)
    }

    /// The recorded descriptor of `range`.
    pub fn get(&self, range: RangeId) -> Option<&RangeDescriptor> {
        let start = self.starts.get(&range)?;
        self.by_start.get(start)
    }

    /// Records `descriptor` unless the table holds one that is as new or newer: of the same
    /// range (`supersedes`), or of another range whose span overlaps it with an epoch as high
    /// or higher. Recording removes the older descriptors it replaces or overlaps. Says
    /// whether it was recorded. The meta range and empty spans are never recorded.
    pub fn update(&mut self, descriptor: RangeDescriptor) -> bool {
        if descriptor.id == RangeId::META || span_is_empty(&descriptor) {
            return false;
        }
        if let Some(current) = self.get(descriptor.id)
            && !descriptor.supersedes(current)
        {
            return false;
        }
        let mut stale = Vec::new();
        for other in self.ranges_in(&descriptor.start, descriptor.end()) {
            if other.id == descriptor.id {
                continue;
            }
            if other.epoch >= descriptor.epoch {
                return false;
            }
            stale.push(other.id);
        }
        for id in stale.into_iter().chain([descriptor.id]) {
            self.remove(id);
        }
        self.starts.insert(descriptor.id, descriptor.start.clone());
        self.by_start.insert(descriptor.start.clone(), descriptor);
        true
    }

    /// Forgets `range`; returns its descriptor if it was recorded.
    pub fn remove(&mut self, range: RangeId) -> Option<RangeDescriptor> {
        let start = self.starts.remove(&range)?;
        let removed = self.by_start.remove(&start);
        assert!(
            removed.as_ref().is_some_and(|d| d.id == range),
            "range table index names {range} at a start key it does not hold"
        );
        removed
    }

    /// Every recorded range, in key order.
    pub fn ranges(&self) -> impl Iterator<Item = &RangeDescriptor> {
        self.by_start.values()
    }

    /// The recorded ranges owning some key of `[start, end)` (`end = None`: unbounded), in key
    /// order: the ranges a scan or a batch over those keys touches. Keys no recorded range
    /// owns are skipped; `check_coverage` tells whether there are any.
    pub fn ranges_in<'a>(
        &'a self,
        start: &'a [u8],
        end: Option<&'a [u8]>,
    ) -> impl Iterator<Item = &'a RangeDescriptor> {
        let before_end = move |key: &[u8]| end.is_none_or(|end| key < end);
        let first = self.lookup(start).filter(|_| before_end(start));
        let after = (Bound::Excluded(start), Bound::Unbounded);
        let rest = self
            .by_start
            .range::<[u8], _>(after)
            .map(|(_, descriptor)| descriptor)
            .take_while(move |descriptor| before_end(&descriptor.start));
        first.into_iter().chain(rest)
    }

    pub fn len(&self) -> usize {
        self.by_start.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_start.is_empty()
    }

    /// Whether the table covers every key exactly once (see `check_coverage`).
    pub fn check_coverage(&self) -> Result<(), CoverageError> {
        check_coverage(self.ranges())
    }
}

/// Whether `ranges` cover the keyspace exactly once: the first starts at the empty key, each
/// next one starts where the one before ends, the last is unbounded, and none is empty. The
/// meta range owns no key and is skipped. Reports the first problem in key order.
pub fn check_coverage<'a>(
    ranges: impl IntoIterator<Item = &'a RangeDescriptor>,
) -> Result<(), CoverageError> {
    let mut ranges: Vec<&RangeDescriptor> = ranges
        .into_iter()
        .filter(|range| range.id != RangeId::META)
        .collect();
    ranges.sort_by(|a, b| a.start.cmp(&b.start));
    if let Some(empty) = ranges.iter().find(|range| span_is_empty(range)) {
        return Err(CoverageError::EmptySpan(Box::new((*empty).clone())));
    }
    let mut covered_to: Option<&[u8]> = Some(b"");
    let mut previous: Option<&RangeDescriptor> = None;
    for range in ranges {
        let Some(from) = covered_to else {
            let left = previous.expect("an unbounded end comes from a previous range");
            return Err(overlap(left, range));
        };
        if range.start.as_slice() > from {
            return Err(CoverageError::Gap {
                start: from.to_vec(),
                end: Some(range.start.clone()),
            });
        }
        if range.start.as_slice() < from {
            let left = previous.expect("only a previous range moves coverage past the empty key");
            return Err(overlap(left, range));
        }
        covered_to = range.end();
        previous = Some(range);
    }
    match covered_to {
        None => Ok(()),
        Some(from) => Err(CoverageError::Gap {
            start: from.to_vec(),
            end: None,
        }),
    }
}

fn overlap(left: &RangeDescriptor, right: &RangeDescriptor) -> CoverageError {
    CoverageError::Overlap {
        left: Box::new(left.clone()),
        right: Box::new(right.clone()),
    }
}

fn span_is_empty(range: &RangeDescriptor) -> bool {
    range.end().is_some_and(|end| end <= range.start.as_slice())
}

fn span_text(start: &[u8], end: Option<&[u8]>) -> String {
    let end = end.map_or_else(|| "+inf".to_string(), keel_types::validate::show_key);
    format!("[{}, {end})", keel_types::validate::show_key(start))
}

#[cfg(test)]
mod tests;
