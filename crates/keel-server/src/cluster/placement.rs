//! The cluster as the meta range's leader sees it: registered nodes with their state and
//! liveness (by heartbeats), every range with its voters, learners and leader (from the
//! meta table and the heartbeats of the ranges' leaders), and per-node counts. The rebalancer
//! plans on it; `Cluster.Members` and `Cluster.Ranges` report it. Knows nothing of how
//! actions are carried out.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use keel_meta::{Liveness, NodeView, RangeView};
use keel_raft::RaftGroup;
use keel_types::{KvError, LedRange, NodeAddr, NodeId, NodeState, RangeDescriptor, RangeId};

use crate::shared::Shared;
use crate::shared::heartbeats::{self, SUSPECT_AFTER_MS};

/// One registered (or initial, or replica-holding) node.
#[derive(Debug, Clone)]
pub(crate) struct NodeEntry {
    pub addr: Option<NodeAddr>,
    pub state: NodeState,
    pub liveness: Liveness,
    /// Since this node last heard from it (`None`: never).
    pub heartbeat_age: Option<Duration>,
}

/// What the meta range's leader knows of the cluster.
#[derive(Debug, Clone, Default)]
pub(crate) struct ClusterView {
    pub nodes: BTreeMap<NodeId, NodeEntry>,
    /// Every range the meta range records, and the meta range itself, by id.
    pub ranges: Vec<RangeView>,
    /// What each range's leader last reported of it.
    pub led: BTreeMap<RangeId, LedRange>,
}

impl ClusterView {
    /// The nodes as the planner takes them (removed ones only while they hold replicas).
    pub fn node_views(&self) -> Vec<NodeView> {
        self.nodes
            .iter()
            .map(|(id, entry)| NodeView {
                id: *id,
                state: entry.state,
                liveness: entry.liveness,
            })
            .collect()
    }

    /// The nodes that take replicas and leaderships: Active and Live.
    pub fn healthy(&self) -> BTreeSet<NodeId> {
        let healthy = |entry: &NodeEntry| {
            entry.state == NodeState::Active && entry.liveness == Liveness::Live
        };
        self.nodes
            .iter()
            .filter(|(_, entry)| healthy(entry))
            .map(|(id, _)| *id)
            .collect()
    }

    /// The healthy nodes when this view shows the leaders settled, given that the look at it
    /// planned nothing with nothing in flight (`nothing_to_do`): every range's leader is known
    /// and on a healthy node. A range whose leader is unknown (an election, or a late report
    /// of its leader) is one the planner could not act on, so an empty plan says nothing of it.
    pub fn settled(&self, nothing_to_do: bool) -> Option<BTreeSet<NodeId>> {
        let healthy = self.healthy();
        let led = |range: &RangeView| range.leader.is_some_and(|node| healthy.contains(&node));
        (nothing_to_do && self.ranges.iter().all(led)).then_some(healthy)
    }

    /// Marks the ranges the rebalancer is busy with (`busy`: with the node a leader transfer
    /// in flight or done hands each to) and makes that node their leader: the heartbeats may
    /// still name the old one, and a plan that counted it would move a second range for the
    /// same imbalance, and the plan after it, seeing both moves, would move them back.
    pub fn mark_busy(&mut self, busy: &BTreeMap<RangeId, Option<NodeId>>) {
        for range in &mut self.ranges {
            let Some(handed_to) = busy.get(&range.id) else {
                continue;
            };
            range.busy = true;
            if let Some(leader) = handed_to {
                range.leader = Some(*leader);
            }
        }
    }

    /// The leader of `range`, if known.
    pub fn leader_of(&self, range: RangeId) -> Option<NodeId> {
        let view = self.ranges.iter().find(|view| view.id == range)?;
        view.leader
    }

    pub fn addr_of(&self, node: NodeId) -> Option<NodeAddr> {
        self.nodes.get(&node)?.addr.clone()
    }

