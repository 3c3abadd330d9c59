//! What every `keel.v1` service (Kv, Lock, Idempotency, Cluster.Split) does with a request:
//! serve it on the local range holding its key (`on_range`, which routes again once when the
//! range split under the request), or else send it on to the range's leader (or a replica
//! the meta table names) and relay that node's answer, following the leader as leadership
//! moves until the request's deadline (`answer`), and let a configured fault drop a
//! mutation's answer. Also the response header every answer carries, and the counting of
//! what a local range served (load, hot keys).
//! Generic over the service's gRPC client; knows nothing of what the requests mean.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use keel_proto::raft::{BatchedRequest, RaftKind};
use keel_proto::v1::{
    AbortRequest, AcquireRequest, BatchRequest, BeginRequest, CompleteRequest, DeleteRequest,
    GetRequest, HistoryRequest, IdempotencyGetRequest, IncrementRequest, InspectRequest,
    LeaseRequest, PutRequest, ReleaseRequest, RenewRequest, ResponseHeader, ScanRequest,
    SplitRequest, TxnRequest,
};
use keel_raft::{Peer, RaftGroup};
use keel_storage::StorageError;
use keel_types::{KvError, NodeAddr, NodeId, RangeId, Revision, limits};
use prost::Message;
use tokio::time::Instant;
use tonic::{Code, Response, Status};
use tracing::{debug, info};

use crate::peer::call::{self as peer, Failure, PeerClient, PeerError, To};
use crate::peer::replaced;
use crate::ranges::lookup;
use crate::shared::Shared;
use crate::status::{kv_error, to_status};

/// A request that can be sent on to a range's leader (which does not send it further).
pub(crate) trait Forwardable: Clone + Message + Default {
    /// The call's gRPC path (`/keel.v1.Kv/Put`): how `Raft.Forward` names it.
    const METHOD: &'static str;

    /// Marks the request as forwarded and returns whether it was already marked.
    fn mark_forwarded(&mut self) -> bool;
}

macro_rules! forwardable {
    ($($request:ty => $method:literal),* $(,)?) => {$(
        impl Forwardable for $request {
            const METHOD: &'static str = $method;

            fn mark_forwarded(&mut self) -> bool {
                std::mem::replace(&mut self.no_forward, true)
            }
        }
    )*};
}

forwardable!(
    GetRequest => "/keel.v1.Kv/Get",
    ScanRequest => "/keel.v1.Kv/Scan",
    HistoryRequest => "/keel.v1.Kv/History",
    PutRequest => "/keel.v1.Kv/Put",
    DeleteRequest => "/keel.v1.Kv/Delete",
    BatchRequest => "/keel.v1.Kv/Batch",
    IncrementRequest => "/keel.v1.Kv/Increment",
    TxnRequest => "/keel.v1.Kv/Txn",
    LeaseRequest => "/keel.v1.Kv/Lease",
    AcquireRequest => "/keel.v1.Lock/Acquire",
    RenewRequest => "/keel.v1.Lock/Renew",
    ReleaseRequest => "/keel.v1.Lock/Release",
    InspectRequest => "/keel.v1.Lock/Inspect",
    BeginRequest => "/keel.v1.Idempotency/Begin",
    CompleteRequest => "/keel.v1.Idempotency/Complete",
    AbortRequest => "/keel.v1.Idempotency/Abort",
    IdempotencyGetRequest => "/keel.v1.Idempotency/Get",
    SplitRequest => "/keel.v1.Cluster/Split",
);

/// What a forwarded request is: a read or a write (a write that fails after it was sent has
/// an unknown outcome), and how long the leader may hold it beyond its own deadline (an
/// acquire that waits for its lock).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Hop {
    pub write: bool,
    pub wait: Duration,
}

impl Hop {
    pub const READ: Hop = Hop {
        write: false,
        wait: Duration::ZERO,
    };
    pub const WRITE: Hop = Hop {
        write: true,
        wait: Duration::ZERO,
    };
}

/// Whom a service instance answers: the node's server it is on tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Audience {
    /// Peers, or peers and clients on the one port of a node without a peer port: answers
    /// name nodes by their peer addresses (the same as their client addresses then).
    Peers,
    /// Clients, on the client port of a node with a peer port: answers name nodes by their
    /// client addresses (`Shared::for_clients`).
    Clients,
}

/// Answers requests for one service of this node.
#[derive(Clone)]
pub(crate) struct Router {
    shared: Arc<Shared>,
    audience: Audience,
}

impl Router {
    pub fn new(shared: Arc<Shared>, audience: Audience) -> Router {
        Router { shared, audience }
    }

    /// Whom this router's service answers.
    pub fn audience(&self) -> Audience {
        self.audience
    }

