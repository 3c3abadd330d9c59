//! One range's Raft group on this node: its openraft instance and state machine, and the
//! operations on it (propose a write, a split or a meta command, make a read consistent,
//! report status and descriptor) with openraft's errors already turned into `KvError`s.
//! Knows nothing of tonic or routing.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use keel_storage::raft_types::TypeConfig;
use keel_storage::{StateMachine, StorageError, Store};
use keel_types::planted::{self, PlantedBug};
use keel_types::{
    Command, CommandOutcome, Consistency, KvError, MetaCommand, MetaOutcome, NodeAddr, NodeId,
    RangeDescriptor, RangeId, ReplicaMembership, Split, limits,
};
use openraft::async_runtime::WatchReceiver;
use openraft::error::ForwardReason;
use openraft::error::{ClientWriteError, ForwardToLeader, LinearizableReadError, RaftError};
use openraft::{ReadPolicy, ServerState};
use tracing::{Instrument, info, info_span, warn};

use crate::error::GroupError;
use crate::freshness::Freshness;
use crate::network::NetworkFactory;
use crate::quiet_state::{Quiet, Wake};
use crate::read_calls::{self, ReadIndex, ReadIndexCounts};
use crate::role::Role;
use crate::timings::RaftTimings;
use crate::transport::Transport;

/// The openraft instance of one group.
pub(crate) type KeelRaft = openraft::Raft<TypeConfig, StateMachine>;

/// One member of a group's membership.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub id: NodeId,
    pub addr: NodeAddr,
    pub voter: bool,
}

/// This replica's view of its group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupStatus {
    pub range: RangeId,
    pub leader: Option<NodeId>,
    pub term: u64,
    pub commit_index: u64,
    pub applied_index: u64,
    pub last_log_index: u64,
    /// Last log index covered by the latest snapshot (0 = none).
    pub snapshot_index: u64,
    /// Last log index purged from the log (0 = none).
    pub purged_index: u64,
    pub revision: u64,
    pub role: Role,
    pub members: Vec<Member>,
    /// The group is quiesced here: its ticker is parked as leader or as an agreeing follower.
    pub quiesced: bool,
    /// On the leader: each other member's last log index known to match the leader's
    /// (0 = none yet), by node id. Empty on other replicas.
    pub matched: BTreeMap<NodeId, u64>,
    /// On a leader: how long ago a quorum last acknowledged it (zero when it alone is its
    /// quorum; `None` before the first acknowledgement and on other replicas).
    pub quorum_acked_ago: Option<Duration>,
    /// Read index calls this replica sent (following) and answered (leading), and the reads
    /// that waited for one, since the group started here.
    pub read_index: ReadIndexCounts,
}

/// One range's Raft group on this node.
pub struct RaftGroup {
    node_id: NodeId,
    range: RangeId,
    raft: KeelRaft,
    state_machine: StateMachine,
    store: Store,
    write_timeout: Duration,
    read_timeout: Duration,
    /// Held by a split or a replica change of the range for its whole course: one at a
    /// time.
    changes: tokio::sync::Mutex<()>,
    /// Whether the ticker is parked, and the operations keeping the group awake.
    pub(crate) quiet: Quiet,
    /// Read index calls to the leader, shared by this replica's linearizable reads while it
    /// follows.
    pub(crate) read_index: ReadIndex,
    /// When this replica was last known current with its leader (`freshness.rs`).
    pub(crate) freshness: Freshness,
    /// Set by `shutdown`: the Raft stops on purpose.
    stopping: AtomicBool,
}

impl RaftGroup {
    /// Starts the group's replica on this node from whatever `store` holds for `range`.
    pub async fn start<T: Transport>(
        node_id: NodeId,
        range: RangeId,
        store: &Store,
        timings: &RaftTimings,
        transport: Arc<T>,
    ) -> Result<RaftGroup, GroupError> {
        let config = timings.openraft_config()?;
        let read_timeout = Duration::from_millis(timings.read_timeout_ms);
        let read_index = ReadIndex::new(range, node_id, transport.clone(), read_timeout);
        let network = NetworkFactory {
            range,
            from: node_id,
            transport,
        };
        let span = info_span!("raft", node_id, range_id = range.0);
        let state_machine = store.state_machine(range).traced_under(span.clone());
        let raft = KeelRaft::new(
            node_id,
            config,
            network,
            store.log_store(range),
            state_machine.clone(),
        )
        .instrument(span)
        .await
        .map_err(|e| GroupError::Start {
            range,
            message: e.to_string(),
        })?;
        info!(node_id, range_id = range.0, "raft group started");
        Ok(RaftGroup {
            node_id,
            range,
            raft,
            state_machine,
            store: store.clone(),
            write_timeout: Duration::from_millis(timings.write_timeout_ms),
            read_timeout,
            changes: tokio::sync::Mutex::new(()),
            quiet: Quiet::new(),
            read_index,
            freshness: Freshness::default(),
            stopping: AtomicBool::new(false),
        })
    }

