//! The split driver: every `split.check_interval_ms`, each range this node leads (never the
//! meta range) is weighed against the split policy (`keel_meta::plan_split`): its size and
//! key count from its state machine, its load from `shared.load`. When the plan says split,
//! the key comes from the storage for size (the key halving the range's bytes) and from the
//! sampled request keys for load (`keel_meta::load_split_key`), and `split::split_range`
//! carries the split out, the same path as `Cluster.Split`. A split for load is declined
//! (and counted, `keel_load_splits_declined_total`) while every live node (heard from within
//! `SUSPECT_AFTER_MS`) already holds a replica of the range (`keel_meta::load_split_has_room`).
//! Before any of that, a range a
//! bound of a tenant's namespace lies inside splits there (`keel_meta::boundary_split_key`),
//! so that each namespace is a whole number of ranges. The driver awaits each split
//! before the next check, so at most one of its splits is in flight on a node. Failures are
//! logged and the range is weighed again next round. A range's counts are read from storage
//! only when something was applied to it since the last check (`shared::applied_cache`), so idle
//! ranges cost no read. The thresholds are read again every round from `shared.split`
//! (`SplitThresholds`): the configuration's, unless a test changed them while the node runs.
//! Knows nothing of gRPC.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use keel_meta::{
    RangeLoad, SplitPolicy, SplitReason, boundary_split_key, load_split_has_room, may_split,
    plan_split, unpinned_split_key,
};
use keel_raft::RaftGroup;
use keel_storage::RangeCounts;
use keel_types::validate::show_key;
use keel_types::{KvError, RangeId};
use tracing::{debug, info, warn};

use crate::config::SplitSettings;
use crate::shared::Shared;
use crate::shared::applied_cache::ByApplied;
use crate::shared::heartbeats::SUSPECT_AFTER_MS;

/// Runs until the node shuts down (the task is aborted then).
pub(crate) async fn run(shared: Arc<Shared>) {
    let interval = Duration::from_millis(shared.split.get().check_interval_ms);
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut counts: ByApplied<RangeCounts> = ByApplied::default();
    loop {
        tick.tick().await;
        if shared.health.check().is_err() {
            continue;
        }
        let policy = policy(&shared.split.get());
        let groups = shared.groups.all();
        let hosted: HashSet<RangeId> = groups.iter().map(|group| group.range()).collect();
        shared.load.retain(|range| hosted.contains(&range));
        counts.retain(|range| hosted.contains(&range));
        let boundaries = boundary_splits(&shared);
        for group in groups {
            let leads = group.leader().map(|(id, _)| id) == Some(shared.node_id);
            if group.range() == RangeId::META || !leads {
                continue;
            }
            match boundaries.get(&group.range()) {
                Some(at) => split(&shared, &group, SplitReason::Boundary, at.clone()).await,
                None => check(&shared, &group, &policy, &mut counts).await,
            }
        }
    }
}

/// The policy the settings describe.
fn policy(settings: &SplitSettings) -> SplitPolicy {
    SplitPolicy {
        range_bytes_max: settings.range_bytes_max,
        requests_per_sec_max: settings.requests_per_sec_max,
        load_secs: settings.load_secs,
    }
}

/// The local ranges a bound of a tenant's namespace lies inside, and that bound: they split
/// there before anything else (with authentication off, none).
fn boundary_splits(shared: &Shared) -> HashMap<RangeId, Vec<u8>> {
    let Some(access) = &shared.access else {
        return HashMap::new();
    };
    let bounds: Vec<&[u8]> = access
        .tenants()
        .iter()
        .flat_map(|tenant| [tenant.namespace.start(), tenant.namespace.end()])
        .collect();
    let local = shared.ranges.local_ranges();
    local
        .iter()
        .filter_map(|range| Some((range.id, boundary_split_key(range, bounds.iter().copied())?)))
        .collect()
}

/// Weighs one range and splits it if the plan says so.
async fn check(
    shared: &Shared,
    group: &RaftGroup,
    policy: &SplitPolicy,
    counts: &mut ByApplied<RangeCounts>,
) {
    let range = group.range();
    let (reason, at) = match plan(shared, group, policy, counts).await {
        Ok(Some(planned)) => planned,
        Ok(None) => return,
        Err(error) => {
            debug!(%range, %error, "split check failed; checking again next round");
            return;
        }
    };
    split(shared, group, reason, at).await;
}

