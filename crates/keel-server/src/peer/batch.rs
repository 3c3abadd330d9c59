//! The sending end of the node-pair streams `Raft.Batch` and `Raft.Forward`. The Raft
//! messages of every group of this node to one peer travel on one long-lived stream (a
//! `Link` of the `Lane::Raft` links), instead of one gRPC call each; the client requests
//! this node forwards to a leader on that peer travel on another (`Lane::Forward`), so
//! that Raft messages never queue behind client traffic. Messages that arrive while a
//! stream is busy go out together in one batch, up to `limits::RAFT_BATCH_BYTES_MAX`;
//! replies come back by id, in any order. Each peer has its own stream and queue
//! (`limits::RAFT_BATCH_QUEUE_MAX`) per lane, so a slow peer holds up only its own
//! messages; a message waits for its reply within its own deadline.
//!
//! A stream that breaks fails the messages waiting on it, and the next message opens a new
//! one. A peer of a release without the stream answers `UNIMPLEMENTED`: the message that
//! found out fails, and for `UNSUPPORTED_RETRY_MS` the peer's messages go as calls of their
//! own (`streams_to`). Knows nothing of openraft's types or of what the requests mean.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures::Stream;
use keel_proto::raft::raft_client::RaftClient;
use keel_proto::raft::{BatchedReply, BatchedRequest, RaftBatch, RaftKind};
use keel_raft::{Peer, RaftMessage, RpcKind};
use keel_types::{NodeId, limits};
use tokio::sync::{mpsc, oneshot};
use tonic::{Code, Status};
use tracing::{debug, info};

use crate::peer::call::{Failure, PeerClient};
use crate::peer::channels::{PeerChannel, Peers};

/// How long a peer that answered `UNIMPLEMENTED` is sent calls of their own before its
/// stream is tried again (it may have been upgraded meanwhile).
const UNSUPPORTED_RETRY_MS: u64 = 60_000;

/// Which stream of a node pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lane {
    /// `Raft.Batch`: Raft messages.
    Raft,
    /// `Raft.Forward`: client requests sent on to a leader.
    Forward,
}

impl Lane {
    fn method(self) -> &'static str {
        match self {
            Lane::Raft => "Raft.Batch",
            Lane::Forward => "Raft.Forward",
        }
    }
}

/// The streams of one lane from this node to its peers; one per peer, shared by all its
/// groups (or requests).
pub(crate) struct Links {
    peers: Arc<Peers>,
    from: NodeId,
    lane: Lane,
    links: Mutex<HashMap<NodeId, Link>>,
}

/// One stream to a peer: the queue its sender task reads, and the messages awaiting replies.
#[derive(Clone)]
struct Link {
    addr: String,
    opened: Instant,
    queue: mpsc::Sender<BatchedRequest>,
    waiting: Arc<Waiting>,
}

/// The messages sent on a stream that await their replies, by id.
#[derive(Default)]
struct Waiting(Mutex<WaitState>);

#[derive(Default)]
struct WaitState {
    next_id: u64,
    replies: HashMap<u64, oneshot::Sender<BatchedReply>>,
    /// Set once the stream has ended; nothing waits on it after that.
    ended: Option<Ended>,
}

#[derive(Debug, Clone)]
enum Ended {
    /// The peer does not serve the lane's method.
    Unsupported(Lane),
    /// The stream failed or the peer ended it.
    Broken(Status),
}

impl Links {
    pub fn new(peers: Arc<Peers>, from: NodeId, lane: Lane) -> Links {
        Links {
            peers,
            from,
            lane,
            links: Mutex::default(),
        }
    }

    /// Whether a message of `bytes` to `target` goes on its stream: it is small enough, and
    /// the peer did not lately answer that it has no such stream.
    pub fn streams_to(&self, target: &Peer, bytes: usize) -> bool {
        if bytes > limits::RAFT_BATCHED_MESSAGE_BYTES_MAX {
            return false;
        }
        let links = self.links.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(link) = links.get(&target.id) else {
            return true;
        };
        let retry = Duration::from_millis(UNSUPPORTED_RETRY_MS);
        !(link.addr == target.addr.addr
            && matches!(link.waiting.ended(), Some(Ended::Unsupported(_)))
            && link.opened.elapsed() < retry)
    }