    /// The status answering `error` to this service's audience.
    pub fn status(&self, error: &KvError) -> Status {
        match self.audience {
            Audience::Peers => to_status(error),
            Audience::Clients => to_status(&self.shared.for_clients(error.clone())),
        }
    }

    /// A status another node answered, relayed to this service's audience.
    pub fn relayed(&self, status: Status) -> Status {
        match self.audience {
            Audience::Peers => status,
            Audience::Clients => self.shared.client_status(status),
        }
    }

    /// The answer to a request: what this node serves with `serve`, or else the outcome of
    /// sending the request on to the range's leader with `call`. A request the caller marked
    /// `no_forward` (or that reached this node forwarded) gets the error instead, once an
    /// election in progress here has ended (`after_election`).
    ///
    /// Sending on rides out leadership moves: a leader that moved is followed to the one it
    /// names (served here when that is this node), an election in progress is waited out, a
    /// range that split under the request is looked up again, and a refusal that says nothing
    /// was done is tried again after a pause; all within the request's deadline and
    /// `FORWARD_TRIES_MAX` tries. The answer is an outcome, or the last error when the
    /// deadline passes (`OutcomeUnknown` for a write whose fate a failed send left open).
    pub async fn answer<C, R, T, S, SFut, F, Fut>(
        &self,
        request: &R,
        hop: Hop,
        serve: S,
        call: F,
    ) -> Result<Response<T>, Status>
    where
        C: PeerClient,
        R: Forwardable,
        T: Message + Default,
        S: Fn() -> SFut,
        SFut: Future<Output = Result<T, KvError>>,
        F: Fn(C, R) -> Fut,
        Fut: Future<Output = Result<Response<T>, Status>>,
    {
        let mut error = match serve().await {
            Ok(response) => return Ok(Response::new(response)),
            Err(error) => error,
        };
        let mut forwarded = request.clone();
        if forwarded.mark_forwarded() {
            return match self.after_election(error, &serve).await {
                Ok(response) => Ok(Response::new(response)),
                Err(error) => Err(self.refusal(&error)),
            };
        }
        let deadline = Instant::now() + self.shared.forward_deadline(hop.write) + hop.wait;
        let mut pause = Duration::from_millis(limits::FORWARD_BACKOFF_MIN_MS);
        for tries in 0..limits::FORWARD_TRIES_MAX {
            // The first try follows the error at once; later ones (a leader hint that went
            // round, a quorum still missing) pause first.
            if tries > 0 && !peer::pause_before(&mut pause, deadline).await {
                break;
            }
            let tried = match self.next_try(&error, deadline).await {
                None => break,
                Some(Try::Here) => serve().await.map(Response::new),
                Some(Try::Leader(leader)) => {
                    let range = match &error {
                        KvError::NotLeader { range_id, .. } => Some(*range_id),
                        _ => None,
                    };
                    let to = Peer {
                        id: leader.0,
                        addr: leader.1,
                    };
                    self.forward(range, to, hop, deadline, &forwarded, &call)
                        .await
                }
            };
            error = match tried {
                Ok(response) => return Ok(response),
                Err(error) if retryable(&error) => error,
                Err(error) => return Err(self.refusal(&error)),
            };
        }
        Err(self.refusal(&error))
    }

    /// A request that may not go on found no leader here: when the local replica knows of
    /// none (an election is in progress, as after every leader transfer), waits up to
    /// `ELECTION_WAIT_MAX_MS` for one. Then serves the request when this node leads, or
    /// answers `NotLeader` naming the leader, so the caller goes there at once rather than
    /// backing off blind. Any other error, or no leader by then, is returned as it was.
    async fn after_election<T, S, SFut>(&self, error: KvError, serve: &S) -> Result<T, KvError>
    where
        S: Fn() -> SFut,
        SFut: Future<Output = Result<T, KvError>>,
    {
        let KvError::NotLeader {
            range_id,
            leader: None,
        } = error
        else {
            return Err(error);
        };
        let Some(group) = self.shared.groups.get(range_id) else {
            return Err(error);
        };
        let leader = match group.leader() {
            // Known since the request failed: an election that ended meanwhile.
            Some(leader) => Some(leader),
            None => {
                let wait = Duration::from_millis(limits::ELECTION_WAIT_MAX_MS);
                group.await_leader(wait).await
            }
        };
        match leader {
            Some((leader, _)) if leader == self.shared.node_id => serve().await,
            Some(leader) => Err(KvError::NotLeader {
                range_id,
                leader: Some(leader),
            }),
            None => Err(error),
        }
    }

