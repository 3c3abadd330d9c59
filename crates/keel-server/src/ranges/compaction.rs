//! The history compaction loop: every `cleanup_interval_ms`, each data range this node holds
//! a replica of (leader or not: compaction is local to the replica and not replicated)
//! removes the events its retention (`history_retention_ms`, `history_retention_bytes`) lets
//! go (`StateMachine::compact_history`). A range whose applied index has not moved since its
//! last round is left alone until its oldest kept event passes the age bound
//! (`shared::applied_cache`): only an apply can add events or bytes. Knows nothing of gRPC.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use keel_storage::HistoryRetention;
use keel_types::RangeId;
use tracing::debug;

use crate::shared::Shared;
use crate::shared::applied_cache::ByApplied;

/// Runs until the node shuts down (the task is aborted then).
pub(crate) async fn run(shared: Arc<Shared>) {
    let interval = Duration::from_millis(shared.kv.cleanup_interval_ms);
    let retention = HistoryRetention {
        max_age_ms: shared.kv.history_retention_ms,
        max_bytes: shared.kv.history_retention_bytes,
    };
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // When each range's oldest kept event passes the age bound, as of its applied index.
    let mut due: ByApplied<Option<u64>> = ByApplied::default();
    loop {
        tick.tick().await;
        if shared.health.check().is_err() {
            continue;
        }
        let groups = shared.groups.all();
        let hosted: BTreeSet<RangeId> = groups.iter().map(|group| group.range()).collect();
        due.retain(|range| hosted.contains(&range));
        for group in groups {
            // The meta range keeps no events.
            if group.range() == RangeId::META {
                continue;
            }
            let (range, applied) = (group.range(), group.applied_index());
            let now_ms = shared.clock.now_ms();
            let waiting = |next: &Option<u64>| next.is_none_or(|next| now_ms < next);
            if due.get(range, applied).is_some_and(waiting) {
                continue;
            }
            match group
                .state_machine()
                .compact_history(now_ms, retention)
                .await
            {
                Ok(next) => due.insert(range, applied, next),
                Err(error) => {
                    debug!(%range, %error, "history compaction failed; retrying next round");
                    due.remove(range);
                }
            }
        }
    }
}
