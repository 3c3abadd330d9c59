//! Node heartbeats: every `HEARTBEAT_INTERVAL_MS` each node tells every peer it knows that it
//! is up (`Raft.Heartbeat`), and tells the meta range's voters (any of which may lead it)
//! which ranges it leads with their membership. Each node keeps the last heartbeat of every peer (`Heartbeats`); the
//! meta range's leader reads them to tell live nodes from dead ones (`judge`) and to know every
//! range's leader. A heartbeat's answer names the meta range's voters and leader as the peer
//! knows them, which is how a node without a replica of the meta range finds it. Heartbeats
//! also carry quiescence (`quiescence.rs`): to each peer, the idle ranges this node leads
//! that the peer follows; back, the ones the peer agreed to keep quiet. Knows nothing of what
//! the rebalancer decides.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::join_all;
use keel_proto::raft::HeartbeatRequest;
use keel_proto::raft::raft_client::RaftClient;
use keel_raft::wire;
use keel_storage::RangeCounts;
use keel_types::{
    KvError, LedRange, MetaMembers, NodeAddr, NodeDescriptor, NodeId, NodeReport, QuietRange,
    RangeId, limits,
};
use tokio::time::MissedTickBehavior;
use tracing::debug;

use crate::applied_cache::ByApplied;
use crate::meta_client::hop_error;
use crate::quiescence;
use crate::ranges::node_addr;
use crate::shared::Shared;

/// How often a node sends its heartbeats.
pub(crate) const HEARTBEAT_INTERVAL_MS: u64 = 1_000;
/// A node whose last heartbeat is older than this is suspect: it takes no new replicas, but
/// its own are left alone until it is dead.
pub(crate) const SUSPECT_AFTER_MS: u64 = 3 * HEARTBEAT_INTERVAL_MS;

/// The last heartbeat of each node, as this node received it (its own included).
#[derive(Default)]
pub(crate) struct Heartbeats {
    seen: Mutex<BTreeMap<NodeId, Seen>>,
}

/// One node's last heartbeat.
#[derive(Debug, Clone)]
pub(crate) struct Seen {
    pub at: Instant,
    pub report: NodeReport,
}

impl Heartbeats {
    pub fn record(&self, node: NodeId, report: NodeReport) {
        let seen = Seen {
            at: Instant::now(),
            report,
        };
        self.lock().insert(node, seen);
    }

    /// Every node's last heartbeat.
    pub fn all(&self) -> BTreeMap<NodeId, Seen> {
        self.lock().clone()
    }

    /// When each node's last heartbeat arrived (without copying the reports).
    pub fn last_seen(&self) -> BTreeMap<NodeId, Instant> {
        self.lock()
            .iter()
            .map(|(node, seen)| (*node, seen.at))
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<NodeId, Seen>> {
        self.seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// How a node stands by its heartbeats, judged at `now` by a meta leader that has been
/// listening since `since` (a node is never dead sooner than `dead_after` after that, so a new
/// meta leader does not declare dead the nodes it has not heard from yet).
pub(crate) fn judge(
    last: Option<Instant>,
    since: Instant,
    now: Instant,
    dead_after: Duration,
) -> keel_meta::Liveness {
    let heard = last.map_or(since, |last| last.max(since));
    let silent = now.saturating_duration_since(heard);
    if last.is_some() && silent < Duration::from_millis(SUSPECT_AFTER_MS) {
        keel_meta::Liveness::Live
    } else if silent < dead_after {
        keel_meta::Liveness::Suspect
    } else {
        keel_meta::Liveness::Dead
    }
}

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
        shared.heartbeats.record(shared.node_id, full.clone());
        let light = NodeReport {
            leads: None,
            ..full.clone()
        };
        let meta = meta_members(&shared);
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
                    learn_meta(&shared, answer.from, answer.members);
                    agreed.insert(answer.from, answer.quiet.into_iter().collect());
                }
                Err(error) => debug!(%error, "heartbeat not answered"),
            }
        }
        round.settle(&agreed);
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

