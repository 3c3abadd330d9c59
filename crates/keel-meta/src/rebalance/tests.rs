//! Rebalance plans, as tables, and a small cluster that carries plans out until none is left.

use super::*;

fn node(id: NodeId, state: NodeState, liveness: Liveness) -> NodeView {
    NodeView {
        id,
        state,
        liveness,
    }
}

fn live(id: NodeId) -> NodeView {
    node(id, NodeState::Active, Liveness::Live)
}

fn suspect(id: NodeId) -> NodeView {
    node(id, NodeState::Active, Liveness::Suspect)
}

fn dead(id: NodeId) -> NodeView {
    node(id, NodeState::Active, Liveness::Dead)
}

fn draining(id: NodeId) -> NodeView {
    node(id, NodeState::Draining, Liveness::Live)
}

/// Live, Active nodes `1..=count`.
fn lives(count: NodeId) -> Vec<NodeView> {
    (1..=count).map(live).collect()
}

/// Range `id` led by `leader`, no learners, not busy.
fn range(id: u64, voters: &[NodeId], leader: NodeId) -> RangeView {
    RangeView {
        id: RangeId(id),
        voters: voters.to_vec(),
        learners: Vec::new(),
        leader: Some(leader),
        busy: false,
        joint: false,
    }
}

fn with_learners(mut view: RangeView, learners: &[NodeId]) -> RangeView {
    view.learners = learners.to_vec();
    view
}

fn busy(mut view: RangeView) -> RangeView {
    view.busy = true;
    view
}

/// A membership left joint: `voters` are those of both configurations.
fn joint(mut view: RangeView) -> RangeView {
    view.joint = true;
    view
}

fn leaderless(mut view: RangeView) -> RangeView {
    view.leader = None;
    view
}

fn policy(replication_factor: usize, actions_max: usize) -> RebalancePolicy {
    RebalancePolicy {
        replication_factor,
        actions_max,
    }
}

fn add(range: u64, node: NodeId) -> Action {
    Action::AddVoter {
        range: RangeId(range),
        node,
    }
}

fn remove(range: u64, node: NodeId) -> Action {
    Action::RemoveVoter {
        range: RangeId(range),
        node,
    }
}

fn replace(range: u64, from: NodeId, to: NodeId) -> Action {
    Action::Replace {
        range: RangeId(range),
        from,
        to,
    }
}

fn transfer(range: u64, to: NodeId) -> Action {
    Action::TransferLeader {
        range: RangeId(range),
        to,
    }
}

fn finish(range: u64) -> Action {
    Action::FinishChange {
        range: RangeId(range),
    }
}

fn drop_learner(range: u64, node: NodeId) -> Action {
    Action::RemoveLearner {
        range: RangeId(range),
        node,
    }
}

fn show(actions: &[Action]) -> String {
    let lines: Vec<String> = actions.iter().map(Action::to_string).collect();
    lines.join("; ")
}

/// The plan for the views is `expected`, and the same when the views come in reverse order.
fn check(
    name: &str,
    nodes: &[NodeView],
    ranges: &[RangeView],
    policy: &RebalancePolicy,
    expected: &[Action],
) {
    let planned = plan_rebalance(nodes, ranges, policy);
    assert_eq!(planned, expected, "{name}: planned {}", show(&planned));
    let nodes_reversed: Vec<NodeView> = nodes.iter().rev().copied().collect();
    let ranges_reversed: Vec<RangeView> = ranges.iter().rev().cloned().collect();
    let reversed = plan_rebalance(&nodes_reversed, &ranges_reversed, policy);
    assert_eq!(reversed, expected, "{name}: views in reverse order");
}

type Case = (
    &'static str,
    Vec<NodeView>,
    Vec<RangeView>,
    RebalancePolicy,
    Vec<Action>,
);

fn check_all(cases: Vec<Case>) {
    for (name, nodes, ranges, policy, expected) in cases {
        check(name, &nodes, &ranges, &policy, &expected);
    }
}

