//! The `keel.raft.v1.Raft` service: the receiving side of the gRPC transport, meta
//! proposals, heartbeats and replica calls from other nodes. Hands raw payloads to `Groups`
//! and returns their encoded replies; decodes a meta command and proposes it on the meta
//! range's leader (here, or forwarded once); records heartbeats; serves replica calls here
//! (`replicas`) or forwards them once to the range's leader; tells the console this node's
//! facts (`console::facts`); serves the batch stream of a peer's Raft messages (`batch`).
//! Serves peers only
//! (`peers_only`, in front of every method). Knows nothing of openraft types.

use std::sync::Arc;
use std::time::Duration;

use keel_proto::raft::raft_client::RaftClient;
use keel_proto::raft::raft_server::Raft;
use keel_proto::raft::{
    HeartbeatReply, HeartbeatRequest, MetaProposal, NodeMessage, RaftBatch, RaftReply, RaftRequest,
    SnapshotChunk,
};
use keel_raft::{Groups, InboundError, RpcKind, wire};
use keel_types::{
    KvError, MetaCommand, MetaOutcome, NodeReport, RangeId, ReplicaChange, ReplicaMembership,
};
use tonic::{Request, Response, Status, Streaming};
use tracing::{Instrument, info_span, warn};

use crate::access::tls;
use crate::api::console;
use crate::api::console::facts::FactsQuery;
use crate::cluster::quiescence;
use crate::locks::queues::LockQueues;
use crate::peer::call::PeerCall;
use crate::peer::channels::PeerChannel;
use crate::ranges::check::{self, CheckQuery};
use crate::ranges::meta;
use crate::ranges::replicas;
use crate::shared::Shared;
use crate::status::to_status;

mod batch;
mod forwarded;

/// Refuses, before any method runs, a call that is not from a node of the cluster
/// (`tls::is_peer`): with TLS on, nobody without a node certificate reaches Raft.
pub(crate) fn peers_only(request: Request<()>) -> Result<Request<()>, Status> {
    if tls::is_peer(&request) {
        return Ok(request);
    }
    Err(Status::permission_denied(
        "keel.raft.v1 serves cluster nodes only: this connection presented no certificate signed by the cluster CA",
    ))
}

pub(crate) struct RaftService {
    shared: Arc<Shared>,
    groups: Groups,
    /// The services the requests of `Raft.Forward` reach.
    forwarded: Arc<forwarded::Services>,
}

impl RaftService {
    pub fn new(shared: Arc<Shared>, queues: Arc<LockQueues>) -> RaftService {
        RaftService {
            groups: shared.groups.clone(),
            forwarded: Arc::new(forwarded::Services::new(shared.clone(), queues)),
            shared,
        }
    }

    /// What resolves when the node starts shutting down: served streams end then.
    fn closing(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let shared = self.shared.clone();
        async move { shared.health.closing().await }
    }

    /// Proposes a peer's meta command: on this node's meta replica if it leads, else (unless
    /// the peer said `no_forward`) on the leader it knows.
    async fn serve_meta(&self, proposal: &MetaProposal) -> Result<MetaOutcome, KvError> {
        self.shared.health.check()?;
        let command: MetaCommand = wire::decode(&proposal.payload).map_err(|e| {
            KvError::invalid(format!("meta proposal from node {}: {e}", proposal.from))
        })?;
        if proposal.no_forward {
            return meta::propose_here(&self.shared, command).await;
        }
        meta::propose_meta(&self.shared, command).await
    }

