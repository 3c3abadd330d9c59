//! Node heartbeats: every `HEARTBEAT_INTERVAL_MS` each node tells every peer it knows that it
//! is up (`Raft.Heartbeat`), and tells the meta range's voters (any of which may lead it)
//! which ranges it leads with their membership. Each node keeps the last heartbeat of every peer (`Heartbeats`); the
//! meta range's leader reads them to tell live nodes from dead ones (`judge`) and to know every
//! range's leader. A heartbeat's answer names the meta range's voters and leader as the peer
//! knows them, which is how a node without a replica of the meta range finds it. Heartbeats
//! also carry quiescence (`quiescence.rs`): to each peer, the idle ranges this node leads
//! that the peer follows; back, the ones the peer agreed to keep quiet. And each names the
//! sender's client address, which its peers tell clients in its place (`Shared::client_addr`).
//! The meta range's leader answers whether the cluster's leaders settled (`LeaderSettling`).
//! Between heartbeats, every `PING_INTERVAL_MS` each node pings every peer (`Raft.Ping`, no
//! payload): the followers of the ranges it keeps quiet judge by the pings whether it fell
//! silent (`quiescence::watch`). Knows nothing of what the rebalancer decides.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use keel_proto::raft::raft_client::RaftClient;
use keel_proto::raft::{HeartbeatRequest, NodeMessage};
use keel_raft::wire;
use keel_storage::RangeCounts;
use keel_types::{
    KvError, LedRange, MetaMembers, NodeAddr, NodeId, NodeReport, QuietRange, RangeId,
};
use tokio::time::MissedTickBehavior;
use tracing::debug;

use crate::cluster::quiescence;
use crate::peer::call::{To, call};
use crate::shared::Shared;
use crate::shared::applied_cache::ByApplied;
use crate::shared::heartbeats::{HEARTBEAT_INTERVAL_MS, PING_INTERVAL_MS};

/// Runs until the node shuts down (the task is aborted then).
pub(crate) async fn run(shared: Arc<Shared>) {
    let mut tick = tokio::time::interval(Duration::from_millis(HEARTBEAT_INTERVAL_MS));
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut counts = ByApplied::default();
    loop {
        tick.tick().await;
        if shared.health.check().is_err() {
            continue;
        }
        let full = report(&shared, &mut counts).await;
        shared
            .heartbeats
            .record(shared.node_id, full.clone(), shared.client_addr.clone());
        let light = NodeReport {
            leads: None,
            ..full.clone()
        };
        let meta = shared.meta_members();
        let round = quiescence::Round::plan(&shared);
        let sends = peers(&shared).into_iter().map(|(node, addr)| {
            let voter = meta.voters.iter().any(|voter| voter.id == node);
            let report = if voter || meta.voters.is_empty() {
                &full
            } else {
                &light
            };
            send(&shared, node, addr, report, round.listed_for(node))
        });
        let mut agreed = BTreeMap::new();
        for answer in join_all(sends).await {
            match answer {
                Ok(answer) => {
                    if answer.leaders_settled {
                        shared.settling.hear();
                    }
                    learn_meta(&shared, answer.from, answer.members);
                    agreed.insert(answer.from, answer.quiet.into_iter().collect());
                }
                Err(error) => debug!(%error, "heartbeat not answered"),
            }
        }
        round.settle(&agreed);
    }
}

/// Pings every peer each `PING_INTERVAL_MS` until the node shuts down (the task is aborted
/// then); a node that is not healthy stays silent, as with heartbeats.
pub(crate) async fn ping(shared: Arc<Shared>) {
    let mut tick = tokio::time::interval(Duration::from_millis(PING_INTERVAL_MS));
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let deadline = Duration::from_millis(PING_INTERVAL_MS);
    loop {
        tick.tick().await;
        if shared.health.check().is_err() {
            continue;
        }
        let pings = peers(&shared).into_iter().map(|(node, addr)| {
            let shared = &shared;
            async move {
                let message = NodeMessage {
                    from: shared.node_id,
                    ..NodeMessage::default()
                };
                let ping = |mut client: RaftClient<_>| async move { client.ping(message).await };
                let answer = call(&shared.peers, To::Node(node, &addr), deadline, ping).await;
                if let Err(error) = answer.map_err(|error| error.into_kv(false)) {
                    debug!(node, %error, "ping not answered");
                }
            }
        });
        join_all(pings).await;
    }
}

