//! Carries out the nemesis plan against the running cluster: finds the leader, starts each
//! fault, holds it, heals it and logs it to faults.jsonl with start and stop on the run's
//! clock, and after every range fault (split, move, membership, disk) the range table to
//! ranges.jsonl. Knows nothing of workloads beyond the keys they route by; it acts on
//! processes (`Cluster`), links (`Network`), data files (`damage`), the test-only Faults
//! service (clocks, split thresholds, moves, rows changed behind Raft's back), and asks nodes
//! who leads through keel-client. At the end it reports on the replicas (`replica_report`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use keel_client::{Client, ClientOptions, PutOptions, RangeInfo};
use keel_proto::test::v1::faults_client::FaultsClient;
use keel_proto::test::v1::{
    CorruptRowRequest, MoveReplicaRequest, SetClockOffsetRequest, SetSplitThresholdsRequest,
};
use keel_proto::v1::RangeCheck;
use keel_types::{Consistency, RangeId};
use serde_json::{Map, Value, json};
use tonic::transport::Channel;

use crate::fault::FaultEvent;
use crate::replicas::{CorruptedKey, RangeVerdict, ReplicaReport};
use crate::run::clock::RunClock;
use crate::run::cluster::{Cluster, node_name};
use crate::run::damage;
use crate::run::net::Network;
use crate::run::plan::{self, FaultAction, FaultKind, MemberChange, PlannedFault, Who};
use crate::run::recorder::Recorder;
use crate::run::rng::Rng;
use crate::run::topology::RangeLog;
use crate::run::workload::{Members, Workload};

/// How long the nemesis looks for a leader before a fault that needs one.
pub const LEADER_WAIT: Duration = Duration::from_secs(5);
/// Pause between two rounds of status requests while looking for the leader.
pub const LEADER_POLL: Duration = Duration::from_millis(200);
/// Budget of one status, transfer, split or clock request of the nemesis.
pub const ADMIN_TIMEOUT: Duration = Duration::from_secs(2);
/// Budget of one replica move (a learner caught up by snapshot, then a joint change).
pub const MOVE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a node restarted on damaged data is watched for refusing to start.
pub const DAMAGE_WATCH: Duration = Duration::from_secs(10);
/// How long the end of a `disk` fault waits for the cluster to re-create the replaced
/// node's replicas elsewhere (the dead timeout, then one replica move per range).
pub const HEAL_WAIT: Duration = Duration::from_secs(30);
/// Tries of a `split` or `move` fault, and the pause between two: the range table it picks
/// from may be a moment old (another fault or the rebalancer just changed the range), and the
/// cluster then refuses the stale choice; each try picks again from a fresh table.
pub const RANGE_FAULT_ATTEMPTS: u64 = 5;
pub const RANGE_FAULT_RETRY: Duration = Duration::from_secs(1);
/// Keys the `corrupt` fault writes and changes: `jepsen-corrupt/1`, ... (no workload uses them).
pub const CORRUPT_KEY_PREFIX: &str = "jepsen-corrupt/";
/// How long a `corrupt` fault waits for its node to apply the key before changing it.
pub const CORRUPT_APPLY_WAIT: Duration = Duration::from_secs(10);
/// How long the end of a run gives the consistency checks to repair the corrupted keys.
pub const REPAIR_WAIT: Duration = Duration::from_secs(30);
/// Budget of the final consistency check of every range.
pub const FINAL_CHECK_TIMEOUT: Duration = Duration::from_secs(120);
/// Split thresholds while a `split` fault holds: a range splits after one second above 10
/// requests per second, or above 1 KiB (the smallest size a node accepts).
pub const SPLIT_BYTES_LOW: u64 = 1024;
pub const SPLIT_REQUESTS_PER_SEC_LOW: u64 = 10;
pub const SPLIT_LOAD_SECS_LOW: u64 = 1;