    /// Sends the Raft `message` on the stream to `target` and waits for its reply within
    /// `deadline`.
    pub async fn call(
        &self,
        target: &Peer,
        kind: RpcKind,
        message: RaftMessage,
        deadline: Duration,
    ) -> Result<Vec<u8>, Failure> {
        let request = BatchedRequest {
            id: 0,
            range_id: message.range.0,
            kind: kind_of(kind) as i32,
            payload: message.payload,
            method: String::new(),
        };
        self.exchange(target, request, deadline).await
    }

    /// Sends `request` (its id is chosen here) on the stream to `target` and waits for its
    /// reply's payload within `deadline`; a refusal comes back as the status it would have
    /// been as a call of its own, details included.
    pub async fn exchange(
        &self,
        target: &Peer,
        mut request: BatchedRequest,
        deadline: Duration,
    ) -> Result<Vec<u8>, Failure> {
        let link = self.link(target)?;
        let (reply, replied) = oneshot::channel();
        let awaiting = link.waiting.wait(reply).map_err(|ended| ended.failure())?;
        request.id = awaiting.id;
        let exchange = async {
            if link.queue.send(request).await.is_err() {
                return Err(link.waiting.ended_failure());
            }
            replied.await.map_err(|_| link.waiting.ended_failure())
        };
        let reply = match tokio::time::timeout(deadline, exchange).await {
            Err(_) => return Err(Failure::Timeout(deadline)),
            Ok(reply) => reply?,
        };
        drop(awaiting);
        if reply.code == Code::Ok as i32 {
            return Ok(reply.payload);
        }
        Err(Failure::Status(Status::with_details(
            Code::from(reply.code),
            reply.message,
            reply.details.into(),
        )))
    }

    /// The open stream to `target`, or a new one when there is none, it ended, or the peer's
    /// address changed.
    fn link(&self, target: &Peer) -> Result<Link, Failure> {
        let addr = &target.addr.addr;
        let mut links = self.links.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(link) = links.get(&target.id)
            && &link.addr == addr
            && link.waiting.ended().is_none()
        {
            return Ok(link.clone());
        }
        let channel = self
            .peers
            .channel(target.id, addr)
            .map_err(|e| Failure::NoChannel(e.to_string()))?;
        let (queue, queued) = mpsc::channel(limits::RAFT_BATCH_QUEUE_MAX);
        let link = Link {
            addr: addr.clone(),
            opened: Instant::now(),
            queue,
            waiting: Arc::default(),
        };
        let client = RaftClient::on(channel);
        let stream = run(
            client,
            self.lane,
            (self.from, target.id),
            queued,
            link.waiting.clone(),
        );
        tokio::spawn(stream);
        links.insert(target.id, link.clone());
        Ok(link)
    }
}

/// Runs one stream until it ends: sends what the queue gathers, hands each reply to the
/// message that waits for it, and fails the rest at the end.
async fn run(
    mut client: RaftClient<PeerChannel>,
    lane: Lane,
    (from, to): (NodeId, NodeId),
    queued: mpsc::Receiver<BatchedRequest>,
    waiting: Arc<Waiting>,
) {
    let outbound = batches(from, queued, waiting.clone());
    let opened = match lane {
        Lane::Raft => client.batch(outbound).await,
        Lane::Forward => client.forward(outbound).await,
    };
    let method = lane.method();
    let ended = match opened {
        Err(status) if status.code() == Code::Unimplemented => {
            info!(
                to,
                "peer has no {method}; its messages go as calls of their own"
            );
            Ended::Unsupported(lane)
        }
        Err(status) => Ended::Broken(status),
        Ok(response) => {
            let mut replies = response.into_inner();
            loop {
                match replies.message().await {
                    Ok(Some(batch)) => waiting.answer(batch.replies),
                    Ok(None) => {
                        let status = Status::unavailable(format!("node {to} ended {method}"));
                        break Ended::Broken(status);
                    }
                    Err(status) => break Ended::Broken(status),
                }
            }
        }
    };
    debug!(to, method, ?ended, "node-pair stream ended");
    waiting.end(ended);
}

