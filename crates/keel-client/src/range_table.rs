//! The client's range table: which range holds a key, which nodes hold its replicas and
//! which one leads it, as `Cluster.Ranges` last described them, plus the rules that say when
//! an answer shows the table is stale. Pure: no I/O, no clock, no tonic.
//!
//! The table is a cache. The truth is each range's own state; a request that reaches the
//! wrong range is refused (`KeyOutOfRange`, `EpochMismatch`, `NotLeader` naming another
//! range) or served under another range id, and the client refreshes the table.

use std::collections::BTreeMap;

use keel_proto::v1;
use keel_types::{KvError, NodeId, RangeDescriptor, RangeId};

use crate::attempt::AttemptError;
use crate::endpoints;

/// Ranges in key order, their leaders and the addresses of the nodes holding them. Bounded
/// by the gRPC message limit of the `Cluster.Ranges` answer it is built from.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RangeTable {
    /// Disjoint, sorted by start key.
    ranges: Vec<Entry>,
    /// Normalized URIs by node id.
    nodes: BTreeMap<NodeId, String>,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Entry {
    pub descriptor: RangeDescriptor,
    /// The URI of the leader: from the table, a `NotLeader` hint, or the last node that served
    /// a leader-only request of the range.
    pub leader: Option<String>,
}

/// Which range a request was routed to, for judging its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Picked {
    /// A range of the table.
    Range(RangeId),
    /// The cluster does not serve `Cluster.Ranges` (an older server): its one range,
    /// `RangeId::FIRST`, holds every key.
    Whole,
    /// No table yet, or the key falls in a gap of the table.
    Unrouted,
}

/// Two ranges that keys of one atomic batch fall in, each with one of its keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Spans {
    pub first: (Vec<u8>, RangeDescriptor),
    pub second: (Vec<u8>, RangeDescriptor),
    /// The keys' indexes grouped by range (see `RangeTable::group`); at least two groups.
    pub groups: Vec<Vec<usize>>,
}

impl RangeTable {
    /// The table of a `Cluster.Ranges` answer. Ranges must not overlap; gaps are allowed (the
    /// meta range may be catching up) and keys in them are routed without the table. Nodes
    /// with an address that is not `host:port` are left out.
    pub fn from_wire(response: v1::RangesResponse) -> Result<RangeTable, KvError> {
        let nodes: BTreeMap<NodeId, String> = response
            .nodes
            .iter()
            .filter_map(|node| Some((node.node_id, endpoints::normalize(&node.addr).ok()?)))
            .collect();
        let mut ranges = Vec::with_capacity(response.ranges.len());
        for info in response.ranges {
            let Some(descriptor) = info.descriptor else {
                return Err(KvError::fatal(
                    "the range table lists a range without a descriptor",
                ));
            };
            let leader = info.leader_id.and_then(|id| nodes.get(&id).cloned());
            ranges.push(Entry {
                descriptor: descriptor.into(),
                leader,
            });
        }
        RangeTable::new(ranges, nodes)
    }

    /// A table of `ranges` (any order) and node URIs; refuses overlapping ranges.
    pub fn new(
        mut ranges: Vec<Entry>,
        nodes: BTreeMap<NodeId, String>,
    ) -> Result<RangeTable, KvError> {
        // The meta range holds no keys; older answers may list it with an empty span.
        ranges.retain(|entry| entry.descriptor.id != RangeId::META);
        ranges.sort_by(|a, b| a.descriptor.start.cmp(&b.descriptor.start));
        for pair in ranges.windows(2) {
            let (left, right) = (&pair[0].descriptor, &pair[1].descriptor);
            if left.end().is_none_or(|end| end > right.start.as_slice()) {
                return Err(KvError::fatal(format!(
                    "the range table is inconsistent: {left} overlaps {right}"
                )));
            }
        }
        Ok(RangeTable { ranges, nodes })
    }

    #[cfg(test)]
    pub fn ranges(&self) -> &[Entry] {
        &self.ranges
    }

    /// The range holding `key`, if the table has one.
    pub fn lookup(&self, key: &[u8]) -> Option<&Entry> {
        let after = self
            .ranges
            .partition_point(|entry| entry.descriptor.start.as_slice() <= key);
        let entry = self.ranges.get(after.checked_sub(1)?)?;
        entry.descriptor.contains(key).then_some(entry)
    }

    /// Where to send a request for `key`: its range, and the first of `preferred` that is a
    /// reachable replica of it (follower reads pass the client's endpoints; others pass
    /// none), else the range's leader if known and reachable, else one of its replicas with a known address that is reachable, chosen by
    /// `rotation`; `None` for the URI when no such node is known (the caller falls back to
    /// its endpoints). `None` when no range holds the key.
    pub fn pick(
        &self,
        key: &[u8],
        preferred: &[String],
        unreachable: &[String],
        rotation: usize,
    ) -> Option<(RangeId, Option<String>)> {
        let entry = self.lookup(key)?;
        let usable = |uri: &&String| !unreachable.contains(uri);
        let replica_uris: Vec<&String> = entry
            .descriptor
            .replicas
            .iter()
            .filter_map(|node| self.nodes.get(node))
            .collect();
        if let Some(uri) = preferred
            .iter()
            .filter(usable)
            .find(|uri| replica_uris.contains(uri))
        {
            return Some((entry.descriptor.id, Some(uri.clone())));
        }
        if let Some(leader) = entry.leader.as_ref().filter(usable) {
            return Some((entry.descriptor.id, Some(leader.clone())));
        }
        let replicas: Vec<&String> = replica_uris.into_iter().filter(usable).collect();
        let uri = match replicas.len() {
            0 => None,
            n => Some(replicas[rotation % n].clone()),
        };
        Some((entry.descriptor.id, uri))
    }

