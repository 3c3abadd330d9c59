//! Rebalance decisions: which membership changes and leader transfers bring every range back
//! to `replication_factor` voters on healthy nodes and spread replicas and leaders evenly
//! (`plan_rebalance`). Knows nothing of Raft, the network or the clock: the driver in
//! `keel-server` gathers the views, carries the actions out and asks again.
//!
//! Vocabulary: a node is *failed* when it is Dead, Removed or absent from the views, *healthy*
//! when it is Active and Live (`keel_types::NodeState` says where a registered node stands). Only healthy nodes take new replicas, and only they are balanced.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};

use keel_types::{NodeId, NodeState, RangeId};

/// What the driver knows of a node's heartbeats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Liveness {
    Live,
    /// Missed heartbeats, not yet past the dead timeout: takes no new replica, keeps its own.
    Suspect,
    /// Past the dead timeout: its replicas are replaced.
    Dead,
}

/// One node, as the planner sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeView {
    pub id: NodeId,
    pub state: NodeState,
    pub liveness: Liveness,
}

/// One range's membership, as the planner sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RangeView {
    pub id: RangeId,
    /// Sorted.
    pub voters: Vec<NodeId>,
    /// Sorted.
    pub learners: Vec<NodeId>,
    pub leader: Option<NodeId>,
    /// A membership change or leader transfer of this range is in flight: plan nothing for it.
    pub busy: bool,
    /// The membership is joint (`voters` holds both configurations): a change is half done,
    /// and when the range is not busy, the leader that made it stopped in between.
    pub joint: bool,
}

/// How many replicas a range should have, and how much one plan may start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RebalancePolicy {
    /// Voters per range. 0 acts as 1: a leader is never removed.
    pub replication_factor: usize,
    /// Actions one plan returns at most.
    pub actions_max: usize,
}

impl Default for RebalancePolicy {
    /// 3 voters: a range survives one failed node. 4 actions: each `AddVoter` or `Replace`
    /// sends a snapshot of up to one range (64 MiB, `SplitPolicy::range_bytes_max`), so a
    /// round moves at most 256 MiB while the cluster keeps serving.
    fn default() -> Self {
        RebalancePolicy {
            replication_factor: 3,
            actions_max: 4,
        }
    }
}

/// One change for the driver to carry out, through the range's leader.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Add `node` as a learner, let it catch up, make it a voter.
    AddVoter { range: RangeId, node: NodeId },
    /// Remove voter `node` (never the range's leader).
    RemoveVoter { range: RangeId, node: NodeId },
    /// Add `to` as a learner, let it catch up, then one membership change swapping `from` for
    /// `to` (`from` is never the leader).
    Replace {
        range: RangeId,
        from: NodeId,
        to: NodeId,
    },
    /// Hand leadership to voter `to`.
    TransferLeader { range: RangeId, to: NodeId },
    /// Remove learner `node` left over from an interrupted change.
    RemoveLearner { range: RangeId, node: NodeId },
    /// Finish a membership change left joint by a leader that stopped in between.
    FinishChange { range: RangeId },
}

impl Action {
    /// The range the action changes.
    pub fn range(&self) -> RangeId {
        match *self {
            Action::AddVoter { range, .. }
            | Action::RemoveVoter { range, .. }
            | Action::Replace { range, .. }
            | Action::TransferLeader { range, .. }
            | Action::RemoveLearner { range, .. }
            | Action::FinishChange { range } => range,
        }
    }
}

impl std::fmt::Display for Action {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "range {}: ", self.range().0)?;
        match *self {
            Action::AddVoter { node, .. } => write!(f, "add voter {node}"),
            Action::RemoveVoter { node, .. } => write!(f, "remove voter {node}"),
            Action::Replace { from, to, .. } => write!(f, "replace {from} -> {to}"),
            Action::TransferLeader { to, .. } => write!(f, "transfer leader to {to}"),
            Action::RemoveLearner { node, .. } => write!(f, "remove learner {node}"),
            Action::FinishChange { .. } => write!(f, "finish the half-done change"),
        }
    }
}

