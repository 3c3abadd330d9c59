//! The node's range tables, routing by key, and the task that keeps the node's groups in step
//! with its store and with the meta range. Knows nothing of gRPC messages.
//!
//! - The *local* table holds the ranges with applied state in this node's store (never the
//!   meta range, which owns no key), by start key. A request is served by the local range
//!   whose span holds its key. The table is refreshed after every range event of the store
//!   (a split applied, a snapshot installed) and whenever an apply answers `KeyOutOfRange`.
//! - The *meta* table is this node's cache of the meta range: descriptors and node addresses.
//!   A key no local range holds goes to a replica it names; it is refreshed on such a miss and
//!   every `META_REFRESH_MS`.
//!
//! The watcher starts a group for every range of the store, and for every range the meta
//! table says this node replicates when no local range with state overlaps it (a replica
//! that missed the split, as when its parent caught up from a snapshot taken after it: it
//! gets the new range by snapshot), unless it still waits for the first range from the
//! bootstrap. A group is never started for a range that overlaps a local range with state,
//! and such a snapshot is refused (`keel_raft::Groups`). After each read of the meta range it
//! collects the replicas this node should no longer have (`replicas::collect_garbage`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use keel_meta::RangeTable;
use keel_raft::RaftGroup;
use keel_types::planted::{self, PlantedBug};
use keel_types::validate::show_key;
use keel_types::{
    KvError, MetaMembers, NodeAddr, NodeDescriptor, NodeId, RangeDescriptor, RangeId,
};
use tokio::time::MissedTickBehavior;
use tracing::{debug, warn};

use crate::meta_client;
use crate::replicas;
use crate::shared::Shared;

/// How often the watcher reads the meta range.
const META_REFRESH_MS: u64 = 2_000;
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
    fn meta_miss_may_refresh(&self) -> bool {
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

/// The group of the local range holding `key`. A key no local range holds is answered
/// `NotLeader` naming a replica from the meta table (the router forwards it there once), or
/// `Unavailable` when the meta table names none either.
pub(crate) async fn route(shared: &Shared, key: &[u8]) -> Result<Arc<RaftGroup>, KvError> {
    shared.health.check()?;
    if let Some(range) = shared.ranges.local(key) {
        return shared.ensure_group(range.id).await;
    }
    // A replica that got its first state from a leader (no range event) is not in the table.
    refresh_local(shared).await?;
    match shared.ranges.local(key) {
        Some(range) => shared.ensure_group(range.id).await,
        None => Err(elsewhere(shared, key).await),
    }
}

/// Reads the store's ranges into the local table and starts a group for any it lacks.
pub(crate) async fn refresh_local(shared: &Shared) -> Result<(), KvError> {
    let descriptors = shared
        .store
        .descriptors()
        .await
        .map_err(|e| KvError::fatal(e.to_string()))?;
    for range in &descriptors {
        shared.ensure_group(range.id).await?;
    }
    shared.ranges.set_local(descriptors);
    Ok(())
}

/// Reads the meta range (the local replica's applied state if this node has one, else the
/// meta leader's) into the meta table.
pub(crate) async fn refresh_meta(shared: &Shared) -> Result<(), KvError> {
    let (ranges, nodes) = meta_client::read_meta(shared).await?;
    shared.ranges.set_meta(ranges, nodes);
    Ok(())
}

/// Runs until the node shuts down (the task is aborted then, or the store closes).
pub(crate) async fn watch(shared: Arc<Shared>) {
    let mut events = shared.store.range_events();
    let mut tick = tokio::time::interval(Duration::from_millis(META_REFRESH_MS));
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        let from_meta = tokio::select! {
            changed = events.changed() => {
                if changed.is_err() {
                    return;
                }
                false
            }
            _ = tick.tick() => true,
        };
        if shared.health.check().is_err() {
            continue;
        }
        if let Err(error) = refresh_local(&shared).await {
            warn!(%error, "reading the store's ranges");
            continue;
        }
        if !from_meta {
            continue;
        }
        if let Err(error) = adopt_from_meta(&shared).await {
            debug!(%error, "reading the meta range; trying again later");
            continue;
        }
        replicas::collect_garbage(&shared).await;
    }
}