    pub fn range(&self) -> RangeId {
        self.range
    }

    pub fn node_id(&self) -> NodeId {
        self.node_id
    }

    /// The openraft instance, for callers that need more than this type offers.
    pub fn raft(&self) -> &KeelRaft {
        &self.raft
    }

    pub fn state_machine(&self) -> &StateMachine {
        &self.state_machine
    }

    /// How long a read may wait to be made consistent.
    pub(crate) fn read_timeout(&self) -> Duration {
        self.read_timeout
    }

    /// The store holding this group's log and state.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Makes this group's first membership: all `members` as voters. Call it once, on one
    /// node, for a group with no Raft state anywhere.
    pub async fn initialize(&self, members: BTreeMap<NodeId, NodeAddr>) -> Result<(), GroupError> {
        self.raft
            .initialize(members)
            .await
            .map_err(|e| GroupError::Initialize {
                range: self.range,
                message: e.to_string(),
            })
    }

    /// Whether this replica has Raft state (a membership), from storage or from a leader.
    pub async fn is_initialized(&self) -> Result<bool, KvError> {
        self.raft
            .is_initialized()
            .await
            .map_err(|e| fatal(self.range, &e))
    }

    /// Whether this replica had Raft state (a log or a vote) as of its latest metrics: no
    /// round trip to the group's Raft, for periodic checks of every group; may lag a state
    /// received a moment ago.
    pub fn has_state(&self) -> bool {
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow_watched();
        metrics.last_log_index.is_some() || metrics.vote.leader_id.term != 0
    }

    /// The leader this replica knows of, with its address.
    pub fn leader(&self) -> Option<(NodeId, NodeAddr)> {
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow_watched();
        let leader = metrics.current_leader?;
        let addr = metrics.membership_config.membership().get_node(&leader)?;
        Some((leader, addr.clone()))
    }

    /// The leader this replica knows of (itself included), waiting up to `timeout` for one
    /// while the group elects; `None` when none is known by then or Raft stopped.
    pub async fn await_leader(&self, timeout: Duration) -> Option<(NodeId, NodeAddr)> {
        let known = |metrics: &openraft::RaftMetrics<TypeConfig>| {
            let membership = metrics.membership_config.membership();
            let leader = metrics.current_leader;
            leader.is_some_and(|leader| membership.get_node(&leader).is_some())
        };
        let wait = self.raft.wait(Some(timeout));
        wait.metrics(known, "a leader is known").await.ok()?;
        self.leader()
    }

    /// The leader once this replica knows one other than `node` in a term after `term`
    /// (`read_calls::elected_since`); `None` when none is by `timeout` or Raft stopped.
    pub async fn await_new_leader(
        &self,
        term: u64,
        node: NodeId,
        timeout: Duration,
    ) -> Option<(NodeId, NodeAddr)> {
        if !read_calls::elected_since(&self.raft, term, node, timeout).await {
            return None;
        }
        self.leader().filter(|(leader, _)| *leader != node)
    }

    /// The members of the group's membership as this replica knows it (none before it has
    /// one).
    pub fn members(&self) -> Vec<Member> {
        members(&self.raft.metrics().borrow_watched())
    }

    /// The ids of the voters among `members`.
    pub fn voter_ids(&self) -> Vec<NodeId> {
        let members = self.members().into_iter();
        members.filter(|m| m.voter).map(|m| m.id).collect()
    }