/// The actions that move the cluster toward every range having `replication_factor` voters on
/// healthy nodes, with replicas and leaders spread evenly. The same views give the same plan,
/// whatever their order.
///
/// A node absent from `nodes` counts as removed, as a Dead one. A node's *replicas* are the
/// ranges it is a voter of; its *leaders* the ranges it leads, the meta range left out. Both
/// count the actions planned so far in this call as done. The *best target* for a new replica
/// of a range is the healthy node not holding it (as voter or learner) with the fewest
/// replicas, then the fewest leaders, then the lowest id. A *leader target* is a healthy
/// voter other than the leader with the fewest leaders, then the lowest id.
///
/// At most one action per range and `actions_max` in all. Nothing is planned for a range that
/// is busy, whose leader is unknown, not a voter or failed (the driver must reach the leader,
/// and a failed one is about to be replaced by an election), or whose voters on non-failed
/// nodes are no quorum (it cannot commit a change). In priority order, ranges by id:
///
/// 0. Finish: a joint range finishes its change, and nothing else is planned for it until
///    it has (its voters are those of both configurations).
/// 1. Repair: a voter on a failed node (the lowest id) is replaced by the best target; with no
///    target it is removed if the range keeps at least `replication_factor` voters, else it
///    stays (removing it would only shrink the quorum).
/// 2. Under-replication: a range with fewer voters than `replication_factor` or the number of
///    healthy nodes, whichever is smaller, gets the best target as a voter.
/// 3. Drain: a Draining leader hands leadership to a leader target; otherwise a voter on a
///    Draining node that does not lead (the lowest id) is replaced by the best target.
/// 4. Over-replication: a range with more voters than `replication_factor` loses one that does
///    not lead: on a failed, Suspect or Draining node first, then the one with the most
///    replicas, then the highest id.
/// 5. Leftover learners: the lowest-id learner of a range is removed.
/// 6. Replica balance: while a healthy node has at least 2 replicas more than the best target
///    of one of its ranges, one such range is replaced onto it (the least loaded target, then
///    the lowest range id), never one the node leads; when it leads all of them, one of them
///    (the meta range last) hands leadership to a leader target instead, so a later plan can
///    move it. Converged, every healthy node's replica count is within 1 of every other's.
/// 7. Leader balance: while a healthy node leads at least 2 ranges more than the leader target
///    of one of them, that range hands leadership to it. When every voter of its ranges leads
///    about as many, the node hands a range to one of them, which hands one of its own on, and
///    so on to a node leading at least 2 fewer: the shortest such chain, planned whole or not
///    at all, changes only the counts of its ends. The meta range is never moved for balance.
///    Converged, no node leads 2 more than a node its chains reach, so when the ranges link
///    every healthy node to every other, leader counts are within 1 of each other.
pub fn plan_rebalance(
    nodes: &[NodeView],
    ranges: &[RangeView],
    policy: &RebalancePolicy,
) -> Vec<Action> {
    let mut planner = Planner::new(nodes, ranges, policy);
    planner.each_range(Planner::finish_change);
    planner.each_range(Planner::repair);
    planner.each_range(Planner::add_voter);
    planner.each_range(Planner::drain);
    planner.each_range(Planner::remove_voter);
    planner.each_range(Planner::remove_learner);
    planner.balance_replicas();
    planner.balance_leaders();
    planner.actions
}

/// A range the plan may act on, with its leader.
#[derive(Debug, Clone, Copy)]
struct LedRange<'a> {
    view: &'a RangeView,
    leader: NodeId,
}

/// A plan being built: the views, the counts with the planned actions applied, the actions.
struct Planner<'a> {
    nodes: BTreeMap<NodeId, &'a NodeView>,
    /// Healthy nodes by id.
    healthy: Vec<NodeId>,
    /// Ranges the plan may act on, by id.
    open: Vec<LedRange<'a>>,
    replicas: BTreeMap<NodeId, usize>,
    leaders: BTreeMap<NodeId, usize>,
    planned: BTreeSet<RangeId>,
    actions: Vec<Action>,
    replication_factor: usize,
    actions_max: usize,
}

impl<'a> Planner<'a> {
    fn new(nodes: &'a [NodeView], ranges: &'a [RangeView], policy: &RebalancePolicy) -> Self {
        let nodes: BTreeMap<NodeId, &NodeView> = nodes.iter().map(|node| (node.id, node)).collect();
        let healthy = nodes
            .values()
            .filter(|node| is_healthy(node))
            .map(|node| node.id)
            .collect();
        let (replicas, leaders) = counts(ranges);
        let mut planner = Planner {
            nodes,
            healthy,
            open: Vec::new(),
            replicas,
            leaders,
            planned: BTreeSet::new(),
            actions: Vec::new(),
            replication_factor: policy.replication_factor,
            actions_max: policy.actions_max,
        };
        let mut open: Vec<LedRange> = ranges
            .iter()
            .filter_map(|view| planner.open_range(view))
            .collect();
        open.sort_by_key(|range| range.view.id);
        planner.open = open;
        planner
    }