    /// Serves a replica call on this node, or (unless `no_forward`) forwards it once to the
    /// node a `NotLeader` names; the reply carries the encoded answer.
    async fn replica_call<P, T, F, Fut, R, RFut>(
        &self,
        request: Request<NodeMessage>,
        write: bool,
        deadline: Duration,
        serve: F,
        forward: R,
    ) -> Result<Response<RaftReply>, Status>
    where
        P: serde::de::DeserializeOwned + serde::Serialize,
        T: serde::Serialize + serde::de::DeserializeOwned,
        F: FnOnce(P) -> Fut,
        Fut: std::future::Future<Output = Result<T, KvError>>,
        R: FnOnce(RaftClient<PeerChannel>, NodeMessage) -> RFut,
        RFut: std::future::Future<Output = Result<Response<RaftReply>, Status>>,
    {
        let message = request.into_inner();
        let range = RangeId(message.range_id);
        let payload: P = query(&message, "replica call")?;
        let answer = match serve(payload).await {
            Err(KvError::NotLeader {
                leader: Some((node, addr)),
                ..
            }) if !message.no_forward && node != self.shared.node_id => {
                let payload: P = wire::decode(&message.payload)
                    .map_err(|e| Status::internal(format!("decoding a payload again: {e}")))?;
                let call = PeerCall {
                    node,
                    addr: &addr,
                    range,
                    payload: &payload,
                    forward: false,
                    write,
                    deadline,
                };
                call.send::<T, _, _>(&self.shared.peers, self.shared.node_id, forward)
                    .await
            }
            answer => answer,
        };
        let answer = answer.map_err(|e| to_status(&e))?;
        reply(&answer)
    }

    async fn handle(
        &self,
        kind: RpcKind,
        request: Request<RaftRequest>,
    ) -> Result<Response<RaftReply>, Status> {
        let request = request.into_inner();
        let payload = self
            .groups
            .handle(RangeId(request.range_id), kind, &request.payload)
            .await
            .map_err(|e| inbound_status(&e))?;
        Ok(Response::new(RaftReply { payload }))
    }
}

#[tonic::async_trait]
impl Raft for RaftService {
    async fn append_entries(
        &self,
        request: Request<RaftRequest>,
    ) -> Result<Response<RaftReply>, Status> {
        self.handle(RpcKind::AppendEntries, request).await
    }

    async fn vote(&self, request: Request<RaftRequest>) -> Result<Response<RaftReply>, Status> {
        self.handle(RpcKind::Vote, request).await
    }

    async fn pre_vote(&self, request: Request<RaftRequest>) -> Result<Response<RaftReply>, Status> {
        self.handle(RpcKind::PreVote, request).await
    }

    async fn transfer_leader(
        &self,
        request: Request<RaftRequest>,
    ) -> Result<Response<RaftReply>, Status> {
        self.handle(RpcKind::TransferLeader, request).await
    }

    async fn read_index(
        &self,
        request: Request<RaftRequest>,
    ) -> Result<Response<RaftReply>, Status> {
        self.handle(RpcKind::ReadIndex, request).await
    }

    type BatchStream = batch::Replies;

    async fn batch(
        &self,
        request: Request<Streaming<RaftBatch>>,
    ) -> Result<Response<batch::Replies>, Status> {
        let groups = self.groups.clone();
        let serve_one = move |request| batch::serve_raft(&groups, request);
        let replies = batch::serve(serve_one, request.into_inner(), self.closing());
        Ok(Response::new(replies))
    }

    type ForwardStream = batch::Replies;

    async fn forward(
        &self,
        request: Request<Streaming<RaftBatch>>,
    ) -> Result<Response<batch::Replies>, Status> {
        let caller = request.extensions().get::<tls::Caller>().copied();
        let services = self.forwarded.clone();
        let serve_one = move |request| {
            let services = services.clone();
            async move { services.serve(caller, request).await }
        };
        let replies = batch::serve(serve_one, request.into_inner(), self.closing());
        Ok(Response::new(replies))
    }

    async fn install_snapshot(
        &self,
        request: Request<Streaming<SnapshotChunk>>,
    ) -> Result<Response<RaftReply>, Status> {
        let mut stream = request.into_inner();
        let mut first = stream
            .message()
            .await?
            .ok_or_else(|| Status::invalid_argument("snapshot stream is empty"))?;
        let range = RangeId(first.range_id);
        let header = std::mem::take(&mut first.header);
        let chunks = snapshot_data(first, stream);
        let payload = self
            .groups
            .install_snapshot(range, &header, chunks)
            .await
            .map_err(|e| inbound_status(&e))?;
        Ok(Response::new(RaftReply { payload }))
    }

