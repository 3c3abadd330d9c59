//! Ranges as the cluster knows them: descriptors, the split command a parent range applies,
//! and the commands of the meta range (range 0), which keeps the descriptors and the node
//! registry. No I/O; placement and split decisions live in `keel-meta`.

use serde::{Deserialize, Serialize};

use crate::ids::{NodeAddr, NodeId, RangeId};

/// One range: its key span `[start, end)` (`end = None`: unbounded), how often the span has
/// changed (`epoch`, grows on every split) and how often its membership has (`conf_version`,
/// grows on every membership change), and the nodes holding a voting replica.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RangeDescriptor {
    pub id: RangeId,
    #[serde(with = "serde_bytes")]
    pub start: Vec<u8>,
    #[serde(with = "serde_bytes")]
    pub end: Option<Vec<u8>>,
    pub epoch: u64,
    pub conf_version: u64,
    /// Voting replicas, in node-id order.
    pub replicas: Vec<NodeId>,
}

impl RangeDescriptor {
    /// Whether `key` lies in `[start, end)`.
    pub fn contains(&self, key: &[u8]) -> bool {
        key >= self.start.as_slice() && self.end().is_none_or(|end| key < end)
    }

    /// The exclusive end; `None` = unbounded.
    pub fn end(&self) -> Option<&[u8]> {
        self.end.as_deref()
    }

    /// Whether this descriptor of the same range is newer than `other`: a later epoch, or the
    /// same epoch and a later `conf_version`. The meta range keeps only the newest.
    pub fn supersedes(&self, other: &RangeDescriptor) -> bool {
        (self.epoch, self.conf_version) > (other.epoch, other.conf_version)
    }

    /// The span as text for messages: `["a", "m")`, with `+inf` for an unbounded end.
    pub fn span_text(&self) -> String {
        let end = match self.end() {
            Some(end) => crate::validate::show_key(end),
            None => "+inf".to_string(),
        };
        format!("[{}, {end})", crate::validate::show_key(&self.start))
    }
}

impl std::fmt::Display for RangeDescriptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {} epoch {}", self.id, self.span_text(), self.epoch)
    }
}

/// Proposed to a parent range: split it at `at`. The parent keeps `[start, at)` and the
/// child `child` takes `[at, end)` with the parent's replicas, revision counter, clock,
/// sessions and request records; no data is copied. Refused (`Rejection::EpochMismatch`)
/// unless the parent's epoch is still `expected_epoch` and `start < at < end`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Split {
    #[serde(with = "serde_bytes")]
    pub at: Vec<u8>,
    pub child: RangeId,
    pub expected_epoch: u64,
}

/// A node as the meta range records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeDescriptor {
    pub id: NodeId,
    pub addr: NodeAddr,
}

/// Where a registered node stands: whether it takes replicas, gives them up, or has left.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub enum NodeState {
    /// Takes replicas and leaderships.
    #[default]
    Active,
    /// Being drained (`keel cluster remove-node`): its replicas and leaderships move to other
    /// nodes; it takes none.
    Draining,
    /// Drained and gone: holds nothing and may not join again under its id.
    Removed,
}

impl NodeState {
    pub fn name(self) -> &'static str {
        match self {
            NodeState::Active => "active",
            NodeState::Draining => "draining",
            NodeState::Removed => "removed",
        }
    }
}

/// A change of a range's replicas, carried out by its leader.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReplicaChange {
    /// Add `node` as a voter: learner, snapshot and log until caught up, then voter.
    Add { node: NodeId, addr: NodeAddr },
    /// Remove voter `node`, which must not be the leader.
    Remove { node: NodeId },
    /// Add `to` as a learner until caught up, then swap voter `from` (not the leader) for it
    /// in one joint change.
    Replace {
        from: NodeId,
        to: NodeId,
        addr: NodeAddr,
    },
    /// Remove learner `node`.
    RemoveLearner { node: NodeId },
    /// Finish a change that a leader stopped in the middle of (the membership is still joint):
    /// move to the change's new voters. Nothing to do when the membership is not joint.
    Finish,
}

impl ReplicaChange {
    /// The node that gains a replica, if any.
    pub fn added(&self) -> Option<(NodeId, &NodeAddr)> {
        match self {
            ReplicaChange::Add { node, addr } => Some((*node, addr)),
            ReplicaChange::Replace { to, addr, .. } => Some((*to, addr)),
            ReplicaChange::Remove { .. }
            | ReplicaChange::RemoveLearner { .. }
            | ReplicaChange::Finish => None,
        }
    }

    /// The node that loses its replica, if any.
    pub fn removed(&self) -> Option<NodeId> {
        match self {
            ReplicaChange::Remove { node } | ReplicaChange::RemoveLearner { node } => Some(*node),
            ReplicaChange::Replace { from, .. } => Some(*from),
            ReplicaChange::Add { .. } | ReplicaChange::Finish => None,
        }
    }
}