/// What a started fault must undo.
#[derive(Debug)]
enum Undo {
    Heal,
    Restart(Vec<usize>),
    Resume(usize),
    ClockZero(usize),
    /// Put these nodes' split thresholds back.
    SplitThresholds(Vec<(usize, SetSplitThresholdsRequest)>),
    /// Node `0`'s data was damaged and it refused to start: replace it by a spare.
    Replace(usize),
    Nothing,
}

/// A fault that has started.
#[derive(Debug)]
struct Active {
    kind: FaultKind,
    target: String,
    start_ns: u64,
    undo: Undo,
    extra: Map<String, Value>,
}

pub struct Nemesis {
    pub cluster: Cluster,
    network: Network,
    /// Every node's endpoint by index, spares included.
    endpoints: Vec<String>,
    admin: Client,
    clock: RunClock,
    faults: Recorder,
    workload: Arc<Workload>,
    ranges: Arc<RangeLog>,
    /// The nodes (by index) that are members now: not drained, not retired; faults that hit
    /// a node pick among them. Published to the clients (`shared_members`) when it changes.
    members: Vec<usize>,
    shared_members: Arc<Members>,
    /// The keys `corrupt` faults changed on one replica, with what was written.
    corrupted: Vec<CorruptedKey>,
}

/// What the nemesis acts on besides the cluster and its network.
pub struct Parts {
    /// Every node's endpoint by index, spares included.
    pub endpoints: Vec<String>,
    /// The members, the first nodes at the start; the nemesis keeps it up to date.
    pub members: Arc<Members>,
    pub clock: RunClock,
    pub faults: Recorder,
    pub workload: Arc<Workload>,
    pub ranges: Arc<RangeLog>,
}

impl Nemesis {
    pub fn new(cluster: Cluster, network: Network, context: Parts) -> anyhow::Result<Nemesis> {
        let members = context.members.now();
        let first = members.iter().map(|m| context.endpoints[*m].clone());
        let admin = Client::new(first.collect(), admin_options())?;
        Ok(Nemesis {
            cluster,
            network,
            endpoints: context.endpoints,
            admin,
            clock: context.clock,
            faults: context.faults,
            workload: context.workload,
            ranges: context.ranges,
            members,
            shared_members: context.members,
            corrupted: Vec::new(),
        })
    }

    /// Runs the plan until `end` (time since the run began); a fault still on then is
    /// healed at `end`. A fault that could not be started is reported and skipped (the
    /// coverage checker notices a kind that never happened).
    pub async fn run(&mut self, faults: &[PlannedFault], end: Duration) -> anyhow::Result<()> {
        for fault in faults {
            let start = Duration::from_millis(fault.start_ms);
            if start >= end {
                break;
            }
            tokio::time::sleep_until(self.clock.at(start)).await;
            let active = match self.begin(&fault.action).await {
                Ok(active) => active,
                Err(error) => {
                    eprintln!(
                        "keel-jepsen: {} not started: {error:#}",
                        fault.action.kind()
                    );
                    continue;
                }
            };
            let stop = (start + Duration::from_millis(fault.hold_ms)).min(end);
            tokio::time::sleep_until(self.clock.at(stop)).await;
            self.end(active).await?;
        }
        Ok(())
    }

    /// Restores everything a fault may have left: links, paused and dead nodes, clocks.
    pub async fn heal_all(&mut self) -> anyhow::Result<()> {
        self.network.heal().await?;
        for index in 0..self.cluster.len() {
            self.cluster.pause(index, false)?;
        }
        for (index, status) in self.cluster.exited() {
            eprintln!(
                "keel-jepsen: node {} had exited on its own ({status}); restarting it",
                node_name(index)
            );
        }
        self.cluster.start_all()
    }

    /// Ends the run: the last range table is recorded, then every node gets kill -9 (their
    /// data stays in the run directory).
    pub async fn finish(mut self) -> anyhow::Result<usize> {
        self.ranges.read(&self.admin, "final").await;
        self.cluster.kill_all().await?;
        self.ranges.finish().map_err(anyhow::Error::msg)?;
        self.faults.finish().map_err(anyhow::Error::msg)
    }

