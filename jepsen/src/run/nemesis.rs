//! Carries out the nemesis plan against the running cluster: finds the leader, starts each
//! fault, holds it, heals it and logs it to faults.jsonl with start and stop on the run's
//! clock. Knows nothing of workloads; it acts on processes (`Cluster`), links (`Network`)
//! and the test-only clock hook, and asks nodes who leads through keel-client.

use std::time::Duration;

use anyhow::Context;
use keel_client::{Client, ClientOptions};
use keel_proto::test::v1::SetClockOffsetRequest;
use keel_proto::test::v1::faults_client::FaultsClient;
use keel_types::RangeId;
use serde_json::Map;

use crate::fault::FaultEvent;
use crate::run::clock::RunClock;
use crate::run::cluster::{Cluster, node_name};
use crate::run::net::Network;
use crate::run::plan::{self, FaultAction, FaultKind, PlannedFault, Who};
use crate::run::recorder::Recorder;

/// How long the nemesis looks for a leader before a fault that needs one.
pub const LEADER_WAIT: Duration = Duration::from_secs(5);
/// Pause between two rounds of status requests while looking for the leader.
pub const LEADER_POLL: Duration = Duration::from_millis(200);
/// Budget of one status, transfer or clock request of the nemesis.
pub const ADMIN_TIMEOUT: Duration = Duration::from_secs(2);

/// What a started fault must undo.
#[derive(Debug)]
enum Undo {
    Heal,
    Restart(Vec<usize>),
    Resume(usize),
    ClockZero(usize),
    Nothing,
}

/// A fault that has started.
#[derive(Debug)]
struct Active {
    kind: FaultKind,
    target: String,
    start_ns: u64,
    undo: Undo,
}

pub struct Nemesis {
    pub cluster: Cluster,
    network: Network,
    endpoints: Vec<String>,
    admin: Client,
    clock: RunClock,
    faults: Recorder,
}

impl Nemesis {
    pub fn new(
        cluster: Cluster,
        network: Network,
        endpoints: Vec<String>,
        clock: RunClock,
        faults: Recorder,
    ) -> anyhow::Result<Nemesis> {
        let options = ClientOptions {
            request_timeout: ADMIN_TIMEOUT,
            read_attempt_timeout: ADMIN_TIMEOUT,
            connect_timeout: ADMIN_TIMEOUT,
            ..ClientOptions::default()
        };
        let admin = Client::new(endpoints.clone(), options)?;
        Ok(Nemesis {
            cluster,
            network,
            endpoints,
            admin,
            clock,
            faults,
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

    /// Ends the run: every node gets kill -9 (their data stays in the run directory).
    pub async fn finish(mut self) -> anyhow::Result<usize> {
        self.cluster.kill_all().await?;
        self.faults.finish().map_err(anyhow::Error::msg)
    }

    async fn begin(&mut self, action: &FaultAction) -> anyhow::Result<Active> {
        let nodes = self.cluster.len();
        let (target, undo) = match action {
            FaultAction::Partition(shape) => {
                let leader = self.resolve(Who::Leader).await;
                let sides = plan::partition_sides(shape, leader, nodes);
                self.network.partition(&sides).await?;
                (sides_text(&sides), Undo::Heal)
            }
            FaultAction::Kill(who) => {
                let node = self.resolve(*who).await;
                self.cluster.kill(node).await?;
                (describe(*who, node), Undo::Restart(vec![node]))
            }
            FaultAction::KillAll => {
                self.cluster.kill_all().await?;
                ("all".to_string(), Undo::Restart((0..nodes).collect()))
            }
            FaultAction::Pause(who) => {
                let node = self.resolve(*who).await;
                self.cluster.pause(node, true)?;
                (describe(*who, node), Undo::Resume(node))
            }
            FaultAction::LeaderTransfer { nth } => {
                let leader = self.resolve(Who::Leader).await;
                let others: Vec<usize> = (0..nodes).filter(|node| *node != leader).collect();
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
        };
        Ok(Active {
            kind: action.kind(),
            target,
            start_ns: self.clock.now_ns(),
            undo,
        })
    }

    async fn end(&mut self, active: Active) -> anyhow::Result<()> {
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
            Undo::Nothing => {}
        }
        self.faults.record(&FaultEvent {
            fault: active.kind.as_str().to_string(),
            target: active.target,
            start_ns: active.start_ns,
            stop_ns: Some(self.clock.now_ns()),
            extra: Map::new(),
        });
        Ok(())
    }

    /// The node a fault hits. The leader is the node that says it leads the first range in
    /// the highest term; if none does within `LEADER_WAIT`, node 1 stands in.
    async fn resolve(&self, who: Who) -> usize {
        match who {
            Who::Node(node) => node,
            Who::Leader => self.find_leader().await.unwrap_or(0),
        }
    }

    async fn find_leader(&self) -> Option<usize> {
        let deadline = tokio::time::Instant::now() + LEADER_WAIT;
        loop {
            let mut best: Option<(u64, usize)> = None;
            for (index, endpoint) in self.endpoints.iter().enumerate() {
                let Ok(status) = self.admin.status(endpoint).await else {
                    continue;
                };
                let leads = status
                    .ranges
                    .iter()
                    .find(|range| range.range_id == RangeId::FIRST.0 && range.role == "leader");
                if let Some(range) = leads
                    && best.is_none_or(|(term, _)| range.term > term)
                {
                    best = Some((range.term, index));
                }
            }
            if let Some((_, index)) = best {
                return Some(index);
            }
            if tokio::time::Instant::now() + LEADER_POLL > deadline {
                return None;
            }
            tokio::time::sleep(LEADER_POLL).await;
        }
    }

    async fn set_clock_offset(&self, node: usize, offset_ms: i64) -> anyhow::Result<()> {
        let uri = format!("http://{}", self.endpoints[node]);
        let call = async {
            let channel = tonic::transport::Endpoint::from_shared(uri.clone())?
                .connect_timeout(ADMIN_TIMEOUT)
                .connect()
                .await?;
            FaultsClient::new(channel)
                .set_clock_offset(SetClockOffsetRequest { offset_ms })
                .await?;
            anyhow::Ok(())
        };
        tokio::time::timeout(ADMIN_TIMEOUT, call)
            .await
            .with_context(|| format!("Faults.SetClockOffset at {uri} timed out"))?
            .with_context(|| format!("Faults.SetClockOffset at {uri}"))
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
