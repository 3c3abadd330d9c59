//! Routing by key: the group of the local range that holds a key, or where else it is
//! served (a replica the meta table names, as a `NotLeader` hint); refreshing the local table
//! from the store (after every range event, and whenever an apply answers `KeyOutOfRange`)
//! and the meta table from the meta range (on a miss, at most every `META_MISS_REFRESH_MS`,
//! and by the watcher); and starting a group for every range the meta table says this node
//! replicates when no local range with state overlaps it (a replica that missed the split,
//! as when its parent caught up from a snapshot taken after it: it gets the new range by
//! snapshot), unless it still waits for the first range from the bootstrap. A group is never
//! started for a range that overlaps a local range with state, and such a snapshot is refused
//! (`keel_raft::Groups`). The tables themselves are `shared::range_tables`. Knows nothing of
//! gRPC messages.

use std::sync::Arc;

use keel_raft::RaftGroup;
use keel_types::validate::show_key;
use keel_types::{KvError, RangeDescriptor, RangeId};
use tracing::debug;

use crate::ranges::meta;
use crate::shared::Shared;

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
    let now_ms = shared.clock.now_ms();
    shared.events.observe_ranges(now_ms, &descriptors);
    shared.ranges.set_local(descriptors);
    Ok(())
}

/// Reads the meta range (the local replica's applied state if this node has one, else the
/// meta leader's) into the meta table.
pub(crate) async fn refresh_meta(shared: &Shared) -> Result<(), KvError> {
    let (ranges, nodes) = meta::read_meta(shared).await?;
    shared.ranges.set_meta(ranges, nodes);
    Ok(())
}

/// Starts a group for every range the meta range says this node replicates, when no local
/// range with state overlaps it.
pub(crate) async fn adopt_from_meta(shared: &Shared) -> Result<(), KvError> {
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
            .find_map(|id| Some((*id, shared.node_addr(*id)?)))
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

/// Whether two spans share a key.
fn overlaps(a: &RangeDescriptor, b: &RangeDescriptor) -> bool {
    let before = |key: &[u8], end: Option<&[u8]>| end.is_none_or(|end| key < end);
    before(&a.start, b.end()) && before(&b.start, a.end())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shared::range_tables::tests::span;

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
}
