//! The node's range tables: the *local* table of the ranges with applied state in this
//! node's store (never the meta range, which owns no key), by start key, which routes
//! requests; and the *meta* table, this node's cache of the meta range's descriptors and node
//! addresses, with the meta range's members as heartbeats told them. `ranges/lookup.rs` and
//! `ranges/watch.rs` keep them fresh. Knows nothing of the network.

use std::collections::BTreeMap;
use std::sync::{Mutex, RwLock};
use std::time::{Duration, Instant};

use keel_meta::RangeTable;
use keel_types::planted::{self, PlantedBug};
use keel_types::{MetaMembers, NodeAddr, NodeDescriptor, NodeId, RangeDescriptor};

/// A key no table knows makes the node read the meta range again, at most this often.
const META_MISS_REFRESH_MS: u64 = 200;

/// The local and the meta table of one node.
#[derive(Default)]
pub(crate) struct RangeTables {
    local: RwLock<RangeTable>,
    meta: RwLock<MetaView>,
    /// When the meta table was last read (`None`: never).
    meta_read_at: Mutex<Option<Instant>>,
    /// The meta range's voters and leader as heartbeats (or a join) told this node.
    meta_members: RwLock<MetaMembers>,
}

/// This node's cache of the meta range.
#[derive(Default)]
struct MetaView {
    table: RangeTable,
    nodes: BTreeMap<NodeId, NodeAddr>,
}

impl RangeTables {
    /// The local range holding `key`.
    pub fn local(&self, key: &[u8]) -> Option<RangeDescriptor> {
        let local = read(&self.local);
        // The planted bug routes a key no local range holds to the local range below it, as
        // if that range had kept its span from before it split.
        if planted::active(PlantedBug::StaleSpan) && local.lookup(key).is_none() {
            let below = local.ranges().filter(|range| range.start.as_slice() <= key);
            return below.last().cloned();
        }
        local.lookup(key).cloned()
    }

    /// Every local range with state, in key order.
    pub fn local_ranges(&self) -> Vec<RangeDescriptor> {
        read(&self.local).ranges().cloned().collect()
    }

    /// Replaces the local table with `ranges` (the store's descriptors).
    pub fn set_local(&self, ranges: Vec<RangeDescriptor>) {
        *write(&self.local) = RangeTable::from_descriptors(ranges);
    }

    /// The range the meta table says holds `key`.
    pub fn meta_lookup(&self, key: &[u8]) -> Option<RangeDescriptor> {
        read(&self.meta).table.lookup(key).cloned()
    }

    /// The address the meta table records for `node`.
    pub fn meta_addr(&self, node: NodeId) -> Option<NodeAddr> {
        read(&self.meta).nodes.get(&node).cloned()
    }

    /// Every range the meta table records, in key order.
    pub fn meta_ranges(&self) -> Vec<RangeDescriptor> {
        read(&self.meta).table.ranges().cloned().collect()
    }

    /// The ids of the nodes the meta table records.
    pub fn meta_node_ids(&self) -> Vec<NodeId> {
        read(&self.meta).nodes.keys().copied().collect()
    }

    /// The meta range's members as heartbeats (or a join) told this node.
    pub fn meta_members(&self) -> MetaMembers {
        read(&self.meta_members).clone()
    }

    pub fn set_meta_members(&self, members: MetaMembers) {
        *write(&self.meta_members) = members;
    }

    /// Adds nodes to the cached meta table's nodes (what a join answered).
    pub fn learn_nodes(&self, nodes: Vec<NodeDescriptor>) {
        let mut view = write(&self.meta);
        for node in nodes {
            view.nodes.insert(node.id, node.addr);
        }
    }

    /// Replaces the cached meta table.
    pub fn set_meta(&self, ranges: Vec<RangeDescriptor>, nodes: Vec<NodeDescriptor>) {
        let view = MetaView {
            table: RangeTable::from_descriptors(ranges),
            nodes: nodes.into_iter().map(|node| (node.id, node.addr)).collect(),
        };
        *write(&self.meta) = view;
    }

    /// Whether a miss may read the meta range again now; if so, marks it read.
    pub fn meta_miss_may_refresh(&self) -> bool {
        let mut read_at = self
            .meta_read_at
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let pause = Duration::from_millis(META_MISS_REFRESH_MS);
        if read_at.is_some_and(|at| at.elapsed() < pause) {
            return false;
        }
        *read_at = Some(Instant::now());
        true
    }
}

fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    lock.read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn write<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use keel_types::RangeId;

    /// A descriptor of range 9 over `[start, end)`.
    pub(crate) fn span(start: &str, end: Option<&str>) -> RangeDescriptor {
        RangeDescriptor {
            id: RangeId(9),
            start: start.as_bytes().to_vec(),
            end: end.map(|end| end.as_bytes().to_vec()),
            epoch: 1,
            conf_version: 0,
            replicas: vec![1],
        }
    }

    #[test]
    fn the_local_table_routes_by_span_and_never_to_the_meta_range() {
        let tables = RangeTables::default();
        let meta = RangeDescriptor {
            id: RangeId::META,
            start: Vec::new(),
            end: Some(Vec::new()),
            ..span("", None)
        };
        let left = RangeDescriptor {
            id: RangeId::FIRST,
            ..span("", Some("m"))
        };
        let right = RangeDescriptor {
            id: RangeId(2),
            ..span("m", None)
        };
        tables.set_local(vec![meta, left, right]);
        let routed = |key: &str| tables.local(key.as_bytes()).map(|range| range.id);
        assert_eq!(routed(""), Some(RangeId::FIRST));
        assert_eq!(routed("l\u{7f}"), Some(RangeId::FIRST));
        assert_eq!(routed("m"), Some(RangeId(2)));
        assert_eq!(routed("zzz"), Some(RangeId(2)));
        assert_eq!(tables.local_ranges().len(), 2);
    }

    /// A node that holds the left half of a split but no longer the right half: a key of the
    /// right half is not local (the router sends it to the right half's replicas).
    fn split_half_gone() -> RangeTables {
        let tables = RangeTables::default();
        let left = RangeDescriptor {
            id: RangeId::FIRST,
            ..span("", Some("m"))
        };
        tables.set_local(vec![left]);
        tables
    }

    #[test]
    fn a_key_no_local_range_holds_is_not_local() {
        let tables = split_half_gone();
        let routed = |key: &str| tables.local(key.as_bytes()).map(|range| range.id);
        assert_eq!(routed("a"), Some(RangeId::FIRST));
        assert_eq!(routed("n"), None);
    }

    #[cfg(feature = "planted-bugs")]
    #[test]
    fn planted_stale_span_routes_a_key_to_the_range_below_it() {
        planted::check_planted(PlantedBug::StaleSpan, || {
            let tables = split_half_gone();
            let routed = |key: &str| tables.local(key.as_bytes()).map(|range| range.id);
            assert_eq!(routed("a"), Some(RangeId::FIRST));
            assert_eq!(routed("n"), Some(RangeId::FIRST));
        });
    }
}
