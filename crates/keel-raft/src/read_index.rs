//! Linearizable reads on a follower, by ReadIndex: the follower asks its group's leader for a
//! read index (the leader confirms with a quorum that it still leads and answers its commit
//! point), waits until it has applied that index itself, then reads its own state machine.
//! Every write acknowledged before the read arrived is then visible.
//!
//! Reads arriving together on one replica share calls (`ReadIndex`): one call in flight per
//! group; a read joins only a call sent after it arrived (an earlier call's index may predate
//! a write the reader already saw acknowledged), so reads arriving while a call is out wait
//! for the next one, which carries them all. The leader's side is `serve_read_index`.
//!
//! Any failure (no leader known, the leader refuses or is unreachable, this replica does not
//! apply the index in time) leaves the read unserved: the caller answers `NotLeader`, never a
//! stale value. Knows nothing of tonic, routing or what is read.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use keel_storage::raft_types::LogId;
use keel_types::{KvError, NodeId, RangeId, limits};
use openraft::ReadPolicy;
use openraft::async_runtime::WatchReceiver;
use openraft::error::{LinearizableReadError, RaftError};
use openraft::raft::linearizable_read::{Linearizer, ReadLogId};
use serde::{Deserialize, Serialize};
use thiserror::Error;
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::debug;

use crate::group::{KeelRaft, RaftGroup};
use crate::quiet_state::Wake;
use crate::transport::{Peer, RaftMessage, RpcKind, Transport, TransportError};
use crate::wire;

/// How many read index calls this replica sent, how many reads waited for one, and how many
/// calls of other replicas it answered as leader. Reads above calls show batching.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReadIndexCounts {
    pub calls: u64,
    pub reads: u64,
    pub served: u64,
}

/// A follower's request for a read index; the range and sender ride on the `RaftMessage`.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub(crate) struct ReadIndexRequest;

/// Why the asked replica gave no read index.
#[derive(Debug, Clone, PartialEq, Eq, Error, Serialize, Deserialize)]
pub(crate) enum ReadIndexRefusal {
    #[error("it does not lead the range (it knows leader {leader:?})")]
    NotLeader { leader: Option<NodeId> },
    #[error("it could not confirm its leadership: {message}")]
    Unconfirmed { message: String },
    #[error("its raft stopped: {message}")]
    Stopped { message: String },
}

/// The leader's answer: the log id to apply through before reading, or why not.
pub(crate) type ReadIndexReply = Result<LogId, ReadIndexRefusal>;

/// Why a follower read could not be made linearizable here.
#[derive(Debug, Clone, Error)]
pub(crate) enum ReadIndexError {
    #[error("this replica knows no leader to ask for a read index")]
    NoLeader,
    #[error(
        "{waiting} reads already wait for a read index; limit is {}",
        limits::READ_INDEX_READS_WAITING_MAX
    )]
    Busy { waiting: u64 },
    #[error("leader {leader} gave no read index: {refusal}")]
    Refused {
        leader: NodeId,
        refusal: ReadIndexRefusal,
    },
    #[error("read index call to node {leader}: {message}")]
    Call { leader: NodeId, message: String },
    #[error("no read index arrived in time")]
    Timeout,
    #[error("applied index {applied} did not reach read index {index} within {timeout:?}")]
    Behind {
        applied: u64,
        index: u64,
        timeout: Duration,
    },
    #[error("raft stopped while waiting to apply the read index: {0}")]
    Stopped(String),
}

/// The read index calls of one group's replica on this node, shared by concurrent reads.
pub(crate) struct ReadIndex {
    calls: Arc<Calls>,
}

impl ReadIndex {
    /// Calls for `range`'s replica on node `from`, sent through `transport`; each call may
    /// take `call_timeout`.
    pub(crate) fn new<T: Transport>(
        range: RangeId,
        from: NodeId,
        transport: Arc<T>,
        call_timeout: Duration,
    ) -> ReadIndex {
        let (answers, _) = watch::channel(None);
        ReadIndex {
            calls: Arc::new(Calls {
                range,
                from,
                call_timeout,
                sender: Box::new(Via(transport)),
                batch: Mutex::new(Batch::default()),
                answers,
                calls: AtomicU64::new(0),
                reads: AtomicU64::new(0),
                served: AtomicU64::new(0),
            }),
        }
    }

    pub(crate) fn counts(&self) -> ReadIndexCounts {
        ReadIndexCounts {
            calls: self.calls.calls.load(Ordering::Relaxed),
            reads: self.calls.reads.load(Ordering::Relaxed),
            served: self.calls.served.load(Ordering::Relaxed),
        }
    }

