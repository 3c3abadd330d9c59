//! The rebalancer: on the meta range's leader, as soon as it leads and then every
//! `rebalance_interval_ms`, it gathers the cluster (`placement::gather`), asks
//! `keel_meta::plan_rebalance` what to change, and carries the actions out through each
//! range's leader (`Raft.ChangeReplicas`, or `Cluster.TransferLeader`), at most
//! `RebalancePolicy::actions_max` at a time and one per range. A range is left alone for a
//! short while after its action, so the next plan sees the heartbeats that report the
//! change; until then a range handed to a new leader counts as led by it
//! (`ClusterView::mark_busy`). A draining node that holds nothing any more is marked
//! removed. It judges whether the leaders settled (`LeaderSettling`) after each look and,
//! between looks, every heartbeat interval. Knows nothing of how a replica is moved.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use keel_meta::{Action, RebalancePolicy, plan_rebalance};
use keel_proto::raft::raft_client::RaftClient;
use keel_proto::v1::TransferLeaderRequest;
use keel_proto::v1::cluster_client::ClusterClient;
use keel_raft::RaftGroup;
use keel_types::{
    KvError, MetaCommand, NodeAddr, NodeId, NodeState, RangeDescriptor, RangeId, ReplicaChange,
};
use tracing::{debug, info};

use crate::cluster::nodes;
use crate::cluster::placement::{self, ClusterView};
use crate::peer::call::PeerCall;
use crate::ranges::meta;
use crate::ranges::replicas;
use crate::shared::Shared;
use crate::shared::heartbeats::{HEARTBEAT_INTERVAL_MS, PING_INTERVAL_MS};

/// After its action succeeded, a range is left alone this long: the heartbeats of its leader
/// report the change within it.
const SETTLE_MS: u64 = 3 * HEARTBEAT_INTERVAL_MS;
/// After its action failed, a range is left alone this long.
const BACKOFF_MS: u64 = 10 * HEARTBEAT_INTERVAL_MS;

/// Ranges with an action in flight or settling, and until when.
#[derive(Default)]
struct Busy {
    ranges: Mutex<BTreeMap<RangeId, Pending>>,
}

/// One busy range.
#[derive(Debug, Clone, Copy)]
struct Pending {
    /// When its pause ends; `None` while its action is in flight.
    until: Option<Instant>,
    /// The node a leader transfer in flight or done hands it to: its leader until the
    /// heartbeats report one (they may still name the old leader for a while).
    leader: Option<NodeId>,
}

impl Busy {
    /// Ranges busy now, with the leader each is handed to; forgets the ones whose pause is
    /// over.
    fn now(&self) -> BTreeMap<RangeId, Option<NodeId>> {
        let mut ranges = self.lock();
        let now = Instant::now();
        ranges.retain(|_, pending| pending.until.is_none_or(|until| until > now));
        ranges
            .iter()
            .map(|(range, pending)| (*range, pending.leader))
            .collect()
    }

    fn in_flight(&self) -> usize {
        self.lock()
            .values()
            .filter(|pending| pending.until.is_none())
            .count()
    }

    fn start(&self, action: &Action) {
        let leader = match action {
            Action::TransferLeader { to, .. } => Some(*to),
            _ => None,
        };
        let pending = Pending {
            until: None,
            leader,
        };
        self.lock().insert(action.range(), pending);
    }