    async fn begin(&mut self, action: &FaultAction) -> anyhow::Result<Active> {
        if self.members.is_empty() {
            bail!("no member is left to fault");
        }
        let mut extra = Map::new();
        // When the fault took effect, if not when `begin` is done.
        let mut took_effect_ns = None;
        let (target, undo) = match action {
            FaultAction::Partition(shape) => {
                let leader = self.resolve(Who::Leader).await;
                let at = self.members.iter().position(|m| *m == leader).unwrap_or(0);
                let sides: Vec<Vec<usize>> = plan::partition_sides(shape, at, self.members.len())
                    .into_iter()
                    .map(|side| side.iter().map(|i| self.members[*i]).collect())
                    .collect();
                self.network.partition(&sides).await?;
                let mut target = sides_text(&sides);
                if *shape == plan::PartitionShape::IsolateLeader {
                    target = target.replacen('|', " (leader)|", 1);
                }
                (target, Undo::Heal)
            }
            FaultAction::Kill(who) => {
                let node = self.resolve(*who).await;
                self.cluster.kill(node).await?;
                (describe(*who, node), Undo::Restart(vec![node]))
            }
            FaultAction::KillAll => {
                let running: Vec<usize> = (0..self.cluster.len())
                    .filter(|node| self.cluster.is_running(*node))
                    .collect();
                self.cluster.kill_all().await?;
                ("all".to_string(), Undo::Restart(running))
            }
            FaultAction::Pause(who) => {
                let node = self.resolve(*who).await;
                self.cluster.pause(node, true)?;
                (describe(*who, node), Undo::Resume(node))
            }
            FaultAction::LeaderTransfer { nth } => {
                let (leader, voters) = match self.find_leader().await {
                    Some(found) => found,
                    None => (self.members[0], Vec::new()),
                };
                let others: Vec<usize> = voters
                    .iter()
                    .map(|id| *id as usize - 1)
                    .filter(|node| *node != leader)
                    .collect();
                let to = others
                    .get(nth % others.len().max(1))
                    .copied()
                    .unwrap_or(leader);
                self.admin
                    .transfer_leader(RangeId::FIRST, to as u64 + 1)
                    .await
                    .context("Cluster.TransferLeader")?;
                let target = format!("{} -> {}", node_name(leader), node_name(to));
                (target, Undo::Nothing)
            }
            FaultAction::Clock {
                node: who,
                offset_ms,
            } => {
                let node = self.resolve(*who).await;
                self.set_clock_offset(node, *offset_ms).await?;
                let target = format!("{} {offset_ms:+} ms", describe(*who, node));
                (target, Undo::ClockZero(node))
            }
            FaultAction::Split { pick } => {
                let target = self.split(*pick).await?;
                let previous = self.lower_split_thresholds().await;
                (target, Undo::SplitThresholds(previous))
            }
            FaultAction::Move { pick } => (self.move_replica(*pick).await?, Undo::Nothing),
            FaultAction::Membership(change) => self.change_members(*change).await?,
            FaultAction::Disk { node: who, damage } => {
                let node = self.resolve(*who).await;
                self.cluster.kill(node).await?;
                took_effect_ns = Some(self.clock.now_ns());
                let done = damage::apply(self.cluster.data_dir(node), *damage)?;
                self.cluster.start(node)?;
                let refused = self.cluster.wait_exit(node, DAMAGE_WATCH).await;
                extra.insert("damage".into(), json!(done));
                let undo = match &refused {
                    Some(status) => {
                        extra.insert("outcome".into(), json!("refused"));
                        extra.insert("exit".into(), json!(status.to_string()));
                        Undo::Replace(node)
                    }
                    None => {
                        extra.insert("outcome".into(), json!("running"));
                        Undo::Nothing
                    }
                };
                (describe(*who, node), undo)
            }
            FaultAction::Corrupt { node: who } => {
                let node = self.resolve(*who).await;
                let (key, range) = self.corrupt(node).await?;
                extra.insert("key".into(), json!(key));
                extra.insert("range".into(), json!(range));
                (describe(*who, node), Undo::Nothing)
            }
        };
        let start_ns = took_effect_ns.unwrap_or_else(|| self.clock.now_ns());
        if action.kind().changes_ranges() {
            self.ranges.read(&self.admin, action.kind().as_str()).await;
        }
        Ok(Active {
            kind: action.kind(),
            target,
            start_ns,
            undo,
            extra,
        })
    }