    /// Asks this replica, which must lead, to hand leadership to voter `to`. Returns once
    /// the hand-over has started; the new leader is elected a round trip later (or, if `to`
    /// cannot win, this replica keeps leading).
    pub async fn transfer_leader(&self, to: NodeId) -> Result<(), KvError> {
        let _use = self.begin_use(Wake::Leader).await;
        let leader = self.leader();
        if leader.as_ref().map(|(id, _)| *id) != Some(self.node_id) {
            return Err(KvError::NotLeader {
                range_id: self.range,
                leader: leader.filter(|(id, _)| *id != self.node_id),
            });
        }
        let metrics = self.raft.metrics().borrow_watched().clone();
        if !metrics
            .membership_config
            .membership()
            .voter_ids()
            .any(|id| id == to)
        {
            return Err(KvError::invalid(format!(
                "node {to} is not a voter of range {}",
                self.range
            )));
        }
        if to == self.node_id {
            return Ok(());
        }
        self.raft
            .trigger()
            .transfer_leader(to)
            .await
            .map_err(|e| KvError::fatal(format!("raft of range {} stopped: {e}", self.range)))
    }

    /// Whether this replica knows a leader it can count on: a follower or learner that
    /// names one, or a leader that alone is its quorum or that a quorum acknowledged within
    /// `quorum_ack_max` (a leader cut off from its followers keeps believing it leads; they
    /// elect another after an election timeout). False for a replica in an election and
    /// for a stopped one.
    pub fn leader_known(&self, quorum_ack_max: Duration) -> bool {
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow_watched();
        if metrics.running_state.is_err() {
            return false;
        }
        match metrics.current_leader {
            None => false,
            Some(leader) if leader != self.node_id => true,
            Some(_) => quorum_acked_ago(&metrics).is_some_and(|ago| ago <= quorum_ack_max),
        }
    }

    /// Whether this replica leads its group, as far as it knows.
    pub fn is_leader(&self) -> bool {
        self.raft.metrics().borrow_watched().current_leader == Some(self.node_id)
    }

    /// `NotLeader` (with the leader it knows of) unless this replica leads.
    pub fn check_leader(&self) -> Result<(), KvError> {
        match self.is_leader() {
            true => Ok(()),
            false => Err(self.not_leader_now()),
        }
    }

    /// `NotLeader` naming the leader this replica knows of, if another.
    pub(crate) fn not_leader_now(&self) -> KvError {
        KvError::NotLeader {
            range_id: self.range,
            leader: self.leader().filter(|(id, _)| *id != self.node_id),
        }
    }

    /// Takes the range's change lock: splits and replica changes run one at a time.
    pub(crate) async fn lock_changes(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.changes.lock().await
    }

    /// The error for a Raft that stopped under a call.
    pub(crate) fn stopped(&self, error: &impl std::fmt::Display) -> KvError {
        fatal(self.range, error)
    }

    /// Starts an election at once (a no-op on a leader). For a range just split off, whose
    /// replicas would otherwise wait an election timeout.
    pub async fn elect(&self) -> Result<(), KvError> {
        let _use = self.begin_use(Wake::Any).await;
        self.raft
            .trigger()
            .elect(false)
            .await
            .map_err(|e| fatal(self.range, &e))
    }

    /// The range as this replica has applied it: span, epoch, conf_version and voters.
    pub async fn descriptor(&self) -> Result<RangeDescriptor, KvError> {
        self.state_machine.descriptor().await.map_err(|e| match e {
            StorageError::SnapshotInstalling { .. } => KvError::unavailable(e.to_string()),
            e => KvError::fatal(format!("range {}: {e}", self.range)),
        })
    }

    /// The range's applied membership (descriptor and learners) on this replica.
    pub async fn replica_membership(&self) -> Result<ReplicaMembership, KvError> {
        let membership = self.state_machine.replica_membership().await;
        membership.map_err(|e| match e {
            StorageError::SnapshotInstalling { .. } => KvError::unavailable(e.to_string()),
            e => KvError::fatal(format!("range {}: {e}", self.range)),
        })
    }

    /// Proposes splitting the range at `at` into a new range `child` (this replica must
    /// lead) and waits until it is applied: the range keeps `[start, at)` and `child` takes
    /// `[at, end)`, both at the next epoch. Returns both descriptors after the split.
    /// `EpochMismatch` when the range's epoch is no longer `expected_epoch` or `at` is not
    /// strictly inside its span (nothing changed).
    pub async fn split(
        &self,
        at: Vec<u8>,
        child: RangeId,
        expected_epoch: u64,
    ) -> Result<(RangeDescriptor, RangeDescriptor), KvError> {
        let split = Split {
            at,
            child,
            expected_epoch,
        };
        let _use = self.begin_use(Wake::Leader).await;
        let _change = self.lock_changes().await;
        match self.write(Command::Split(split)).await? {
            CommandOutcome::Split { left, right } => Ok((left, right)),
            CommandOutcome::Rejected(rejection) => Err(rejection.into()),
            other => Err(self.unexpected(&other)),
        }
    }

