//! The nemesis schedule as a pure function of the seed: which fault happens when, for how
//! long, against whom. "Decide in pure code, act in the runtime": `nemesis.rs` carries the
//! plan out. Knows nothing of processes, networks or clients; the leader is named as a role
//! (`Who::Leader`) and found when the fault starts.

use std::fmt;
use std::str::FromStr;

use crate::run::rng::Rng;

/// `--consistency-check-interval-ms` of runs with the `corrupt` or `disk` fault: each node
/// checks every range it leads once a second.
pub const CHECK_INTERVAL_MS: u64 = 1_000;

/// Time with no fault at the start of a run, so the cluster elects a leader and the clients
/// warm up.
pub const WARMUP_MS: u64 = 3_000;
/// How long one fault lasts, drawn in this range.
pub const HOLD_MS_MIN: u64 = 2_000;
pub const HOLD_MS_MAX: u64 = 5_000;
/// Quiet time between two faults, drawn in this range.
pub const GAP_MS_MIN: u64 = 1_000;
pub const GAP_MS_MAX: u64 = 3_000;
/// A fault shorter than this is not started (it would end before it acted).
pub const HOLD_MS_SHORTEST: u64 = 1_000;
/// Faults in one plan, whatever the time limit.
pub const FAULTS_MAX: usize = 10_000;
/// The clock fault shifts a node's clock by this much, either way.
pub const CLOCK_OFFSET_MS: i64 = 2_000;
/// Chance (per mille) that `kill` and `clock` hit the leader rather than a random node.
pub const LEADER_PER_MILLE: u64 = 500;
/// Shortest hold of a `membership` outage and of a `disk` fault: longer than the node dead
/// timeout runs with these faults give their nodes (`DEAD_AFTER_MS`), so the node's replicas
/// are re-created elsewhere while it is gone.
pub const LONG_HOLD_MS: u64 = 7_000;
/// `--node-dead-after-ms` of runs with `membership` or `disk` faults.
pub const DEAD_AFTER_MS: u64 = 3_000;

/// A fault kind, as named on the command line, in run.json and in faults.jsonl.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FaultKind {
    Partition,
    Kill,
    KillAll,
    Pause,
    LeaderTransfer,
    Clock,
    Split,
    Move,
    Membership,
    Disk,
    Corrupt,
}

/// A node by role or by index (0-based; node id = index + 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Who {
    Leader,
    Node(usize),
}

/// Which nodes a partition separates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PartitionShape {
    /// The leader alone against the rest.
    IsolateLeader,
    /// These nodes (about half) against the rest.
    Halves(Vec<usize>),
    /// This node alone against the rest.
    OneNode(usize),
}

/// What a fault does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FaultAction {
    Partition(PartitionShape),
    /// kill -9, then restart with the same data at the end of the hold.
    Kill(Who),
    /// kill -9 of every node, then restart them all: loses what was acknowledged unsynced.
    KillAll,
    /// SIGSTOP, then SIGCONT.
    Pause(Who),
    /// Ask the leader to hand over to the `nth` other node (modulo their number).
    LeaderTransfer {
        nth: usize,
    },
    /// Shift a node's clock (TTL and session time, never the host's), then back to 0.
    Clock {
        node: Who,
        offset_ms: i64,
    },
    /// Split a range at a key the workload is using and lower every node's split thresholds
    /// for the hold (load and size splits); `pick` chooses the key.
    Split {
        pick: u64,
    },
    /// Move a replica of a range holding workload keys to a node without one, and hand
    /// another range's leadership to another voter; `pick` chooses ranges and nodes.
    Move {
        pick: u64,
    },
    /// Change the cluster's members.
    Membership(MemberChange),
    /// With a node stopped, damage its data; restart it. It must refuse to serve.
    Disk {
        node: Who,
        damage: Damage,
    },
    /// Write a key of the nemesis's own, then change its row on one node's replica behind
    /// Raft's back (`Faults.CorruptRow`): the consistency checks must find and repair it.
    Corrupt {
        node: Who,
    },
}