#[test]
fn voters_on_failed_nodes_are_replaced_or_left() {
    let rf3 = policy(3, 4);
    check_all(vec![
        (
            "a dead voter is replaced",
            vec![live(1), live(2), dead(3), live(4)],
            vec![range(1, &[1, 2, 3], 1)],
            rf3,
            vec![replace(1, 3, 4)],
        ),
        (
            "a removed node counts as failed",
            vec![
                live(1),
                live(2),
                node(3, NodeState::Removed, Liveness::Live),
                live(4),
            ],
            vec![range(1, &[1, 2, 3], 1)],
            rf3,
            vec![replace(1, 3, 4)],
        ),
        (
            "a node missing from the views counts as removed",
            vec![live(1), live(2), live(4)],
            vec![range(1, &[1, 2, 3], 1)],
            rf3,
            vec![replace(1, 3, 4)],
        ),
        (
            "the lowest failed voter goes first",
            vec![live(1), live(2), live(3), dead(4), dead(5), live(6)],
            vec![range(1, &[1, 2, 3, 4, 5], 1)],
            rf3,
            vec![replace(1, 4, 6)],
        ),
        (
            "no target but a voter to spare: removed",
            vec![live(1), live(2), live(3), dead(4)],
            vec![range(1, &[1, 2, 3, 4], 1)],
            rf3,
            vec![remove(1, 4)],
        ),
        (
            "no target and none to spare: left",
            vec![live(1), live(2), dead(3)],
            vec![range(1, &[1, 2, 3], 1)],
            rf3,
            vec![],
        ),
        (
            "a majority failed: left, though targets exist",
            vec![live(1), dead(2), dead(3), live(4), live(5)],
            vec![range(1, &[1, 2, 3], 1)],
            rf3,
            vec![],
        ),
        (
            "half of 4 failed is no quorum either",
            vec![live(1), live(2), dead(3), dead(4), live(5), live(6)],
            vec![range(1, &[1, 2, 3, 4], 1)],
            rf3,
            vec![],
        ),
        (
            "a failed leader: wait for the election",
            vec![dead(1), live(2), live(3), live(4)],
            vec![range(1, &[1, 2, 3], 1)],
            rf3,
            vec![],
        ),
        (
            "a suspect voter is not replaced",
            vec![live(1), live(2), suspect(3), live(4)],
            vec![range(1, &[1, 2, 3], 1)],
            rf3,
            vec![],
        ),
    ]);
}

#[test]
fn ranges_with_too_few_voters_get_one() {
    check_all(vec![
        (
            "two voters get a third",
            lives(3),
            vec![range(1, &[1, 2], 1)],
            policy(3, 4),
            vec![add(1, 3)],
        ),
        (
            "one voter gets the lowest free node",
            lives(3),
            vec![range(1, &[1], 1)],
            policy(3, 4),
            vec![add(1, 2)],
        ),
        (
            "no more voters than healthy nodes",
            vec![live(1), live(2), suspect(3), draining(4)],
            vec![range(1, &[1, 2], 1)],
            policy(3, 4),
            vec![],
        ),
        (
            "voters on unhealthy nodes count toward the healthy nodes",
            vec![live(1), live(2), suspect(3)],
            vec![range(1, &[1, 3], 1)],
            policy(3, 4),
            vec![],
        ),
        (
            "a larger factor",
            lives(5),
            vec![range(1, &[1, 2, 3], 1)],
            policy(5, 4),
            vec![add(1, 4)],
        ),
        (
            "a factor of 0 keeps the leader",
            lives(2),
            vec![range(1, &[1, 2], 1)],
            policy(0, 4),
            vec![remove(1, 2)],
        ),
        (
            "a learner's node is no target; the learner goes",
            lives(3),
            vec![with_learners(range(1, &[1, 2], 1), &[3])],
            policy(3, 4),
            vec![drop_learner(1, 3)],
        ),
    ]);
}

