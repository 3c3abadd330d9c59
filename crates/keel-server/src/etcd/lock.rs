//! etcd's `v3lock` and `v3election` services on Keel (what the Rust `etcd-client` crate's
//! lock and election calls use), built on the waiting line of `queue`: a lock or a
//! campaign puts the caller's key under the name, attached to its lease, and answers once
//! that key is the oldest; unlock and resign delete it. A call given up while it waits
//! leaves the line (its key is deleted), as etcd's server does. Observe streams the leader
//! each time it changes, from a task.

use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use keel_proto::etcd::etcdserverpb::ResponseHeader;
use keel_proto::etcd::v3electionpb::election_server::Election;
use keel_proto::etcd::v3electionpb::{
    CampaignRequest, CampaignResponse, LeaderKey, LeaderRequest, LeaderResponse, ProclaimRequest,
    ProclaimResponse, ResignRequest, ResignResponse,
};
use keel_proto::etcd::v3lockpb::lock_server::Lock;
use keel_proto::etcd::v3lockpb::{LockRequest, LockResponse, UnlockRequest, UnlockResponse};
use keel_types::limits;
use tokio::sync::mpsc;
use tonic::codegen::tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status};

use super::convert;
use super::kv::EtcdKv;
use super::queue::{Place, Queue, contender_key, prefix, prefix_end};
use crate::api::kv::KvService;

type Leaders = Pin<Box<dyn Stream<Item = Result<LeaderResponse, Status>> + Send>>;

/// Both services: they share the line.
#[derive(Clone)]
pub(crate) struct EtcdLock {
    etcd: Arc<EtcdKv>,
    keel: Arc<KvService>,
    node_id: u64,
}

impl EtcdLock {
    pub fn new(etcd: EtcdKv, keel: KvService, node_id: u64) -> EtcdLock {
        EtcdLock {
            etcd: Arc::new(etcd),
            keel: Arc::new(keel),
            node_id,
        }
    }

    fn queue(&self, metadata: MetadataMap) -> Queue {
        Queue {
            etcd: self.etcd.clone(),
            keel: self.keel.clone(),
            metadata,
        }
    }

    /// The header of an answer at `revision` (0: none read).
    fn header(&self, revision: i64) -> Option<ResponseHeader> {
        Some(convert::header(self.node_id, revision.max(0) as u64, 0))
    }

    /// Joins the line of `name` with `value` under `lease` and waits for the first place;
    /// a wait given up (the caller went, or an error) leaves the line.
    async fn first_place(
        &self,
        queue: &Queue,
        name: &[u8],
        lease: i64,
        value: &[u8],
    ) -> Result<Place, Status> {
        if name.is_empty() {
            return Err(Status::invalid_argument("etcdserver: a name is needed"));
        }
        if lease <= 0 {
            return Err(Status::invalid_argument(
                "etcdserver: a lease is needed; grant one (LeaseGrant) and keep it alive",
            ));
        }
        let place = queue
            .join(&contender_key(name, lease), value, lease)
            .await?;
        let mut leaving = Leaving {
            queue: Some(queue.clone()),
            place: place.clone(),
        };
        queue.wait_turn(name, &place).await?;
        leaving.queue = None;
        Ok(place)
    }
}

/// Deletes a contender's key when dropped before it got its place.
struct Leaving {
    queue: Option<Queue>,
    place: Place,
}

impl Drop for Leaving {
    /// Outside a runtime (never, for a call's future) the key stays until its lease ends.
    fn drop(&mut self) {
        let (Some(queue), Ok(runtime)) = (self.queue.take(), tokio::runtime::Handle::try_current())
        else {
            return;
        };
        let place = self.place.clone();
        runtime.spawn(async move {
            let _ = queue.leave(&place.key, Some(place.created)).await;
        });
    }
}

#[tonic::async_trait]
impl Lock for EtcdLock {
    async fn lock(&self, request: Request<LockRequest>) -> Result<Response<LockResponse>, Status> {
        let (metadata, _, request) = request.into_parts();
        let queue = self.queue(metadata);
        let place = self
            .first_place(&queue, &request.name, request.lease, b"")
            .await?;
        Ok(Response::new(LockResponse {
            header: self.header(place.created),
            key: place.key,
        }))
    }

