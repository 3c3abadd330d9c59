//! The node registry's side of the Cluster service, served by the meta range's leader: adding
//! a node (`AddNode`), draining one (`RemoveNode`) and listing them with their state,
//! liveness and counts (`Members`). Any other node forwards the call once to that leader.
//! Knows nothing of how replicas move; the rebalancer acts on what is recorded here.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;

use keel_proto::v1::cluster_client::ClusterClient;
use keel_proto::v1::{
    AddNodeRequest, AddNodeResponse, Member, MembersRequest, MembersResponse, NodeInfo,
    RemoveNodeRequest, RemoveNodeResponse,
};
use keel_raft::RaftGroup;
use keel_types::{
    Consistency, KvError, MetaCommand, NodeAddr, NodeDescriptor, NodeId, NodeState, RangeId,
};

use crate::cluster::placement::{self, ClusterView};
use crate::peer::call::{self as peer, To};
use crate::peer::channels::PeerChannel;
use crate::ranges::meta;
use crate::shared::Shared;

/// Serves a call on the meta range's leader: `here` on this node if it leads the meta range
/// (also when it won the meta range's election while the call waited on the old leader),
/// else (unless `no_forward`) `remote` on the leader, found as every meta call finds it
/// (`meta::on_leader`; `write`: the call changes the meta range).
pub(crate) async fn on_meta_leader<T, H, HFut, R, RFut>(
    shared: &Shared,
    no_forward: bool,
    write: bool,
    here: H,
    remote: R,
) -> Result<T, KvError>
where
    H: FnOnce(Arc<RaftGroup>) -> HFut,
    HFut: Future<Output = Result<T, KvError>>,
    R: Fn(NodeId, NodeAddr) -> RFut,
    RFut: Future<Output = Result<T, KvError>>,
{
    shared.health.check()?;
    let leading = || {
        shared
            .groups
            .get(RangeId::META)
            .filter(|meta| meta.is_leader())
    };
    if let Some(meta) = leading() {
        return here(meta).await;
    }
    if no_forward {
        return Err(KvError::NotLeader {
            range_id: RangeId::META,
            leader: shared.replica_hint(RangeId::META),
        });
    }
    match meta::on_leader(shared, write, remote).await {
        Err(KvError::NotLeader {
            leader: Some((leader, _)),
            ..
        }) if leader == shared.node_id
            && let Some(meta) = leading() =>
        {
            here(meta).await
        }
        answer => answer,
    }
}

/// One Cluster call to `node`, within the forwarding deadline (`write`: an unknown outcome
/// when the answer is lost).
pub(crate) async fn remote<T, F, Fut>(
    shared: &Shared,
    node: NodeId,
    addr: NodeAddr,
    write: bool,
    call: F,
) -> Result<T, KvError>
where
    F: FnOnce(ClusterClient<PeerChannel>) -> Fut,
    Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
{
    let deadline = shared.forward_deadline(write);
    let answer = peer::call::<ClusterClient<_>, _, _, _>(
        &shared.peers,
        To::Node(node, &addr),
        deadline,
        call,
    );
    Ok(answer
        .await
        .map_err(|error| error.into_kv(write))?
        .into_inner())
}

/// `AddNode` on the meta range's leader: records the node and makes it active.
pub(crate) async fn add_node(
    shared: &Shared,
    meta: &RaftGroup,
    request: &AddNodeRequest,
) -> Result<AddNodeResponse, KvError> {
    let (node, addr) = (request.node_id, request.addr.as_str());
    check_address(node, addr)?;
    meta.read_barrier(Consistency::Linearizable).await?;
    let view = placement::gather(shared, meta).await?;
    let registered = registered(meta).await?;
    check_addable(&view, &registered, node, addr)?;
    let descriptor = NodeDescriptor {
        id: node,
        addr: NodeAddr::new(addr),
    };
    if registered.get(&node) != Some(&descriptor.addr) {
        meta::propose_here(shared, MetaCommand::RegisterNode(descriptor.clone())).await?;
    }
    let state = view.nodes.get(&node).map(|entry| entry.state);
    if state != Some(NodeState::Active) || !registered.contains_key(&node) {
        let command = MetaCommand::SetNodeState {
            node,
            state: NodeState::Active,
        };
        meta::propose_here(shared, command).await?;
    }
    tracing::info!(node, addr, "node added");
    let mut nodes = registered;
    nodes.insert(node, descriptor.addr);
    let meta_voters = shared.meta_members().voters;
    Ok(AddNodeResponse {
        nodes: nodes.into_iter().map(member).collect(),
        meta: meta_voters
            .into_iter()
            .map(|voter| member((voter.id, voter.addr)))
            .collect(),
    })
}