    /// The action on `range` ended: the range pauses `pause_ms`, still handed to its new
    /// leader if the action `succeeded`.
    fn finish(&self, range: RangeId, pause_ms: u64, succeeded: bool) {
        let until = Some(Instant::now() + Duration::from_millis(pause_ms));
        let mut ranges = self.lock();
        let leader = ranges.get(&range).and_then(|pending| pending.leader);
        let leader = leader.filter(|_| succeeded);
        ranges.insert(range, Pending { until, leader });
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<RangeId, Pending>> {
        self.ranges
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Runs until the node shuts down (the task is aborted then).
pub(crate) async fn run(shared: Arc<Shared>) {
    let busy = Arc::new(Busy::default());
    let interval = Duration::from_millis(shared.placement.rebalance_interval_ms);
    // Between the looks that act, whether the leaders settled is judged again this often: a
    // node heard from only after a look does not wait for the next one to report ready.
    let judge_every = interval.min(Duration::from_millis(HEARTBEAT_INTERVAL_MS));
    // While this node leads the meta range: when its next look acts.
    let mut next_act: Option<Instant> = None;
    loop {
        let wait = match next_act {
            Some(at) => at
                .saturating_duration_since(Instant::now())
                .min(judge_every),
            None => Duration::from_millis(PING_INTERVAL_MS),
        };
        tokio::time::sleep(wait).await;
        if shared.health.check().is_err() {
            continue;
        }
        let Some(meta) = shared.groups.get(RangeId::META).filter(|g| g.is_leader()) else {
            next_act = None;
            shared.settling.judge(None);
            continue;
        };
        // A node that takes the meta range acts at once, then every interval: starting nodes
        // wait for a judgement to report ready (`LeaderSettling`).
        let now = Instant::now();
        let acts = now >= *next_act.get_or_insert(now);
        if acts {
            next_act = Some(now + interval);
        }
        match round(&shared, &meta, &busy, acts).await {
            Ok(settled) => shared.settling.judge(settled),
            Err(error) => {
                shared.settling.judge(None);
                debug!(%error, "rebalancing; trying again");
            }
        }
    }
}

/// One look at the cluster: judges whether the leaders settled and, when it `acts`, starts
/// the planned actions and marks drained nodes removed. Returns the healthy nodes when the
/// look found the leaders settled: nothing planned, nothing in flight or settling, every
/// range's leader known and healthy (`ClusterView::settled`).
async fn round(
    shared: &Arc<Shared>,
    meta: &RaftGroup,
    busy: &Arc<Busy>,
    acts: bool,
) -> Result<Option<BTreeSet<NodeId>>, KvError> {
    let mut view = placement::gather(shared, meta).await?;
    let busy_now = busy.now();
    view.mark_busy(&busy_now);
    if acts {
        mark_drained(shared, &view).await;
    }
    let policy = RebalancePolicy {
        replication_factor: shared.placement.replication_factor as usize,
        ..RebalancePolicy::default()
    };
    let room = policy.actions_max.saturating_sub(busy.in_flight());
    let actions = plan_rebalance(&view.node_views(), &view.ranges, &policy);
    let settled = view.settled(actions.is_empty() && busy_now.is_empty());
    if !acts {
        return Ok(settled);
    }
    let view = Arc::new(view);
    for action in actions.into_iter().take(room) {
        busy.start(&action);
        let (shared, busy, view) = (shared.clone(), busy.clone(), view.clone());
        tokio::spawn(async move {
            info!(%action, "rebalancing");
            match execute(&shared, &view, &action).await {
                Ok(()) => busy.finish(action.range(), SETTLE_MS, true),
                Err(error) => {
                    info!(%action, %error, "rebalancing action failed; retried later");
                    busy.finish(action.range(), BACKOFF_MS, false);
                }
            }
        });
    }
    Ok(settled)
}

/// Marks removed every draining node that holds no replica and leads nothing.
async fn mark_drained(shared: &Shared, view: &ClusterView) {
    for (node, entry) in &view.nodes {
        if entry.state != NodeState::Draining || !view.holds_nothing(*node) {
            continue;
        }
        let command = MetaCommand::SetNodeState {
            node: *node,
            state: NodeState::Removed,
        };
        match meta::propose_meta(shared, command).await {
            Ok(_) => info!(node, "node drained; marked removed"),
            Err(error) => debug!(node, %error, "marking a drained node removed"),
        }
    }
}

/// Carries out one action through its range's leader.
async fn execute(shared: &Shared, view: &ClusterView, action: &Action) -> Result<(), KvError> {
    let range = action.range();
    let leader = view
        .leader_of(range)
        .ok_or_else(|| KvError::unavailable(format!("range {range} has no known leader")))?;
    let addr_of = |node: NodeId| {
        view.addr_of(node)
            .ok_or_else(|| KvError::unavailable(format!("node {node} has no known address")))
    };
    let change = match *action {
        Action::TransferLeader { to, .. } => {
            return transfer(shared, view, range, leader, to).await;
        }
        Action::AddVoter { node, .. } => ReplicaChange::Add {
            node,
            addr: addr_of(node)?,
        },
        Action::Replace { from, to, .. } => ReplicaChange::Replace {
            from,
            to,
            addr: addr_of(to)?,
        },
        Action::RemoveVoter { node, .. } => ReplicaChange::Remove { node },
        Action::RemoveLearner { node, .. } => ReplicaChange::RemoveLearner { node },
        Action::FinishChange { .. } => ReplicaChange::Finish,
    };
    change_on(shared, view, range, leader, &change)
        .await
        .map(|_| ())
}

/// `change` of `range`'s replicas, on `leader` (this node or a peer).
async fn change_on(
    shared: &Shared,
    view: &ClusterView,
    range: RangeId,
    leader: NodeId,
    change: &ReplicaChange,
) -> Result<RangeDescriptor, KvError> {
    if leader == shared.node_id {
        return replicas::change(shared, range, change).await;
    }
    let addr = view
        .addr_of(leader)
        .ok_or_else(|| KvError::unavailable(format!("node {leader} has no known address")))?;
    change_through(shared, leader, &addr, range, change).await
}

/// `change` of `range`'s replicas sent to peer `leader` at `addr` (`Raft.ChangeReplicas`),
/// which forwards it once when it no longer leads the range. Waits as long as the change may
/// take: a snapshot to the new replica and its catching up.
pub(crate) async fn change_through(
    shared: &Shared,
    leader: NodeId,
    addr: &NodeAddr,
    range: RangeId,
    change: &ReplicaChange,
) -> Result<RangeDescriptor, KvError> {
    let catch_up = shared.timings.snapshot_timeout_ms + shared.timings.write_timeout_ms;
    let call = PeerCall {
        node: leader,
        addr,
        range,
        payload: change,
        forward: true,
        write: true,
        deadline: shared.forward_deadline(true) + Duration::from_millis(catch_up),
    };
    call.send(
        &shared.peers,
        shared.node_id,
        |mut client: RaftClient<_>, message| async move { client.change_replicas(message).await },
    )
    .await
}

/// Hands `range`'s leadership from `leader` to `to`.
async fn transfer(
    shared: &Shared,
    view: &ClusterView,
    range: RangeId,
    leader: NodeId,
    to: NodeId,
) -> Result<(), KvError> {
    if leader == shared.node_id {
        return shared.group(range)?.transfer_leader(to).await;
    }
    let addr = view
        .addr_of(leader)
        .ok_or_else(|| KvError::unavailable(format!("node {leader} has no known address")))?;
    let request = TransferLeaderRequest {
        range_id: range.0,
        node_id: to,
        no_forward: false,
    };
    let transfer =
        |mut cluster: ClusterClient<_>| async move { cluster.transfer_leader(request).await };
    nodes::remote(shared, leader, addr, false, transfer).await?;
    Ok(())
}