    async fn heartbeat(
        &self,
        request: Request<HeartbeatRequest>,
    ) -> Result<Response<HeartbeatReply>, Status> {
        let message = request.into_inner();
        let from = message.from;
        let report: NodeReport = wire::decode(&message.payload)
            .map_err(|e| Status::invalid_argument(format!("heartbeat from node {from}: {e}")))?;
        // A list that does not decode counts as none: the groups quiet under the sender wake.
        let listed = quiescence::decode(&message.quiet).unwrap_or_else(|error| {
            warn!(from, %error, "heartbeat with a malformed quiet list");
            Vec::new()
        });
        let client_addr = message.client_addr;
        // Answered before it is recorded as heard: see `quiescence::answer`.
        let agreed = quiescence::answer(&self.shared, from, &listed);
        self.shared.heartbeats.record(from, report, client_addr);
        let members = self.shared.meta_members();
        let leads_meta = (self.shared.groups.get(RangeId::META)).is_some_and(|g| g.is_leader());
        let internal = |e: wire::WireError| Status::internal(e.to_string());
        Ok(Response::new(HeartbeatReply {
            payload: wire::encode(&members).map_err(internal)?,
            quiet: quiescence::encode(&agreed).map_err(internal)?,
            leaders_settled: leads_meta && self.shared.settling.settled_for(from),
        }))
    }

    async fn ping(&self, request: Request<NodeMessage>) -> Result<Response<RaftReply>, Status> {
        self.shared.heartbeats.record_ping(request.get_ref().from);
        Ok(Response::new(RaftReply::default()))
    }

    async fn prepare_replica(
        &self,
        request: Request<NodeMessage>,
    ) -> Result<Response<RaftReply>, Status> {
        let range = RangeId(request.get_ref().range_id);
        let shared = self.shared.clone();
        let serve =
            |view: ReplicaMembership| async move { replicas::prepare(&shared, range, &view).await };
        let forward = |mut client: RaftClient<PeerChannel>, message| async move {
            client.prepare_replica(message).await
        };
        self.replica_call(
            request,
            false,
            self.shared.forward_deadline(false),
            serve,
            forward,
        )
        .await
    }

    async fn remove_replica(
        &self,
        request: Request<NodeMessage>,
    ) -> Result<Response<RaftReply>, Status> {
        let range = RangeId(request.get_ref().range_id);
        let shared = self.shared.clone();
        let serve =
            |view: ReplicaMembership| async move { replicas::remove(&shared, range, &view).await };
        let forward = |mut client: RaftClient<PeerChannel>, message| async move {
            client.remove_replica(message).await
        };
        self.replica_call(
            request,
            false,
            self.shared.forward_deadline(false),
            serve,
            forward,
        )
        .await
    }

    async fn replica_membership(
        &self,
        request: Request<NodeMessage>,
    ) -> Result<Response<RaftReply>, Status> {
        let range = RangeId(request.get_ref().range_id);
        let shared = self.shared.clone();
        let serve = |()| async move { replicas::membership(&shared, range).await };
        let forward = |mut client: RaftClient<PeerChannel>, message| async move {
            client.replica_membership(message).await
        };
        self.replica_call(
            request,
            false,
            self.shared.forward_deadline(false),
            serve,
            forward,
        )
        .await
    }

    async fn change_replicas(
        &self,
        request: Request<NodeMessage>,
    ) -> Result<Response<RaftReply>, Status> {
        let range = RangeId(request.get_ref().range_id);
        let span = info_span!(
            "replicas",
            node_id = self.shared.node_id,
            range_id = range.0
        );
        let shared = self.shared.clone();
        let serve =
            |change: ReplicaChange| async move { replicas::change(&shared, range, &change).await };
        let forward = |mut client: RaftClient<PeerChannel>, message| async move {
            client.change_replicas(message).await
        };
        self.replica_call(
            request,
            true,
            self.shared.forward_deadline(true),
            serve,
            forward,
        )
        .instrument(span)
        .await
    }