    /// Proposes a command of the meta range (this replica must lead the meta range) and
    /// waits until it is applied.
    pub async fn propose_meta(&self, command: MetaCommand) -> Result<MetaOutcome, KvError> {
        match self.write(Command::Meta(command)).await? {
            CommandOutcome::Meta(outcome) => Ok(outcome),
            CommandOutcome::Rejected(rejection) => Err(rejection.into()),
            other => Err(self.unexpected(&other)),
        }
    }

    /// This replica's current term.
    pub fn term(&self) -> u64 {
        self.raft.metrics().borrow_watched().current_term
    }

    /// Proposes `command` if this replica leads and waits until it is applied.
    ///
    /// `NotLeader` and `Unavailable` mean the command was definitely not proposed;
    /// `OutcomeUnknown` means it may have been (timeout, leadership lost after proposing, Raft
    /// stopped mid-way). A leader whose lease lapsed renews it with a heartbeat round first.
    /// A replica that knows another node leads answers `NotLeader` at once: the Raft core
    /// (another task) would only give the same answer a round trip later.
    pub async fn write(&self, command: Command) -> Result<CommandOutcome, KvError> {
        let _use = self.begin_use(Wake::Leader).await;
        if let Some(leader) = self.leader().filter(|(id, _)| *id != self.node_id) {
            return Err(KvError::NotLeader {
                range_id: self.range,
                leader: Some(leader),
            });
        }
        let deadline = Instant::now() + self.write_timeout;
        for _ in 0..limits::WRITE_LEASE_RENEWALS_MAX {
            match self.propose(command.clone(), deadline).await {
                Err(Proposal::LeaseExpired) => self.renew_lease(deadline).await?,
                Err(Proposal::Failed(error)) => return Err(error),
                Ok(outcome) => return Ok(outcome),
            }
        }
        match self.propose(command, deadline).await {
            Err(Proposal::LeaseExpired) => Err(KvError::unavailable(format!(
                "leader of range {} could not renew its lease",
                self.range
            ))),
            Err(Proposal::Failed(error)) => Err(error),
            Ok(outcome) => Ok(outcome),
        }
    }