    async fn end(&mut self, mut active: Active) -> anyhow::Result<()> {
        match &active.undo {
            Undo::Heal => self.network.heal().await?,
            Undo::Restart(nodes) => {
                for node in nodes {
                    self.cluster.start(*node)?;
                }
            }
            Undo::Resume(node) => self.cluster.pause(*node, false)?,
            Undo::ClockZero(node) => {
                if let Err(error) = self.set_clock_offset(*node, 0).await {
                    eprintln!(
                        "keel-jepsen: clock of {} not reset: {error:#}",
                        node_name(*node)
                    );
                }
            }
            Undo::SplitThresholds(previous) => {
                for (node, settings) in previous {
                    // A node restarted meanwhile has its own settings again.
                    let call = self.faults_call(*node, ADMIN_TIMEOUT, |mut faults| async move {
                        faults.set_split_thresholds(*settings).await.map(|_| ())
                    });
                    if let Err(error) = call.await {
                        eprintln!(
                            "keel-jepsen: split thresholds of {} not reset: {error:#}",
                            node_name(*node)
                        );
                    }
                }
            }
            Undo::Replace(node) => {
                let replaced = self.replace(*node).await;
                active.extra.insert("replaced_by".into(), json!(replaced));
                let healed = self.wait_healed(*node as u64 + 1).await;
                active.extra.insert("healed".into(), json!(healed));
            }
            Undo::Nothing => {}
        }
        let stop_ns = self.clock.now_ns();
        if active.kind.changes_ranges() {
            self.ranges.read(&self.admin, active.kind.as_str()).await;
        }
        self.faults.record(&FaultEvent {
            fault: active.kind.as_str().to_string(),
            target: active.target,
            start_ns: active.start_ns,
            stop_ns: Some(stop_ns),
            extra: active.extra,
        });
        Ok(())
    }

    /// Splits the range holding one of the keys the workload routes by now, at that key
    /// (`pick` chooses which among the keys that do not start a range yet).
    async fn split(&self, pick: u64) -> anyhow::Result<String> {
        retried(pick, |rng| self.try_split(rng)).await
    }

    async fn try_split(&self, mut rng: Rng) -> anyhow::Result<String> {
        let table = self.admin.ranges().await.context("Cluster.Ranges")?;
        let starts_none = |key: &Vec<u8>| table.iter().all(|range| range.descriptor.start != *key);
        let used = self.workload.routing_keys();
        let mut keys: Vec<Vec<u8>> = used
            .iter()
            .filter(|key| starts_none(key))
            .cloned()
            .collect();
        if keys.is_empty() {
            // Every key in use starts a range (a workload with few keys, split before): split
            // right after one instead, so its range still changes while it is written.
            keys = used
                .iter()
                .map(|key| [key.as_slice(), &[0]].concat())
                .filter(|key| starts_none(key))
                .collect();
        }
        let Some(key) = pick_one(&keys, &mut rng) else {
            bail!("every key the workload uses, and the key after it, starts a range already");
        };
        let (left, right) = self
            .admin
            .split(key)
            .await
            .with_context(|| format!("splitting at {:?}", String::from_utf8_lossy(key)))?;
        Ok(format!(
            "{} at {:?} -> {} | {}",
            left.id,
            String::from_utf8_lossy(key),
            left.id,
            right.id
        ))
    }

