//! A node's replicas coming and going: changing a range's replicas on its leader (prepare the
//! node that gains one, change the membership, tell the node that lost one, publish the
//! descriptor), the node-side answers to those calls (`prepare`, `remove`), the committed
//! membership a leader reports (`membership`), and the collection of replicas this node should
//! no longer have (`collect_garbage`, run by the range watcher). Knows nothing of gRPC
//! messages or of who decided a change.
//!
//! A node removes its replica of a range only on the word of the range's leader: either the
//! leader's call after it committed the removal, or the leader's answer when the meta range
//! names newer replicas without this node. Either way it carries the leader's committed
//! membership, and the replica goes only when that membership does not name this node and
//! is at least as new as the replica's own (a replica re-added since is newer).

use std::collections::BTreeMap;
use std::time::Duration;

use keel_proto::raft::raft_client::RaftClient;
use keel_raft::RaftGroup;
use keel_types::{
    KvError, NodeAddr, NodeId, RangeDescriptor, RangeId, ReplicaChange, ReplicaMembership,
};
use tracing::{debug, info, warn};

use crate::peer::call::PeerCall;
use crate::ranges::lookup;
use crate::ranges::publisher;
use crate::shared::Shared;

/// Carries out `change` of `range`'s replicas on this node, which must lead it (`NotLeader`
/// otherwise), and returns the descriptor after it.
pub(crate) async fn change(
    shared: &Shared,
    range: RangeId,
    change: &ReplicaChange,
) -> Result<RangeDescriptor, KvError> {
    shared.health.check()?;
    let group = leading_group(shared, range)?;
    if let Some((node, addr)) = change.added() {
        let view = current_membership(&group).await?;
        prepare_on(shared, node, addr, &view).await?;
    }
    let catch_up =
        Duration::from_millis(shared.timings.snapshot_timeout_ms + shared.timings.write_timeout_ms);
    let voters_min = shared.placement.replication_factor as usize;
    let after = group.change_replicas(change, catch_up, voters_min).await?;
    if let Some(node) = change.removed() {
        let view = current_membership(&group).await?;
        tell_removed(shared, node, &view).await;
    }
    if range != RangeId::META
        && let Err(error) = publisher::publish(shared, vec![after.clone()]).await
    {
        warn!(%after, %error, "publishing a replica change; the publisher tries again");
    }
    Ok(after)
}

/// Re-creates voter `node`'s replica of `range` (this node must lead it, and `node` must not)
/// from the leader's state: removes it (the range has one voter fewer meanwhile, which the
/// replication-factor floor allows for this change only), has `node` drop its state, and
/// adds it back, as a learner that receives a snapshot and then as a voter. For a replica a
/// consistency check found to differ from the majority. If the re-add fails the range stays
/// one voter short until the rebalancer adds a replica; a removed replica the node did not
/// drop is collected later.
pub(crate) async fn recreate(
    shared: &Shared,
    range: RangeId,
    node: NodeId,
    addr: &NodeAddr,
) -> Result<RangeDescriptor, KvError> {
    shared.health.check()?;
    let group = leading_group(shared, range)?;
    let catch_up =
        Duration::from_millis(shared.timings.snapshot_timeout_ms + shared.timings.write_timeout_ms);
    let voters_min = (shared.placement.replication_factor as usize).saturating_sub(1);
    let removal = ReplicaChange::Remove { node };
    let removed = group
        .change_replicas(&removal, catch_up, voters_min)
        .await?;
    if range != RangeId::META
        && let Err(error) = publisher::publish(shared, vec![removed]).await
    {
        warn!(%range, %error, "publishing a replica removal; the publisher tries again");
    }
    let view = current_membership(&group).await?;
    removed_on(shared, node, &view).await?;
    info!(%range, node, "a replica removed to be re-created");
    let addition = ReplicaChange::Add {
        node,
        addr: addr.clone(),
    };
    change(shared, range, &addition).await
}

/// The committed membership of `range`, from this node, which must lead it.
pub(crate) async fn membership(
    shared: &Shared,
    range: RangeId,
) -> Result<ReplicaMembership, KvError> {
    shared.health.check()?;
    leading_group(shared, range)?.replica_membership().await
}

