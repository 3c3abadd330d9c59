//! The read index calls of one group's replica on this node, shared by its concurrent
//! linearizable reads while it follows: one call in flight per group; a read joins only a
//! call sent after it arrived (an earlier call's index may predate a write the reader already
//! saw acknowledged), so reads arriving while a call is out wait for the next one, which
//! carries them all. Also the call's wire types and the counts. Plain machinery: `RaftGroup`
//! holds a `ReadIndex` and `read_index.rs` uses it. Knows nothing of `RaftGroup`, tonic or
//! what is read.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use keel_storage::StateMachine;
use keel_storage::raft_types::{LogId, TypeConfig};
use keel_types::{NodeId, RangeId, limits};
use openraft::async_runtime::WatchReceiver;
use serde::{Deserialize, Serialize};
use thiserror::Error;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::transport::{Peer, RaftMessage, RpcKind, Transport, TransportError};
use crate::wire;

/// A group's openraft instance, as far as the calls need it (its metrics).
type KeelRaft = openraft::Raft<TypeConfig, StateMachine>;

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

    /// Counts a call of another replica this one answered as leader.
    pub(crate) fn count_served(&self) {
        self.calls.served.fetch_add(1, Ordering::Relaxed);
    }

    /// The read index for a read arriving now: the answer of the first call sent after now,
    /// by `deadline`.
    pub(crate) async fn index(
        &self,
        raft: &KeelRaft,
        deadline: Instant,
    ) -> Result<LogId, ReadIndexError> {
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

    /// Asks the leader this replica knows of for a read index. If this replica learns of a
    /// newer leader while the call is out (the one asked was paused or cut off, and the
    /// others elected another), it asks that one instead: every read waiting for this call
    /// arrived before either was asked, so the new leader's index serves them as well.
    async fn ask_leader(&self, raft: &KeelRaft) -> Result<LogId, ReadIndexError> {
        loop {
            let leader = other_leader(raft, self.from).ok_or(ReadIndexError::NoLeader)?;
            let term = raft.metrics().borrow_watched().current_term;
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
            let reply = tokio::select! {
                biased;
                reply = sent => reply.map_err(|e| failed(e.to_string()))?,
                true = elected_since(raft, term, leader.id, self.call_timeout) => continue,
            };
            let reply: ReadIndexReply = wire::decode(&reply).map_err(|e| failed(e.to_string()))?;
            return reply.map_err(|refusal| ReadIndexError::Refused {
                leader: leader.id,
                refusal,
            });
        }
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

/// Whether `raft`'s replica learns within `timeout` of a leader other than `node` in a term
/// after `term` (an election or a transfer since); only a later term counts, so a replica
/// that has not yet heard of a leader another node named does not turn back to the old one.
pub(crate) async fn elected_since(
    raft: &KeelRaft,
    term: u64,
    node: NodeId,
    timeout: Duration,
) -> bool {
    let moved = |metrics: &openraft::RaftMetrics<TypeConfig>| {
        let membership = metrics.membership_config.membership();
        metrics.current_term > term
            && metrics
                .current_leader
                .is_some_and(|leader| leader != node && membership.get_node(&leader).is_some())
    };
    let wait = raft.wait(Some(timeout));
    wait.metrics(moved, "a new leader is known").await.is_ok()
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