#[test]
fn draining_nodes_hand_over_leaders_then_replicas() {
    let rf3 = policy(3, 4);
    check_all(vec![
        (
            "a draining voter is replaced",
            vec![live(1), live(2), draining(3), live(4)],
            vec![range(1, &[1, 2, 3], 1)],
            rf3,
            vec![replace(1, 3, 4)],
        ),
        (
            "a draining leader hands over to the voter leading least",
            vec![draining(1), live(2), live(3), live(4)],
            vec![range(1, &[1, 2, 3], 1), range(2, &[2, 3, 4], 2)],
            rf3,
            vec![transfer(1, 3)],
        ),
        (
            "a draining leader with no one to hand to: another draining voter moves",
            vec![draining(1), draining(2), suspect(3), live(4)],
            vec![range(1, &[1, 2, 3], 1)],
            rf3,
            vec![replace(1, 2, 4)],
        ),
        (
            "a draining leader alone: skipped",
            vec![draining(1), suspect(2), suspect(3), live(4)],
            vec![range(1, &[1, 2, 3], 1)],
            rf3,
            vec![],
        ),
        (
            "no target for a draining voter",
            vec![live(1), live(2), draining(3)],
            vec![range(1, &[1, 2, 3], 1)],
            rf3,
            vec![],
        ),
    ]);
}

#[test]
fn ranges_with_too_many_voters_lose_one() {
    let rf3 = policy(3, 4);
    check_all(vec![
        (
            "an unhealthy voter first",
            vec![live(1), suspect(2), live(3), live(4)],
            vec![range(1, &[1, 2, 3, 4], 1)],
            rf3,
            vec![remove(1, 2)],
        ),
        (
            "a draining voter first",
            vec![live(1), draining(2), live(3), live(4)],
            vec![range(1, &[1, 2, 3, 4], 1)],
            rf3,
            vec![remove(1, 2)],
        ),
        (
            "then the most replicas",
            lives(4),
            vec![range(1, &[1, 2, 3, 4], 1), range(2, &[1, 2, 3], 2)],
            rf3,
            vec![remove(1, 3)],
        ),
        (
            "then the highest id, never the leader",
            lives(4),
            vec![range(1, &[1, 2, 3, 4], 4)],
            rf3,
            vec![remove(1, 3)],
        ),
        (
            "a smaller factor",
            lives(3),
            vec![range(1, &[1, 2, 3], 1)],
            policy(1, 4),
            vec![remove(1, 3)],
        ),
    ]);
}

#[test]
fn half_done_changes_are_finished_first() {
    check_all(vec![
        (
            "a joint range with a voter on a dead node finishes its change, nothing else",
            vec![live(1), dead(2), live(3), live(4), live(5)],
            vec![joint(range(1, &[1, 2, 3, 4], 1)), range(2, &[1, 2, 3], 1)],
            policy(3, 4),
            vec![finish(1), replace(2, 2, 5)],
        ),
        (
            "finishing comes before every other rule, in range order",
            lives(4),
            vec![
                with_learners(range(1, &[1, 2], 1), &[4]),
                joint(range(2, &[1, 2, 3, 4], 2)),
            ],
            policy(3, 1),
            vec![finish(2)],
        ),
        (
            "a busy joint range is changing now: nothing to finish",
            lives(4),
            vec![busy(joint(range(1, &[1, 2, 3, 4], 1)))],
            policy(3, 4),
            vec![],
        ),
    ]);
}

#[test]
fn leftover_learners_are_removed() {
    check_all(vec![
        (
            "the lowest learner first",
            lives(5),
            vec![with_learners(range(1, &[1, 2, 3], 1), &[4, 5])],
            policy(3, 4),
            vec![drop_learner(1, 4)],
        ),
        (
            "a busy range keeps its learner",
            lives(5),
            vec![busy(with_learners(range(1, &[1, 2, 3], 1), &[4]))],
            policy(3, 4),
            vec![],
        ),
    ]);
}

