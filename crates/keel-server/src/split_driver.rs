//! The split driver: every `split.check_interval_ms`, each range this node leads (never the
//! meta range) is weighed against the split policy (`keel_meta::plan_split`): its size and
//! key count from its state machine, its load from `shared.load`. When the plan says split,
//! the key comes from the storage for size (the key halving the range's bytes) and from the
//! sampled request keys for load (`keel_meta::load_split_key`), and `splits::split_range`
//! carries the split out, the same path as `Cluster.Split`. The driver awaits each split
//! before the next check, so at most one of its splits is in flight on a node. Failures are
//! logged and the range is weighed again next round. A range's counts are read from storage
//! only when something was applied to it since the last check (`applied_cache`), so idle
//! ranges cost no read. Knows nothing of gRPC.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use keel_meta::{RangeLoad, SplitPolicy, SplitReason, plan_split};
use keel_raft::RaftGroup;
use keel_storage::RangeCounts;
use keel_types::validate::show_key;
use keel_types::{KvError, RangeId};
use tracing::{debug, info, warn};

use crate::applied_cache::ByApplied;
use crate::config::SplitSettings;
use crate::shared::Shared;

/// Runs until the node shuts down (the task is aborted then).
pub(crate) async fn run(shared: Arc<Shared>) {
    let settings = shared.kv.split;
    let policy = policy(&settings);
    let mut tick = tokio::time::interval(Duration::from_millis(settings.check_interval_ms));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut counts: ByApplied<RangeCounts> = ByApplied::default();
    loop {
        tick.tick().await;
        if shared.health.check().is_err() {
            continue;
        }
        let groups = shared.groups.all();
        let hosted: HashSet<RangeId> = groups.iter().map(|group| group.range()).collect();
        shared.load.retain(|range| hosted.contains(&range));
        counts.retain(|range| hosted.contains(&range));
        for group in groups {
            let leads = group.leader().map(|(id, _)| id) == Some(shared.node_id);
            if group.range() == RangeId::META || !leads {
                continue;
            }
            check(&shared, &group, &policy, &mut counts).await;
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
    let rate = shared.load.requests_per_sec(range);
    match crate::splits::split_range(shared, group, at.clone()).await {
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
    let at = match reason {
        SplitReason::Size => state_machine.split_key().await.map_err(storage)?,
        SplitReason::Load => {
            let span = state_machine.descriptor().await.map_err(storage)?;
            shared.load.split_key(&span)
        }
    };
    if at.is_none() {
        debug!(
            %range, %reason, keys = load.keys, size_bytes = load.size_bytes,
            "no key divides the range; not splitting"
        );
    }
    Ok(at.map(|at| (reason, at)))
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