/// The queue as a stream of batches: each takes the first waiting message and every other
/// one already queued, within `limits::RAFT_BATCH_BYTES_MAX` (a message that does not fit
/// opens the next batch). A message nobody waits for any more (its sender timed out while
/// the peer was slow, paused or cut off) is dropped unsent, so a peer that comes back gets
/// no backlog of stale messages ahead of the current ones. Ends when every sender is gone.
fn batches(
    from: NodeId,
    queued: mpsc::Receiver<BatchedRequest>,
    waiting: Arc<Waiting>,
) -> impl Stream<Item = RaftBatch> + Send + 'static {
    let state = (queued, None, waiting);
    futures::stream::unfold(state, move |(mut queued, carried, waiting)| async move {
        let first = match carried {
            Some(request) => request,
            None => loop {
                let request = queued.recv().await?;
                if waiting.awaits(request.id) {
                    break request;
                }
            },
        };
        let mut bytes = first.payload.len();
        let mut requests = vec![first];
        let mut carried = None;
        while let Ok(next) = queued.try_recv() {
            if !waiting.awaits(next.id) {
                continue;
            }
            if bytes + next.payload.len() > limits::RAFT_BATCH_BYTES_MAX {
                carried = Some(next);
                break;
            }
            bytes += next.payload.len();
            requests.push(next);
        }
        Some((RaftBatch { from, requests }, (queued, carried, waiting)))
    })
}

impl Waiting {
    fn state(&self) -> std::sync::MutexGuard<'_, WaitState> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers a message's reply channel under a new id, unless the stream has ended.
    fn wait(&self, reply: oneshot::Sender<BatchedReply>) -> Result<Awaiting<'_>, Ended> {
        let mut state = self.state();
        if let Some(ended) = &state.ended {
            return Err(ended.clone());
        }
        state.next_id += 1;
        let id = state.next_id;
        state.replies.insert(id, reply);
        Ok(Awaiting { waiting: self, id })
    }

    /// Whether a message still waits for its reply.
    fn awaits(&self, id: u64) -> bool {
        self.state().replies.contains_key(&id)
    }

    fn answer(&self, replies: Vec<BatchedReply>) {
        let mut state = self.state();
        for reply in replies {
            // A reply nobody waits for any more (its message timed out) is dropped.
            if let Some(waiter) = state.replies.remove(&reply.id) {
                let _ = waiter.send(reply);
            }
        }
    }

    /// Marks the stream ended; every message still waiting learns it from `ended_failure`.
    fn end(&self, ended: Ended) {
        let mut state = self.state();
        state.ended = Some(ended);
        state.replies.clear();
    }

    fn ended(&self) -> Option<Ended> {
        self.state().ended.clone()
    }

    /// Why a message on this stream got no reply.
    fn ended_failure(&self) -> Failure {
        let ended = self
            .ended()
            .unwrap_or_else(|| Ended::Broken(Status::unavailable("the node-pair stream closed")));
        ended.failure()
    }
}

impl Ended {
    fn failure(self) -> Failure {
        match self {
            Ended::Unsupported(lane) => Failure::Status(Status::unimplemented(format!(
                "the peer has no {}; its messages go as calls of their own from now on",
                lane.method()
            ))),
            Ended::Broken(status) => Failure::Status(status),
        }
    }
}

/// A message waiting for its reply; forgotten when the wait ends, however it ends (a
/// reply, a timeout, the caller giving up).
struct Awaiting<'a> {
    waiting: &'a Waiting,
    id: u64,
}

impl Drop for Awaiting<'_> {
    fn drop(&mut self) {
        self.waiting.state().replies.remove(&self.id);
    }
}

/// The wire name of a Raft call.
pub(crate) fn kind_of(kind: RpcKind) -> RaftKind {
    match kind {
        RpcKind::AppendEntries => RaftKind::AppendEntries,
        RpcKind::Vote => RaftKind::Vote,
        RpcKind::PreVote => RaftKind::PreVote,
        RpcKind::TransferLeader => RaftKind::TransferLeader,
        RpcKind::ReadIndex => RaftKind::ReadIndex,
    }
}