    /// Lowers every running member's split thresholds; returns what they were.
    async fn lower_split_thresholds(&self) -> Vec<(usize, SetSplitThresholdsRequest)> {
        let low = SetSplitThresholdsRequest {
            range_split_bytes: SPLIT_BYTES_LOW,
            range_split_requests_per_sec: SPLIT_REQUESTS_PER_SEC_LOW,
            range_split_load_secs: SPLIT_LOAD_SECS_LOW,
        };
        let mut previous = Vec::new();
        for &node in &self.members {
            let call = self.faults_call(node, ADMIN_TIMEOUT, |mut faults| async move {
                faults
                    .set_split_thresholds(low)
                    .await
                    .map(|answer| answer.into_inner())
            });
            match call.await {
                Ok(answer) => previous.push((
                    node,
                    SetSplitThresholdsRequest {
                        range_split_bytes: answer.range_split_bytes,
                        range_split_requests_per_sec: answer.range_split_requests_per_sec,
                        range_split_load_secs: answer.range_split_load_secs,
                    },
                )),
                Err(error) => eprintln!(
                    "keel-jepsen: split thresholds of {} not lowered: {error:#}",
                    node_name(node)
                ),
            }
        }
        previous
    }

    /// Moves a replica of a range holding workload keys to a member without one, then hands
    /// another range's leadership to another of its voters.
    async fn move_replica(&self, pick: u64) -> anyhow::Result<String> {
        retried(pick, |rng| self.try_move(rng)).await
    }

    async fn try_move(&self, mut rng: Rng) -> anyhow::Result<String> {
        let table = self.admin.ranges().await.context("Cluster.Ranges")?;
        let keys = self.workload.routing_keys();
        let busy: Vec<&RangeInfo> = table
            .iter()
            .filter(|range| keys.iter().any(|key| range.descriptor.contains(key)))
            .collect();
        let Some(range) = pick_one(&busy, &mut rng) else {
            bail!("no range holds the workload's keys");
        };
        let id = range.descriptor.id;
        // The leader must hand over before its replica can go; leaderships move below.
        let voters: Vec<u64> = range
            .descriptor
            .replicas
            .iter()
            .copied()
            .filter(|node| Some(*node) != range.leader)
            .collect();
        let outside: Vec<u64> = self
            .members
            .iter()
            .map(|node| *node as u64 + 1)
            .filter(|node| !voters.contains(node))
            .collect();
        let (Some(&from), Some(&to)) = (pick_one(&voters, &mut rng), pick_one(&outside, &mut rng))
        else {
            bail!(
                "range {id} has no voter but its leader to move, or no member without a \
                 replica to move one to (a move needs more nodes than replicas: --nodes 5)"
            );
        };
        let via = self.members[rng.below(self.members.len() as u64) as usize];
        let request = MoveReplicaRequest {
            range_id: id.0,
            from_node: from,
            to_node: to,
        };
        self.faults_call(via, MOVE_TIMEOUT, |mut faults| async move {
            faults.move_replica(request).await.map(|_| ())
        })
        .await
        .with_context(|| format!("moving range {id}'s replica from n{from} to n{to}"))?;
        let mut target = format!("{id} n{from} -> n{to}");
        // The new replica, made from a snapshot, leads the range next, so that what the
        // snapshot carried is read back at once (a follower that installed one would only
        // serve reads once it leads). Then another range's leadership moves too.
        self.hand_leadership(id, to, &mut target).await;
        let table = self.admin.ranges().await.context("Cluster.Ranges")?;
        let others: Vec<&RangeInfo> = table.iter().filter(|r| r.descriptor.id != id).collect();
        if let Some(other) = pick_one(&others, &mut rng) {
            let candidates: Vec<u64> = other
                .descriptor
                .replicas
                .iter()
                .copied()
                .filter(|node| Some(*node) != other.leader)
                .collect();
            if let Some(&to) = pick_one(&candidates, &mut rng) {
                self.hand_leadership(other.descriptor.id, to, &mut target)
                    .await;
            }
        }
        Ok(target)
    }