/// What this node reports: its address, its groups, and the ranges it leads with their
/// membership, size and load. A range's size is read from storage only when something was
/// applied to it since the last report (`counts`).
async fn report(shared: &Shared, known: &mut ByApplied<RangeCounts>) -> NodeReport {
    let groups = shared.groups.all();
    let hosted: BTreeSet<RangeId> = groups.iter().map(|group| group.range()).collect();
    known.retain(|range| hosted.contains(&range));
    let mut led = Vec::new();
    for group in groups.iter().filter(|group| group.is_leader()) {
        let membership = group.membership();
        let (range, applied) = (group.range(), group.applied_index());
        let counts = match known.get(range, applied) {
            Some(counts) => *counts,
            None => match group.state_machine().counts().await {
                Ok(counts) => {
                    known.insert(range, applied, counts);
                    counts
                }
                Err(_) => RangeCounts::default(),
            },
        };
        let rate = shared.load.requests_per_sec(group.range());
        led.push(LedRange {
            range: group.range(),
            voters: membership.voters,
            learners: membership.learners,
            joint: membership.joint,
            keys: counts.keys,
            size_bytes: counts.size_bytes,
            requests_per_sec_milli: (rate * 1000.0) as u64,
        });
    }
    NodeReport {
        addr: NodeAddr::new(shared.addr.clone()),
        replicas: groups.len() as u64,
        leads: Some(led),
    }
}

/// Every other node this node knows of: registered with the meta range, in the initial
/// cluster, or a voter of the meta range.
fn peers(shared: &Shared) -> Vec<(NodeId, NodeAddr)> {
    let mut nodes: BTreeMap<NodeId, NodeAddr> = BTreeMap::new();
    for id in shared
        .cluster
        .keys()
        .chain(shared.ranges.meta_node_ids().iter())
    {
        if let Some(addr) = shared.node_addr(*id) {
            nodes.insert(*id, addr);
        }
    }
    for voter in shared.meta_members().voters {
        nodes.entry(voter.id).or_insert(voter.addr);
    }
    nodes.remove(&shared.node_id);
    nodes.into_iter().collect()
}

/// Takes what a meta replica says of its range's members (anything better than nothing from
/// another node).
fn learn_meta(shared: &Shared, from: NodeId, members: MetaMembers) {
    let from_replica = members.voters.iter().any(|voter| voter.id == from);
    if from_replica || shared.ranges.meta_members().voters.is_empty() {
        shared.ranges.set_meta_members(members);
    }
}

/// A peer's answer to a heartbeat.
struct Answer {
    from: NodeId,
    /// The meta range's members as the peer knows them.
    members: MetaMembers,
    /// The listed ranges the peer agreed to keep quiet.
    quiet: Vec<QuietRange>,
    /// The peer leads the meta range and found the cluster's leaders settled with this node
    /// healthy (`LeaderSettling`).
    leaders_settled: bool,
}

/// Sends one heartbeat, listing `quiet`, within one heartbeat interval.
async fn send(
    shared: &Shared,
    node: NodeId,
    addr: NodeAddr,
    report: &NodeReport,
    quiet: &[QuietRange],
) -> Result<Answer, KvError> {
    let malformed = |e: wire::WireError| KvError::invalid(e.to_string());
    let request = HeartbeatRequest {
        from: shared.node_id,
        payload: wire::encode(report).map_err(malformed)?,
        quiet: quiescence::encode(quiet).map_err(malformed)?,
        client_addr: shared.client_addr.clone(),
    };
    let deadline = Duration::from_millis(HEARTBEAT_INTERVAL_MS);
    let beat = |mut client: RaftClient<_>| async move { client.heartbeat(request).await };
    let reply = call(&shared.peers, To::Node(node, &addr), deadline, beat).await;
    let reply = reply.map_err(|error| error.into_kv(false))?.into_inner();
    let garbled = |e: wire::WireError| KvError::unavailable(format!("node {node} answered {e}"));
    Ok(Answer {
        from: node,
        members: wire::decode(&reply.payload).map_err(garbled)?,
        quiet: quiescence::decode(&reply.quiet).map_err(garbled)?,
        leaders_settled: reply.leaders_settled,
    })
}