/// Starts an empty group of `range` here so that a leader can add this node as a learner;
/// `leader_view` is the leader's membership now. Refused while this node holds state of the
/// range that `leader_view` does not count as a replica (it must be removed first: replaying
/// its log could apply a split this node was not a replica for).
pub(crate) async fn prepare(
    shared: &Shared,
    range: RangeId,
    leader_view: &ReplicaMembership,
) -> Result<(), KvError> {
    shared.health.check()?;
    if let Some(group) = shared.groups.get(range)
        && group.is_initialized().await?
    {
        if leader_view.includes(shared.node_id) {
            return Ok(());
        }
        return Err(KvError::unavailable(format!(
            "node {} still holds an old replica of range {range}; it is removed first",
            shared.node_id
        )));
    }
    shared.prepared.mark(range);
    shared.ensure_group(range).await?;
    debug!(%range, "prepared an empty group for a new replica");
    Ok(())
}

/// Removes this node's replica of `range` on the word of its leader (`leader_view`: the
/// leader's committed membership). Refused when the membership still names this node or
/// when this replica's state is newer than it.
pub(crate) async fn remove(
    shared: &Shared,
    range: RangeId,
    leader_view: &ReplicaMembership,
) -> Result<(), KvError> {
    shared.health.check()?;
    if leader_view.includes(shared.node_id) {
        return Err(KvError::invalid(format!(
            "node {} is a member of range {range} ({}); its replica stays",
            shared.node_id, leader_view.range
        )));
    }
    if let Some(group) = shared.groups.get(range)
        && group.is_initialized().await?
    {
        let local = group.descriptor().await?;
        if local.conf_version > leader_view.range.conf_version {
            return Err(KvError::unavailable(format!(
                "replica of range {range} on node {} is newer (conf_version {}) than the membership naming its removal ({})",
                shared.node_id, local.conf_version, leader_view.range.conf_version
            )));
        }
    }
    remove_here(shared, range).await
}

/// Stops the group of `range` and deletes the replica from the store.
async fn remove_here(shared: &Shared, range: RangeId) -> Result<(), KvError> {
    shared.groups.retire(range).await;
    let removed = shared.store.remove_range(range).await;
    shared.groups.release(range).await;
    shared.prepared.forget(range);
    removed.map_err(|e| KvError::fatal(format!("removing the replica of range {range}: {e}")))?;
    info!(%range, "replica removed");
    lookup::refresh_local(shared).await
}

/// Removes replicas this node should no longer have: one the meta range no longer names for
/// it (when the range's leader confirms), and an empty group prepared for a replica that
/// never came. Errors are logged; the watcher calls again later. A group the meta range
/// names this node a replica of costs a lookup, no storage read.
pub(crate) async fn collect_garbage(shared: &Shared) {
    let recorded: BTreeMap<RangeId, RangeDescriptor> = shared
        .ranges
        .meta_ranges()
        .into_iter()
        .map(|range| (range.id, range))
        .collect();
    for group in shared.groups.all() {
        let range = group.range();
        let collected = match group.has_state() {
            true => collect_replica(shared, &group, &recorded).await,
            false => collect_empty(shared, range, &recorded).await,
        };
        if let Err(error) = collected {
            debug!(%range, %error, "replica garbage collection; trying again later");
        }
    }
}

/// Removes `group`'s replica when the meta range (`recorded`) names newer replicas without
/// this node and the range's leader confirms it.
async fn collect_replica(
    shared: &Shared,
    group: &RaftGroup,
    recorded: &BTreeMap<RangeId, RangeDescriptor>,
) -> Result<(), KvError> {
    let range = group.range();
    let Some(candidates) = replaced_by(shared, group, recorded).await? else {
        return Ok(());
    };
    for (node, addr) in candidates {
        let asked = membership_from(shared, node, &addr, range).await;
        match asked {
            Ok(view) => return remove(shared, range, &view).await,
            Err(error) => debug!(%range, node, %error, "asking for a range's membership"),
        }
    }
    Ok(())
}

/// The replicas to ask about `group`'s range when the meta range knows newer replicas of it
/// that do not include this node; `None` while it still names this node.
async fn replaced_by(
    shared: &Shared,
    group: &RaftGroup,
    recorded: &BTreeMap<RangeId, RangeDescriptor>,
) -> Result<Option<Vec<(NodeId, NodeAddr)>>, KvError> {
    let range = group.range();
    let me = shared.node_id;
    let named: Vec<NodeId> = if range == RangeId::META {
        let members = shared.ranges.meta_members();
        members.voters.iter().map(|voter| voter.id).collect()
    } else {
        let Some(recorded) = recorded.get(&range) else {
            return Ok(None);
        };
        if recorded.replicas.contains(&me) {
            return Ok(None);
        }
        let local = group.descriptor().await?;
        match recorded.supersedes(&local) {
            true => recorded.replicas.clone(),
            false => return Ok(None),
        }
    };
    if named.is_empty() || named.contains(&me) {
        return Ok(None);
    }
    let candidates = named
        .into_iter()
        .filter_map(|node| Some((node, shared.node_addr(node)?)))
        .collect();
    Ok(Some(candidates))
}

