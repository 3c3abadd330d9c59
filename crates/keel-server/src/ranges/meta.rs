//! Reaching the meta range from any node: propose a meta command on its leader (here, or
//! through `keel.raft.v1.Raft.ProposeMeta`), and read its table (this node's replica, or the
//! leader's through `Cluster.Ranges`). Knows nothing of what the descriptors are used for.
//!
//! The leader is the one this node's meta replica knows of; a node without one asks the meta
//! range's voters it knows (its replica's membership, else the first three nodes of the
//! initial cluster, where bootstrap put the meta range) in turn, and follows one leader hint.
//! Every hop is sent with `no_forward`, so a command is carried to at most one leader per
//! attempt and never loops.

use std::future::Future;

use keel_proto::raft::MetaProposal;
use keel_proto::raft::raft_client::RaftClient;
use keel_proto::v1::RangesRequest;
use keel_proto::v1::cluster_client::ClusterClient;
use keel_raft::wire;
use keel_types::{
    KvError, MetaCommand, MetaOutcome, NodeAddr, NodeDescriptor, NodeId, RangeDescriptor, RangeId,
    limits,
};

use crate::peer::call::{To, call};
use crate::peer::replaced;
use crate::shared::Shared;

/// How many of the initial cluster's nodes (by id) bootstrap makes replicas of the meta range.
pub(crate) const META_REPLICAS: usize = 3;

/// Proposes `command` on the meta range's leader and returns its outcome.
pub(crate) async fn propose_meta(
    shared: &Shared,
    command: MetaCommand,
) -> Result<MetaOutcome, KvError> {
    check(&command)?;
    if let Some(group) = shared.groups.get(RangeId::META)
        && group.is_leader()
    {
        return group.propose_meta(command).await;
    }
    let payload = wire::encode(&command).map_err(|e| KvError::invalid(e.to_string()))?;
    on_leader(shared, true, |node, addr| {
        remote_propose(shared, node, addr, payload.clone())
    })
    .await
}

/// Proposes `command` on this node's meta replica, which must lead (`NotLeader` otherwise).
pub(crate) async fn propose_here(
    shared: &Shared,
    command: MetaCommand,
) -> Result<MetaOutcome, KvError> {
    check(&command)?;
    shared.group(RangeId::META)?.propose_meta(command).await
}

/// The meta range's descriptors and nodes: this node's replica's applied state if it has one
/// (possibly stale, as any cache), else the leader's.
pub(crate) async fn read_meta(
    shared: &Shared,
) -> Result<(Vec<RangeDescriptor>, Vec<NodeDescriptor>), KvError> {
    if let Some(group) = shared.groups.get(RangeId::META)
        && group.is_initialized().await?
    {
        let state_machine = group.state_machine();
        let stored = |e: keel_storage::StorageError| KvError::fatal(e.to_string());
        let ranges = state_machine.meta_ranges().await.map_err(stored)?;
        let nodes = state_machine.meta_nodes().await.map_err(stored)?;
        return Ok((ranges, nodes));
    }
    let response = ranges_from_leader(shared).await?;
    let ranges = response
        .ranges
        .into_iter()
        .filter_map(|info| info.descriptor.map(RangeDescriptor::from))
        .collect();
    let nodes = response
        .nodes
        .into_iter()
        .map(|member| NodeDescriptor {
            id: member.node_id,
            addr: NodeAddr::new(member.addr),
        })
        .collect();
    Ok((ranges, nodes))
}

/// `Cluster.Ranges` as the meta range's leader answers it.
pub(crate) async fn ranges_from_leader(
    shared: &Shared,
) -> Result<keel_proto::v1::RangesResponse, KvError> {
    on_leader(shared, false, |node, addr| {
        remote_ranges(shared, node, addr)
    })
    .await
}