    /// Asks range `range`'s leader to hand leadership to `to`, noting it in `target`; a
    /// refusal is logged and the fault goes on.
    async fn hand_leadership(&self, range: RangeId, to: u64, target: &mut String) {
        match self.admin.transfer_leader(range, to).await {
            Ok(()) => target.push_str(&format!("; {range} leader -> n{to}")),
            Err(error) => eprintln!(
                "keel-jepsen: move: leadership of range {range} to n{to} not moved: {error}"
            ),
        }
    }

    /// Adds, drains or takes down a member for a while.
    async fn change_members(&mut self, change: MemberChange) -> anyhow::Result<(String, Undo)> {
        match change {
            MemberChange::Add => {
                let Some(&node) = self.cluster.spares().first() else {
                    bail!("no spare node left to add");
                };
                self.cluster.activate(node)?;
                self.members.push(node);
                self.shared_members.set(&self.members);
                Ok((format!("{} joins", node_name(node)), Undo::Nothing))
            }
            MemberChange::Drain { pick } => {
                let node = self.members[pick as usize % self.members.len()];
                self.admin
                    .remove_node(node as u64 + 1)
                    .await
                    .with_context(|| format!("Cluster.RemoveNode of {}", node_name(node)))?;
                self.members.retain(|member| *member != node);
                self.shared_members.set(&self.members);
                Ok((format!("{} drained", node_name(node)), Undo::Nothing))
            }
            MemberChange::Outage { pick } => {
                let node = self.members[pick as usize % self.members.len()];
                self.cluster.kill(node).await?;
                Ok((
                    format!("{} down", node_name(node)),
                    Undo::Restart(vec![node]),
                ))
            }
        }
    }

    /// Replaces `node`, whose data is damaged, as an operator would: it never starts again,
    /// it is removed from the cluster, and a spare node joins in its place. Returns the
    /// spare's name, if there was one.
    async fn replace(&mut self, node: usize) -> Option<String> {
        if let Err(error) = self.cluster.retire(node).await {
            eprintln!("keel-jepsen: {} not retired: {error:#}", node_name(node));
        }
        self.members.retain(|member| *member != node);
        self.shared_members.set(&self.members);
        if let Err(error) = self.admin.remove_node(node as u64 + 1).await {
            eprintln!(
                "keel-jepsen: damaged {} not removed: {error}",
                node_name(node)
            );
        }
        let spare = *self.cluster.spares().first()?;
        match self.cluster.activate(spare) {
            Ok(()) => {
                self.members.push(spare);
                self.shared_members.set(&self.members);
                Some(node_name(spare))
            }
            Err(error) => {
                eprintln!("keel-jepsen: {} not started: {error:#}", node_name(spare));
                None
            }
        }
    }

    /// Waits up to `HEAL_WAIT` until no range has a voter on node `id` (its replicas were
    /// re-created on other nodes), so the next fault does not take a second replica of a
    /// range that has not healed from this one: two of three replicas lost for good is a
    /// lost quorum in any Raft store, not a finding. Returns whether it healed in time.
    async fn wait_healed(&self, id: u64) -> bool {
        let deadline = tokio::time::Instant::now() + HEAL_WAIT;
        loop {
            if let Ok(table) = self.admin.ranges().await
                && table
                    .iter()
                    .all(|range| !range.descriptor.replicas.contains(&id))
            {
                return true;
            }
            if tokio::time::Instant::now() + LEADER_POLL > deadline {
                return false;
            }
            tokio::time::sleep(LEADER_POLL).await;
        }
    }

    /// The node a fault hits. The leader is the member that says it leads the first range
    /// in the highest term; if none does within `LEADER_WAIT`, the first member stands in.
    /// `Who::Node(i)` is the i-th member (modulo their number).
    async fn resolve(&self, who: Who) -> usize {
        match who {
            Who::Node(nth) => self.members[nth % self.members.len()],
            Who::Leader => match self.find_leader().await {
                Some((node, _)) => node,
                None => self.members[0],
            },
        }
    }