/// Stops an empty group that no replica is coming to: not prepared lately, not one the meta
/// range names for this node (a replica that missed a split waits for its snapshot), and not
/// a first range or meta range this node waits to receive from the bootstrap.
async fn collect_empty(
    shared: &Shared,
    range: RangeId,
    recorded: &BTreeMap<RangeId, RangeDescriptor>,
) -> Result<(), KvError> {
    if shared.prepared.recent(range) || shared.awaits_bootstrap(range) {
        return Ok(());
    }
    let named = recorded
        .get(&range)
        .is_some_and(|recorded| recorded.replicas.contains(&shared.node_id));
    if named {
        return Ok(());
    }
    shared.groups.retire(range).await;
    shared.groups.release(range).await;
    shared.prepared.forget(range);
    info!(%range, "stopped an empty group no replica came to");
    Ok(())
}

/// The group of `range` on this node if it leads it; `NotLeader` with a hint otherwise.
pub(crate) fn leading_group(
    shared: &Shared,
    range: RangeId,
) -> Result<std::sync::Arc<RaftGroup>, KvError> {
    match shared.groups.get(range) {
        Some(group) if group.is_leader() => Ok(group),
        Some(group) => Err(KvError::NotLeader {
            range_id: range,
            leader: group
                .leader()
                .filter(|(id, _)| *id != shared.node_id)
                .or_else(|| shared.replica_hint(range)),
        }),
        None => Err(KvError::NotLeader {
            range_id: range,
            leader: shared.replica_hint(range),
        }),
    }
}

/// The leader's membership now: its applied descriptor with the voters and learners its
/// Raft has (a learner added a moment ago included).
async fn current_membership(group: &RaftGroup) -> Result<ReplicaMembership, KvError> {
    let mut view = group.replica_membership().await?;
    let now = group.membership();
    view.range.replicas = now.voters;
    view.learners = now.learners;
    Ok(view)
}

/// Asks `node` to prepare an empty group for its new replica.
async fn prepare_on(
    shared: &Shared,
    node: NodeId,
    addr: &NodeAddr,
    view: &ReplicaMembership,
) -> Result<(), KvError> {
    let range = view.range.id;
    if node == shared.node_id {
        return prepare(shared, range, view).await;
    }
    let call = PeerCall {
        node,
        addr,
        range,
        payload: view,
        forward: false,
        write: false,
        deadline: shared.forward_deadline(false),
    };
    call.send(
        &shared.peers,
        shared.node_id,
        |mut client: RaftClient<_>, message| async move { client.prepare_replica(message).await },
    )
    .await
}

/// Tells `node` it lost its replica (`view`: the membership after the change). A node that
/// does not hear it removes the replica later (`collect_garbage`).
async fn tell_removed(shared: &Shared, node: NodeId, view: &ReplicaMembership) {
    let range = view.range.id;
    if let Err(error) = removed_on(shared, node, view).await {
        info!(%range, node, %error, "a removed replica was not told; it is collected later");
    }
}

/// Has `node` remove its replica of the range `view` (the membership after its removal)
/// names; `Ok` once it has.
async fn removed_on(
    shared: &Shared,
    node: NodeId,
    view: &ReplicaMembership,
) -> Result<(), KvError> {
    let range = view.range.id;
    let Some(addr) = shared.node_addr(node) else {
        return Err(KvError::unavailable(format!(
            "node {node} has no known address"
        )));
    };
    let call = PeerCall {
        node,
        addr: &addr,
        range,
        payload: view,
        forward: false,
        write: false,
        deadline: shared.forward_deadline(true),
    };
    call.send(
        &shared.peers,
        shared.node_id,
        |mut client: RaftClient<_>, message| async move { client.remove_replica(message).await },
    )
    .await
}

/// `range`'s committed membership as `node` (or the leader it forwards to) answers it.
async fn membership_from(
    shared: &Shared,
    node: NodeId,
    addr: &NodeAddr,
    range: RangeId,
) -> Result<ReplicaMembership, KvError> {
    let call = PeerCall {
        node,
        addr,
        range,
        payload: &(),
        forward: true,
        write: false,
        deadline: shared.forward_deadline(false),
    };
    call.send(&shared.peers, shared.node_id, |mut client: RaftClient<_>, message| async move {
        client.replica_membership(message).await
    })
    .await
}
