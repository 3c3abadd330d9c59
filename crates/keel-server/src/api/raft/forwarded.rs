//! The requests of `Raft.Forward`: client calls a peer sends on to a range's leader here.
//! Each is served by the same service a call of its own from that peer would reach (the one
//! answering peers), with the stream's caller as its caller, so admission, confinement and
//! every answer are the same as for a call. Knows nothing of what the requests mean.

use std::future::Future;
use std::sync::Arc;

use keel_proto::raft::{BatchedReply, BatchedRequest};
use keel_proto::v1::cluster_server::Cluster;
use keel_proto::v1::idempotency_server::Idempotency;
use keel_proto::v1::kv_server::Kv;
use keel_proto::v1::lock_server::Lock;
use keel_proto::v1::{
    AbortRequest, AcquireRequest, BatchRequest, BeginRequest, CompleteRequest, DeleteRequest,
    GetRequest, HistoryRequest, IdempotencyGetRequest, IncrementRequest, InspectRequest,
    LeaseRequest, PutRequest, ReleaseRequest, RenewRequest, ScanRequest, SplitRequest, TxnRequest,
};
use prost::Message;
use tonic::{Request, Response, Status};

use super::batch::reply;
use crate::access::tls::Caller;
use crate::api::cluster::ClusterService;
use crate::api::idempotency::IdempotencyService;
use crate::api::kv::KvService;
use crate::api::lock::LockService;
use crate::locks::queues::LockQueues;
use crate::requests::router::{Audience, Forwardable};
use crate::shared::Shared;

/// The services forwarded requests reach.
pub(crate) struct Services {
    kv: KvService,
    lock: LockService,
    idempotency: IdempotencyService,
    cluster: ClusterService,
}

impl Services {
    /// The services, with the node's lock `queues` (shared with the Lock service of its
    /// ports, so a forwarded release hands the lock to an acquire waiting from a call).
    pub fn new(shared: Arc<Shared>, queues: Arc<LockQueues>) -> Services {
        Services {
            kv: KvService::new(shared.clone(), Audience::Peers),
            lock: LockService::new(shared.clone(), Audience::Peers, queues),
            idempotency: IdempotencyService::new(shared.clone(), Audience::Peers),
            cluster: ClusterService::new(shared, Audience::Peers),
        }
    }

    /// Serves one forwarded request as its call would be served, from `caller` (what the
    /// stream's connection proved). A method the stream does not carry is `UNIMPLEMENTED`,
    /// which makes the sender send it as a call of its own.
    pub async fn serve(&self, caller: Option<Caller>, request: BatchedRequest) -> BatchedReply {
        let payload = request.payload.as_slice();
        let served = match request.method.as_str() {
            GetRequest::METHOD => unary(payload, caller, |r| self.kv.get(r)).await,
            ScanRequest::METHOD => unary(payload, caller, |r| self.kv.scan(r)).await,
            HistoryRequest::METHOD => unary(payload, caller, |r| self.kv.history(r)).await,
            PutRequest::METHOD => unary(payload, caller, |r| self.kv.put(r)).await,
            DeleteRequest::METHOD => unary(payload, caller, |r| self.kv.delete(r)).await,
            BatchRequest::METHOD => unary(payload, caller, |r| self.kv.batch(r)).await,
            IncrementRequest::METHOD => unary(payload, caller, |r| self.kv.increment(r)).await,
            TxnRequest::METHOD => unary(payload, caller, |r| self.kv.txn(r)).await,
            LeaseRequest::METHOD => unary(payload, caller, |r| self.kv.lease(r)).await,
            AcquireRequest::METHOD => unary(payload, caller, |r| self.lock.acquire(r)).await,
            RenewRequest::METHOD => unary(payload, caller, |r| self.lock.renew(r)).await,
            ReleaseRequest::METHOD => unary(payload, caller, |r| self.lock.release(r)).await,
            InspectRequest::METHOD => unary(payload, caller, |r| self.lock.inspect(r)).await,
            BeginRequest::METHOD => unary(payload, caller, |r| self.idempotency.begin(r)).await,
            CompleteRequest::METHOD => {
                unary(payload, caller, |r| self.idempotency.complete(r)).await
            }
            AbortRequest::METHOD => unary(payload, caller, |r| self.idempotency.abort(r)).await,
            IdempotencyGetRequest::METHOD => {
                unary(payload, caller, |r| self.idempotency.get(r)).await
            }
            SplitRequest::METHOD => unary(payload, caller, |r| self.cluster.split(r)).await,
            other => Err(Status::unimplemented(format!(
                "Raft.Forward does not carry {other:?}; send it as a call of its own"
            ))),
        };
        reply(request.id, served)
    }
}

/// Decodes a request of type `Q`, serves it with `serve` as from `caller`, and encodes the
/// response.
async fn unary<Q, P, S, Fut>(
    payload: &[u8],
    caller: Option<Caller>,
    serve: S,
) -> Result<Vec<u8>, Status>
where
    Q: Message + Default,
    P: Message,
    S: FnOnce(Request<Q>) -> Fut,
    Fut: Future<Output = Result<Response<P>, Status>>,
{
    let decoded = Q::decode(payload).map_err(|e| {
        Status::invalid_argument(format!("a forwarded request that does not decode: {e}"))
    })?;
    let mut request = Request::new(decoded);
    if let Some(caller) = caller {
        request.extensions_mut().insert(caller);
    }
    let response = serve(request).await?;
    Ok(response.into_inner().encode_to_vec())
}