/// What a `membership` fault does; they take turns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemberChange {
    /// Start a new node that joins the cluster (`keel serve --join`).
    Add,
    /// Drain a member (`Cluster.RemoveNode`): its replicas move away, then it is removed.
    Drain { pick: u64 },
    /// Kill a member for longer than the dead timeout, so its replicas are re-created
    /// elsewhere, then restart it.
    Outage { pick: u64 },
}

/// How a `disk` fault damages a stopped node's data; they take turns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Damage {
    /// Flip bytes inside the store file (keel.redb).
    FlipStore { pick: u64 },
    /// Flip bytes inside the newest snapshot file (the store file when there is none).
    FlipSnapshot { pick: u64 },
    /// Cut the end of the store file off, as a lost last write would.
    TruncateStore { pick: u64 },
    /// Flip bytes inside the written part of the newest Raft log segment (keel.raft-log/).
    FlipLog { pick: u64 },
}

/// One fault of the plan; times in ms since the run began.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedFault {
    pub start_ms: u64,
    pub hold_ms: u64,
    pub action: FaultAction,
}

/// Plans faults of `kinds` for a cluster of `nodes` from `WARMUP_MS` until `time_limit_ms`:
/// kinds take turns (from a seeded first one, so every requested kind comes early), holds
/// and gaps are drawn from the seed, and every fault ends by the time limit.
pub fn plan(seed: u64, kinds: &[FaultKind], nodes: usize, time_limit_ms: u64) -> Vec<PlannedFault> {
    let mut kinds = kinds.to_vec();
    kinds.sort();
    kinds.dedup();
    if kinds.is_empty() || nodes == 0 {
        return Vec::new();
    }
    let mut rng = Rng::new(seed).fork(u64::from_le_bytes(*b"nemesis\0"));
    rng.shuffle(&mut kinds);
    let mut turns = Turns::new(&mut rng);
    let mut faults = Vec::new();
    let mut start_ms = WARMUP_MS;
    while faults.len() < FAULTS_MAX {
        let left_ms = time_limit_ms.saturating_sub(start_ms);
        let mut hold_ms = rng.between(HOLD_MS_MIN, HOLD_MS_MAX).min(left_ms);
        if hold_ms < HOLD_MS_SHORTEST {
            break;
        }
        let kind = kinds[faults.len() % kinds.len()];
        let action = choose_action(kind, nodes, &mut rng, &mut turns);
        if action.needs_long_hold() {
            hold_ms = hold_ms.max(LONG_HOLD_MS);
            if hold_ms > left_ms {
                break;
            }
        }
        faults.push(PlannedFault {
            start_ms,
            hold_ms,
            action,
        });
        start_ms += hold_ms + rng.between(GAP_MS_MIN, GAP_MS_MAX);
    }
    faults
}

/// The plan with every `kill` and `partition` aimed at the leader (kill the leader; isolate
/// the leader from the rest), as `pause` always is; other faults as they were. For
/// measuring fail-over (`--leader-faults`, bench/failover.sh): each such fault then costs the
/// cluster its leader.
pub fn at_leader(mut faults: Vec<PlannedFault>) -> Vec<PlannedFault> {
    for fault in &mut faults {
        match fault.action {
            FaultAction::Kill(_) => fault.action = FaultAction::Kill(Who::Leader),
            FaultAction::Partition(_) => {
                fault.action = FaultAction::Partition(PartitionShape::IsolateLeader)
            }
            _ => {}
        }
    }
    faults
}

/// The plan with at least `gap_ms_min` of quiet between the end of one fault and the start of
/// the next: later faults move later, and those that no longer end by `time_limit_ms` are
/// dropped. For measuring fail-over (`--fault-gap-ms-min`, bench/failover.sh): a window that
/// runs from a fault's start until some seconds after its heal is then never cut short by the
/// next fault.
pub fn spaced(faults: Vec<PlannedFault>, gap_ms_min: u64, time_limit_ms: u64) -> Vec<PlannedFault> {
    let mut spaced: Vec<PlannedFault> = Vec::new();
    for mut fault in faults {
        if let Some(previous) = spaced.last() {
            let earliest_ms = previous.start_ms + previous.hold_ms + gap_ms_min;
            fault.start_ms = fault.start_ms.max(earliest_ms);
        }
        if fault.start_ms + fault.hold_ms > time_limit_ms {
            break;
        }
        spaced.push(fault);
    }
    spaced
}

