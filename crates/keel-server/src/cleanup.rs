//! The leader's cleanup loop: every `cleanup_interval_ms`, each data range this node leads
//! (never the meta range) looks for keys whose TTL has passed, client sessions idle longer
//! than the dedup window, lock records that became free and idempotency records that expired,
//! and proposes their removal through Raft in bounded batches. All of them are already hidden from reads; this only
//! reclaims their space. Knows nothing of gRPC.

use std::sync::Arc;
use std::time::Duration;

use keel_raft::RaftGroup;
use keel_types::{Command, KvError, RangeId};
use tracing::debug;

use crate::shared::Shared;

/// Runs until the node shuts down (the task is aborted then).
pub(crate) async fn run(shared: Arc<Shared>) {
    let interval = Duration::from_millis(shared.kv.cleanup_interval_ms);
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if shared.health.check().is_err() {
            continue;
        }
        for group in shared.groups.all() {
            // The meta range keeps no keys, sessions, locks or records to clean up.
            if group.range() == RangeId::META || !group.is_leader() {
                continue;
            }
            if let Err(error) = clean(&shared, &group).await {
                debug!(range = %group.range(), %error, "cleanup round failed; retrying next round");
            }
            if let Err(error) = reclaim(&shared, &group).await {
                debug!(range = %group.range(), %error, "reclaim round failed; retrying next round");
            }
        }
    }
}

/// One cleanup round of one group: plan from a read of the state machine, then propose.
/// Applying the cleanup checks every item again, so a plan that went stale is harmless.
async fn clean(shared: &Shared, group: &RaftGroup) -> Result<(), KvError> {
    let now_ms = shared.clock.now_ms();
    let idle_before_ms = now_ms.saturating_sub(shared.kv.dedup_window_ms);
    let cleanup = group
        .state_machine()
        .plan_cleanup(now_ms, idle_before_ms)
        .await
        .map_err(|e| KvError::fatal(e.to_string()))?;
    if cleanup.is_empty() {
        return Ok(());
    }
    debug!(
        range = %group.range(),
        keys = cleanup.keys.len(),
        sessions = cleanup.sessions.len(),
        "proposing cleanup"
    );
    group.write(Command::Cleanup(cleanup)).await.map(|_| ())
}

/// One reclaim round of one group: free lock records and expired idempotency records, planned
/// from a read and checked again when applied.
async fn reclaim(shared: &Shared, group: &RaftGroup) -> Result<(), KvError> {
    let reclaim = group
        .state_machine()
        .plan_reclaim(shared.clock.now_ms())
        .await
        .map_err(|e| KvError::fatal(e.to_string()))?;
    if reclaim.is_empty() {
        return Ok(());
    }
    debug!(
        range = %group.range(),
        locks = reclaim.locks.len(),
        records = reclaim.records.len(),
        "proposing reclaim"
    );
    group.write(Command::Reclaim(reclaim)).await.map(|_| ())
}