#[test]
fn replicas_move_from_nodes_with_2_more() {
    let rf3 = policy(3, 4);
    check_all(vec![
        (
            "2 more than an empty node: one moves",
            lives(4),
            vec![range(1, &[1, 2, 3], 2), range(2, &[1, 2, 3], 3)],
            rf3,
            vec![replace(1, 1, 4)],
        ),
        (
            "1 more: nothing moves",
            lives(4),
            vec![range(1, &[1, 2, 3], 1)],
            rf3,
            vec![],
        ),
        (
            "never from the leader: a node that does not lead moves",
            lives(4),
            vec![range(1, &[1, 2, 3], 1), range(2, &[1, 2, 3], 1)],
            rf3,
            vec![replace(1, 2, 4), transfer(2, 2)],
        ),
        (
            "the source leads every range it could move: leadership moves first",
            lives(6),
            vec![range(1, &[1, 2, 3], 1), range(2, &[1, 4, 5], 1)],
            rf3,
            vec![transfer(1, 2)],
        ),
        (
            "the meta range's leadership moves last",
            lives(6),
            vec![range(0, &[1, 2, 3], 1), range(2, &[1, 4, 5], 1)],
            rf3,
            vec![transfer(2, 4)],
        ),
        (
            "the least loaded target first, then the lowest range",
            lives(6),
            vec![
                range(1, &[1, 2, 6], 6),
                range(2, &[1, 2, 3], 2),
                range(3, &[1, 3, 4], 3),
                range(4, &[1, 4, 5], 4),
                range(5, &[2, 3, 5], 5),
            ],
            rf3,
            vec![replace(2, 1, 6)],
        ),
        (
            "a suspect node is no target",
            vec![live(1), live(2), live(3), suspect(4)],
            vec![range(1, &[1, 2, 3], 1), range(2, &[1, 2, 3], 2)],
            rf3,
            vec![],
        ),
        (
            "a suspect node is no source",
            vec![live(1), live(2), live(3), live(4), suspect(5), live(6)],
            vec![range(1, &[1, 2, 5], 1), range(2, &[3, 4, 5], 3)],
            rf3,
            vec![],
        ),
        (
            "busy ranges count, though nothing is planned for them",
            lives(4),
            vec![busy(range(1, &[1, 2, 3], 1)), range(2, &[1, 2, 3], 2)],
            rf3,
            vec![replace(2, 1, 4)],
        ),
    ]);
}

#[test]
fn leaders_move_from_nodes_leading_2_more() {
    let rf3 = policy(3, 4);
    check_all(vec![
        (
            "2 more: one moves to the voter leading least",
            lives(3),
            vec![
                range(1, &[1, 2, 3], 1),
                range(2, &[1, 2, 3], 1),
                range(3, &[1, 2, 3], 2),
            ],
            rf3,
            vec![transfer(1, 3)],
        ),
        (
            "1 more: nothing moves",
            lives(3),
            vec![range(1, &[1, 2, 3], 1), range(2, &[1, 2, 3], 2)],
            rf3,
            vec![],
        ),
        (
            "the meta range neither counts nor moves",
            lives(3),
            vec![range(0, &[1, 2, 3], 1), range(1, &[1, 2, 3], 1)],
            rf3,
            vec![],
        ),
        (
            "the meta range's leader is not counted against it",
            lives(3),
            vec![
                range(0, &[1, 2, 3], 2),
                range(1, &[1, 2, 3], 1),
                range(2, &[1, 2, 3], 1),
            ],
            rf3,
            vec![transfer(1, 2)],
        ),
        (
            "only to healthy voters",
            vec![live(1), suspect(2), draining(4)],
            vec![range(1, &[1, 2, 4], 1), range(2, &[1, 2, 4], 1)],
            rf3,
            vec![],
        ),
        (
            "one after another, counted as done",
            lives(3),
            (1..=6).map(|id| range(id, &[1, 2, 3], 1)).collect(),
            rf3,
            vec![
                transfer(1, 2),
                transfer(2, 3),
                transfer(3, 2),
                transfer(4, 3),
            ],
        ),
    ]);
}

#[test]
fn leaders_move_along_a_chain_when_no_voter_leads_2_fewer() {
    // Node 1 leads 3 ranges whose only other healthy voter, node 2, leads 2; node 2 shares
    // ranges with node 3, which leads 1. Replicas are balanced (5, 5, 4), nodes 4 and 5 are
    // suspect, so nothing else moves.
    let nodes = vec![live(1), live(2), live(3), suspect(4), suspect(5)];
    let ranges = vec![
        range(1, &[1, 2, 4], 1),
        range(2, &[1, 2, 4], 1),
        range(3, &[1, 2, 5], 1),
        range(4, &[2, 3, 4], 2),
        range(5, &[2, 3, 5], 2),
        range(6, &[1, 3, 5], 3),
        range(7, &[1, 3, 4], 4),
    ];
    check_all(vec![
        (
            "1 hands range 1 to 2, 2 hands range 4 to 3",
            nodes.clone(),
            ranges.clone(),
            policy(3, 4),
            vec![transfer(1, 2), transfer(4, 3)],
        ),
        (
            "a chain longer than the actions left waits",
            nodes,
            ranges,
            policy(3, 1),
            vec![],
        ),
    ]);
}

