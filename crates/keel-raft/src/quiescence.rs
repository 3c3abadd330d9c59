//! Quiescence of idle groups, decided without I/O: which groups a leader may propose for
//! quiescence, whether a follower's replica agrees to a leader's proposal, and when a leader
//! may park its own ticker. `RaftGroup` (`quiet.rs`) reads the views from openraft's metrics
//! and carries the decisions out; the node's heartbeats carry proposals and agreements.
//! Knows nothing of openraft's types, clocks or the network.
//!
//! A quiesced group has parked the ticker of every replica: no heartbeats, no election
//! timeouts. That is safe only when nothing is left to replicate, so a leader proposes a group
//! only when it has not used it for a while (no proposal, no read needing the leader, no
//! split, replica change or leader transfer) and its log is committed, applied and matched on
//! every member, with no learner and no joint configuration. A follower agrees only when its
//! replica holds the same last log index, knows the entries committed and applied, and follows
//! that very leader in that very term.

use std::collections::BTreeSet;
use std::time::Duration;

use keel_types::{NodeId, QuietRange, RangeId};

use crate::role::Role;

/// What a group's replica on the leader's node knows, for the proposal decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderView {
    pub range: RangeId,
    /// This node's id.
    pub node: NodeId,
    pub role: Role,
    /// The leader this replica knows of.
    pub leader: Option<NodeId>,
    pub term: u64,
    pub last_log_index: u64,
    /// Committed by a quorum, as the leader knows it.
    pub committed_index: u64,
    pub applied_index: u64,
    /// Voters of every configuration (both, while joint), in id order.
    pub voters: Vec<NodeId>,
    pub learners: Vec<NodeId>,
    pub joint: bool,
    /// Each member's matched log index as the leader's replication knows it (the leader's
    /// own included); `None` for a member not matched yet.
    pub matched: Vec<(NodeId, Option<u64>)>,
    /// Operations on the group running on this node now.
    pub uses_in_flight: u32,
    /// How long since the last operation on the group ended (or the group started).
    pub idle: Duration,
}

/// A leader's proposal of one group: the range as its heartbeats list it and the nodes
/// whose agreement it waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proposal {
    pub quiet: QuietRange,
    /// The group's other voters, in id order.
    pub followers: Vec<NodeId>,
}

/// What a follower's replica knows, for the agreement decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FollowerView {
    pub role: Role,
    pub leader: Option<NodeId>,
    pub term: u64,
    pub last_log_index: u64,
    /// Committed as this replica knows it.
    pub committed_index: u64,
    pub applied_index: u64,
}

/// The proposal of a group whose leader's replica is `view`, or `None` while the group may
/// not go quiet: it was used less than `quiesce_after` ago or is in use, or it is not
/// `settled`. `quiesce_after` of zero turns quiescence off.
pub fn proposal(view: &LeaderView, quiesce_after: Duration) -> Option<Proposal> {
    let idle = view.uses_in_flight == 0 && view.idle >= quiesce_after;
    if quiesce_after.is_zero() || !idle {
        return None;
    }
    settled(view)
}

/// The proposal of a group whose leader's replica is `view`, however lately it was used, or
/// `None` unless this replica leads it, its membership has neither learners nor two
/// configurations, and every entry is committed, applied and matched on every member.
pub fn settled(view: &LeaderView) -> Option<Proposal> {
    let leading = view.role == Role::Leader && view.leader == Some(view.node);
    let membership = !view.joint && view.learners.is_empty() && view.voters.contains(&view.node);
    let last = view.last_log_index;
    let done = view.committed_index == last && view.applied_index == last;
    let matched = view.voters.iter().all(|voter| {
        view.matched
            .iter()
            .any(|(member, index)| member == voter && *index == Some(last))
    });
    if !(leading && membership && done && matched) {
        return None;
    }
    let followers = view
        .voters
        .iter()
        .copied()
        .filter(|voter| *voter != view.node)
        .collect();
    let quiet = QuietRange {
        range: view.range,
        term: view.term,
        last_log_index: last,
    };
    Some(Proposal { quiet, followers })
}

/// The proposals among the groups a node leads, in the order of `views`.
pub fn proposals(views: &[LeaderView], quiesce_after: Duration) -> Vec<Proposal> {
    views
        .iter()
        .filter_map(|view| proposal(view, quiesce_after))
        .collect()
}

/// Whether a follower's replica `view` agrees to keep `listed` quiet, as node `from`
/// listed it: it follows `from` in the listed term and holds, committed and applied, the same
/// last log index.
pub fn agrees(listed: &QuietRange, from: NodeId, view: &FollowerView) -> bool {
    let index = listed.last_log_index;
    view.role == Role::Follower
        && view.leader == Some(from)
        && view.term == listed.term
        && view.last_log_index == index
        && view.committed_index == index
        && view.applied_index == index
}

/// Whether the leader of `proposal` may park: every follower agreed to this very proposal.
pub fn all_agreed(proposal: &Proposal, agreed_by: &BTreeSet<NodeId>) -> bool {
    proposal
        .followers
        .iter()
        .all(|follower| agreed_by.contains(follower))
}

#[cfg(test)]
mod tests {
    use super::*;

    const AFTER: Duration = Duration::from_secs(3);

    /// Node 1 leads range 7 at term 4, every entry up to 20 done everywhere, idle 5 s.
    fn idle_leader() -> LeaderView {
        LeaderView {
            range: RangeId(7),
            node: 1,
            role: Role::Leader,
            leader: Some(1),
            term: 4,
            last_log_index: 20,
            committed_index: 20,
            applied_index: 20,
            voters: vec![1, 2, 3],
            learners: Vec::new(),
            joint: false,
            matched: vec![(1, Some(20)), (2, Some(20)), (3, Some(20))],
            uses_in_flight: 0,
            idle: Duration::from_secs(5),
        }
    }