    /// The read index for a read arriving now: the answer of the first call sent after now,
    /// by `deadline`.
    async fn index(&self, raft: &KeelRaft, deadline: Instant) -> Result<LogId, ReadIndexError> {
        let (call, mut answers, _waiting) = self.join(raft)?;
        let answered = answers.wait_for(|answer| answer.as_ref().is_some_and(|a| a.call >= call));
        match tokio::time::timeout_at(deadline, answered).await {
            Err(_) => Err(ReadIndexError::Timeout),
            // The sender lives as long as `self`; closed means the group is going away.
            Ok(Err(_)) => Err(ReadIndexError::Stopped(
                "read index calls ended".to_string(),
            )),
            Ok(Ok(answer)) => match answer.as_ref() {
                Some(answer) => answer.index.clone(),
                None => Err(ReadIndexError::Timeout),
            },
        }
    }

    /// Registers a read for the next call not yet sent, and starts the calls if none run.
    fn join(
        &self,
        raft: &KeelRaft,
    ) -> Result<(u64, watch::Receiver<Option<Answer>>, Waiting), ReadIndexError> {
        let mut batch = self.calls.lock();
        if batch.waiting >= limits::READ_INDEX_READS_WAITING_MAX {
            return Err(ReadIndexError::Busy {
                waiting: batch.waiting,
            });
        }
        batch.waiting += 1;
        self.calls.reads.fetch_add(1, Ordering::Relaxed);
        let call = batch.started + 1;
        batch.wanted = batch.wanted.max(call);
        let answers = self.calls.answers.subscribe();
        if !batch.driving {
            batch.driving = true;
            tokio::spawn(drive(self.calls.clone(), raft.clone()));
        }
        Ok((call, answers, Waiting(self.calls.clone())))
    }
}

impl RaftGroup {
    /// Makes a linearizable read on this replica, which does not lead, wait until it is as
    /// fresh as the leader's commit point at its arrival (see the module doc). `NotLeader`,
    /// naming the leader this replica knows of, when it cannot.
    pub(crate) async fn follower_read_barrier(&self) -> Result<(), KvError> {
        let deadline = Instant::now() + self.read_timeout();
        let ready = match self.read_index.index(self.raft(), deadline).await {
            Ok(index) => self.await_applied(index, deadline).await,
            Err(error) => Err(error),
        };
        ready.map_err(|error| {
            debug!(range_id = self.range().0, %error, "follower read not served here");
            self.not_leader_now()
        })
    }

    /// Answers a follower's read index call: the read log id once a quorum confirmed this
    /// replica leads. Wakes a quiesced leader, as its own reads do.
    pub(crate) async fn serve_read_index(&self) -> ReadIndexReply {
        let _use = self.begin_use(Wake::Leader).await;
        let policy = ReadPolicy::ReadIndex;
        let asked =
            tokio::time::timeout(self.read_timeout(), self.raft().get_read_linearizer(policy));
        let linearizer = match asked.await {
            Err(_) => {
                let message = format!("no quorum answered within {:?}", self.read_timeout());
                return Err(ReadIndexRefusal::Unconfirmed { message });
            }
            Ok(Err(error)) => return Err(refusal(error)),
            Ok(Ok(linearizer)) => linearizer,
        };
        self.read_index.calls.served.fetch_add(1, Ordering::Relaxed);
        Ok(*linearizer.read_log_id().log_id())
    }

    /// How many read index calls this replica sent and answered, and reads that waited.
    pub fn read_index_counts(&self) -> ReadIndexCounts {
        self.read_index.counts()
    }

    /// Waits until this replica applied `index`, by `deadline`.
    async fn await_applied(&self, index: LogId, deadline: Instant) -> Result<(), ReadIndexError> {
        let applied = self.raft().metrics().borrow_watched().last_applied;
        let linearizer = Linearizer::new(self.node_id(), ReadLogId::from_log_id(index), applied);
        let timeout = deadline.saturating_duration_since(Instant::now());
        match linearizer.try_await_ready(self.raft(), Some(timeout)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(state)) => Err(ReadIndexError::Behind {
                applied: state.applied().map_or(0, |id| id.index),
                index: index.index,
                timeout,
            }),
            Err(fatal) => Err(ReadIndexError::Stopped(fatal.to_string())),
        }
    }
}

/// The state shared by a replica's reads and its calls.
struct Calls {
    range: RangeId,
    from: NodeId,
    call_timeout: Duration,
    sender: Box<dyn Sender>,
    batch: Mutex<Batch>,
    /// The latest call's answer.
    answers: watch::Sender<Option<Answer>>,
    calls: AtomicU64,
    reads: AtomicU64,
    served: AtomicU64,
}