/// Starts a group for every range the meta range says this node replicates, when no local
/// range with state overlaps it.
async fn adopt_from_meta(shared: &Shared) -> Result<(), KvError> {
    refresh_meta(shared).await?;
    // The first range without state owns the whole keyspace as soon as it applies its first
    // entries from the bootstrap's log: a range adopted before that would be overwritten by
    // its replay.
    if shared.awaits_bootstrap(RangeId::FIRST) {
        return Ok(());
    }
    for range in shared.ranges.meta_ranges() {
        let named = range.replicas.contains(&shared.node_id);
        if !named || shared.groups.get(range.id).is_some() {
            continue;
        }
        let local = shared.ranges.local_ranges();
        if local.iter().any(|other| overlaps(other, &range)) {
            continue;
        }
        debug!(%range, "starting a replica the meta range names");
        shared.ensure_group(range.id).await?;
    }
    Ok(())
}

/// Where a key no local range holds is served: a replica of its range in the meta table
/// (refreshed first when it knows no such range), as a `NotLeader` hint.
async fn elsewhere(shared: &Shared, key: &[u8]) -> KvError {
    let mut found = shared.ranges.meta_lookup(key);
    if found.is_none() && shared.ranges.meta_miss_may_refresh() {
        if let Err(error) = refresh_meta(shared).await {
            debug!(%error, "reading the meta range for a key no local range holds");
        }
        found = shared.ranges.meta_lookup(key);
    }
    let replica = found.as_ref().and_then(|range| {
        range
            .replicas
            .iter()
            .filter(|id| **id != shared.node_id)
            .find_map(|id| Some((*id, node_addr(shared, *id)?)))
    });
    match (found, replica) {
        (Some(range), Some(replica)) => KvError::NotLeader {
            range_id: range.id,
            leader: Some(replica),
        },
        (Some(range), None) => KvError::unavailable(format!(
            "range {range} holds key {} and has no replica node {} can reach (replicas {:?})",
            show_key(key),
            shared.node_id,
            range.replicas
        )),
        (None, _) => KvError::unavailable(format!(
            "no range on node {} holds key {} and the meta range names none",
            shared.node_id,
            show_key(key)
        )),
    }
}

/// Another node to ask about `range` when this node does not lead it: the meta range's
/// leader or a voter of it (the meta range), else a replica the meta table names.
pub(crate) fn replica_hint(shared: &Shared, range: RangeId) -> Option<(NodeId, NodeAddr)> {
    let me = shared.node_id;
    if range == RangeId::META {
        let members = shared.ranges.meta_members();
        let leader = members.leader.filter(|id| *id != me);
        let preferred = leader
            .into_iter()
            .chain(members.voters.iter().map(|v| v.id));
        return preferred
            .filter(|id| *id != me)
            .find_map(|id| Some((id, node_addr(shared, id)?)));
    }
    let recorded = shared.ranges.meta_ranges();
    let range = recorded.into_iter().find(|recorded| recorded.id == range)?;
    range
        .replicas
        .into_iter()
        .filter(|id| *id != me)
        .find_map(|id| Some((id, node_addr(shared, id)?)))
}

/// A node's address: as the meta range records it, as the initial cluster lists it, or as
/// the meta range's members name it.
pub(crate) fn node_addr(shared: &Shared, node: NodeId) -> Option<NodeAddr> {
    shared
        .ranges
        .meta_addr(node)
        .or_else(|| shared.cluster.get(&node).map(NodeAddr::new))
        .or_else(|| {
            let members = shared.ranges.meta_members();
            let voter = members.voters.into_iter().find(|voter| voter.id == node);
            voter.map(|voter| voter.addr)
        })
}

/// Whether two spans share a key.
fn overlaps(a: &RangeDescriptor, b: &RangeDescriptor) -> bool {
    let before = |key: &[u8], end: Option<&[u8]>| end.is_none_or(|end| key < end);
    before(&a.start, b.end()) && before(&b.start, a.end())
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
mod tests {
    use super::*;

    fn span(start: &str, end: Option<&str>) -> RangeDescriptor {
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
    fn spans_overlap_when_they_share_a_key() {
        let cases = [
            (span("", None), span("m", None), true),
            (span("", Some("m")), span("m", None), false),
            (span("a", Some("c")), span("b", Some("d")), true),
            (span("a", Some("b")), span("c", Some("d")), false),
            (span("c", None), span("a", Some("c")), false),
            (span("c", None), span("a", Some("c\0")), true),
        ];
        for (a, b, expected) in cases {
            assert_eq!(overlaps(&a, &b), expected, "{a} / {b}");
            assert_eq!(overlaps(&b, &a), expected, "{b} / {a}");
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
