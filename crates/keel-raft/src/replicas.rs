//! Changing which nodes replicate a range, on its leader: add a replica (as a learner that
//! first receives a snapshot, then a voter), remove one, replace one by another in a single
//! joint change, drop a learner an interrupted change left behind, or finish a joint change a
//! stopped leader left half done. One change at a time per range (the group's change lock,
//! shared with splits). Knows nothing of who decided the change or how the new replica's node
//! was told to expect the range.
//!
//! A new replica must start from a snapshot, never from the log: the log may hold splits
//! applied before the node was a member, and replaying one would make the node create the
//! child range without being one of its replicas. So before the learner is added, the leader
//! builds a snapshot of everything it applied and purges its log up to it; entries after the
//! snapshot cannot hold a split, because splits take the same change lock and a split that
//! returned was applied. A split that reaches the log anyway (from a new leader) while the
//! range has a learner is refused when applied (`Rejection::MembershipChanging`).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use keel_storage::raft_types::TypeConfig;
use keel_types::{KvError, NodeAddr, NodeId, RangeDescriptor, ReplicaChange};
use openraft::async_runtime::WatchReceiver;
use openraft::error::{ClientWriteError, RaftError};
use openraft::{ChangeMembers, RaftMetrics};
use tracing::info;

use crate::group::RaftGroup;
use crate::quiet_state::Wake;

/// A group's membership as one replica knows it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MembershipView {
    /// Voters of every configuration (both, while joint), in id order.
    pub voters: Vec<NodeId>,
    pub learners: Vec<NodeId>,
    /// Two configurations: a change is half done.
    pub joint: bool,
}

impl RaftGroup {
    /// The group's membership as this replica knows it.
    pub fn membership(&self) -> MembershipView {
        membership_view(&self.raft().metrics().borrow_watched())
    }

    /// Carries out `change` on this replica, which must lead, and returns the range's
    /// descriptor after it. A node gaining a replica must already run an empty group for
    /// the range (the caller prepares it). `catch_up` bounds the wait for a new replica to
    /// receive its snapshot and the log after it.
    ///
    /// `NotLeader` when this replica does not lead; `InvalidArgument` when the change does
    /// not fit the membership (removing the leader or a node that is not a voter, adding a
    /// voter, removing a voter from a range with `voters_min` voters or fewer: the floor is
    /// checked against the membership under the change lock, so changes planned from an
    /// older view cannot together take a range below it); `Unavailable` while another change
    /// is half done (`ReplicaChange::Finish` finishes it) or when the new replica did not
    /// catch up in time (it stays a learner; removing it is a later change).
    pub async fn change_replicas(
        &self,
        change: &ReplicaChange,
        catch_up: Duration,
        voters_min: usize,
    ) -> Result<RangeDescriptor, KvError> {
        let using = self.begin_use(Wake::Leader).await;
        let _change = self.lock_changes().await;
        self.check_leader()?;
        if using.woke_leader {
            // A quiesced leader's lease lapsed, and a membership change needs a valid one.
            let deadline = tokio::time::Instant::now() + catch_up;
            self.renew_lease(deadline).await?;
        }
        let current = self.membership();
        if *change == ReplicaChange::Finish && !current.joint {
            return self.descriptor().await;
        }
        check_change(self, &current, change, voters_min)?;
        info!(range_id = self.range().0, %change, "changing replicas");
        if let Some((node, addr)) = change.added() {
            let joined = match current.learners.contains(&node) {
                true => self.membership_index(),
                false => {
                    self.snapshot_for_learner(catch_up).await?;
                    self.propose_change(add_nodes(node, addr)).await?
                }
            };
            self.wait_caught_up(node, joined, catch_up).await?;
        }
        let voters: BTreeSet<NodeId> = current.voters.iter().copied().collect();
        let members = match change {
            ReplicaChange::Add { node, .. } => Some(with(&voters, *node)),
            ReplicaChange::Remove { node } => Some(without(&voters, *node)),
            ReplicaChange::Replace { from, to, .. } => Some(with(&without(&voters, *from), *to)),
            ReplicaChange::RemoveLearner { .. } | ReplicaChange::Finish => None,
        };
        let membership = match (members, change) {
            (Some(voters), _) => ChangeMembers::ReplaceAllVoters(voters),
            (None, ReplicaChange::RemoveLearner { node }) => {
                ChangeMembers::RemoveNodes(BTreeSet::from([*node]))
            }
            // From a joint membership, a change that adds nothing moves to its newer half.
            (None, ReplicaChange::Finish) => ChangeMembers::AddVoterIds(BTreeSet::new()),
            (None, _) => unreachable!("every other change sets the voters"),
        };
        self.propose_change(membership).await?;
        info!(range_id = self.range().0, %change, "replicas changed");
        self.descriptor().await
    }

    /// Builds a snapshot of everything applied so far and purges the log up to it, so a
    /// learner added next starts from the snapshot.
    async fn snapshot_for_learner(&self, timeout: Duration) -> Result<(), KvError> {
        let raft = self.raft();
        let applied = self.applied_index();
        let what = "a snapshot for a new replica";
        let upto = self.build_snapshot_covering(applied, timeout, what).await?;
        raft.trigger()
            .purge_log(upto)
            .await
            .map_err(|e| self.stopped(&e))?;
        let purged = |m: &RaftMetrics<TypeConfig>| m.purged.is_some_and(|id| id.index >= upto);
        self.wait_for(timeout, purged, "the log purged up to the snapshot")
            .await?;
        Ok(())
    }