    /// Voting replicas and leaderships per node.
    pub fn counts(&self) -> BTreeMap<NodeId, (u64, u64)> {
        let mut counts: BTreeMap<NodeId, (u64, u64)> = BTreeMap::new();
        for range in &self.ranges {
            for voter in &range.voters {
                counts.entry(*voter).or_default().0 += 1;
            }
            if let Some(leader) = range.leader {
                counts.entry(leader).or_default().1 += 1;
            }
        }
        counts
    }

    /// Whether `node` holds no replica (voter or learner) and leads nothing.
    pub fn holds_nothing(&self, node: NodeId) -> bool {
        self.ranges.iter().all(|range| {
            !range.voters.contains(&node)
                && !range.learners.contains(&node)
                && range.leader != Some(node)
        })
    }
}

/// The cluster as this node, which leads the meta range (`meta`), sees it now.
pub(crate) async fn gather(shared: &Shared, meta: &RaftGroup) -> Result<ClusterView, KvError> {
    let since = shared.meta_leadership.since(meta.term());
    let state_machine = meta.state_machine();
    let stored = |e: keel_storage::StorageError| KvError::fatal(e.to_string());
    let descriptors = state_machine.meta_ranges().await.map_err(stored)?;
    let registered = state_machine.meta_nodes().await.map_err(stored)?;
    let states = state_machine.meta_node_states().await.map_err(stored)?;
    let seen = shared.heartbeats.all();
    let led = leaders(&seen);
    let mut view = ClusterView {
        led: led
            .iter()
            .map(|(range, (_, reported))| (*range, reported.clone()))
            .collect(),
        ..ClusterView::default()
    };
    let meta_view = meta_range_view(shared, meta);
    view.ranges = std::iter::once(meta_view)
        .chain(descriptors.iter().map(|d| from_meta(d, &led)))
        .collect();
    let now = Instant::now();
    let dead_after = Duration::from_millis(shared.placement.node_dead_after_ms);
    let mut ids: BTreeSet<NodeId> = shared.cluster.keys().copied().collect();
    ids.extend(registered.iter().map(|node| node.id));
    for range in &view.ranges {
        ids.extend(range.voters.iter().chain(&range.learners));
    }
    let addrs: BTreeMap<NodeId, NodeAddr> = registered
        .into_iter()
        .map(|node| (node.id, node.addr))
        .collect();
    for id in ids {
        let state = states.get(&id).copied().unwrap_or_default();
        let held = !view.holds_nothing(id);
        if state == NodeState::Removed && !held {
            continue;
        }
        let last = seen.get(&id).map(|seen| seen.at);
        let liveness = match id == shared.node_id {
            true => Liveness::Live,
            false => heartbeats::judge(last, since, now, dead_after),
        };
        let addr = addrs
            .get(&id)
            .cloned()
            .or_else(|| shared.cluster.get(&id).map(NodeAddr::new));
        let entry = NodeEntry {
            addr,
            state,
            liveness,
            heartbeat_age: last.map(|last| now.saturating_duration_since(last)),
        };
        view.nodes.insert(id, entry);
    }
    Ok(view)
}

/// The meta range, from this node's own replica (it leads it).
fn meta_range_view(shared: &Shared, meta: &RaftGroup) -> RangeView {
    let membership = meta.membership();
    RangeView {
        id: RangeId::META,
        voters: membership.voters,
        learners: membership.learners,
        leader: Some(shared.node_id),
        busy: false,
        joint: membership.joint,
    }
}

/// A data range: its recorded descriptor, with the membership its leader reported when a
/// live node reported leading it (fresher than the meta table).
fn from_meta(
    descriptor: &RangeDescriptor,
    led: &BTreeMap<RangeId, (NodeId, LedRange)>,
) -> RangeView {
    match led.get(&descriptor.id) {
        Some((leader, reported)) => RangeView {
            id: descriptor.id,
            voters: reported.voters.clone(),
            learners: reported.learners.clone(),
            leader: Some(*leader),
            busy: false,
            joint: reported.joint,
        },
        None => RangeView {
            id: descriptor.id,
            voters: descriptor.replicas.clone(),
            learners: Vec::new(),
            leader: None,
            busy: false,
            joint: false,
        },
    }
}

