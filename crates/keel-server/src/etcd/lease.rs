//! etcd's `Lease` service on Keel: each call is a `keel.v1.Kv.Lease` call on the etcd
//! namespace, made in-process with the caller's metadata (so a tenant's leases are its own
//! namespace's). TTLs are seconds in etcd and milliseconds in Keel; a grant below
//! `limits::ETCD_LEASE_TTL_MIN_S` gets that minimum (etcd raises short TTLs too, so a lease
//! outlives a leader election). A keep-alive stream is a task that keeps the lease alive
//! once per request and answers each in order; a lease that is gone answers TTL 0, and a
//! time-to-live of one answers TTL -1, as etcd does.

use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use keel_proto::etcd::etcdserverpb::lease_server::Lease;
use keel_proto::etcd::etcdserverpb::{
    LeaseGrantRequest, LeaseGrantResponse, LeaseKeepAliveRequest, LeaseKeepAliveResponse,
    LeaseLeasesRequest, LeaseLeasesResponse, LeaseRevokeRequest, LeaseRevokeResponse, LeaseStatus,
    LeaseTimeToLiveRequest, LeaseTimeToLiveResponse, ResponseHeader,
};
use keel_proto::v1::kv_server::Kv;
use keel_proto::v1::lease_request::Op;
use keel_proto::v1::lease_response::Result as Answer;
use keel_proto::v1::{self, LeaseRequest};
use keel_types::limits;
use keel_types::pinned::ETCD_PREFIX;
use tokio::sync::mpsc;
use tonic::codegen::tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::MetadataMap;
use tonic::{Code, Request, Response, Status, Streaming};

use super::convert;
use crate::api::kv::KvService;

type KeepAlives = Pin<Box<dyn Stream<Item = Result<LeaseKeepAliveResponse, Status>> + Send>>;

#[derive(Clone)]
pub(crate) struct EtcdLease {
    kv: Arc<KvService>,
    node_id: u64,
}

impl EtcdLease {
    pub fn new(kv: KvService, node_id: u64) -> EtcdLease {
        EtcdLease {
            kv: Arc::new(kv),
            node_id,
        }
    }

    /// Makes `op` on the etcd namespace's leases for a caller with `metadata`.
    async fn lease(
        &self,
        metadata: &MetadataMap,
        op: Op,
    ) -> Result<(ResponseHeader, Option<Answer>), Status> {
        let mut request = Request::new(LeaseRequest {
            namespace: ETCD_PREFIX.to_vec(),
            op: Some(op),
            ..LeaseRequest::default()
        });
        *request.metadata_mut() = metadata.clone();
        let answer = self.kv.lease(request).await;
        let answer = answer.map_err(convert::status)?.into_inner();
        let header = answer.header.unwrap_or_default();
        let header = convert::header(self.node_id, header.revision, header.term);
        Ok((header, answer.result))
    }

    /// Keeps lease `id` alive; etcd's answer (TTL 0 for a lease that is gone).
    async fn keep_alive(
        &self,
        metadata: &MetadataMap,
        id: i64,
    ) -> Result<LeaseKeepAliveResponse, Status> {
        let kept = self.lease(metadata, Op::KeepAlive(v1::LeaseKeepAlive { id }));
        let (header, ttl_ms) = match kept.await {
            Ok((header, Some(Answer::KeptAlive(kept)))) => (header, kept.ttl_ms),
            Ok(_) => return Err(unexpected()),
            Err(status) if status.code() == Code::NotFound => {
                (convert::header(self.node_id, 0, 0), 0)
            }
            Err(status) => return Err(status),
        };
        Ok(LeaseKeepAliveResponse {
            header: Some(header),
            id,
            ttl: seconds(ttl_ms),
        })
    }
}

fn unexpected() -> Status {
    Status::internal("etcdserver: Keel answered a lease call with another call's result")
}

/// Whole seconds of `ms`, rounded down.
fn seconds(ms: u64) -> i64 {
    i64::try_from(ms / 1000).unwrap_or(i64::MAX)
}

/// The Keel TTL of etcd's `ttl` seconds: at least the minimum, at most Keel's TTL limit.
fn ttl_ms(ttl: i64) -> Result<u64, Status> {
    let ttl = ttl.max(limits::ETCD_LEASE_TTL_MIN_S as i64) as u64;
    match ttl.checked_mul(1000).filter(|ms| *ms <= limits::TTL_MS_MAX) {
        Some(ms) => Ok(ms),
        None => Err(Status::out_of_range("etcdserver: too large lease TTL")),
    }
}