    /// Asks openraft for a snapshot and waits until one covers log index `applied`; returns
    /// the index the snapshot covers. `what` names the wait in errors.
    pub(crate) async fn build_snapshot_covering(
        &self,
        applied: u64,
        timeout: Duration,
        what: &str,
    ) -> Result<u64, KvError> {
        self.raft()
            .trigger()
            .snapshot()
            .await
            .map_err(|e| self.stopped(&e))?;
        let built = |m: &RaftMetrics<TypeConfig>| m.snapshot.is_some_and(|id| id.index >= applied);
        let snapshot = self.wait_for(timeout, built, what).await?;
        Ok(snapshot.snapshot.map_or(0, |id| id.index))
    }

    /// The log index of the membership this replica has now.
    fn membership_index(&self) -> u64 {
        let metrics = self.raft().metrics();
        let metrics = metrics.borrow_watched();
        metrics.membership_config.log_id().map_or(0, |id| id.index)
    }

    /// Waits until `node`'s replica holds the entry at `joined` (the one that made it a
    /// member).
    async fn wait_caught_up(
        &self,
        node: NodeId,
        joined: u64,
        timeout: Duration,
    ) -> Result<(), KvError> {
        let caught_up = move |m: &RaftMetrics<TypeConfig>| {
            m.replication
                .as_ref()
                .and_then(|replication| replication.get(&node).cloned().flatten())
                .is_some_and(|matched| matched.index >= joined)
        };
        self.wait_for(timeout, caught_up, "the new replica to catch up")
            .await
            .map(|_| ())
    }

    /// Waits until the metrics satisfy `done`; `Unavailable` after `timeout` or once this
    /// replica stops leading.
    pub(crate) async fn wait_for(
        &self,
        timeout: Duration,
        done: impl Fn(&RaftMetrics<TypeConfig>) -> bool + Send + Sync,
        what: &str,
    ) -> Result<RaftMetrics<TypeConfig>, KvError> {
        let node = self.node_id();
        let waited = self
            .raft()
            .wait(Some(timeout))
            .metrics(
                |m| done(m) || m.current_leader != Some(node),
                format!("range {}: {what}", self.range()),
            )
            .await;
        match waited {
            Ok(metrics) if done(&metrics) => Ok(metrics),
            Ok(_) => Err(self.not_leader_now()),
            Err(error) => Err(KvError::unavailable(format!(
                "range {}: waiting for {what}: {error}",
                self.range()
            ))),
        }
    }

    /// Proposes a membership change and waits until it is committed (both steps of a joint
    /// change); returns the log index of the last entry it wrote.
    async fn propose_change(
        &self,
        change: ChangeMembers<NodeId, NodeAddr>,
    ) -> Result<u64, KvError> {
        match self.raft().change_membership(change, false).await {
            Ok(response) => Ok(response.log_id.index),
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(_))) => {
                Err(self.not_leader_now())
            }
            Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(error))) => Err(
                KvError::unavailable(format!("range {}: {error}", self.range())),
            ),
            Err(RaftError::APIError(error)) => Err(KvError::OutcomeUnknown {
                message: format!("membership change of range {}: {error}", self.range()),
            }),
            Err(RaftError::Fatal(error)) => Err(KvError::OutcomeUnknown {
                message: format!(
                    "raft of range {} stopped while changing its membership ({error})",
                    self.range()
                ),
            }),
        }
    }
}

/// Refuses a change that does not fit `current`.
fn check_change(
    group: &RaftGroup,
    current: &MembershipView,
    change: &ReplicaChange,
    voters_min: usize,
) -> Result<(), KvError> {
    let range = group.range();
    if current.joint && *change != ReplicaChange::Finish {
        return Err(KvError::unavailable(format!(
            "range {range} is in the middle of a membership change"
        )));
    }
    let voter = |node: &NodeId| current.voters.contains(node);
    let refuse = |why: String| Err(KvError::invalid(format!("range {range}: {why}")));
    if let Some(node) = change.removed() {
        if node == group.node_id() {
            return refuse(format!(
                "node {node} leads the range; hand leadership over before removing it"
            ));
        }
        let learner_change = matches!(change, ReplicaChange::RemoveLearner { .. });
        if learner_change && !current.learners.contains(&node) {
            return refuse(format!("node {node} is not a learner"));
        }
        if !learner_change && !voter(&node) {
            return refuse(format!("node {node} is not a voter"));
        }
    }
    if let Some((node, _)) = change.added()
        && voter(&node)
    {
        return refuse(format!("node {node} is already a voter"));
    }
    if matches!(change, ReplicaChange::Remove { .. }) && current.voters.len() <= voters_min.max(1) {
        return refuse(format!(
            "it has {} voter(s); removing one would leave fewer than {}",
            current.voters.len(),
            voters_min.max(1)
        ));
    }
    Ok(())
}

fn add_nodes(node: NodeId, addr: &NodeAddr) -> ChangeMembers<NodeId, NodeAddr> {
    ChangeMembers::AddNodes(BTreeMap::from([(node, addr.clone())]))
}

fn with(voters: &BTreeSet<NodeId>, node: NodeId) -> BTreeSet<NodeId> {
    let mut voters = voters.clone();
    voters.insert(node);
    voters
}

fn without(voters: &BTreeSet<NodeId>, node: NodeId) -> BTreeSet<NodeId> {
    let mut voters = voters.clone();
    voters.remove(&node);
    voters
}

pub(crate) fn membership_view(metrics: &RaftMetrics<TypeConfig>) -> MembershipView {
    let membership = metrics.membership_config.membership();
    let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
    MembershipView {
        voters: voters.into_iter().collect(),
        learners: membership.learner_ids().collect(),
        joint: membership.get_joint_config().len() > 1,
    }
}