    async fn propose(
        &self,
        command: Command,
        deadline: Instant,
    ) -> Result<CommandOutcome, Proposal> {
        let proposed = tokio::time::timeout_at(deadline, self.raft.client_write(command));
        let Ok(result) = proposed.await else {
            return Err(Proposal::Failed(KvError::OutcomeUnknown {
                message: format!(
                    "write to range {} not applied within {:?}; it may still be",
                    self.range, self.write_timeout
                ),
            }));
        };
        let error = match result {
            Ok(response) => {
                // Into the request's span, when it declares these fields (keel-server's do).
                let span = tracing::Span::current();
                span.record("log_index", response.log_id.index);
                span.record("term", response.log_id.committed_leader_id().term);
                return Ok(response.data);
            }
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(forward))) => {
                if forward.reason == ForwardReason::LeaseExpired {
                    return Err(Proposal::LeaseExpired);
                }
                self.not_leader(&forward)
            }
            Err(RaftError::APIError(error)) => KvError::OutcomeUnknown {
                message: format!("write to range {}: {error}", self.range),
            },
            Err(RaftError::Fatal(error)) => KvError::OutcomeUnknown {
                message: format!(
                    "raft of range {} stopped while writing ({error}); the write may have been applied",
                    self.range
                ),
            },
        };
        Err(Proposal::Failed(error))
    }

    /// Confirms leadership with a quorum (a heartbeat round), which renews the leader lease.
    pub(crate) async fn renew_lease(&self, deadline: Instant) -> Result<(), KvError> {
        let renewed = tokio::time::timeout_at(deadline, self.confirm(ReadPolicy::ReadIndex));
        match renewed.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(ReadFailure::Error(KvError::Timeout { message })))
            | Ok(Err(ReadFailure::Error(KvError::Unavailable { message }))) => {
                Err(KvError::unavailable(message))
            }
            Ok(Err(ReadFailure::Error(error))) => Err(error),
            Ok(Err(ReadFailure::LeaseExpired)) | Err(_) => Err(KvError::unavailable(format!(
                "leader of range {} could not renew its lease",
                self.range
            ))),
        }
    }

    /// Waits until a read of the local state machine is as consistent as `consistency` asks.
    /// Linearizable reads are served on any replica: a follower asks the leader for a read
    /// index and waits to apply it (`read_index.rs`), and answers `NotLeader` when it cannot.
    /// Lease reads are the leader's only, and fall back to ReadIndex when the lease has lapsed
    /// (as it has on a leader that was quiesced). Follower reads need nothing of the leader
    /// and do not wake it. A held range (`keel_types::Hold`) serves no read: `Unavailable`
    /// once the barrier is met, so a read ordered after the hold sees it.
    pub async fn read_barrier(&self, consistency: Consistency) -> Result<(), KvError> {
        self.barrier(consistency).await?;
        match self.state_machine().hold() {
            Some(hold) => Err(KvError::range_held(self.range, &hold)),
            None => Ok(()),
        }
    }

    async fn barrier(&self, consistency: Consistency) -> Result<(), KvError> {
        // The planted bug serves every read from local state, on any replica.
        if planted::active(PlantedBug::StaleRead) {
            return Ok(());
        }
        let policy = match consistency {
            Consistency::Follower => return Ok(()),
            Consistency::Linearizable => ReadPolicy::ReadIndex,
            Consistency::Lease => ReadPolicy::LeaseRead,
        };
        let started = Instant::now();
        let _use = self.begin_use(Wake::Leader).await;
        let confirmed = if matches!(consistency, Consistency::Linearizable) && !self.is_leader() {
            self.follower_read_barrier().await
        } else {
            self.leader_read_barrier(policy).await
        };
        if confirmed.is_ok() {
            self.freshness.confirmed(started);
        }
        confirmed
    }

    /// A read barrier on a replica that leads (or believes it does): `policy`, falling back
    /// from an expired lease to a read index.
    async fn leader_read_barrier(&self, policy: ReadPolicy) -> Result<(), KvError> {
        match self.confirm(policy).await {
            Err(ReadFailure::LeaseExpired) => match self.confirm(ReadPolicy::ReadIndex).await {
                Err(ReadFailure::LeaseExpired) => Err(self.not_leader(&ForwardToLeader::empty())),
                Err(ReadFailure::Error(error)) => Err(error),
                Ok(()) => Ok(()),
            },
            Err(ReadFailure::Error(error)) => Err(error),
            Ok(()) => Ok(()),
        }
    }

    /// Waits until this replica's applied index (`applied_index`) is other than `seen`: it
    /// applied an entry or installed a snapshot. `Unavailable` once the group stopped.
    pub async fn applied_change(&self, seen: u64) -> Result<(), KvError> {
        let mut metrics = self.raft.metrics();
        loop {
            let applied = metrics
                .borrow_watched()
                .last_applied
                .map_or(0, |id| id.index);
            if applied != seen {
                return Ok(());
            }
            if metrics.changed().await.is_err() {
                return Err(KvError::unavailable(format!(
                    "the replica of range {} on node {} stopped",
                    self.range, self.node_id
                )));
            }
        }
    }

    /// This replica's view of its group, with the applied revision from the state machine.
    pub async fn status(&self) -> Result<GroupStatus, KvError> {
        let (revision, applied) = self
            .state_machine
            .applied()
            .await
            .map_err(|e| KvError::fatal(format!("range {}: {e}", self.range)))?;
        let metrics = self.raft.metrics().borrow_watched().clone();
        let members = members(&metrics);
        Ok(GroupStatus {
            range: self.range,
            leader: metrics.current_leader,
            term: metrics.current_term,
            commit_index: metrics.cluster_committed.map_or(0, |id| id.index),
            applied_index: applied.map_or(0, |id| id.index),
            last_log_index: metrics.last_log_index.unwrap_or(0),
            snapshot_index: metrics.snapshot.map_or(0, |id| id.index),
            purged_index: metrics.purged.map_or(0, |id| id.index),
            revision,
            role: Role::of(metrics.state, metrics.running_state.is_ok()),
            members,
            quiesced: self.is_quiesced(),
            matched: matched(&metrics, self.node_id),
            quorum_acked_ago: quorum_acked_ago(&metrics),
            read_index: self.read_index.counts(),
        })
    }

    /// Why this group's Raft stopped on its own (a storage failure or a panic), if it did.
    /// None once `shutdown` was called: a group stopped on purpose (a replica removed while a
    /// health check holds the group) has not failed.
    pub fn failure(&self) -> Option<String> {
        if self.stopping.load(Ordering::Acquire) {
            return None;
        }
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow_watched();
        metrics
            .running_state
            .as_ref()
            .err()
            .map(|e| format!("raft of range {} stopped: {e}", self.range))
    }

    /// Stops the group's Raft tasks. Later calls on this group fail.
    pub async fn shutdown(&self) {
        self.stopping.store(true, Ordering::Release);
        if let Err(error) = self.raft.shutdown().await {
            warn!(node_id = self.node_id, range_id = self.range.0, %error, "raft shutdown");
        }
    }

    async fn confirm(&self, policy: ReadPolicy) -> Result<(), ReadFailure> {
        let confirmed =
            tokio::time::timeout(self.read_timeout, self.raft.ensure_linearizable(policy));
        let Ok(result) = confirmed.await else {
            return Err(ReadFailure::Error(KvError::Timeout {
                message: format!(
                    "range {} could not confirm leadership within {:?}",
                    self.range, self.read_timeout
                ),
            }));
        };
        let error = match result {
            Ok(_) => return Ok(()),
            Err(RaftError::APIError(LinearizableReadError::ForwardToLeader(forward))) => {
                if forward.reason == ForwardReason::LeaseExpired {
                    return Err(ReadFailure::LeaseExpired);
                }
                self.not_leader(&forward)
            }
            Err(RaftError::APIError(LinearizableReadError::QuorumNotEnough(error))) => {
                KvError::unavailable(format!("range {}: {error}", self.range))
            }
            Err(RaftError::Fatal(error)) => fatal(self.range, &error),
        };
        Err(ReadFailure::Error(error))
    }

    /// A command applied with an outcome it cannot have: its fate is not known from it.
    fn unexpected(&self, outcome: &CommandOutcome) -> KvError {
        KvError::OutcomeUnknown {
            message: format!(
                "range {} answered the command with an outcome of kind {}, which it cannot have; it may or may not have been applied",
                self.range,
                outcome.kind()
            ),
        }
    }

    fn not_leader(&self, forward: &ForwardToLeader<TypeConfig>) -> KvError {
        let leader = match (forward.leader_id, &forward.leader_node) {
            (Some(id), Some(addr)) if id != self.node_id => Some((id, addr.clone())),
            _ => None,
        };
        KvError::NotLeader {
            range_id: self.range,
            leader,
        }
    }
}