/// `RemoveNode` on the meta range's leader: marks the node draining (a removed node stays
/// removed). Refused when fewer active nodes than the replication factor would be left.
pub(crate) async fn remove_node(
    shared: &Shared,
    meta: &RaftGroup,
    request: &RemoveNodeRequest,
) -> Result<RemoveNodeResponse, KvError> {
    let node = request.node_id;
    meta.read_barrier(Consistency::Linearizable).await?;
    let view = placement::gather(shared, meta).await?;
    let Some(entry) = view.nodes.get(&node) else {
        return Err(KvError::invalid(format!(
            "node {node} is not a member of the cluster"
        )));
    };
    if entry.state != NodeState::Active {
        return Ok(RemoveNodeResponse {});
    }
    let active = view
        .nodes
        .values()
        .filter(|entry| entry.state == NodeState::Active)
        .count() as u64;
    let factor = shared.placement.replication_factor;
    if active - 1 < factor {
        return Err(KvError::invalid(format!(
            "removing node {node} would leave {} active nodes; every range needs {factor} (the replication factor): add a node first",
            active - 1
        )));
    }
    let command = MetaCommand::SetNodeState {
        node,
        state: NodeState::Draining,
    };
    meta::propose_here(shared, command).await?;
    tracing::info!(node, "node draining");
    Ok(RemoveNodeResponse {})
}

/// `Members` on the meta range's leader.
pub(crate) async fn members(
    shared: &Shared,
    meta: &RaftGroup,
    _request: &MembersRequest,
) -> Result<MembersResponse, KvError> {
    let view = placement::gather(shared, meta).await?;
    let counts = view.counts();
    let nodes = view
        .nodes
        .iter()
        .map(|(id, entry)| {
            let (replicas, leaders) = counts.get(id).copied().unwrap_or_default();
            NodeInfo {
                node_id: *id,
                addr: entry
                    .addr
                    .as_ref()
                    .map(|a| a.addr.clone())
                    .unwrap_or_default(),
                peer_addr: entry
                    .addr
                    .as_ref()
                    .map(|a| a.addr.clone())
                    .unwrap_or_default(),
                state: entry.state.name().to_string(),
                liveness: liveness_name(entry.liveness).to_string(),
                heartbeat_age_ms: entry.heartbeat_age.map(|age| age.as_millis() as u64),
                replicas,
                leaders,
            }
        })
        .collect();
    Ok(MembersResponse {
        nodes,
        meta_leader_id: shared.node_id,
        replication_factor: shared.placement.replication_factor,
    })
}

fn liveness_name(liveness: keel_meta::Liveness) -> &'static str {
    match liveness {
        keel_meta::Liveness::Live => "live",
        keel_meta::Liveness::Suspect => "suspect",
        keel_meta::Liveness::Dead => "dead",
    }
}

/// Registered nodes and their addresses.
async fn registered(meta: &RaftGroup) -> Result<BTreeMap<NodeId, NodeAddr>, KvError> {
    let nodes = meta.state_machine().meta_nodes().await;
    let nodes = nodes.map_err(|e| KvError::fatal(e.to_string()))?;
    Ok(nodes.into_iter().map(|node| (node.id, node.addr)).collect())
}

fn check_address(node: NodeId, addr: &str) -> Result<(), KvError> {
    if node == 0 {
        return Err(KvError::invalid(
            "node id 0 is reserved; node ids start at 1",
        ));
    }
    match addr.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => Ok(()),
        _ => Err(KvError::invalid(format!(
            "node address {addr:?} is not host:port"
        ))),
    }
}

/// Refuses a node that was removed, an address another node has, or an id a live node
/// holds at another address.
fn check_addable(
    view: &ClusterView,
    registered: &BTreeMap<NodeId, NodeAddr>,
    node: NodeId,
    addr: &str,
) -> Result<(), KvError> {
    let state = view.nodes.get(&node).map(|entry| entry.state);
    if state == Some(NodeState::Removed) || (state.is_none() && registered.contains_key(&node)) {
        return Err(KvError::invalid(format!(
            "node {node} was removed from the cluster; a new node joins under a new id with an empty data dir"
        )));
    }
    let taken = registered
        .iter()
        .find(|(other, known)| **other != node && known.addr == addr);
    if let Some((other, _)) = taken {
        return Err(KvError::invalid(format!(
            "address {addr} belongs to node {other}"
        )));
    }
    let live = view
        .nodes
        .get(&node)
        .is_some_and(|entry| entry.liveness == keel_meta::Liveness::Live);
    match registered.get(&node) {
        Some(known) if known.addr != addr && live => Err(KvError::invalid(format!(
            "node {node} is registered at {} and alive; remove it first or choose another id",
            known.addr
        ))),
        _ => Ok(()),
    }
}

fn member((node_id, addr): (NodeId, NodeAddr)) -> Member {
    Member {
        node_id,
        peer_addr: addr.addr.clone(),
        addr: addr.addr,
        voter: true,
    }
}