    /// The leader of the first range and that range's voters (node ids), as the leader says.
    async fn find_leader(&self) -> Option<(usize, Vec<u64>)> {
        let deadline = tokio::time::Instant::now() + LEADER_WAIT;
        loop {
            let mut best: Option<(u64, usize, Vec<u64>)> = None;
            for &index in &self.members {
                let Ok(status) = self.admin.status(&self.endpoints[index]).await else {
                    continue;
                };
                let leads = status
                    .ranges
                    .iter()
                    .find(|range| range.range_id == RangeId::FIRST.0 && range.role == "leader");
                if let Some(range) = leads
                    && best.as_ref().is_none_or(|(term, ..)| range.term > *term)
                {
                    let voters = range.members.iter().filter(|m| m.voter);
                    let voters = voters.map(|member| member.node_id).collect();
                    best = Some((range.term, index, voters));
                }
            }
            if let Some((_, index, voters)) = best {
                return Some((index, voters));
            }
            if tokio::time::Instant::now() + LEADER_POLL > deadline {
                return None;
            }
            tokio::time::sleep(LEADER_POLL).await;
        }
    }

    /// Writes a key of the nemesis's own, waits until node `node`'s replica serves it, then
    /// changes its row there behind Raft's back. Returns the key and its range.
    async fn corrupt(&mut self, node: usize) -> anyhow::Result<(String, u64)> {
        let n = self.corrupted.len() + 1;
        let (key, written) = (format!("{CORRUPT_KEY_PREFIX}{n}"), format!("written {n}"));
        self.admin
            .put(key.as_bytes(), written.as_bytes(), PutOptions::default())
            .await
            .context("writing the key to corrupt")?;
        let reader = Client::new(vec![self.endpoints[node].clone()], admin_options())?;
        let deadline = tokio::time::Instant::now() + CORRUPT_APPLY_WAIT;
        while follower_read(&reader, &key).await.as_deref() != Some(written.as_str()) {
            if tokio::time::Instant::now() >= deadline {
                bail!(
                    "{} did not apply {key} within {CORRUPT_APPLY_WAIT:?}",
                    node_name(node)
                );
            }
            tokio::time::sleep(LEADER_POLL).await;
        }
        let request = CorruptRowRequest {
            key: key.clone().into_bytes(),
        };
        let range = self
            .faults_call(node, ADMIN_TIMEOUT, |mut faults| async move {
                faults.corrupt_row(request).await
            })
            .await?
            .into_inner()
            .range_id;
        self.corrupted.push(CorruptedKey {
            key: key.clone(),
            written,
            node: node_name(node),
            reads: BTreeMap::new(),
        });
        Ok((key, range))
    }

    /// What the run ends with about the replicas themselves (`replicas.json`): every
    /// corrupted key read on every member (each given up to `REPAIR_WAIT` to serve what was
    /// written: the periodic checks repair it), then a consistency check of every range.
    pub async fn replica_report(&mut self) -> ReplicaReport {
        let mut report = ReplicaReport::default();
        let deadline = tokio::time::Instant::now() + REPAIR_WAIT;
        for key in &mut self.corrupted {
            for node in self.members.clone() {
                let reader = match Client::new(vec![self.endpoints[node].clone()], admin_options())
                {
                    Ok(reader) => reader,
                    Err(_) => continue,
                };
                let mut read = follower_read(&reader, &key.key).await;
                while read.as_deref() != Some(key.written.as_str())
                    && tokio::time::Instant::now() < deadline
                {
                    tokio::time::sleep(LEADER_POLL).await;
                    read = follower_read(&reader, &key.key).await;
                }
                key.reads.insert(node_name(node), read);
            }
        }
        report.corrupted = self.corrupted.clone();
        match self.admin.check(None, FINAL_CHECK_TIMEOUT).await {
            Ok(ranges) => {
                report.ranges = ranges.iter().map(range_verdict).collect();
            }
            Err(error) => report.check_error = error.to_string(),
        }
        report
    }