    /// The URIs of the replicas of `range` whose address the table knows.
    pub fn replica_uris(&self, range: RangeId) -> Vec<String> {
        let Some(entry) = self
            .ranges
            .iter()
            .find(|entry| entry.descriptor.id == range)
        else {
            return Vec::new();
        };
        entry
            .descriptor
            .replicas
            .iter()
            .filter_map(|node| self.nodes.get(node).cloned())
            .collect()
    }

    /// Records `uri` as the leader of `range` (a hint, or a node that served it).
    pub fn set_leader(&mut self, range: RangeId, uri: String) {
        if let Some(entry) = self.entry_mut(range) {
            entry.leader = Some(uri);
        }
    }

    /// Forgets the leader of `range` if it is `uri` (it failed or said it does not lead).
    pub fn forget_leader(&mut self, range: RangeId, uri: &str) {
        if let Some(entry) = self.entry_mut(range)
            && entry.leader.as_deref() == Some(uri)
        {
            entry.leader = None;
        }
    }

    /// The first two ranges `keys` fall in, in the order of `keys`, if they fall in more than
    /// one. Keys in gaps of the table are not counted: the server judges them.
    pub fn spans(&self, keys: &[&[u8]]) -> Option<Spans> {
        let mut first: Option<(&[u8], &RangeDescriptor)> = None;
        for &key in keys {
            let Some(entry) = self.lookup(key) else {
                continue;
            };
            match first {
                None => first = Some((key, &entry.descriptor)),
                Some((first_key, range)) if range.id != entry.descriptor.id => {
                    return Some(Spans {
                        first: (first_key.to_vec(), range.clone()),
                        second: (key.to_vec(), entry.descriptor.clone()),
                        groups: self.group(keys),
                    });
                }
                Some(_) => {}
            }
        }
        None
    }

    /// The indexes of `keys` grouped by the range holding them, each group ascending (the
    /// caller's order), the groups in key order of their ranges. Keys in gaps of the table
    /// form one more group, placed by its smallest key.
    pub fn group(&self, keys: &[&[u8]]) -> Vec<Vec<usize>> {
        // By the range's start key; keys in gaps under the smallest of them.
        let mut groups: BTreeMap<(Vec<u8>, bool), Vec<usize>> = BTreeMap::new();
        let gap_start = keys
            .iter()
            .filter(|key| self.lookup(key).is_none())
            .min()
            .map(|key| key.to_vec());
        for (index, key) in keys.iter().enumerate() {
            let slot = match self.lookup(key) {
                Some(entry) => (entry.descriptor.start.clone(), false),
                None => (gap_start.clone().unwrap_or_default(), true),
            };
            groups.entry(slot).or_default().push(index);
        }
        groups.into_values().collect()
    }

    fn entry_mut(&mut self, range: RangeId) -> Option<&mut Entry> {
        self.ranges
            .iter_mut()
            .find(|entry| entry.descriptor.id == range)
    }
}

/// What a refusal shows about the range table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stale {
    No,
    /// Perhaps stale: refresh before a later request, if allowed; follow the answer now.
    Suspected,
    /// The table routed this request to the wrong range: refresh it and route again.
    Shown,
}

/// What a refusal shows: `KeyOutOfRange` and `EpochMismatch` always show the table stale;
/// so does `NotLeader` naming another range than the one picked. Without a table, from a
/// cluster that does not serve `Cluster.Ranges`, a `NotLeader` naming another range than
/// `RangeId::FIRST` only raises the suspicion (the cluster may be being upgraded): its hint
/// is followed.
pub(crate) fn refused_as_stale(picked: Picked, error: &AttemptError) -> Stale {
    match (picked, error) {
        (
            _,
            AttemptError::Server(KvError::KeyOutOfRange { .. } | KvError::EpochMismatch { .. }),
        ) => Stale::Shown,
        (Picked::Range(id), AttemptError::Server(KvError::NotLeader { range_id, .. }))
            if *range_id != id =>
        {
            Stale::Shown
        }
        (Picked::Whole, AttemptError::Server(KvError::NotLeader { range_id, .. }))
            if *range_id != RangeId::FIRST =>
        {
            Stale::Suspected
        }
        _ => Stale::No,
    }
}

/// Whether a successful answer served by range `served` (from its header; 0 = not said)
/// shows that the table routed the request to the wrong range (the server forwarded or
/// re-routed it).
pub(crate) fn served_as_stale(picked: Picked, served: u64) -> bool {
    served != 0 && is_other_range(picked, RangeId(served))
}

fn is_other_range(picked: Picked, range: RangeId) -> bool {
    match picked {
        Picked::Range(id) => id != range,
        Picked::Whole => range != RangeId::FIRST,
        Picked::Unrouted => false,
    }
}

#[cfg(test)]
mod tests;