    /// Serves a request routed by `key` with `serve`, on the group of the local range holding
    /// the key. When the apply (or a read's span check) says the key is no longer in that
    /// range, the local table is refreshed from the store and the request routed again, once;
    /// the command was not applied, so this is safe for writes. Counts the request in the
    /// node's load when a local range served it (not when it goes elsewhere).
    pub async fn on_range<T, F, Fut>(&self, key: &[u8], serve: F) -> Result<T, KvError>
    where
        F: Fn(Arc<RaftGroup>) -> Fut,
        Fut: Future<Output = Result<T, KvError>>,
    {
        let group = lookup::route(&self.shared, key).await?;
        let range = group.range();
        traced(&group);
        let (range, served) = match serve(group).await {
            Err(KvError::KeyOutOfRange { .. }) => {
                debug!(%range, "key left the range; routing again");
                lookup::refresh_local(&self.shared).await?;
                let group = lookup::route(&self.shared, key).await?;
                traced(&group);
                (group.range(), serve(group).await)
            }
            served => (range, served),
        };
        self.count(range, key, &served);
        served
    }

    /// Counts a request `range` served (not one it sent elsewhere), in the range's load and
    /// the node's hot keys.
    fn count<T>(&self, range: RangeId, key: &[u8], served: &Result<T, KvError>) {
        if !matches!(
            served,
            Err(KvError::NotLeader { .. } | KvError::KeyOutOfRange { .. })
        ) {
            self.shared.load.record(range, key);
            self.shared.metrics.hot_keys.record(key);
        }
    }

    /// `KeyOutOfRange` unless `group`'s range still holds `key`. A read calls it after
    /// reading: a range's span only shrinks, so a key still inside was inside when it read,
    /// and an answer of "absent" was not caused by a split that moved the key away.
    pub async fn check_span(&self, group: &RaftGroup, key: &[u8]) -> Result<(), KvError> {
        let range = group.descriptor().await?;
        if range.contains(key) {
            return Ok(());
        }
        Err(KvError::KeyOutOfRange {
            key: key.to_vec(),
            range: Box::new(range),
        })
    }

    /// A mutation's answer as it leaves the node; with a response-loss fault configured,
    /// some answers are lost after the mutation was applied.
    pub fn deliver<T>(&self, answer: Result<Response<T>, Status>) -> Result<Response<T>, Status> {
        if self.shared.faults.drop_response() {
            info!("fault injection: dropping the response of a served mutation");
            return Err(Status::unknown("fault injection: response dropped"));
        }
        answer
    }

    /// The header of an answer served by `group`'s replica on this node.
    pub fn header(
        &self,
        group: &RaftGroup,
        revision: Revision,
        replayed: bool,
    ) -> Option<ResponseHeader> {
        Some(ResponseHeader {
            revision,
            served_by: self.shared.node_id,
            range_id: group.range().0,
            term: group.term(),
            replayed,
        })
    }

    /// A storage failure on a read: the node may be poisoned now, so recheck its health. A
    /// range in the middle of a snapshot install is only unavailable for a moment.
    pub fn storage_failed(&self, error: StorageError) -> KvError {
        if let StorageError::SnapshotInstalling { .. } = error {
            return KvError::unavailable(error.to_string());
        }
        self.shared
            .health
            .check()
            .err()
            .unwrap_or_else(|| KvError::fatal(error.to_string()))
    }