/// The meta range's members as this node knows them: from its own replica when it has one
/// with a membership, else what heartbeats taught it.
pub(crate) fn meta_members(shared: &Shared) -> MetaMembers {
    if let Some(group) = shared.groups.get(RangeId::META) {
        let members = group.members();
        if !members.is_empty() {
            let voters = members
                .into_iter()
                .filter(|member| member.voter)
                .map(|member| NodeDescriptor {
                    id: member.id,
                    addr: member.addr,
                })
                .collect();
            let leader = group.leader().map(|(id, _)| id);
            return MetaMembers { leader, voters };
        }
    }
    shared.ranges.meta_members()
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
        if let Some(addr) = node_addr(shared, *id) {
            nodes.insert(*id, addr);
        }
    }
    for voter in meta_members(shared).voters {
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
}

/// Sends one heartbeat, listing `quiet`, within one heartbeat interval.
async fn send(
    shared: &Shared,
    node: NodeId,
    addr: NodeAddr,
    report: &NodeReport,
    quiet: &[QuietRange],
) -> Result<Answer, KvError> {
    let channel = shared
        .peers
        .channel(node, &addr.addr)
        .map_err(|e| KvError::unavailable(format!("node {node}: {e}")))?;
    let mut client = RaftClient::new(channel)
        .max_decoding_message_size(limits::GRPC_MESSAGE_BYTES_MAX)
        .max_encoding_message_size(limits::GRPC_MESSAGE_BYTES_MAX);
    let malformed = |e: wire::WireError| KvError::invalid(e.to_string());
    let request = HeartbeatRequest {
        from: shared.node_id,
        payload: wire::encode(report).map_err(malformed)?,
        quiet: quiescence::encode(quiet).map_err(malformed)?,
    };
    let deadline = Duration::from_millis(HEARTBEAT_INTERVAL_MS);
    let reply = match tokio::time::timeout(deadline, client.heartbeat(request)).await {
        Err(_) => {
            return Err(KvError::Timeout {
                message: format!("node {node} did not answer within {deadline:?}"),
            });
        }
        Ok(Err(status)) => return Err(hop_error(node, &status, false)),
        Ok(Ok(reply)) => reply.into_inner(),
    };
    let garbled = |e: wire::WireError| KvError::unavailable(format!("node {node} answered {e}"));
    Ok(Answer {
        from: node,
        members: wire::decode(&reply.payload).map_err(garbled)?,
        quiet: quiescence::decode(&reply.quiet).map_err(garbled)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_meta::Liveness;

    #[test]
    fn nodes_are_live_then_suspect_then_dead() {
        let since = Instant::now();
        let dead_after = Duration::from_secs(60);
        let at = |ms: u64| since + Duration::from_millis(ms);
        let cases = [
            // (last heartbeat, now, judged)
            (Some(at(0)), at(1_000), Liveness::Live),
            (Some(at(0)), at(SUSPECT_AFTER_MS - 1), Liveness::Live),
            (Some(at(0)), at(SUSPECT_AFTER_MS), Liveness::Suspect),
            (Some(at(0)), at(59_999), Liveness::Suspect),
            (Some(at(0)), at(60_000), Liveness::Dead),
            (Some(at(58_000)), at(60_000), Liveness::Live),
            // Never heard from: suspect until dead_after past the start of listening.
            (None, at(1), Liveness::Suspect),
            (None, at(59_999), Liveness::Suspect),
            (None, at(60_000), Liveness::Dead),
        ];
        for (last, now, expected) in cases {
            assert_eq!(
                judge(last, since, now, dead_after),
                expected,
                "{last:?} {now:?}"
            );
        }
        // A heartbeat from before a new meta leader started listening counts from its start.
        let before = since.checked_sub(Duration::from_secs(600)).unwrap_or(since);
        assert_eq!(
            judge(Some(before), since, at(59_999), dead_after),
            Liveness::Suspect
        );
    }
}