    #[test]
    fn only_an_idle_settled_leader_proposes() {
        type Change = fn(&mut LeaderView);
        let cases: Vec<(&str, Change, bool)> = vec![
            ("idle and done", |_| {}, true),
            ("idle exactly the threshold", |v| v.idle = AFTER, true),
            (
                "used lately",
                |v| v.idle = Duration::from_millis(2_999),
                false,
            ),
            ("an operation in flight", |v| v.uses_in_flight = 1, false),
            ("a follower", |v| v.role = Role::Follower, false),
            (
                "leader state, other leader named",
                |v| v.leader = Some(2),
                false,
            ),
            ("a candidate", |v| v.role = Role::Candidate, false),
            ("entry not committed", |v| v.committed_index = 19, false),
            ("entry not applied", |v| v.applied_index = 19, false),
            ("a follower lags", |v| v.matched[2] = (3, Some(19)), false),
            (
                "a follower never matched",
                |v| v.matched[1] = (2, None),
                false,
            ),
            (
                "a voter missing from replication",
                |v| {
                    v.matched.pop();
                },
                false,
            ),
            (
                "a learner",
                |v| {
                    v.learners = vec![4];
                    v.matched.push((4, Some(20)));
                },
                false,
            ),
            ("joint configuration", |v| v.joint = true, false),
            ("leader not a voter", |v| v.voters = vec![2, 3], false),
            (
                "single voter",
                |v| {
                    v.voters = vec![1];
                    v.matched = vec![(1, Some(20))];
                },
                true,
            ),
        ];
        for (what, change, expected) in cases {
            let mut view = idle_leader();
            change(&mut view);
            assert_eq!(proposal(&view, AFTER).is_some(), expected, "{what}");
            let busy = view.idle < AFTER || view.uses_in_flight > 0;
            assert_eq!(
                settled(&view).is_some(),
                expected || busy,
                "settled: {what}"
            );
        }
    }

    #[test]
    fn a_proposal_names_the_leaders_log_and_its_followers() {
        let proposed = proposal(&idle_leader(), AFTER).unwrap();
        let quiet = QuietRange {
            range: RangeId(7),
            term: 4,
            last_log_index: 20,
        };
        assert_eq!(
            proposed,
            Proposal {
                quiet,
                followers: vec![2, 3]
            }
        );
        assert_eq!(
            proposal(&idle_leader(), Duration::ZERO),
            None,
            "zero turns quiescence off"
        );
        let mut busy = idle_leader();
        busy.range = RangeId(8);
        busy.uses_in_flight = 2;
        let views = [idle_leader(), busy, idle_leader()];
        let ranges: Vec<RangeId> = proposals(&views, AFTER)
            .iter()
            .map(|p| p.quiet.range)
            .collect();
        assert_eq!(ranges, vec![RangeId(7), RangeId(7)]);
    }

    fn caught_up() -> FollowerView {
        FollowerView {
            role: Role::Follower,
            leader: Some(1),
            term: 4,
            last_log_index: 20,
            committed_index: 20,
            applied_index: 20,
        }
    }

    #[test]
    fn a_follower_agrees_only_when_caught_up_with_that_leader() {
        let listed = QuietRange {
            range: RangeId(7),
            term: 4,
            last_log_index: 20,
        };
        type Change = fn(&mut FollowerView);
        let cases: Vec<(&str, NodeId, Change, bool)> = vec![
            ("caught up", 1, |_| {}, true),
            ("listed by another node", 2, |_| {}, false),
            ("knows no leader", 1, |v| v.leader = None, false),
            ("follows another leader", 1, |v| v.leader = Some(3), false),
            ("newer term", 1, |v| v.term = 5, false),
            ("older term", 1, |v| v.term = 3, false),
            ("shorter log", 1, |v| v.last_log_index = 19, false),
            ("longer log", 1, |v| v.last_log_index = 21, false),
            ("commit not known", 1, |v| v.committed_index = 19, false),
            ("not applied", 1, |v| v.applied_index = 19, false),
            ("a candidate", 1, |v| v.role = Role::Candidate, false),
            ("the leader itself", 1, |v| v.role = Role::Leader, false),
            ("a learner", 1, |v| v.role = Role::Learner, false),
            ("stopped", 1, |v| v.role = Role::Stopped, false),
        ];
        for (what, from, change, expected) in cases {
            let mut view = caught_up();
            change(&mut view);
            assert_eq!(agrees(&listed, from, &view), expected, "{what}");
        }
    }

    #[test]
    fn a_leader_parks_once_every_follower_agreed() {
        let proposal = proposal(&idle_leader(), AFTER).unwrap();
        let cases: Vec<(Vec<NodeId>, bool)> = vec![
            (vec![], false),
            (vec![2], false),
            (vec![3], false),
            (vec![2, 3], true),
            (vec![2, 3, 4], true),
            (vec![1, 2], false),
        ];
        for (agreed, expected) in cases {
            let agreed_by: BTreeSet<NodeId> = agreed.iter().copied().collect();
            assert_eq!(all_agreed(&proposal, &agreed_by), expected, "{agreed:?}");
        }
        let alone = Proposal {
            followers: Vec::new(),
            ..proposal
        };
        assert!(
            all_agreed(&alone, &BTreeSet::new()),
            "no follower to wait for"
        );
    }
}