    async fn set_clock_offset(&self, node: usize, offset_ms: i64) -> anyhow::Result<()> {
        self.faults_call(node, ADMIN_TIMEOUT, |mut faults| async move {
            faults
                .set_clock_offset(SetClockOffsetRequest { offset_ms })
                .await
                .map(|_| ())
        })
        .await
    }

    /// One call of node `node`'s `keel.test.v1.Faults` service within `timeout`.
    async fn faults_call<T, F, Fut>(
        &self,
        node: usize,
        timeout: Duration,
        call: F,
    ) -> anyhow::Result<T>
    where
        F: FnOnce(FaultsClient<Channel>) -> Fut,
        Fut: Future<Output = Result<T, tonic::Status>>,
    {
        let uri = format!("http://{}", self.endpoints[node]);
        let attempt = async {
            let channel = tonic::transport::Endpoint::from_shared(uri.clone())?
                .connect_timeout(ADMIN_TIMEOUT)
                .connect()
                .await?;
            anyhow::Ok(call(FaultsClient::new(channel)).await?)
        };
        tokio::time::timeout(timeout, attempt)
            .await
            .with_context(|| format!("Faults call to {uri} timed out"))?
            .with_context(|| format!("Faults call to {uri}"))
    }
}

/// The nemesis' admin client options: one budget for every call.
/// A follower read of `key` on the client's one node: its value, `None` if absent or the
/// node did not answer.
async fn follower_read(reader: &Client, key: &str) -> Option<String> {
    let got = reader
        .get(key.as_bytes(), Consistency::Follower)
        .await
        .ok()?;
    got.kv
        .map(|kv| String::from_utf8_lossy(&kv.value).into_owned())
}

fn range_verdict(range: &RangeCheck) -> RangeVerdict {
    RangeVerdict {
        range: range.range_id,
        verdict: range.verdict.clone(),
        divergent: range.divergent.clone(),
        repaired: range.repaired.clone(),
        rows: range.replicas.iter().flat_map(|r| r.rows.clone()).collect(),
        error: range.error.clone(),
    }
}

fn admin_options() -> ClientOptions {
    ClientOptions {
        request_timeout: ADMIN_TIMEOUT,
        read_attempt_timeout: ADMIN_TIMEOUT,
        connect_timeout: ADMIN_TIMEOUT,
        ..ClientOptions::default()
    }
}

/// `attempt` up to `RANGE_FAULT_ATTEMPTS` times, `RANGE_FAULT_RETRY` apart, each with its own
/// random stream from `pick`; the last error if none succeeds.
async fn retried<T, F, Fut>(pick: u64, mut attempt: F) -> anyhow::Result<T>
where
    F: FnMut(Rng) -> Fut,
    Fut: Future<Output = anyhow::Result<T>>,
{
    let mut last = None;
    for n in 0..RANGE_FAULT_ATTEMPTS {
        match attempt(Rng::new(pick).fork(n)).await {
            Ok(value) => return Ok(value),
            Err(error) => last = Some(error),
        }
        tokio::time::sleep(RANGE_FAULT_RETRY).await;
    }
    Err(last.unwrap_or_else(|| anyhow::anyhow!("no attempt was made")))
}

/// A random item of `items`, if any.
fn pick_one<'a, T>(items: &'a [T], rng: &mut Rng) -> Option<&'a T> {
    match items.len() {
        0 => None,
        len => items.get(rng.below(len as u64) as usize),
    }
}

/// `n2` or `n2 (leader)`.
fn describe(who: Who, node: usize) -> String {
    match who {
        Who::Leader => format!("{} (leader)", node_name(node)),
        Who::Node(_) => node_name(node),
    }
}

/// `n1|n2,n3`.
fn sides_text(sides: &[Vec<usize>]) -> String {
    sides
        .iter()
        .map(|side| {
            side.iter()
                .map(|node| node_name(*node))
                .collect::<Vec<_>>()
                .join(",")
        })
        .collect::<Vec<_>>()
        .join("|")
}
