//! The standard `grpc.health.v1` statuses: the overall service "" and each `keel.v1` service
//! are SERVING while the node is healthy (store not poisoned, no Raft group stopped, not
//! shutting down) and every range it hosts has a leader it can count on; NOT_SERVING
//! otherwise (an election, a node cut off from its peers, a failure). `keel.raft.v1.Raft`
//! follows the node's own health: an election never turns it NOT_SERVING, so probes that
//! ask it never restart or unready a node for one. After a start, both also wait for the
//! cluster's leaders to settle (`LeaderSettling`), once and for at most
//! `LEADERS_SETTLE_WAIT_MAX_MS`. A background task re-judges every
//! `HEALTH_REPORT_INTERVAL_MS` and changes a status only when the verdict changes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use keel_proto::raft::raft_server;
use keel_proto::v1::{cluster_server, idempotency_server, kv_server, lock_server};
use keel_raft::RaftGroup;
use tokio::time::MissedTickBehavior;
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;
use tracing::{info, warn};

use crate::shared::Shared;

/// How often the statuses are judged again.
const HEALTH_REPORT_INTERVAL_MS: u64 = 200;

/// The services whose status follows the whole verdict: "" (the server) and the public API.
pub(crate) const PUBLIC: &[&str] = &[
    "",
    kv_server::SERVICE_NAME,
    lock_server::SERVICE_NAME,
    idempotency_server::SERVICE_NAME,
    cluster_server::SERVICE_NAME,
];

/// The service whose status follows the node's own verdict (`node_verdict`).
pub(crate) const RAFT: &str = raft_server::SERVICE_NAME;

/// Whether the node itself serves (`keel.raft.v1.Raft`, `/healthz`), or why not: it is
/// healthy and, after a start, the cluster's leaders settled (`LeaderSettling`).
pub(crate) fn node_verdict(shared: &Shared) -> Result<(), String> {
    let (healthy, message) = shared.health.summary();
    if !healthy {
        return Err(message);
    }
    shared.settling.gate(Instant::now())
}

/// Whether the node serves its ranges (`""`, the public services, `/readyz`), or why not.
/// The first time it does, leader settling stops holding it back.
pub(crate) fn verdict(shared: &Shared) -> Result<(), String> {
    let (healthy, message) = shared.health.summary();
    if !healthy {
        return Err(message);
    }
    let quorum_ack_max = quorum_ack_max(shared);
    for group in shared.groups.all() {
        // A group without a membership waits for its first state (a replica on its way).
        if group.members().is_empty() {
            continue;
        }
        if !leader_known(shared, &group, quorum_ack_max) {
            return Err(format!("range {} has no leader", group.range()));
        }
    }
    shared.settling.gate(Instant::now())?;
    shared.settling.pass();
    Ok(())
}

/// Whether `group`'s replica here knows a leader it can count on (`RaftGroup::leader_known`),
/// or leads it quiesced while a quorum of its voters, this node included, are not silent
/// (`LastHeard::silent`: their pings arrive): a quiet group has no Raft traffic to count on,
/// and its followers wake and elect another once this node has been silent that long.
pub(crate) fn leader_known(shared: &Shared, group: &RaftGroup, quorum_ack_max: Duration) -> bool {
    if group.leader_known(quorum_ack_max) {
        return true;
    }
    if !(group.is_quiesced() && group.is_leader()) {
        return false;
    }
    let heard = shared.heartbeats.last_heard();
    let now = Instant::now();
    let voters = group.voter_ids();
    let live = voters
        .iter()
        .filter(|id| **id == shared.node_id || !heard.silent(**id, now, Duration::ZERO))
        .count();
    live > voters.len() / 2
}

/// How long a leader may go without a quorum's acknowledgement and still count as the
/// leader: the longest election timeout (by then its followers elect another).
pub(crate) fn quorum_ack_max(shared: &Shared) -> Duration {
    Duration::from_millis(shared.timings.election_timeout_ms_max)
}

/// A reporter with every status NOT_SERVING, until the task judges.
pub(crate) async fn not_serving(reporter: &HealthReporter) {
    for name in PUBLIC.iter().chain([&RAFT]) {
        reporter
            .set_service_status(name, ServingStatus::NotServing)
            .await;
    }
}

/// Keeps the statuses current until the task is aborted.
pub(crate) async fn run(shared: Arc<Shared>, reporter: HealthReporter) {
    let mut tick = tokio::time::interval(Duration::from_millis(HEALTH_REPORT_INTERVAL_MS));
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut last: Option<(bool, bool)> = None;
    loop {
        tick.tick().await;
        let verdict = verdict(&shared);
        let now = (verdict.is_ok(), node_verdict(&shared).is_ok());
        if last == Some(now) {
            continue;
        }
        match &verdict {
            Ok(()) => info!("health: serving"),
            Err(reason) => warn!(%reason, "health: not serving"),
        }
        for name in PUBLIC {
            reporter.set_service_status(name, status(now.0)).await;
        }
        reporter.set_service_status(RAFT, status(now.1)).await;
        last = Some(now);
    }
}

fn status(serving: bool) -> ServingStatus {
    match serving {
        true => ServingStatus::Serving,
        false => ServingStatus::NotServing,
    }
}