/// Each range's leader by the recent heartbeats (the newest claim wins while two nodes both
/// believe they lead, around an election).
fn leaders(seen: &BTreeMap<NodeId, heartbeats::Seen>) -> BTreeMap<RangeId, (NodeId, LedRange)> {
    let fresh = Duration::from_millis(SUSPECT_AFTER_MS);
    let mut claims: BTreeMap<RangeId, (Instant, NodeId, LedRange)> = BTreeMap::new();
    for (node, seen) in seen {
        if seen.at.elapsed() >= fresh {
            continue;
        }
        for led in seen.report.leads.iter().flatten() {
            let newer = claims
                .get(&led.range)
                .is_none_or(|(at, _, _)| seen.at > *at);
            if newer {
                claims.insert(led.range, (seen.at, *node, led.clone()));
            }
        }
    }
    claims
        .into_iter()
        .map(|(range, (_, node, led))| (range, (node, led)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_meta::{Action, RebalancePolicy, plan_rebalance};

    fn node(liveness: Liveness) -> NodeEntry {
        NodeEntry {
            addr: None,
            state: NodeState::Active,
            liveness,
            heartbeat_age: None,
        }
    }

    fn range(id: u64, leader: Option<NodeId>) -> RangeView {
        RangeView {
            id: RangeId(id),
            voters: vec![1, 2, 3],
            learners: Vec::new(),
            leader,
            busy: false,
            joint: false,
        }
    }

    /// Three nodes, node 3 of `liveness`; range 0 led by node 1, range 1 by `leader`.
    fn view(liveness: Liveness, leader: Option<NodeId>) -> ClusterView {
        ClusterView {
            nodes: BTreeMap::from([
                (1, node(Liveness::Live)),
                (2, node(Liveness::Live)),
                (3, node(liveness)),
            ]),
            ranges: vec![range(0, Some(1)), range(1, leader)],
            led: BTreeMap::new(),
        }
    }

    #[test]
    fn a_range_handed_to_a_new_leader_counts_as_led_by_it_before_the_heartbeats_say_so() {
        // Node 3 is back and leads nothing; range 1 is being handed to it, but the
        // heartbeats still name node 2, which also leads range 3.
        let mut view = view(Liveness::Live, Some(2));
        view.ranges.extend([range(2, Some(1)), range(3, Some(2))]);
        let policy = RebalancePolicy::default();
        let plan = |view: &ClusterView| plan_rebalance(&view.node_views(), &view.ranges, &policy);
        let mut stale = view.clone();
        stale.mark_busy(&BTreeMap::from([(RangeId(1), None)]));
        let second_move = Action::TransferLeader {
            range: RangeId(3),
            to: 3,
        };
        assert_eq!(plan(&stale), vec![second_move], "what the stale view plans");
        view.mark_busy(&BTreeMap::from([(RangeId(1), Some(3))]));
        assert_eq!(view.ranges[1].leader, Some(3));
        assert!(view.ranges[1].busy);
        assert_eq!(plan(&view), Vec::new(), "one leader each: nothing to move");
    }

    #[test]
    fn leaders_settle_only_with_nothing_to_do_and_every_leader_known_and_healthy() {
        let all = BTreeSet::from([1, 2, 3]);
        assert_eq!(view(Liveness::Live, Some(2)).settled(true), Some(all));
        assert_eq!(view(Liveness::Live, Some(2)).settled(false), None);
        assert_eq!(
            view(Liveness::Live, None).settled(true),
            None,
            "a range whose leader's report is late: the empty plan could not move it"
        );
        assert_eq!(
            view(Liveness::Suspect, Some(3)).settled(true),
            None,
            "a leader on a suspect node may be about to move"
        );
        assert_eq!(
            view(Liveness::Suspect, Some(2)).settled(true),
            Some(BTreeSet::from([1, 2])),
            "settled for the healthy nodes only"
        );
    }
}