/// Partition shapes, membership changes and damages each rotate, from a seeded first one.
struct Turns {
    shape: u64,
    member: u64,
    damage: u64,
}

impl Turns {
    fn new(rng: &mut Rng) -> Turns {
        // The membership and damage turns start from a stream of their own, so plans
        // without those faults stay what they were before they existed.
        let mut own = rng.fork(u64::from_le_bytes(*b"turns\0\0\0"));
        Turns {
            shape: rng.below(3),
            member: own.below(3),
            damage: own.below(3),
        }
    }

    fn member(&mut self, rng: &mut Rng) -> MemberChange {
        self.member += 1;
        let pick = rng.next_u64();
        match self.member % 3 {
            0 => MemberChange::Add,
            1 => MemberChange::Drain { pick },
            _ => MemberChange::Outage { pick },
        }
    }

    fn damage(&mut self, rng: &mut Rng) -> Damage {
        self.damage += 1;
        let pick = rng.next_u64();
        match self.damage % 4 {
            0 => Damage::FlipStore { pick },
            1 => Damage::FlipSnapshot { pick },
            2 => Damage::TruncateStore { pick },
            _ => Damage::FlipLog { pick },
        }
    }

    fn shape(&mut self, nodes: usize, rng: &mut Rng) -> PartitionShape {
        let turn = self.shape % 3;
        self.shape += 1;
        match turn {
            0 => PartitionShape::IsolateLeader,
            1 => {
                let mut order: Vec<usize> = (0..nodes).collect();
                rng.shuffle(&mut order);
                let mut side: Vec<usize> = order[..nodes / 2].to_vec();
                side.sort();
                PartitionShape::Halves(side)
            }
            _ => PartitionShape::OneNode(rng.below(nodes as u64) as usize),
        }
    }
}

fn choose_action(kind: FaultKind, nodes: usize, rng: &mut Rng, turns: &mut Turns) -> FaultAction {
    let leader_or_any = |rng: &mut Rng| match rng.chance(LEADER_PER_MILLE) {
        true => Who::Leader,
        false => Who::Node(rng.below(nodes as u64) as usize),
    };
    match kind {
        FaultKind::Partition => FaultAction::Partition(turns.shape(nodes, rng)),
        FaultKind::Kill => FaultAction::Kill(leader_or_any(rng)),
        FaultKind::KillAll => FaultAction::KillAll,
        FaultKind::Pause => FaultAction::Pause(Who::Leader),
        FaultKind::LeaderTransfer => FaultAction::LeaderTransfer {
            nth: rng.below(nodes as u64) as usize,
        },
        FaultKind::Clock => {
            let node = leader_or_any(rng);
            let offset_ms = match rng.chance(500) {
                true => CLOCK_OFFSET_MS,
                false => -CLOCK_OFFSET_MS,
            };
            FaultAction::Clock { node, offset_ms }
        }
        FaultKind::Split => FaultAction::Split {
            pick: rng.next_u64(),
        },
        FaultKind::Move => FaultAction::Move {
            pick: rng.next_u64(),
        },
        FaultKind::Membership => FaultAction::Membership(turns.member(rng)),
        FaultKind::Disk => FaultAction::Disk {
            node: leader_or_any(rng),
            damage: turns.damage(rng),
        },
        FaultKind::Corrupt => FaultAction::Corrupt {
            node: leader_or_any(rng),
        },
    }
}

impl FaultKind {
    pub const ALL: [FaultKind; 11] = [
        FaultKind::Partition,
        FaultKind::Kill,
        FaultKind::KillAll,
        FaultKind::Pause,
        FaultKind::LeaderTransfer,
        FaultKind::Clock,
        FaultKind::Split,
        FaultKind::Move,
        FaultKind::Membership,
        FaultKind::Disk,
        FaultKind::Corrupt,
    ];