impl std::fmt::Display for ReplicaChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReplicaChange::Add { node, .. } => write!(f, "add {node}"),
            ReplicaChange::Remove { node } => write!(f, "remove {node}"),
            ReplicaChange::Replace { from, to, .. } => write!(f, "replace {from} -> {to}"),
            ReplicaChange::RemoveLearner { node } => write!(f, "remove learner {node}"),
            ReplicaChange::Finish => write!(f, "finish the half-done change"),
        }
    }
}

/// A range's membership as its leader committed it: the descriptor (span, epoch,
/// conf_version, voters) and the learners.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaMembership {
    pub range: RangeDescriptor,
    pub learners: Vec<NodeId>,
}

impl ReplicaMembership {
    /// Whether `node` is a voter or a learner.
    pub fn includes(&self, node: NodeId) -> bool {
        self.range.replicas.contains(&node) || self.learners.contains(&node)
    }
}

/// What a node tells its peers in its heartbeat.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeReport {
    pub addr: NodeAddr,
    /// Groups it runs.
    pub replicas: u64,
    /// The ranges it leads (the meta range included) with their membership as it knows it;
    /// sent only to the meta range's voters (`None` to the other peers).
    pub leads: Option<Vec<LedRange>>,
}

/// A range a node leads, with the membership its group has now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LedRange {
    pub range: RangeId,
    /// In id order.
    pub voters: Vec<NodeId>,
    /// In id order.
    pub learners: Vec<NodeId>,
    /// A membership change is half done (two configurations).
    pub joint: bool,
    /// Live keys and their bytes (keys + values) in the leader's applied state.
    pub keys: u64,
    pub size_bytes: u64,
    /// Requests per second the leader served lately, in thousandths.
    pub requests_per_sec_milli: u64,
}

/// A range its leader names in its heartbeat to a node holding a follower of it: idle on the
/// leader (every entry committed, applied and matched on every member) and proposed for
/// quiescence or already quiesced. In the follower node's answer, a listed range it agreed
/// to: its replica holds the same last log index and knows this leader in this term, and its
/// ticker is parked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct QuietRange {
    pub range: RangeId,
    /// The leader's term.
    pub term: u64,
    /// The index of the last entry in the leader's log.
    pub last_log_index: u64,
}

/// The meta range's voters and leader as a node knows them: what a heartbeat answers, so
/// nodes that host no replica of it can still reach it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetaMembers {
    pub leader: Option<NodeId>,
    /// In id order.
    pub voters: Vec<NodeDescriptor>,
}

/// A command of the meta range (range 0). Applied only there; any other range refuses it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum MetaCommand {
    /// Records each descriptor unless the meta range holds a descriptor of the same range
    /// that is as new or newer (`RangeDescriptor::supersedes`). Also moves the range id
    /// allocator past every id recorded.
    UpdateRanges { ranges: Vec<RangeDescriptor> },
    /// Hands out `count` range ids never handed out or recorded before.
    AllocateRangeIds { count: u64 },
    /// Records a node's address (a later record of the same id replaces it).
    RegisterNode(NodeDescriptor),
    /// Records where a node stands (a node without a record is `Active`). A `Removed` node
    /// stays removed: the command is refused for it.
    SetNodeState { node: NodeId, state: NodeState },
}

/// What applying a `MetaCommand` produced.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum MetaOutcome {
    /// How many of the descriptors were recorded (the others were not newer).
    RangesUpdated {
        recorded: u32,
    },
    /// Ids `first .. first + count`.
    RangeIdsAllocated {
        first: RangeId,
        count: u64,
    },
    NodeRegistered,
    NodeStateSet,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn descriptor(start: &[u8], end: Option<&[u8]>, epoch: u64, conf: u64) -> RangeDescriptor {
        RangeDescriptor {
            id: RangeId(7),
            start: start.to_vec(),
            end: end.map(<[u8]>::to_vec),
            epoch,
            conf_version: conf,
            replicas: vec![1, 2, 3],
        }
    }

    #[test]
    fn spans_are_half_open() {
        /// (start, end, key, contained)
        type Case = (&'static [u8], Option<&'static [u8]>, &'static [u8], bool);
        let cases: Vec<Case> = vec![
            (b"", None, b"any", true),
            (b"b", Some(b"d"), b"a", false),
            (b"b", Some(b"d"), b"b", true),
            (b"b", Some(b"d"), b"c\xff", true),
            (b"b", Some(b"d"), b"d", false),
            (b"b", None, b"\xff\xff", true),
        ];
        for (start, end, key, expected) in cases {
            let range = descriptor(start, end, 1, 1);
            assert_eq!(range.contains(key), expected, "{range} contains {key:?}");
        }
    }

    #[test]
    fn newer_epochs_and_conf_versions_supersede() {
        let base = descriptor(b"a", None, 2, 5);
        assert!(descriptor(b"a", Some(b"m"), 3, 0).supersedes(&base));
        assert!(descriptor(b"a", None, 2, 6).supersedes(&base));
        assert!(!descriptor(b"a", None, 2, 5).supersedes(&base));
        assert!(!descriptor(b"a", None, 1, 9).supersedes(&base));
    }
}