/// The Raft call a batched request stands for; `None` for an unknown or unset kind.
pub(crate) fn rpc_kind(kind: i32) -> Option<RpcKind> {
    match RaftKind::try_from(kind).ok()? {
        RaftKind::Unspecified => None,
        RaftKind::AppendEntries => Some(RpcKind::AppendEntries),
        RaftKind::Vote => Some(RpcKind::Vote),
        RaftKind::PreVote => Some(RpcKind::PreVote),
        RaftKind::TransferLeader => Some(RpcKind::TransferLeader),
        RaftKind::ReadIndex => Some(RpcKind::ReadIndex),
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;
    use keel_types::{NodeAddr, RangeId};
    use tokio::net::TcpListener;
    use tonic::transport::server::TcpIncoming;

    use super::*;

    fn request(id: u64, bytes: usize) -> BatchedRequest {
        BatchedRequest {
            id,
            range_id: 1,
            kind: RaftKind::AppendEntries as i32,
            payload: vec![0; bytes],
            method: String::new(),
        }
    }

    fn ids(batch: &RaftBatch) -> Vec<u64> {
        batch.requests.iter().map(|r| r.id).collect()
    }

    /// What is queued goes out together; a message past the byte budget opens the next batch;
    /// a message whose sender gave up is not sent.
    #[tokio::test]
    async fn batches_take_everything_queued_within_the_byte_budget() {
        let waiting = Arc::new(Waiting::default());
        let (queue, queued) = mpsc::channel(16);
        let mut awaiting = Vec::new();
        let third = limits::RAFT_BATCH_BYTES_MAX / 3;
        for bytes in [10, 20, third, third, third, 1, 1, 1, 1] {
            let (reply, _) = oneshot::channel();
            let waiter = waiting.wait(reply).unwrap();
            queue.send(request(waiter.id, bytes)).await.unwrap();
            awaiting.push(waiter);
        }
        // The senders of messages 8 and 9 gave up.
        awaiting.truncate(7);
        let mut batches = Box::pin(batches(7, queued, waiting.clone()));
        let first = batches.next().await.unwrap();
        assert_eq!((first.from, ids(&first)), (7, vec![1, 2, 3, 4]));
        let second = batches.next().await.unwrap();
        assert_eq!(ids(&second), vec![5, 6, 7]);
        let (reply, _) = oneshot::channel();
        let waiter = waiting.wait(reply).unwrap();
        queue.send(request(waiter.id, 1)).await.unwrap();
        assert_eq!(ids(&batches.next().await.unwrap()), vec![10]);
        drop(queue);
        assert!(batches.next().await.is_none());
    }

    fn message() -> RaftMessage {
        RaftMessage {
            range: RangeId::FIRST,
            from: 1,
            payload: b"append".to_vec(),
        }
    }

    /// A peer without the lane's stream (here a server of only the health service, which
    /// answers `UNIMPLEMENTED` like a release before the stream): the message fails and the
    /// peer's next messages go as calls of their own. A peer that is down is tried again at
    /// once. The same for both lanes.
    #[tokio::test]
    async fn a_peer_without_the_stream_gets_calls_of_their_own() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (_, health) = tonic_health::server::health_reporter();
        let server = tonic::transport::Server::builder()
            .add_service(health)
            .serve_with_incoming(TcpIncoming::from(listener));
        let server = tokio::spawn(server);
        for lane in [Lane::Raft, Lane::Forward] {
            let links = Links::new(Arc::new(Peers::new(1, None, None)), 1, lane);
            let old = Peer {
                id: 2,
                addr: NodeAddr::new(addr.to_string()),
            };
            assert!(links.streams_to(&old, 100));
            let deadline = Duration::from_secs(10);
            let sent = links.call(&old, RpcKind::AppendEntries, message(), deadline);
            let Err(Failure::Status(status)) = sent.await else {
                panic!("a peer without the stream must refuse it");
            };
            assert_eq!(status.code(), Code::Unimplemented, "{lane:?}: {status:?}");
            assert!(status.message().contains(lane.method()), "{status:?}");
            assert!(!links.streams_to(&old, 100));

            let down = Peer {
                id: 3,
                addr: NodeAddr::new("127.0.0.1:1"),
            };
            let sent = links.call(&down, RpcKind::Vote, message(), deadline);
            let Err(Failure::Status(status)) = sent.await else {
                panic!("a peer that is down cannot answer");
            };
            assert_eq!(status.code(), Code::Unavailable, "{lane:?}: {status:?}");
            assert!(links.streams_to(&down, 100));
            assert!(!links.streams_to(&down, limits::RAFT_BATCHED_MESSAGE_BYTES_MAX + 1));
        }
        server.abort();
    }

    #[test]
    fn every_kind_round_trips_and_unknown_kinds_are_none() {
        let kinds = [
            RpcKind::AppendEntries,
            RpcKind::Vote,
            RpcKind::PreVote,
            RpcKind::TransferLeader,
            RpcKind::ReadIndex,
        ];
        for kind in kinds {
            assert_eq!(rpc_kind(kind_of(kind) as i32), Some(kind));
        }
        assert_eq!(rpc_kind(RaftKind::Unspecified as i32), None);
        assert_eq!(rpc_kind(99), None);
    }
}
