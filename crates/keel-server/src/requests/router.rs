//! What every `keel.v1` service (Kv, Lock, Idempotency, Cluster.Split) does with a request:
//! serve it on the local range holding its key (`on_range`, which routes again once when the
//! range split under the request), or else forward it once to the range's leader (or a
//! replica the meta table names) or answer the error, relay that node's answer, and let a
//! configured fault drop a mutation's answer. Also the response header every answer carries,
//! and the counting of what a local range served (load, hot keys).
//! Generic over the service's gRPC client; knows nothing of what the requests mean.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use keel_proto::v1::{
    AbortRequest, AcquireRequest, BatchRequest, BeginRequest, CompleteRequest, DeleteRequest,
    GetRequest, IdempotencyGetRequest, IncrementRequest, InspectRequest, PutRequest,
    ReleaseRequest, RenewRequest, ResponseHeader, ScanRequest, SplitRequest,
};
use keel_raft::RaftGroup;
use keel_storage::StorageError;
use keel_types::{KvError, NodeAddr, NodeId, RangeId, Revision};
use tonic::{Response, Status};
use tracing::{debug, info};

use crate::peer::call::{self as peer, PeerClient, To};
use crate::ranges::lookup;
use crate::shared::Shared;
use crate::status::to_status;

/// A request that can be forwarded to the leader once.
pub(crate) trait Forwardable {
    /// Marks the request as forwarded and returns whether it was already marked.
    fn mark_forwarded(&mut self) -> bool;
}

macro_rules! forwardable {
    ($($request:ty),*) => {$(
        impl Forwardable for $request {
            fn mark_forwarded(&mut self) -> bool {
                std::mem::replace(&mut self.no_forward, true)
            }
        }
    )*};
}

forwardable!(
    GetRequest,
    ScanRequest,
    PutRequest,
    DeleteRequest,
    BatchRequest,
    IncrementRequest,
    AcquireRequest,
    RenewRequest,
    ReleaseRequest,
    InspectRequest,
    BeginRequest,
    CompleteRequest,
    AbortRequest,
    IdempotencyGetRequest,
    SplitRequest
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

    /// The answer to a request: what this node served, or else the request routed on
    /// (forwarded once to the leader with `call`, or the error).
    pub async fn answer<C, R, T, F, Fut>(
        &self,
        served: Result<T, KvError>,
        mut request: R,
        hop: Hop,
        call: F,
    ) -> Result<Response<T>, Status>
    where
        C: PeerClient,
        R: Forwardable,
        F: FnOnce(C, R) -> Fut,
        Fut: Future<Output = Result<Response<T>, Status>>,
    {
        match served {
            Ok(response) => Ok(Response::new(response)),
            Err(error) => {
                let no_forward = request.mark_forwarded();
                let call = |client| call(client, request);
                self.route(error, no_forward, hop, call).await
            }
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

    /// What to do when serving here failed: forward a `NotLeader` to the known leader (once),
    /// or answer with the error.
    async fn route<C, T, F, Fut>(
        &self,
        error: KvError,
        no_forward: bool,
        hop: Hop,
        call: F,
    ) -> Result<Response<T>, Status>
    where
        C: PeerClient,
        F: FnOnce(C) -> Fut,
        Fut: Future<Output = Result<Response<T>, Status>>,
    {
        match error {
            KvError::NotLeader {
                leader: Some(leader),
                ..
            } if !no_forward => self.forward(leader, hop, call).await,
            KvError::NotLeader {
                range_id,
                leader: None,
            } => Err(to_status(&KvError::unavailable(format!(
                "range {range_id} has no known leader"
            )))),
            error => Err(self.status(&error)),
        }
    }

    /// Sends the request to the leader's service (the caller set `no_forward`) and relays
    /// its answer. A failure of the hop itself becomes `Unavailable` when nothing was sent,
    /// and `OutcomeUnknown` for a write that may have reached the leader.
    async fn forward<C, T, F, Fut>(
        &self,
        leader: (NodeId, NodeAddr),
        hop: Hop,
        call: F,
    ) -> Result<Response<T>, Status>
    where
        C: PeerClient,
        F: FnOnce(C) -> Fut,
        Fut: Future<Output = Result<Response<T>, Status>>,
    {
        let (leader_id, leader_addr) = leader;
        debug!(leader_id, %leader_addr, "forwarding to leader");
        let deadline = self.shared.forward_deadline(hop.write) + hop.wait;
        let to = To::Node(leader_id, &leader_addr);
        let answer = peer::call(&self.shared.peers, to, deadline, call).await;
        answer.map_err(|error| self.relayed(error.into_status(hop.write)))
    }
}

/// Names the range serving the request, and its term, in the request's span (opened by
/// the metering layer).
fn traced(group: &RaftGroup) {
    let span = tracing::Span::current();
    span.record("range_id", group.range().0);
    span.record("term", group.term());
}