/// Runs `call` against the meta range's leader: the one this node knows of, else each voter
/// it knows in turn; a `NotLeader` naming another node is followed once. Moves on to the next
/// node only when the call was certainly not carried out there. A leader that this node's
/// meta replica learns was replaced meanwhile is given up (`peer::replaced`): a read
/// follows the new leader, a `write` is answered `OutcomeUnknown`.
pub(crate) async fn on_leader<T, F, Fut>(
    shared: &Shared,
    write: bool,
    call: F,
) -> Result<T, KvError>
where
    F: Fn(NodeId, NodeAddr) -> Fut,
    Fut: Future<Output = Result<T, KvError>>,
{
    let mut last = KvError::unavailable(format!(
        "node {} knows no node of the meta range",
        shared.node_id
    ));
    let meta = shared.groups.get(RangeId::META);
    let left = shared.forward_deadline(write);
    for (node, addr) in targets(shared) {
        let answer =
            replaced::unless_replaced(meta.as_deref(), node, write, left, call(node, addr)).await;
        match answer {
            Err(KvError::NotLeader {
                leader: Some((leader, addr)),
                ..
            }) if leader != node && leader != shared.node_id => return call(leader, addr).await,
            Err(error @ (KvError::NotLeader { .. } | KvError::Unavailable { .. })) => last = error,
            answer => return answer,
        }
    }
    Err(last)
}

/// The nodes to ask for the meta range's leader, best first: the leader this node's replica
/// (or its heartbeats) knows of, else the meta range's voters, else the first three nodes of
/// the initial cluster.
fn targets(shared: &Shared) -> Vec<(NodeId, NodeAddr)> {
    let members = shared.meta_members();
    let leader = members.leader.filter(|id| *id != shared.node_id);
    if let Some(leader) = leader
        && let Some(addr) = shared.node_addr(leader)
    {
        return vec![(leader, addr)];
    }
    let voters: Vec<(NodeId, NodeAddr)> = members
        .voters
        .into_iter()
        .map(|voter| (voter.id, voter.addr))
        .collect();
    let voters = if voters.is_empty() {
        let first = shared.cluster.keys().take(META_REPLICAS);
        first
            .filter_map(|id| Some((*id, shared.node_addr(*id)?)))
            .collect()
    } else {
        voters
    };
    voters
        .into_iter()
        .filter(|(id, _)| *id != shared.node_id)
        .collect()
}

/// Refuses a command its limits do not allow before it reaches the log.
fn check(command: &MetaCommand) -> Result<(), KvError> {
    match command {
        MetaCommand::UpdateRanges { ranges } if ranges.len() > limits::META_UPDATE_RANGES_MAX => {
            Err(KvError::invalid(format!(
                "a meta update carries {} range descriptors; limit is {}",
                ranges.len(),
                limits::META_UPDATE_RANGES_MAX
            )))
        }
        MetaCommand::AllocateRangeIds { count }
            if !(1..=limits::RANGE_IDS_ALLOCATE_MAX).contains(count) =>
        {
            Err(KvError::invalid(format!(
                "a meta allocation asks for {count} range ids; it must be 1 to {}",
                limits::RANGE_IDS_ALLOCATE_MAX
            )))
        }
        _ => Ok(()),
    }
}

async fn remote_propose(
    shared: &Shared,
    node: NodeId,
    addr: NodeAddr,
    payload: Vec<u8>,
) -> Result<MetaOutcome, KvError> {
    let request = MetaProposal {
        from: shared.node_id,
        payload,
        no_forward: true,
    };
    let deadline = shared.forward_deadline(true);
    let propose = |mut client: RaftClient<_>| async move { client.propose_meta(request).await };
    let reply = call(&shared.peers, To::Node(node, &addr), deadline, propose).await;
    let reply = reply.map_err(|error| error.into_kv(true))?.into_inner();
    wire::decode(&reply.payload).map_err(|e| KvError::OutcomeUnknown {
        message: format!("node {node} answered a meta proposal with {e}"),
    })
}

async fn remote_ranges(
    shared: &Shared,
    node: NodeId,
    addr: NodeAddr,
) -> Result<keel_proto::v1::RangesResponse, KvError> {
    let request = RangesRequest { no_forward: true };
    let deadline = shared.forward_deadline(false);
    let list = |mut client: ClusterClient<_>| async move { client.ranges(request).await };
    let answer = call(&shared.peers, To::Node(node, &addr), deadline, list).await;
    Ok(answer.map_err(|error| error.into_kv(false))?.into_inner())
}