#[test]
fn plans_go_in_priority_order_within_their_limits() {
    let mixed = vec![live(1), live(2), dead(3), draining(4), live(5), live(6)];
    let three = vec![
        with_learners(range(1, &[1, 2, 5], 1), &[6]),
        range(2, &[1, 2, 4], 1),
        range(3, &[1, 2, 3], 1),
    ];
    let failed: Vec<RangeView> = (1..=3).map(|id| range(id, &[1, 2, 3], 1)).collect();
    let nodes_four = vec![live(1), live(2), dead(3), live(4)];
    check_all(vec![
        (
            "repair, drain, learners: by rule, not by range",
            mixed.clone(),
            three.clone(),
            policy(3, 4),
            vec![replace(3, 3, 6), replace(2, 4, 5), drop_learner(1, 6)],
        ),
        (
            "the first action is the most urgent",
            mixed,
            three,
            policy(3, 1),
            vec![replace(3, 3, 6)],
        ),
        (
            "repair before adding, and the added voter goes to the emptier node",
            vec![live(1), live(2), dead(3), live(4), live(5)],
            vec![range(1, &[1, 2], 1), range(2, &[1, 2, 3], 1)],
            policy(3, 4),
            vec![replace(2, 3, 4), add(1, 5)],
        ),
        (
            "at most actions_max",
            nodes_four.clone(),
            failed.clone(),
            policy(3, 2),
            vec![replace(1, 3, 4), replace(2, 3, 4)],
        ),
        (
            "actions_max 0",
            nodes_four.clone(),
            failed,
            policy(3, 0),
            vec![],
        ),
        (
            "busy and leaderless ranges are skipped",
            nodes_four.clone(),
            vec![
                busy(range(1, &[1, 2, 3], 1)),
                leaderless(range(2, &[1, 2, 3], 1)),
                range(3, &[1, 2, 3], 1),
            ],
            policy(3, 4),
            vec![replace(3, 3, 4)],
        ),
        (
            "a leader that is no voter is as unknown",
            nodes_four,
            vec![range(1, &[1, 2, 3], 4)],
            policy(3, 4),
            vec![],
        ),
    ]);
}

#[test]
fn ties_break_by_leaders_then_lowest_id() {
    check_all(vec![
        (
            "equal replicas: the target leading fewer",
            vec![live(1), live(2), dead(3), live(4), live(5)],
            vec![range(1, &[1, 2, 3], 1), range(2, &[2, 4, 5], 4)],
            policy(3, 4),
            vec![replace(1, 3, 5)],
        ),
        (
            "equal replicas and leaders: the lowest id",
            vec![live(1), live(2), dead(3), live(4), live(5)],
            vec![range(1, &[1, 2, 3], 1)],
            policy(3, 4),
            vec![replace(1, 3, 4)],
        ),
        (
            "fewer replicas beat fewer leaders",
            vec![live(1), live(2), dead(3), live(4), live(5)],
            vec![
                range(1, &[1, 2, 3], 1),
                range(2, &[2, 4, 5], 4),
                range(3, &[1, 2, 5], 2),
            ],
            policy(3, 4),
            vec![replace(1, 3, 4)],
        ),
    ]);
}

#[test]
fn actions_name_their_range_and_print_short() {
    let cases = [
        (add(7, 4), "range 7: add voter 4"),
        (remove(7, 2), "range 7: remove voter 2"),
        (replace(7, 2, 4), "range 7: replace 2 -> 4"),
        (transfer(7, 3), "range 7: transfer leader to 3"),
        (drop_learner(7, 5), "range 7: remove learner 5"),
    ];
    for (action, text) in cases {
        assert_eq!(action.range(), RangeId(7), "{text}");
        assert_eq!(action.to_string(), text);
    }
    let policy = RebalancePolicy::default();
    assert_eq!(policy.replication_factor, 3);
    assert_eq!(policy.actions_max, 4);
}

/// Nodes and ranges that carry plans out at once, checking each action against the views.
#[derive(Debug, Clone)]
struct Cluster {
    nodes: Vec<NodeView>,
    ranges: Vec<RangeView>,
}