/// Which calls were sent and which are wanted. Calls are numbered from 1, one at a time.
#[derive(Debug, Default)]
struct Batch {
    /// The number of the last call sent (in flight while `driving`).
    started: u64,
    /// The highest call number a waiting read needs.
    wanted: u64,
    /// A task is sending calls.
    driving: bool,
    /// Reads waiting for an answer.
    waiting: u64,
}

/// Call number `call`'s answer.
#[derive(Debug, Clone)]
struct Answer {
    call: u64,
    index: Result<LogId, ReadIndexError>,
}

/// One read waiting for a call; dropped when it stops waiting (answered, timed out, or its
/// request went away).
struct Waiting(Arc<Calls>);

impl Drop for Waiting {
    fn drop(&mut self) {
        self.0.lock().waiting -= 1;
    }
}

impl Calls {
    fn lock(&self) -> MutexGuard<'_, Batch> {
        self.batch.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The number of the call to send now, if a read waits for one; else the task stops.
    fn next_call(&self) -> Option<u64> {
        let mut batch = self.lock();
        if batch.wanted <= batch.started {
            batch.driving = false;
            return None;
        }
        batch.started += 1;
        Some(batch.started)
    }

    /// Asks the leader this replica knows of for a read index.
    async fn ask_leader(&self, raft: &KeelRaft) -> Result<LogId, ReadIndexError> {
        let leader = other_leader(raft, self.from).ok_or(ReadIndexError::NoLeader)?;
        let failed = |message: String| ReadIndexError::Call {
            leader: leader.id,
            message,
        };
        let payload = wire::encode(&ReadIndexRequest).map_err(|e| failed(e.to_string()))?;
        let message = RaftMessage {
            range: self.range,
            from: self.from,
            payload,
        };
        let sent = self.sender.send(leader.clone(), message, self.call_timeout);
        let reply = sent.await.map_err(|e| failed(e.to_string()))?;
        let reply: ReadIndexReply = wire::decode(&reply).map_err(|e| failed(e.to_string()))?;
        reply.map_err(|refusal| ReadIndexError::Refused {
            leader: leader.id,
            refusal,
        })
    }
}

/// Sends the calls wanted, one at a time, and publishes each answer; stops when no read
/// waits for another call. Runs as its own task, so a read that goes away mid-call does not
/// cancel the call the others wait for.
async fn drive(calls: Arc<Calls>, raft: KeelRaft) {
    while let Some(call) = calls.next_call() {
        calls.calls.fetch_add(1, Ordering::Relaxed);
        let index = calls.ask_leader(&raft).await;
        calls.answers.send_replace(Some(Answer { call, index }));
    }
}

/// The leader `raft` knows of, with its address, unless it is `own` or unknown.
fn other_leader(raft: &KeelRaft, own: NodeId) -> Option<Peer> {
    let metrics = raft.metrics();
    let metrics = metrics.borrow_watched();
    let leader = metrics.current_leader.filter(|id| *id != own)?;
    let addr = metrics.membership_config.membership().get_node(&leader)?;
    Some(Peer {
        id: leader,
        addr: addr.clone(),
    })
}

fn refusal(
    error: RaftError<
        keel_storage::raft_types::TypeConfig,
        LinearizableReadError<keel_storage::raft_types::TypeConfig>,
    >,
) -> ReadIndexRefusal {
    match error {
        RaftError::APIError(LinearizableReadError::ForwardToLeader(forward)) => {
            ReadIndexRefusal::NotLeader {
                leader: forward.leader_id,
            }
        }
        RaftError::APIError(LinearizableReadError::QuorumNotEnough(error)) => {
            ReadIndexRefusal::Unconfirmed {
                message: error.to_string(),
            }
        }
        RaftError::Fatal(error) => ReadIndexRefusal::Stopped {
            message: error.to_string(),
        },
    }
}

/// A reply that is still on its way.
type Reply = Pin<Box<dyn Future<Output = Result<Vec<u8>, TransportError>> + Send>>;

/// The part of a `Transport` the calls use, as a trait object: a group does not name its
/// transport's type.
trait Sender: Send + Sync {
    fn send(&self, target: Peer, message: RaftMessage, deadline: Duration) -> Reply;
}

struct Via<T>(Arc<T>);

impl<T: Transport> Sender for Via<T> {
    fn send(&self, target: Peer, message: RaftMessage, deadline: Duration) -> Reply {
        let transport = self.0.clone();
        Box::pin(async move {
            let kind = RpcKind::ReadIndex;
            transport.call(&target, kind, message, deadline).await
        })
    }
}