    async fn unlock(
        &self,
        request: Request<UnlockRequest>,
    ) -> Result<Response<UnlockResponse>, Status> {
        let (metadata, _, request) = request.into_parts();
        let header = self.queue(metadata).leave(&request.key, None).await?;
        Ok(Response::new(UnlockResponse {
            header: Some(header),
        }))
    }
}

/// The caller's leadership as etcd's election calls name it.
fn leader_place(leader: Option<LeaderKey>) -> Result<(LeaderKey, Place), Status> {
    let leader =
        leader.ok_or_else(|| Status::invalid_argument("etcdserver: a leader key is needed"))?;
    let place = Place {
        key: leader.key.clone(),
        created: leader.rev,
    };
    Ok((leader, place))
}

fn no_leader() -> Status {
    Status::unavailable("etcdserver: election: no leader")
}

#[tonic::async_trait]
impl Election for EtcdLock {
    async fn campaign(
        &self,
        request: Request<CampaignRequest>,
    ) -> Result<Response<CampaignResponse>, Status> {
        let (metadata, _, request) = request.into_parts();
        let queue = self.queue(metadata);
        let place = self
            .first_place(&queue, &request.name, request.lease, &request.value)
            .await?;
        Ok(Response::new(CampaignResponse {
            header: self.header(place.created),
            leader: Some(LeaderKey {
                name: request.name,
                key: place.key,
                rev: place.created,
                lease: request.lease,
            }),
        }))
    }

    async fn proclaim(
        &self,
        request: Request<ProclaimRequest>,
    ) -> Result<Response<ProclaimResponse>, Status> {
        let (metadata, _, request) = request.into_parts();
        let (leader, place) = leader_place(request.leader)?;
        let queue = self.queue(metadata);
        queue.proclaim(&place, leader.lease, &request.value).await?;
        Ok(Response::new(ProclaimResponse {
            header: self.header(0),
        }))
    }

    async fn leader(
        &self,
        request: Request<LeaderRequest>,
    ) -> Result<Response<LeaderResponse>, Status> {
        let (metadata, _, request) = request.into_parts();
        let (kv, revision) = self.queue(metadata).first(&request.name).await?;
        let kv = kv.ok_or_else(no_leader)?;
        Ok(Response::new(LeaderResponse {
            header: self.header(revision),
            kv: Some(kv),
        }))
    }

    type ObserveStream = Leaders;

    /// A task sends the leader whenever it changes (another key, or a new value), until the
    /// caller goes or a read fails.
    async fn observe(&self, request: Request<LeaderRequest>) -> Result<Response<Leaders>, Status> {
        let (metadata, _, request) = request.into_parts();
        let (sender, receiver) = mpsc::channel(limits::ETCD_KEEPALIVE_RESPONSES_BUFFERED);
        let queue = self.queue(metadata);
        let lock = self.clone();
        tokio::spawn(async move {
            let mut last: Option<(Vec<u8>, i64)> = None;
            loop {
                let (kv, revision) = match queue.first(&request.name).await {
                    Ok(read) => read,
                    Err(status) => {
                        let _ = sender.send(Err(status)).await;
                        return;
                    }
                };
                if let Some(kv) = kv {
                    let seen = Some((kv.key.clone(), kv.mod_revision));
                    if seen != last {
                        last = seen;
                        let answer = LeaderResponse {
                            header: lock.header(revision),
                            kv: Some(kv),
                        };
                        if sender.send(Ok(answer)).await.is_err() {
                            return;
                        }
                    }
                }
                let under = prefix(&request.name);
                let end = Some(prefix_end(&under));
                let changed = tokio::select! {
                    changed = queue.changed(&under, end, revision + 1, false) => changed,
                    () = sender.closed() => return,
                };
                if let Err(status) = changed {
                    let _ = sender.send(Err(status)).await;
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(receiver))))
    }

    async fn resign(
        &self,
        request: Request<ResignRequest>,
    ) -> Result<Response<ResignResponse>, Status> {
        let (metadata, _, request) = request.into_parts();
        let (_, place) = leader_place(request.leader)?;
        let queue = self.queue(metadata);
        let header = queue.leave(&place.key, Some(place.created)).await?;
        Ok(Response::new(ResignResponse {
            header: Some(header),
        }))
    }
}