    /// Whether the fault changes ranges or their replicas (split, move, membership, disk,
    /// corrupt: its repair re-creates a replica): the runner records the range table when one
    /// starts and ends.
    pub fn changes_ranges(self) -> bool {
        matches!(
            self,
            FaultKind::Split
                | FaultKind::Move
                | FaultKind::Membership
                | FaultKind::Disk
                | FaultKind::Corrupt
        )
    }

    pub fn as_str(self) -> &'static str {
        match self {
            FaultKind::Partition => "partition",
            FaultKind::Kill => "kill",
            FaultKind::KillAll => "kill-all",
            FaultKind::Pause => "pause",
            FaultKind::LeaderTransfer => "leader-transfer",
            FaultKind::Clock => "clock",
            FaultKind::Split => "split",
            FaultKind::Move => "move",
            FaultKind::Membership => "membership",
            FaultKind::Disk => "disk",
            FaultKind::Corrupt => "corrupt",
        }
    }
}

impl FaultAction {
    pub fn kind(&self) -> FaultKind {
        match self {
            FaultAction::Partition(_) => FaultKind::Partition,
            FaultAction::Kill(_) => FaultKind::Kill,
            FaultAction::KillAll => FaultKind::KillAll,
            FaultAction::Pause(_) => FaultKind::Pause,
            FaultAction::LeaderTransfer { .. } => FaultKind::LeaderTransfer,
            FaultAction::Clock { .. } => FaultKind::Clock,
            FaultAction::Split { .. } => FaultKind::Split,
            FaultAction::Move { .. } => FaultKind::Move,
            FaultAction::Membership(_) => FaultKind::Membership,
            FaultAction::Disk { .. } => FaultKind::Disk,
            FaultAction::Corrupt { .. } => FaultKind::Corrupt,
        }
    }

    /// Whether the fault must outlast the dead timeout (`LONG_HOLD_MS`).
    fn needs_long_hold(&self) -> bool {
        matches!(
            self,
            FaultAction::Membership(MemberChange::Outage { .. }) | FaultAction::Disk { .. }
        )
    }

    /// Whether the fault needs a node that is not a member yet: an added node, or the node
    /// that replaces one whose data was damaged.
    pub fn needs_spare_node(&self) -> bool {
        matches!(
            self,
            FaultAction::Membership(MemberChange::Add) | FaultAction::Disk { .. }
        )
    }
}

/// Nodes a plan may start beyond the first `nodes` (one per added or replaced node), within
/// `nodes_max` in all.
pub fn spare_nodes(plan: &[PlannedFault], nodes: usize, nodes_max: usize) -> usize {
    let wanted = plan
        .iter()
        .filter(|fault| fault.action.needs_spare_node())
        .count();
    wanted.min(nodes_max.saturating_sub(nodes))
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for FaultKind {
    type Err = String;

    fn from_str(name: &str) -> Result<FaultKind, String> {
        FaultKind::ALL
            .into_iter()
            .find(|kind| kind.as_str() == name)
            .ok_or_else(|| {
                let known: Vec<&str> = FaultKind::ALL.iter().map(|k| k.as_str()).collect();
                format!("unknown fault {name:?}; known: {}", known.join(", "))
            })
    }
}

/// The groups of a partition, by node index: the named side first, then the rest.
pub fn partition_sides(shape: &PartitionShape, leader: usize, nodes: usize) -> Vec<Vec<usize>> {
    let side: Vec<usize> = match shape {
        PartitionShape::IsolateLeader => vec![leader],
        PartitionShape::Halves(side) => side.clone(),
        PartitionShape::OneNode(node) => vec![*node],
    };
    let rest = (0..nodes).filter(|node| !side.contains(node)).collect();
    vec![side, rest]
}

/// Every pair of nodes (lower index first) that a partition into `sides` cuts apart.
pub fn cut_pairs(sides: &[Vec<usize>]) -> Vec<(usize, usize)> {
    let mut pairs = Vec::new();
    for (i, a_side) in sides.iter().enumerate() {
        for b_side in &sides[i + 1..] {
            for &a in a_side {
                for &b in b_side {
                    pairs.push((a.min(b), a.max(b)));
                }
            }
        }
    }
    pairs.sort();
    pairs
}