#[tonic::async_trait]
impl Lease for EtcdLease {
    async fn lease_grant(
        &self,
        request: Request<LeaseGrantRequest>,
    ) -> Result<Response<LeaseGrantResponse>, Status> {
        let (metadata, _, request) = request.into_parts();
        let grant = v1::LeaseGrant {
            id: request.id,
            ttl_ms: ttl_ms(request.ttl)?,
        };
        match self.lease(&metadata, Op::Grant(grant)).await? {
            (header, Some(Answer::Granted(granted))) => Ok(Response::new(LeaseGrantResponse {
                header: Some(header),
                id: granted.id,
                ttl: seconds(granted.ttl_ms),
                error: String::new(),
            })),
            _ => Err(unexpected()),
        }
    }

    async fn lease_revoke(
        &self,
        request: Request<LeaseRevokeRequest>,
    ) -> Result<Response<LeaseRevokeResponse>, Status> {
        let (metadata, _, request) = request.into_parts();
        let revoke = Op::Revoke(v1::LeaseRevoke { id: request.id });
        match self.lease(&metadata, revoke).await? {
            (header, Some(Answer::Revoked(_))) => Ok(Response::new(LeaseRevokeResponse {
                header: Some(header),
            })),
            _ => Err(unexpected()),
        }
    }

    type LeaseKeepAliveStream = KeepAlives;

    /// A task answers each keep-alive in order until the client's stream ends, the client
    /// goes, or a call fails (the stream then ends with that error).
    async fn lease_keep_alive(
        &self,
        request: Request<Streaming<LeaseKeepAliveRequest>>,
    ) -> Result<Response<KeepAlives>, Status> {
        let (metadata, _, mut incoming) = request.into_parts();
        let (sender, receiver) = mpsc::channel(limits::ETCD_KEEPALIVE_RESPONSES_BUFFERED);
        let lease = self.clone();
        tokio::spawn(async move {
            loop {
                let message = tokio::select! {
                    message = incoming.message() => message,
                    () = sender.closed() => return,
                };
                let Ok(Some(request)) = message else {
                    return;
                };
                let answer = lease.keep_alive(&metadata, request.id).await;
                let failed = answer.is_err();
                if sender.send(answer).await.is_err() || failed {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(receiver))))
    }

    /// A lease that does not exist answers TTL -1, as etcd's does.
    async fn lease_time_to_live(
        &self,
        request: Request<LeaseTimeToLiveRequest>,
    ) -> Result<Response<LeaseTimeToLiveResponse>, Status> {
        let (metadata, _, request) = request.into_parts();
        let asked = Op::TimeToLive(v1::LeaseTimeToLive {
            id: request.id,
            keys: request.keys,
        });
        let answer = match self.lease(&metadata, asked).await {
            Ok((header, Some(Answer::Info(info)))) => LeaseTimeToLiveResponse {
                header: Some(header),
                id: info.id,
                ttl: seconds(info.remaining_ms),
                granted_ttl: seconds(info.granted_ttl_ms),
                keys: info.keys.into_iter().map(convert::etcd_key).collect(),
            },
            Ok(_) => return Err(unexpected()),
            Err(status) if status.code() == Code::NotFound => LeaseTimeToLiveResponse {
                header: Some(convert::header(self.node_id, 0, 0)),
                id: request.id,
                ttl: -1,
                granted_ttl: 0,
                keys: Vec::new(),
            },
            Err(status) => return Err(status),
        };
        Ok(Response::new(answer))
    }

    async fn lease_leases(
        &self,
        request: Request<LeaseLeasesRequest>,
    ) -> Result<Response<LeaseLeasesResponse>, Status> {
        let (metadata, _, _) = request.into_parts();
        match self.lease(&metadata, Op::List(v1::LeaseList {})).await? {
            (header, Some(Answer::Leases(leases))) => Ok(Response::new(LeaseLeasesResponse {
                header: Some(header),
                leases: leases
                    .ids
                    .into_iter()
                    .map(|id| LeaseStatus { id })
                    .collect(),
            })),
            _ => Err(unexpected()),
        }
    }
}