/// Splits `group`'s range at `at` for `reason`, logging what came of it.
async fn split(shared: &Shared, group: &RaftGroup, reason: SplitReason, at: Vec<u8>) {
    let range = group.range();
    let rate = shared.load.requests_per_sec(range);
    match crate::ranges::split::split_range(shared, group, at.clone()).await {
        Ok((left, right)) => {
            // The load counted so far is of the whole parent; both halves start afresh.
            shared.load.forget(range);
            info!(
                %range, %reason, at = %show_key(&at), %left, %right, requests_per_sec = rate,
                "split range"
            );
        }
        Err(error @ (KvError::NotLeader { .. } | KvError::EpochMismatch { .. })) => {
            debug!(
                %range, %reason, %error,
                "split raced a leader change or another split; checking again next round"
            );
        }
        Err(error) => {
            warn!(
                %range, %reason, at = %show_key(&at), %error,
                "split failed; trying again next round"
            );
        }
    }
}

/// Reads what the decision needs, decides, and picks the split key: `None` when the range
/// should not split or no key divides it. The range's size and key count are read again only
/// when something was applied to it since the last read (`counts`); its load is in memory.
async fn plan(
    shared: &Shared,
    group: &RaftGroup,
    policy: &SplitPolicy,
    known: &mut ByApplied<RangeCounts>,
) -> Result<Option<(SplitReason, Vec<u8>)>, KvError> {
    let range = group.range();
    let state_machine = group.state_machine();
    let applied = group.applied_index();
    let counts = match known.get(range, applied) {
        Some(counts) => *counts,
        None => {
            let counts = state_machine.counts().await.map_err(storage)?;
            known.insert(range, applied, counts);
            counts
        }
    };
    let load = RangeLoad {
        size_bytes: counts.size_bytes,
        keys: counts.keys,
        requests_per_sec_history: shared.load.history(range),
    };
    let Some(reason) = plan_split(&load, policy) else {
        return Ok(None);
    };
    let span = state_machine.descriptor().await.map_err(storage)?;
    if !may_split(&span) {
        return Ok(None);
    }
    let at = match reason {
        SplitReason::Size => state_machine.split_key().await.map_err(storage)?,
        SplitReason::Load => {
            if !load_split_has_room(&span.replicas, live_nodes(shared)) {
                shared
                    .metrics
                    .load_splits_declined
                    .fetch_add(1, Ordering::Relaxed);
                debug!(
                    %range, replicas = ?span.replicas,
                    "every live node holds the range; not splitting it for load"
                );
                return Ok(None);
            }
            shared.load.split_key(&span)
        }
        // `boundary_splits` finds these, before the plan is asked.
        SplitReason::Boundary => return Ok(None),
    };
    // Never inside the etcd namespace: at its bounds, or not at all.
    let at = at.and_then(|at| unpinned_split_key(at, &span));
    if at.is_none() {
        debug!(
            %range, %reason, keys = load.keys, size_bytes = load.size_bytes,
            "no key divides the range; not splitting"
        );
    }
    Ok(at.map(|at| (reason, at)))
}

/// This node and every peer it heard from within `SUSPECT_AFTER_MS`.
fn live_nodes(shared: &Shared) -> Vec<keel_types::NodeId> {
    let now = Instant::now();
    let recent = Duration::from_millis(SUSPECT_AFTER_MS);
    let heard = shared.heartbeats.last_seen().into_iter();
    let peers = heard.filter(|(_, at)| now.saturating_duration_since(*at) < recent);
    std::iter::once(shared.node_id)
        .chain(peers.map(|(node, _)| node))
        .collect()
}

fn storage(error: keel_storage::StorageError) -> KvError {
    KvError::fatal(error.to_string())
}

#[cfg(test)]
mod tests {
    use keel_meta::limits::LOAD_WINDOW_SECS;

    use super::*;
    use crate::config::{KvSettings, RANGE_SPLIT_LOAD_SECS_MAX};

    #[test]
    fn default_settings_are_the_default_policy() {
        let settings = KvSettings::default().split;
        assert_eq!(policy(&settings), SplitPolicy::default());
        assert_eq!(RANGE_SPLIT_LOAD_SECS_MAX, LOAD_WINDOW_SECS as u64);
    }

    #[test]
    fn settings_carry_over_to_the_policy() {
        let settings = SplitSettings {
            range_bytes_max: 4_096,
            requests_per_sec_max: 7,
            load_secs: 3,
            check_interval_ms: 50,
        };
        let expected = SplitPolicy {
            range_bytes_max: 4_096,
            requests_per_sec_max: 7,
            load_secs: 3,
        };
        assert_eq!(policy(&settings), expected);
    }
}