    /// `view` with its leader, when the plan may act on it.
    fn open_range(&self, view: &'a RangeView) -> Option<LedRange<'a>> {
        let leader = view.leader?;
        if view.busy || !view.voters.contains(&leader) || self.is_failed(leader) {
            return None;
        }
        let reachable = view
            .voters
            .iter()
            .filter(|&&voter| !self.is_failed(voter))
            .count();
        if reachable < view.voters.len() / 2 + 1 {
            return None;
        }
        Some(LedRange { view, leader })
    }

    /// Runs `rule` on every open range without an action yet, in id order, until the plan is
    /// full.
    fn each_range(&mut self, rule: fn(&Self, LedRange<'a>) -> Option<Action>) {
        for index in 0..self.open.len() {
            if self.is_full() {
                return;
            }
            let range = self.open[index];
            if self.planned.contains(&range.view.id) {
                continue;
            }
            if let Some(action) = rule(self, range) {
                self.push(range, action);
            }
        }
    }

    /// Rule 0: finish a half-done membership change.
    fn finish_change(&self, range: LedRange<'a>) -> Option<Action> {
        range.view.joint.then_some(Action::FinishChange {
            range: range.view.id,
        })
    }

    /// Rule 1: replace, or remove, a voter on a failed node.
    fn repair(&self, range: LedRange<'a>) -> Option<Action> {
        let id = range.view.id;
        let failed = range
            .view
            .voters
            .iter()
            .copied()
            .filter(|&voter| self.is_failed(voter))
            .min()?;
        if let Some(to) = self.best_target(range.view) {
            return Some(Action::Replace {
                range: id,
                from: failed,
                to,
            });
        }
        // The voters left on Live nodes are at most the voters left, so "at least the factor
        // left on Live nodes" needs no test of its own.
        if range.view.voters.len() > self.replication_factor {
            return Some(Action::RemoveVoter {
                range: id,
                node: failed,
            });
        }
        None
    }

    /// Rule 2: add a voter to a range with too few.
    fn add_voter(&self, range: LedRange<'a>) -> Option<Action> {
        let wanted = self.replication_factor.min(self.healthy.len());
        if range.view.voters.len() >= wanted {
            return None;
        }
        let node = self.best_target(range.view)?;
        Some(Action::AddVoter {
            range: range.view.id,
            node,
        })
    }

    /// Rule 3: move leadership, then voters, off Draining nodes.
    fn drain(&self, range: LedRange<'a>) -> Option<Action> {
        let id = range.view.id;
        if self.is_draining(range.leader)
            && let Some(to) = self.leader_target(range)
        {
            return Some(Action::TransferLeader { range: id, to });
        }
        let from = range
            .view
            .voters
            .iter()
            .copied()
            .filter(|&voter| voter != range.leader && self.is_draining(voter))
            .min()?;
        let to = self.best_target(range.view)?;
        Some(Action::Replace {
            range: id,
            from,
            to,
        })
    }

    /// Rule 4: remove a voter from a range with too many.
    fn remove_voter(&self, range: LedRange<'a>) -> Option<Action> {
        if range.view.voters.len() <= self.replication_factor {
            return None;
        }
        let node = range
            .view
            .voters
            .iter()
            .copied()
            .filter(|&voter| voter != range.leader)
            .max_by_key(|&voter| (!self.is_healthy_id(voter), self.replica_count(voter), voter))?;
        Some(Action::RemoveVoter {
            range: range.view.id,
            node,
        })
    }

    /// Rule 5: remove a learner no change is waiting for (the range is not busy).
    fn remove_learner(&self, range: LedRange<'a>) -> Option<Action> {
        let node = range.view.learners.iter().copied().min()?;
        Some(Action::RemoveLearner {
            range: range.view.id,
            node,
        })
    }

    /// Rule 6: replica moves from nodes with 2 more than a target, and when only leaders
    /// hold them back, leader transfers that free a range for the next plan.
    fn balance_replicas(&mut self) {
        // One transfer per source and plan: the next plan moves the range it frees, and more
        // would spend this plan's actions on transfers the next one does not need yet.
        let mut freed = BTreeSet::new();
        while !self.is_full() {
            let mut sources = self.healthy.clone();
            sources.sort_by_key(|&node| (Reverse(self.replica_count(node)), node));
            let next = sources
                .iter()
                .find_map(|&source| self.replica_replace(source))
                .or_else(|| {
                    let unfreed = sources.iter().filter(|source| !freed.contains(*source));
                    unfreed
                        .into_iter()
                        .find_map(|&source| self.replica_transfer(source))
                });
            let Some((range, action)) = next else {
                return;
            };
            if let Action::TransferLeader { .. } = action {
                freed.insert(range.leader);
            }
            self.push(range, action);
        }
    }

    /// Ranges of `source` with no action yet whose best target holds at least 2 replicas
    /// fewer than `source`, with that target.
    fn replica_candidates(&self, source: NodeId) -> Vec<(LedRange<'a>, NodeId)> {
        let count = self.replica_count(source);
        self.unplanned()
            .filter(|range| range.view.voters.contains(&source))
            .filter_map(|range| Some((range, self.best_target(range.view)?)))
            .filter(|&(_, target)| count >= self.replica_count(target) + 2)
            .collect()
    }

    /// A replica of `source` moved to the least loaded target that lacks one of its ranges
    /// (the lowest range id), never of a range `source` leads.
    fn replica_replace(&self, source: NodeId) -> Option<(LedRange<'a>, Action)> {
        let (range, to) = self
            .replica_candidates(source)
            .into_iter()
            .filter(|(range, _)| range.leader != source)
            .min_by_key(|&(range, target)| (self.target_rank(target), range.view.id))?;
        let action = Action::Replace {
            range: range.view.id,
            from: source,
            to,
        };
        Some((range, action))
    }

    /// When `source` leads every range it could give: the lowest of them (the meta range
    /// last) hands leadership to its leader target.
    fn replica_transfer(&self, source: NodeId) -> Option<(LedRange<'a>, Action)> {
        let (range, to) = self
            .replica_candidates(source)
            .into_iter()
            .filter_map(|(range, _)| Some((range, self.leader_target(range)?)))
            .min_by_key(|(range, _)| (range.view.id == RangeId::META, range.view.id))?;
        Some((
            range,
            Action::TransferLeader {
                range: range.view.id,
                to,
            },
        ))
    }

    /// Rule 7: chains of leader transfers, each taking one leader from a node and giving one
    /// to a node leading at least 2 fewer, until none is left or the plan is full.
    fn balance_leaders(&mut self) {
        while !self.is_full() {
            let mut sources = self.healthy.clone();
            sources.sort_by_key(|&node| (Reverse(self.leader_count(node)), node));
            let Some(chain) = sources
                .into_iter()
                .find_map(|source| self.leader_chain(source))
            else {
                return;
            };
            if self.actions.len() + chain.len() > self.actions_max {
                return;
            }
            for (range, to) in chain {
                self.push(
                    range,
                    Action::TransferLeader {
                        range: range.view.id,
                        to,
                    },
                );
            }
        }
    }

    /// The shortest chain of transfers from `source` to a node leading at least 2 fewer:
    /// `source` hands a range to a healthy voter of it, which hands one of its own on, and so
    /// on, so that only the two ends change count. A direct transfer when one does; a chain
    /// when the nodes `source` shares ranges with lead about as many as it does but the ones
    /// they share ranges with do not. Among the nodes a chain of the shortest length reaches,
    /// the end is the one leading fewest (then the lowest id).
    fn leader_chain(&self, source: NodeId) -> Option<Vec<(LedRange<'a>, NodeId)>> {
        let count = self.leader_count(source);
        // How each reached node was reached: the range handed to it and who led it.
        let mut reached: BTreeMap<NodeId, (LedRange<'a>, NodeId)> = BTreeMap::new();
        let mut frontier = vec![source];
        while !frontier.is_empty() {
            let mut next = Vec::new();
            for &node in &frontier {
                for (range, to) in self.leader_edges(node) {
                    if to != source && !reached.contains_key(&to) {
                        reached.insert(to, (range, node));
                        next.push(to);
                    }
                }
            }
            let end = next
                .iter()
                .copied()
                .filter(|&node| count >= self.leader_count(node) + 2)
                .min_by_key(|&node| (self.leader_count(node), node));
            if let Some(end) = end {
                return Some(chain_to(&reached, source, end));
            }
            frontier = next;
        }
        None
    }

    /// The transfers `node` could make: each range it leads with no action yet, the meta
    /// range left out, to each of its healthy voters, ranges and voters by id.
    fn leader_edges(&self, node: NodeId) -> Vec<(LedRange<'a>, NodeId)> {
        self.unplanned()
            .filter(|range| range.leader == node && range.view.id != RangeId::META)
            .flat_map(|range| {
                let voters = range.view.voters.iter().copied();
                voters
                    .filter(move |&voter| voter != node)
                    .map(move |voter| (range, voter))
            })
            .filter(|&(_, voter)| self.is_healthy_id(voter))
            .collect()
    }

    /// Adds `action` on `range` to the plan and counts it as done.
    fn push(&mut self, range: LedRange<'a>, action: Action) {
        assert_eq!(action.range(), range.view.id);
        assert!(
            self.planned.insert(range.view.id),
            "a second action for {}: {action}",
            range.view.id
        );
        match action {
            Action::AddVoter { node, .. } => increment(&mut self.replicas, node),
            Action::RemoveVoter { node, .. } => decrement(&mut self.replicas, node),
            Action::Replace { from, to, .. } => {
                decrement(&mut self.replicas, from);
                increment(&mut self.replicas, to);
            }
            Action::TransferLeader { to, .. } if range.view.id != RangeId::META => {
                decrement(&mut self.leaders, range.leader);
                increment(&mut self.leaders, to);
            }
            Action::TransferLeader { .. }
            | Action::RemoveLearner { .. }
            | Action::FinishChange { .. } => {}
        }
        self.actions.push(action);
    }

    fn is_full(&self) -> bool {
        self.actions.len() >= self.actions_max
    }

    fn unplanned(&self) -> impl Iterator<Item = LedRange<'a>> + '_ {
        self.open
            .iter()
            .copied()
            .filter(|range| !self.planned.contains(&range.view.id))
    }

    /// The best target for a new replica of `view`.
    fn best_target(&self, view: &RangeView) -> Option<NodeId> {
        self.healthy
            .iter()
            .copied()
            .filter(|node| !view.voters.contains(node) && !view.learners.contains(node))
            .min_by_key(|&node| self.target_rank(node))
    }

    /// The leader target of `range`.
    fn leader_target(&self, range: LedRange<'a>) -> Option<NodeId> {
        range
            .view
            .voters
            .iter()
            .copied()
            .filter(|&voter| voter != range.leader && self.is_healthy_id(voter))
            .min_by_key(|&voter| (self.leader_count(voter), voter))
    }

    /// Lower is a better target.
    fn target_rank(&self, node: NodeId) -> (usize, usize, NodeId) {
        (self.replica_count(node), self.leader_count(node), node)
    }

    fn replica_count(&self, node: NodeId) -> usize {
        self.replicas.get(&node).copied().unwrap_or(0)
    }

    fn leader_count(&self, node: NodeId) -> usize {
        self.leaders.get(&node).copied().unwrap_or(0)
    }

    fn is_failed(&self, node: NodeId) -> bool {
        self.nodes
            .get(&node)
            .is_none_or(|view| view.liveness == Liveness::Dead || view.state == NodeState::Removed)
    }

    fn is_draining(&self, node: NodeId) -> bool {
        self.nodes
            .get(&node)
            .is_some_and(|view| view.state == NodeState::Draining)
    }

    fn is_healthy_id(&self, node: NodeId) -> bool {
        self.nodes.get(&node).is_some_and(|view| is_healthy(view))
    }
}

fn is_healthy(node: &NodeView) -> bool {
    node.state == NodeState::Active && node.liveness == Liveness::Live
}

/// Replicas (voters) and leaders (the meta range left out) per node, over every range.
fn counts(ranges: &[RangeView]) -> (BTreeMap<NodeId, usize>, BTreeMap<NodeId, usize>) {
    let mut replicas = BTreeMap::new();
    let mut leaders = BTreeMap::new();
    for range in ranges {
        for &voter in &range.voters {
            increment(&mut replicas, voter);
        }
        if let Some(leader) = range.leader
            && range.id != RangeId::META
        {
            increment(&mut leaders, leader);
        }
    }
    (replicas, leaders)
}

/// The transfers leading from `source` to `end`, first hop first.
fn chain_to<'a>(
    reached: &BTreeMap<NodeId, (LedRange<'a>, NodeId)>,
    source: NodeId,
    end: NodeId,
) -> Vec<(LedRange<'a>, NodeId)> {
    let mut chain = Vec::new();
    let mut node = end;
    while node != source {
        let (range, from) = reached[&node];
        chain.push((range, node));
        node = from;
    }
    chain.reverse();
    chain
}

fn increment(counts: &mut BTreeMap<NodeId, usize>, node: NodeId) {
    *counts.entry(node).or_default() += 1;
}

/// Only a node counted at least once is ever uncounted: a voter, or a range's leader.
fn decrement(counts: &mut BTreeMap<NodeId, usize>, node: NodeId) {
    let count = counts.get_mut(&node).expect("a counted node");
    *count -= 1;
}

#[cfg(test)]
mod tests;