    /// Where to try a request again after `error`, a refusal that says nothing was done: at
    /// the leader it names (or the one an election in progress makes), else here (routed
    /// afresh). `None` when no leader is known by the deadline.
    async fn next_try(&self, error: &KvError, deadline: Instant) -> Option<Try> {
        let leader = match error {
            KvError::NotLeader {
                leader: Some(leader),
                ..
            } => leader.clone(),
            KvError::NotLeader {
                range_id,
                leader: None,
            } => match self.shared.groups.get(*range_id) {
                Some(group) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    group.await_leader(left).await?
                }
                // Not a range of this node: the meta table names where it went.
                None => return self.looked_up_again(false).await,
            },
            KvError::KeyOutOfRange { .. } => return self.looked_up_again(true).await,
            _ => return Some(Try::Here),
        };
        match leader.0 == self.shared.node_id {
            true => Some(Try::Here),
            false => Some(Try::Leader(leader)),
        }
    }

    /// Refreshes the meta table (and the local one, with `local`) before a request is routed
    /// again here (a refresh that fails is only logged: the next try refreshes again).
    async fn looked_up_again(&self, local: bool) -> Option<Try> {
        let refreshed = match local {
            true => lookup::refresh_local(&self.shared).await,
            false => Ok(()),
        };
        if let Err(error) = refreshed.and(lookup::refresh_meta(&self.shared).await) {
            debug!(%error, "refreshing the range tables before routing again");
        }
        Some(Try::Here)
    }

    /// The status refusing a request with `error`: a `NotLeader` that names no leader is
    /// `Unavailable` (no leader is known), anything else as it is.
    fn refusal(&self, error: &KvError) -> Status {
        match error {
            KvError::NotLeader {
                range_id,
                leader: None,
            } => to_status(&KvError::unavailable(format!(
                "range {range_id} has no known leader"
            ))),
            error => self.status(error),
        }
    }

    /// Sends the request to the leader's service (marked `no_forward`), within what is left
    /// of `deadline`, and returns its answer: the leader's response, or its own error, or what
    /// a failure of the hop means (`PeerError::into_kv`: `Unavailable` when nothing was sent,
    /// `OutcomeUnknown` for a write that may have reached the leader). A leader that this
    /// node's replica of `range` learns was replaced meanwhile is given up
    /// (`peer::replaced`): a read then goes to the new leader, and a write, which carries no
    /// request id to make a second sending safe, is answered `OutcomeUnknown`. The request
    /// rides the `Raft.Forward` stream to the leader (`on_stream`), else goes as a call of
    /// its own with `call`.
    async fn forward<C, R, T, F, Fut>(
        &self,
        range: Option<RangeId>,
        leader: Peer,
        hop: Hop,
        deadline: Instant,
        request: &R,
        call: F,
    ) -> Result<Response<T>, KvError>
    where
        C: PeerClient,
        R: Forwardable,
        T: Message + Default,
        F: FnOnce(C, R) -> Fut,
        Fut: Future<Output = Result<Response<T>, Status>>,
    {
        debug!(leader_id = leader.id, leader_addr = %leader.addr, "forwarding to leader");
        let left = || deadline.saturating_duration_since(Instant::now());
        let group = range.and_then(|range| self.shared.groups.get(range));
        let answer = async {
            let streamed = self.on_stream(range, &leader, hop, request, left()).await;
            let metrics = &self.shared.metrics;
            let answer = match streamed {
                Some(answer) => {
                    metrics.forwarded_on_stream.fetch_add(1, Ordering::Relaxed);
                    answer
                }
                None => {
                    metrics.forwarded_as_calls.fetch_add(1, Ordering::Relaxed);
                    let to = To::Node(leader.id, &leader.addr);
                    let send = |client| call(client, request.clone());
                    peer::call(&self.shared.peers, to, left(), send).await
                }
            };
            answer.map_err(|error| error.into_kv(hop.write))
        };
        replaced::unless_replaced(group.as_deref(), leader.id, hop.write, left(), answer).await
    }

    /// The leader's answer to `request` over the `Raft.Forward` stream to it; `None` when the
    /// request goes as a call of its own instead: a lock acquire that may wait (a stream does
    /// not cancel on the leader what its sender gave up, and the lock would be taken for
    /// nobody), a request too large to batch, or a leader without the stream (it answered
    /// `UNIMPLEMENTED`: nothing was done).
    async fn on_stream<R, T>(
        &self,
        range: Option<RangeId>,
        leader: &Peer,
        hop: Hop,
        request: &R,
        left: Duration,
    ) -> Option<Result<Response<T>, PeerError>>
    where
        R: Forwardable,
        T: Message + Default,
    {
        let forwards = &self.shared.forwards;
        if !hop.wait.is_zero() || !forwards.streams_to(leader, request.encoded_len()) {
            return None;
        }
        let batched = BatchedRequest {
            id: 0,
            range_id: range.map_or(0, |range| range.0),
            kind: RaftKind::Unspecified as i32,
            payload: request.encode_to_vec(),
            method: R::METHOD.to_string(),
        };
        let failed = |failure| PeerError {
            to: To::Node(leader.id, &leader.addr).to_string(),
            failure,
        };
        match forwards.exchange(leader, batched, left).await {
            Err(Failure::Status(status))
                if status.code() == Code::Unimplemented && kv_error(&status).is_none() =>
            {
                None
            }
            Err(failure) => Some(Err(failed(failure))),
            Ok(payload) => Some(
                T::decode(payload.as_slice())
                    .map(Response::new)
                    .map_err(|e| {
                        let status =
                            Status::internal(format!("an answer that does not decode: {e}"));
                        failed(Failure::Status(status))
                    }),
            ),
        }
    }
}

/// Where a forwarding node tries a request next.
enum Try {
    /// Serve it on this node (it leads now, the tables were refreshed, or a quorum was
    /// missing a moment ago).
    Here,
    /// Send it to this leader.
    Leader((NodeId, NodeAddr)),
}

/// Whether `error` says the request was not carried out and may go again, elsewhere or a
/// moment later: a leader that moved or is being elected, a key that left its range, a
/// moment without a quorum.
fn retryable(error: &KvError) -> bool {
    matches!(
        error,
        KvError::NotLeader { .. } | KvError::Unavailable { .. } | KvError::KeyOutOfRange { .. }
    )
}

/// Names the range serving the request, and its term, in the request's span (opened by
/// the metering layer).
fn traced(group: &RaftGroup) {
    let span = tracing::Span::current();
    span.record("range_id", group.range().0);
    span.record("term", group.term());
}