impl Cluster {
    /// `node_count` live nodes and `range_count` ranges (the meta range among them), each on
    /// nodes 1, 2 and 3 and led by node 1.
    fn new(node_count: NodeId, range_count: u64) -> Cluster {
        Cluster {
            nodes: lives(node_count),
            ranges: (0..range_count)
                .map(|id| range(id, &[1, 2, 3], 1))
                .collect(),
        }
    }

    /// Plans and carries out until a plan is empty; the rounds that planned something.
    fn converge(&mut self, policy: &RebalancePolicy, rounds_max: usize) -> usize {
        for round in 0..=rounds_max {
            let plan = plan_rebalance(&self.nodes, &self.ranges, policy);
            if plan.is_empty() {
                return round;
            }
            assert!(plan.len() <= policy.actions_max, "{}", show(&plan));
            let mut ranges: Vec<RangeId> = plan.iter().map(Action::range).collect();
            ranges.sort();
            ranges.dedup();
            assert_eq!(ranges.len(), plan.len(), "one per range: {}", show(&plan));
            for action in plan {
                self.apply(action);
            }
        }
        panic!("no empty plan within {rounds_max} rounds");
    }

    fn apply(&mut self, action: Action) {
        let healthy: Vec<NodeId> = self.healthy();
        let view = self
            .ranges
            .iter_mut()
            .find(|view| view.id == action.range())
            .expect("a planned range exists");
        let leader = view.leader.expect("planned ranges have a leader");
        let holds =
            |view: &RangeView, node| view.voters.contains(&node) || view.learners.contains(&node);
        match action {
            Action::AddVoter { node, .. } => {
                assert!(!holds(view, node) && healthy.contains(&node), "{action}");
                view.voters.push(node);
            }
            Action::RemoveVoter { node, .. } => {
                assert!(node != leader && view.voters.contains(&node), "{action}");
                view.voters.retain(|&voter| voter != node);
            }
            Action::Replace { from, to, .. } => {
                assert!(from != leader && view.voters.contains(&from), "{action}");
                assert!(!holds(view, to) && healthy.contains(&to), "{action}");
                view.voters.retain(|&voter| voter != from);
                view.voters.push(to);
            }
            Action::TransferLeader { to, .. } => {
                assert!(to != leader && view.voters.contains(&to), "{action}");
                view.leader = Some(to);
            }
            Action::RemoveLearner { node, .. } => {
                assert!(view.learners.contains(&node), "{action}");
                view.learners.retain(|&learner| learner != node);
            }
            Action::FinishChange { .. } => panic!("the simulated ranges are never joint"),
        }
        view.voters.sort_unstable();
    }

    /// Marks `id` dead; ranges it led elect their lowest other voter.
    fn kill(&mut self, id: NodeId) {
        self.set(id, |node| node.liveness = Liveness::Dead);
        for view in &mut self.ranges {
            if view.leader == Some(id) {
                view.leader = view.voters.iter().copied().find(|&voter| voter != id);
            }
        }
    }

    fn set(&mut self, id: NodeId, change: impl Fn(&mut NodeView)) {
        let node = self.nodes.iter_mut().find(|node| node.id == id);
        change(node.expect("a known node"));
    }

    fn healthy(&self) -> Vec<NodeId> {
        let healthy = self.nodes.iter().filter(|node| is_healthy(node));
        healthy.map(|node| node.id).collect()
    }

    fn replicas(&self, id: NodeId) -> usize {
        let holding = self.ranges.iter().filter(|view| view.voters.contains(&id));
        holding.count()
    }

    fn leaders(&self, id: NodeId) -> usize {
        let led = self.ranges.iter().filter(|view| view.leader == Some(id));
        led.filter(|view| view.id != RangeId::META).count()
    }

