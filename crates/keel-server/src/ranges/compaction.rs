//! The history compaction loop: every `cleanup_interval_ms`, each data range this node holds
//! a replica of (leader or not: compaction is local to the replica and not replicated)
//! removes the events its retention (`history_retention_ms`, `history_retention_bytes`) lets
//! go (`StateMachine::compact_history`). A range whose applied index has not moved since its
//! last round is left alone until its oldest kept event passes the age bound (`rounds`): only
//! an apply can add events or bytes. Knows nothing of gRPC.

use std::sync::Arc;
use std::time::Duration;

use keel_raft::RaftGroup;
use keel_storage::HistoryRetention;

use crate::ranges::rounds;
use crate::shared::Shared;

/// Runs until the node shuts down (the task is aborted then). The meta range keeps no events.
pub(crate) async fn run(shared: Arc<Shared>) {
    let interval = Duration::from_millis(shared.kv.cleanup_interval_ms);
    let retention = HistoryRetention {
        max_age_ms: shared.kv.history_retention_ms,
        max_bytes: shared.kv.history_retention_bytes,
    };
    let round = move |group: Arc<RaftGroup>, now_ms| async move {
        group
            .state_machine()
            .compact_history(now_ms, retention)
            .await
    };
    rounds::run(shared, interval, "history compaction", |_| true, round).await
}