    async fn console_facts(
        &self,
        request: Request<NodeMessage>,
    ) -> Result<Response<RaftReply>, Status> {
        let _query: FactsQuery = query(&request.into_inner(), "console query")?;
        let facts = console::facts::local(&self.shared).await;
        reply(&facts)
    }

    async fn check_range(
        &self,
        request: Request<NodeMessage>,
    ) -> Result<Response<RaftReply>, Status> {
        let range = RangeId(request.get_ref().range_id);
        let shared = self.shared.clone();
        let serve = |_: CheckQuery| async move { check::check_range(&shared, range).await };
        let forward = |mut client: RaftClient<PeerChannel>, message| async move {
            client.check_range(message).await
        };
        let deadline = check::check_deadline();
        self.replica_call(request, false, deadline, serve, forward)
            .await
    }

    async fn range_digest(
        &self,
        request: Request<NodeMessage>,
    ) -> Result<Response<RaftReply>, Status> {
        let message = request.into_inner();
        let index: u64 = query(&message, "digest query")?;
        let range = RangeId(message.range_id);
        let answer = check::local_digest(&self.shared, range, index).await;
        reply(&answer)
    }

    async fn propose_meta(
        &self,
        request: Request<MetaProposal>,
    ) -> Result<Response<RaftReply>, Status> {
        let proposal = request.into_inner();
        let span = info_span!("meta", node_id = self.shared.node_id, from = proposal.from);
        let outcome = self.serve_meta(&proposal).instrument(span).await;
        let outcome = outcome.map_err(|e| to_status(&e))?;
        reply(&outcome)
    }
}

/// The payload of a peer's `message`; `InvalidArgument` naming `what` and the sender when it
/// does not decode.
fn query<T: serde::de::DeserializeOwned>(message: &NodeMessage, what: &str) -> Result<T, Status> {
    wire::decode(&message.payload).map_err(|e| {
        let error = KvError::invalid(format!("{what} from node {}: {e}", message.from));
        to_status(&error)
    })
}

/// `answer` encoded as a peer's reply.
fn reply<T: serde::Serialize>(answer: &T) -> Result<Response<RaftReply>, Status> {
    let payload = wire::encode(answer).map_err(|e| Status::internal(e.to_string()))?;
    Ok(Response::new(RaftReply { payload }))
}

/// The data of every chunk, starting with the first one already read; an error if the stream
/// ends before a chunk marked `done` or goes on after it. The consumer stops at the first
/// error.
fn snapshot_data(
    first: SnapshotChunk,
    rest: Streaming<SnapshotChunk>,
) -> impl futures::Stream<Item = Result<Vec<u8>, String>> + Send {
    let state = (Some(first), rest, false);
    futures::stream::unfold(state, |(pending, mut rest, done)| async move {
        let next = match pending {
            Some(chunk) => Ok(Some(chunk)),
            None => rest.message().await,
        };
        let item = match (next, done) {
            (Ok(None), true) => return None,
            (Ok(None), false) => Err("snapshot stream ended before its last chunk".to_string()),
            (Ok(Some(_)), true) => Err("snapshot stream goes on after its last chunk".to_string()),
            (Ok(Some(chunk)), false) => {
                let done = chunk.done;
                return Some((Ok(chunk.data), (None, rest, done)));
            }
            (Err(status), _) => Err(status.message().to_string()),
        };
        Some((item, (None, rest, true)))
    })
}

fn inbound_status(error: &InboundError) -> Status {
    match error {
        InboundError::UnknownRange(_) => Status::not_found(error.to_string()),
        InboundError::Malformed(_) | InboundError::SnapshotStream(_) => {
            Status::invalid_argument(error.to_string())
        }
        InboundError::Overlap { .. } => Status::failed_precondition(error.to_string()),
        InboundError::Io(_) | InboundError::Storage(_) => Status::internal(error.to_string()),
    }
}