    /// Why the cluster is not balanced: a range without 3 voters on distinct healthy nodes,
    /// or a healthy node more than 1 away from the mean replica or leader count.
    fn imbalance(&self) -> Option<String> {
        let healthy = self.healthy();
        for view in &self.ranges {
            let mut distinct = view.voters.clone();
            distinct.dedup();
            if distinct.len() != 3 || !distinct.iter().all(|node| healthy.contains(node)) {
                return Some(format!("{} has voters {:?}", view.id, view.voters));
            }
        }
        let replicas: Vec<usize> = healthy.iter().map(|&id| self.replicas(id)).collect();
        let leaders: Vec<usize> = healthy.iter().map(|&id| self.leaders(id)).collect();
        let far = |counts: &[usize]| {
            let total: usize = counts.iter().sum();
            counts
                .iter()
                .any(|&count| (count * counts.len()).abs_diff(total) > counts.len())
        };
        if far(&replicas) || far(&leaders) {
            return Some(format!(
                "nodes {healthy:?} hold {replicas:?} and lead {leaders:?}"
            ));
        }
        None
    }
}

/// 3 nodes holding 30 ranges, balanced, then nodes 4 and 5 added and balanced again.
fn grown() -> Cluster {
    let policy = RebalancePolicy::default();
    let mut cluster = Cluster::new(3, 30);
    assert!(cluster.imbalance().is_some(), "node 1 leads every range");
    // 19 of 29 leaders move, 4 a round.
    let rounds = cluster.converge(&policy, 5);
    assert_eq!(cluster.imbalance(), None, "3 nodes after {rounds} rounds");
    cluster.nodes.extend([live(4), live(5)]);
    assert!(cluster.imbalance().is_some(), "nodes 4 and 5 are empty");
    // 36 replicas move, 4 a round: at least 9 rounds.
    let rounds = cluster.converge(&policy, 15);
    assert_eq!(cluster.imbalance(), None, "5 nodes after {rounds} rounds");
    cluster
}

#[test]
fn added_nodes_take_an_even_share() {
    let cluster = grown();
    for id in 1..=5 {
        assert_eq!(
            cluster.replicas(id),
            18,
            "node {id}: 90 replicas over 5 nodes"
        );
        let leaders = cluster.leaders(id);
        assert!(
            (5..=6).contains(&leaders),
            "node {id} leads {leaders} of 29"
        );
    }
}

#[test]
fn a_dead_node_is_replaced_everywhere() {
    let mut cluster = grown();
    cluster.kill(5);
    assert!(cluster.imbalance().is_some(), "node 5's replicas are gone");
    // 18 replicas to replace, 4 a round: at least 5 rounds.
    let rounds = cluster.converge(&RebalancePolicy::default(), 6);
    assert_eq!(cluster.imbalance(), None, "after {rounds} rounds");
    assert_eq!(cluster.replicas(5), 0);
}

#[test]
fn a_draining_node_ends_empty() {
    let mut cluster = grown();
    cluster.set(2, |node| node.state = NodeState::Draining);
    assert!(cluster.imbalance().is_some(), "node 2 still holds replicas");
    // 18 replicas and about 6 leaders move, 4 a round: at least 6 rounds.
    let rounds = cluster.converge(&RebalancePolicy::default(), 10);
    assert_eq!(cluster.imbalance(), None, "after {rounds} rounds");
    assert_eq!(cluster.replicas(2), 0);
    assert_eq!(cluster.leaders(2), 0);
}

#[test]
fn the_balance_checker_sees_a_planted_imbalance() {
    let mut cluster = grown();
    let view = cluster
        .ranges
        .iter_mut()
        .find(|view| !view.voters.contains(&5))
        .expect("a range off node 5");
    let from = view.voters[0];
    view.voters[0] = 5;
    view.voters.sort_unstable();
    // 19 on node 5 is within 1 of the mean of 18; one more move is not.
    assert_eq!(cluster.imbalance(), None);
    let view = cluster
        .ranges
        .iter_mut()
        .find(|view| !view.voters.contains(&5) && view.voters.contains(&from))
        .expect("another range off node 5");
    let index = view.voters.iter().position(|&voter| voter == from).unwrap();
    view.voters[index] = 5;
    view.voters.sort_unstable();
    assert!(cluster.imbalance().is_some(), "node {from} holds 16");
    let mut doubled = cluster.clone();
    doubled.ranges[0].voters = vec![1, 1, 2];
    assert!(doubled.imbalance().is_some(), "a node twice in one range");
}

#[test]
#[should_panic(expected = "range 1: replace 1 -> 4")]
fn the_cluster_refuses_to_replace_a_leader() {
    let mut cluster = Cluster::new(4, 2);
    cluster.apply(replace(1, 1, 4));
}
