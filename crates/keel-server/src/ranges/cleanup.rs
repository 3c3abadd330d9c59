//! The leader's cleanup loop: every `cleanup_interval_ms`, each data range this node leads
//! (never the meta range) looks for keys whose TTL has passed, client sessions idle longer
//! than the dedup window, lock records that became free, idempotency records that expired and
//! etcd leases that expired, and proposes their removal through Raft in bounded batches
//! (`Cleanup`, `Reclaim`, `ExpireLeases`). All but the leases are already
//! hidden from reads (an expired lease's keys stay readable until it is revoked, as in etcd);
//! this reclaims their space, and records their removals as events of the
//! range's history (expired keys, free locks and expired records; not idle sessions). Knows
//! nothing of gRPC.
//!
//! One read plans all three commands and says when the range's next item falls due
//! (`StateMachine::plan_upkeep`). A range whose applied index has not moved since is left
//! alone until then (`rounds`): an idle range costs no storage read until a key of it
//! expires, a session idles out or a lock or record falls due, and then it is cleaned up in
//! the round after, quiesced or not (the proposal wakes it).

use std::sync::Arc;
use std::time::Duration;

use keel_raft::RaftGroup;
use keel_types::{Command, KvError};
use tracing::debug;

use crate::ranges::rounds;
use crate::shared::Shared;

/// Runs until the node shuts down (the task is aborted then). The meta range keeps no keys,
/// sessions, locks or records to clean up; only a leader proposes.
pub(crate) async fn run(shared: Arc<Shared>) {
    let interval = Duration::from_millis(shared.kv.cleanup_interval_ms);
    let round = |group: Arc<RaftGroup>, now_ms| {
        let shared = shared.clone();
        async move { upkeep(&shared, &group, now_ms).await }
    };
    rounds::run(
        shared.clone(),
        interval,
        "cleanup",
        |group| group.is_leader(),
        round,
    )
    .await
}

/// One round of one group: plan from one read of the state machine, then propose what is
/// due (every command, even if one fails). Applying each command checks every item
/// again, so a plan that went stale is harmless. Returns when to look again: when the next
/// item falls due, or now if anything was due (once proposed the range has changed).
async fn upkeep(shared: &Shared, group: &RaftGroup, now_ms: u64) -> Result<Option<u64>, KvError> {
    let range = group.range();
    let upkeep = group
        .state_machine()
        .plan_upkeep(now_ms, shared.kv.dedup_window_ms)
        .await
        .map_err(|e| KvError::fatal(e.to_string()))?;
    let (cleanup, reclaim, expire) = (upkeep.cleanup, upkeep.reclaim, upkeep.expire_leases);
    if cleanup.is_empty() && reclaim.is_empty() && expire.leases.is_empty() {
        return Ok(upkeep.next_due_ms);
    }
    let mut cleaned = Ok(());
    if !cleanup.is_empty() {
        debug!(
            %range, keys = cleanup.keys.len(), sessions = cleanup.sessions.len(),
            "proposing cleanup"
        );
        cleaned = propose(group, Command::Cleanup(cleanup)).await;
    }
    let mut reclaimed = Ok(());
    if !reclaim.is_empty() {
        debug!(
            %range, locks = reclaim.locks.len(), records = reclaim.records.len(),
            "proposing reclaim"
        );
        reclaimed = propose(group, Command::Reclaim(reclaim)).await;
    }
    let mut expired = Ok(());
    if !expire.leases.is_empty() {
        debug!(%range, leases = expire.leases.len(), "proposing lease expiry");
        expired = propose(group, Command::ExpireLeases(expire)).await;
    }
    cleaned.and(reclaimed).and(expired).map(|()| Some(now_ms))
}

async fn propose(group: &RaftGroup, command: Command) -> Result<(), KvError> {
    group.write(command).await.map(|_| ())
}