/// Why a proposal did not go through.
enum Proposal {
    /// The leader's lease lapsed; nothing was proposed.
    LeaseExpired,
    Failed(KvError),
}

/// Why a leadership confirmation failed.
enum ReadFailure {
    /// The leader's lease lapsed; a ReadIndex round may still succeed.
    LeaseExpired,
    Error(KvError),
}

fn members(metrics: &openraft::RaftMetrics<TypeConfig>) -> Vec<Member> {
    let membership = metrics.membership_config.membership();
    let voters: Vec<NodeId> = membership.voter_ids().collect();
    membership
        .nodes()
        .map(|(id, addr)| Member {
            id: *id,
            addr: addr.clone(),
            voter: voters.contains(id),
        })
        .collect()
}

/// On a leader, each other member's matched log index (0 = none yet).
fn matched(metrics: &openraft::RaftMetrics<TypeConfig>, own: NodeId) -> BTreeMap<NodeId, u64> {
    let Some(replication) = &metrics.replication else {
        return BTreeMap::new();
    };
    replication
        .iter()
        .filter(|(id, _)| **id != own)
        .map(|(id, matched)| (*id, matched.as_ref().map_or(0, |log_id| log_id.index)))
        .collect()
}

/// On a leader, how long ago a quorum acknowledged it; zero for a leader that alone is its
/// quorum (openraft's `millis_since_quorum_ack` says so; `last_quorum_acked` does not).
fn quorum_acked_ago(metrics: &openraft::RaftMetrics<TypeConfig>) -> Option<Duration> {
    if metrics.state != ServerState::Leader {
        return None;
    }
    let voters = metrics.membership_config.membership().voter_ids().count();
    if voters == 1 {
        return Some(Duration::ZERO);
    }
    use openraft::Instant as _;
    metrics
        .last_quorum_acked
        .as_ref()
        .map(|acked| acked.elapsed())
}

fn fatal(range: RangeId, error: &impl std::fmt::Display) -> KvError {
    KvError::fatal(format!("raft of range {range} stopped: {error}"))
}
