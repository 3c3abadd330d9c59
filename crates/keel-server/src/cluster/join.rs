//! Joining a running cluster (`keel serve --join`): the node registers itself through one of
//! the given nodes (`Cluster.AddNode`, answered by the meta range's leader) until one
//! answers, and learns the registered nodes and the meta range's members from the answer, so
//! that its heartbeats reach the cluster and the rebalancer gives it replicas. A restarted
//! node registers again (the same id and address are accepted again). Knows nothing of
//! replicas.

use std::sync::Arc;
use std::time::Duration;

use keel_proto::v1::AddNodeRequest;
use keel_proto::v1::cluster_client::ClusterClient;
use keel_types::{KvError, MetaMembers, NodeAddr, NodeDescriptor};
use tracing::{error, info, warn};

use crate::peer::call::{To, call};
use crate::shared::Shared;

/// Pause between rounds over the join addresses.
const JOIN_RETRY_MS: u64 = 1_000;

/// Registers this node through the join addresses, round after round until one accepts it
/// or refuses it for good (an invalid request: a removed node, a taken address).
pub(crate) async fn run(shared: Arc<Shared>) {
    loop {
        for seed in &shared.join {
            match add_self(&shared, seed).await {
                Ok(()) => {
                    info!(%seed, "joined the cluster");
                    return;
                }
                Err(refused @ KvError::InvalidArgument { .. }) => {
                    error!(%seed, error = %refused, "the cluster refused this node");
                    return;
                }
                Err(failed) => warn!(%seed, error = %failed, "joining through a node failed"),
            }
        }
        tokio::time::sleep(Duration::from_millis(JOIN_RETRY_MS)).await;
    }
}

/// Asks `seed` to register this node; takes the nodes and meta members it answers with.
async fn add_self(shared: &Shared, seed: &str) -> Result<(), KvError> {
    let request = AddNodeRequest {
        node_id: shared.node_id,
        addr: shared.addr.clone(),
        no_forward: false,
    };
    let deadline = shared.forward_deadline(true) * 2;
    let add = |mut cluster: ClusterClient<_>| async move { cluster.add_node(request).await };
    let answer = call(&shared.peers, To::Seed(seed), deadline, add).await;
    let answer = answer.map_err(|error| error.into_kv(false))?.into_inner();
    let described = |member: keel_proto::v1::Member| NodeDescriptor {
        id: member.node_id,
        addr: NodeAddr::new(member.addr),
    };
    shared
        .ranges
        .learn_nodes(answer.nodes.into_iter().map(described).collect());
    let voters: Vec<NodeDescriptor> = answer.meta.into_iter().map(described).collect();
    if !voters.is_empty() {
        let members = MetaMembers {
            leader: None,
            voters,
        };
        shared.ranges.set_meta_members(members);
    }
    Ok(())
}
