//! A scripted, in-process Kv server: answers each call with the next scripted reply (or the
//! fallback reply once the script is empty; success by default), records which listener got
//! which call and which request ids writes carried, and applies writes at most once per
//! request id, as a Keel server does. It also serves the Lock and Idempotency services
//! (`coordination`), and, made with `Fake::cluster`, plays a cluster of several nodes whose
//! keyspace is split into ranges (`ranged`). Knows nothing of Raft or storage.

mod coordination;
mod ranged;

use std::any::Any;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use keel_proto::v1;
use keel_proto::v1::kv_server::{Kv, KvServer};
use keel_types::KvError;
use prost::Message;
use tokio::sync::{Notify, watch};
use tonic::transport::server::TcpIncoming;
use tonic::{Code, Request, Response, Status};

/// The key whose reads report a TTL, so tests can see `ttl_remaining`.
pub const TTL_KEY: &[u8] = b"has-ttl";
/// The range clock of the event a history read of any key reports.
pub const HISTORY_CLOCK_MS: u64 = 1_700_000_000_000;
/// The TTL reads of `TTL_KEY` report.
pub const TTL_REMAINING_MS: u64 = 1_500;

/// What the fake does with one call.
#[derive(Clone)]
pub enum Reply {
    /// Answers with this error, as a Keel server would (with an `ErrorDetail`).
    Error(KvError),
    /// Never answers.
    Hang,
    /// Answers `Unknown` without an `ErrorDetail`, having applied nothing.
    Unknown,
    /// Applies the write, then answers `Unknown` without an `ErrorDetail`: the response was
    /// lost on the way.
    Lose,
    /// Waits until the notify fires, then answers normally.
    Gate(Arc<Notify>),
}

/// One write as the fake received it.
#[derive(Debug, Clone, PartialEq)]
pub struct Write {
    pub method: &'static str,
    pub request_id: Option<v1::RequestId>,
    pub ttl_ms: Option<i64>,
    pub fence: Option<v1::Fence>,
}

pub struct Fake {
    node_id: u64,
    replies: Mutex<VecDeque<Reply>>,
    fallback: Mutex<Option<Reply>>,
    /// (method, port of the listener that took the call), in arrival order.
    calls: Mutex<Vec<(&'static str, u16)>>,
    writes: Mutex<Vec<Write>>,
    /// How many writes have arrived, for tests to wait on.
    arrived: watch::Sender<usize>,
    sessions_opened: Mutex<u64>,
    store: Mutex<Store>,
    /// The ranges, when the fake plays a cluster of ranges (`Fake::cluster`).
    ranged: Mutex<Option<ranged::Ranged>>,
    /// Nodes that take calls and never answer them (as a paused process would).
    paused: Mutex<Vec<u64>>,
    /// (method, node) of every call a paused node took, in arrival order.
    held: Mutex<Vec<(&'static str, u64)>>,
}

/// What the fake has applied.
#[derive(Default)]
struct Store {
    revision: u64,
    counter: i64,
    /// Keys and values written (a cluster of ranges reads them; a plain fake answers every
    /// get with `value`).
    data: BTreeMap<Vec<u8>, Vec<u8>>,
    /// The answer of every applied write that had a request id, by (client, sequence).
    records: HashMap<(u64, u64), Applied>,
    /// Locks and idempotency records, and the answers of their writes by request id.
    coordination: coordination::State,
    answers: HashMap<(u64, u64), Box<dyn Any + Send>>,
}

#[derive(Clone)]
struct Applied {
    revision: u64,
    /// Per op: the counter after it, for increments.
    counters: Vec<Option<i64>>,
}

/// One op of a write, as the fake applies it. Increments add to one counter shared by all
/// keys, and store its new value under their key.
#[derive(Debug, Clone)]
pub enum Op {
    Put(Vec<u8>, Vec<u8>),
    Delete(Vec<u8>),
    Increment(Vec<u8>, i64),
}

impl Op {
    fn key(&self) -> &[u8] {
        match self {
            Op::Put(key, _) | Op::Delete(key) | Op::Increment(key, _) => key,
        }
    }
}

/// A response with a header the fake fills in.
pub trait Headed {
    fn header_mut(&mut self) -> &mut Option<v1::ResponseHeader>;
}

macro_rules! headed {
    ($($response:ty),*) => {$(
        impl Headed for $response {
            fn header_mut(&mut self) -> &mut Option<v1::ResponseHeader> {
                &mut self.header
            }
        }
    )*};
}

headed!(
    v1::GetResponse,
    v1::HistoryResponse,
    v1::PutResponse,
    v1::DeleteResponse,
    v1::ScanResponse,
    v1::BatchResponse,
    v1::IncrementResponse,
    v1::AcquireResponse,
    v1::RenewResponse,
    v1::ReleaseResponse,
    v1::InspectResponse,
    v1::BeginResponse,
    v1::CompleteResponse,
    v1::AbortResponse,
    v1::IdempotencyGetResponse
);

impl Fake {
    pub fn new(node_id: u64, replies: Vec<Reply>) -> Arc<Fake> {
        Arc::new(Fake {
            node_id,
            replies: Mutex::new(replies.into()),
            fallback: Mutex::new(None),
            calls: Mutex::new(Vec::new()),
            writes: Mutex::new(Vec::new()),
            arrived: watch::channel(0).0,
            sessions_opened: Mutex::new(0),
            store: Mutex::new(Store::default()),
            ranged: Mutex::new(None),
            paused: Mutex::new(Vec::new()),
            held: Mutex::new(Vec::new()),
        })
    }

    /// From now on node `node` takes calls (recorded as usual) and never answers them.
    pub fn pause(&self, node: u64) {
        self.paused.lock().unwrap().push(node);
    }

    /// (method, node) of every call a paused node took, in arrival order.
    pub fn held(&self) -> Vec<(&'static str, u64)> {
        self.held.lock().unwrap().clone()
    }

    /// Never returns when the node that took `request` is paused (the call is kept in
    /// `held`).
    async fn hold_if_paused<R>(&self, method: &'static str, request: &Request<R>) {
        let node = self.node_of(request);
        if self.paused.lock().unwrap().contains(&node) {
            self.held.lock().unwrap().push((method, node));
            std::future::pending::<()>().await;
        }
    }

    /// Adds a reply to the end of the script.
    pub fn replies_push(&self, reply: Reply) {
        self.replies.lock().unwrap().push_back(reply);
    }

    /// The reply once the script is empty (instead of success).
    pub fn set_fallback(&self, reply: Reply) {
        *self.fallback.lock().unwrap() = Some(reply);
    }

    pub fn calls(&self) -> Vec<(&'static str, u16)> {
        self.calls.lock().unwrap().clone()
    }

    pub fn writes(&self) -> Vec<Write> {
        self.writes.lock().unwrap().clone()
    }

    /// The request ids writes carried, in arrival order.
    pub fn request_ids(&self) -> Vec<v1::RequestId> {
        let writes = self.writes();
        writes.into_iter().map(|w| w.request_id.unwrap()).collect()
    }

    pub fn sessions_opened(&self) -> u64 {
        *self.sessions_opened.lock().unwrap()
    }

    /// The counter every increment adds to (one counter for all keys).
    pub fn counter(&self) -> i64 {
        self.store.lock().unwrap().counter
    }

    /// Waits until `count` writes have arrived.
    pub async fn writes_arrived(&self, count: usize) {
        let mut arrived = self.arrived.subscribe();
        arrived.wait_for(|n| *n >= count).await.unwrap();
    }

    /// Serves the fake on a new loopback port; returns its address.
    pub async fn serve(self: &Arc<Fake>) -> SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        self.serve_on(listener).await
    }

    /// Serves the fake on `listener`; the Cluster service only when it plays a cluster of
    /// ranges (a plain fake is a server from before ranges: UNIMPLEMENTED).
    async fn serve_on(self: &Arc<Fake>, listener: tokio::net::TcpListener) -> SocketAddr {
        let addr = listener.local_addr().unwrap();
        let service = KvServer::new(Service(self.clone()));
        let cluster = self
            .is_ranged()
            .then(|| ranged::cluster_server(self.clone()));
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .add_service(coordination::lock_server(self.clone()))
                .add_service(coordination::idempotency_server(self.clone()))
                .add_optional_service(cluster)
                .serve_with_incoming(TcpIncoming::from(listener)),
        );
        addr
    }

    fn next_reply(&self) -> Option<Reply> {
        let scripted = self.replies.lock().unwrap().pop_front();
        scripted.or_else(|| self.fallback.lock().unwrap().clone())
    }

    fn record<R>(&self, method: &'static str, request: &Request<R>) {
        let port = request.local_addr().map(|addr| addr.port()).unwrap_or(0);
        self.calls.lock().unwrap().push((method, port));
    }

    /// A read of `key`: routed (in a cluster of ranges), then the scripted reply, or `ok`
    /// (its header says which node and range served it).
    async fn read<T: Headed, R>(
        &self,
        method: &'static str,
        request: &Request<R>,
        key: &[u8],
        mut ok: T,
    ) -> Result<Response<T>, Status> {
        self.record(method, request);
        self.hold_if_paused(method, request).await;
        let range = self
            .route(request, &[key])
            .map_err(|error| status(&error))?;
        self.stamp(&mut ok, request, range);
        match self.next_reply() {
            None | Some(Reply::Lose) => Ok(Response::new(ok)),
            Some(Reply::Gate(gate)) => {
                gate.notified().await;
                Ok(Response::new(ok))
            }
            Some(reply) => Err(refuse(reply).await),
        }
    }

    /// Sets who served `response`: the node that took `request`, and `range`.
    fn stamp<T: Headed, R>(&self, response: &mut T, request: &Request<R>, range: u64) {
        let node = self.node_of(request);
        if let Some(header) = response.header_mut() {
            header.served_by = node;
            header.range_id = range;
        }
    }

    /// A write of `ops`: recorded, routed (in a cluster of ranges: the first key picks the
    /// range, which must hold every key), then applied at most once per request id. Returns
    /// what was applied, whether it is a replay, and the range.
    async fn write<R>(
        &self,
        request: &Request<R>,
        write: Write,
        ops: Vec<Op>,
    ) -> Result<(Applied, bool, u64), Status> {
        self.record(write.method, request);
        self.hold_if_paused(write.method, request).await;
        let id = write
            .request_id
            .as_ref()
            .map(|id| (id.client_id, id.sequence));
        self.writes.lock().unwrap().push(write);
        let mut arrived = 0;
        self.arrived.send_modify(|n| {
            *n += 1;
            arrived = *n;
        });
        self.split_if_due(arrived);
        let keys: Vec<&[u8]> = ops.iter().map(Op::key).collect();
        let range = self.route(request, &keys).map_err(|error| status(&error))?;
        let (applied, replayed) = match self.next_reply() {
            None => self.apply(id, &ops),
            Some(Reply::Gate(gate)) => {
                gate.notified().await;
                self.apply(id, &ops)
            }
            Some(Reply::Lose) => {
                self.apply(id, &ops);
                return Err(Status::new(Code::Unknown, "response lost"));
            }
            Some(reply) => return Err(refuse(reply).await),
        };
        Ok((applied, replayed, range))
    }

    fn apply(&self, id: Option<(u64, u64)>, ops: &[Op]) -> (Applied, bool) {
        let mut store = self.store.lock().unwrap();
        if let Some(applied) = id.and_then(|id| store.records.get(&id)) {
            return (applied.clone(), true);
        }
        store.revision += 1;
        let mut counters = Vec::new();
        for op in ops {
            let counter = match op {
                Op::Put(key, value) => {
                    store.data.insert(key.clone(), value.clone());
                    None
                }
                Op::Delete(key) => {
                    store.data.remove(key);
                    None
                }
                Op::Increment(key, delta) => {
                    store.counter += delta;
                    let counter = store.counter;
                    store
                        .data
                        .insert(key.clone(), counter.to_string().into_bytes());
                    Some(counter)
                }
            };
            counters.push(counter);
        }
        let applied = Applied {
            revision: store.revision,
            counters,
        };
        if let Some(id) = id {
            store.records.insert(id, applied.clone());
        }
        (applied, false)
    }

    fn header(&self, revision: u64, replayed: bool) -> Option<v1::ResponseHeader> {
        Some(v1::ResponseHeader {
            revision,
            served_by: self.node_id,
            range_id: 1,
            term: 1,
            replayed,
        })
    }
}

/// The failing replies.
async fn refuse(reply: Reply) -> Status {
    match reply {
        Reply::Error(error) => status(&error),
        Reply::Unknown => Status::new(Code::Unknown, "no detail"),
        Reply::Hang => std::future::pending().await,
        Reply::Lose | Reply::Gate(_) => unreachable!("answered by the caller"),
    }
}

/// A status as a Keel server sends it: a code and the encoded `ErrorDetail`.
pub fn status(error: &KvError) -> Status {
    let code = match error {
        KvError::InvalidArgument { .. } => Code::InvalidArgument,
        KvError::NotLeader { .. }
        | KvError::ConditionFailed(_)
        | KvError::RequestIdExpired { .. }
        | KvError::NotACounter { .. }
        | KvError::Overflow { .. }
        | KvError::FencedOut { .. }
        | KvError::LockNotHeld { .. }
        | KvError::RecordNotOwned { .. }
        | KvError::KeyOutOfRange { .. }
        | KvError::EpochMismatch { .. } => Code::FailedPrecondition,
        KvError::Unavailable { .. } => Code::Unavailable,
        KvError::Overloaded { .. } => Code::ResourceExhausted,
        KvError::Timeout { .. } => Code::DeadlineExceeded,
        KvError::OutcomeUnknown { .. } => Code::Unknown,
        KvError::Fatal { .. } => Code::Internal,
        KvError::Unauthenticated { .. } => Code::Unauthenticated,
        KvError::PermissionDenied { .. } => Code::PermissionDenied,
        KvError::QuotaExceeded { .. } => Code::ResourceExhausted,
        KvError::FutureRevision { .. } | KvError::Compacted { .. } => Code::OutOfRange,
        KvError::LeaseNotFound { .. } => Code::NotFound,
    };
    let detail = v1::ErrorDetail::from(error).encode_to_vec();
    Status::with_details(code, error.to_string(), detail.into())
}

struct Service(Arc<Fake>);

#[tonic::async_trait]
impl Kv for Service {
    async fn get(
        &self,
        request: Request<v1::GetRequest>,
    ) -> Result<Response<v1::GetResponse>, Status> {
        let key = request.get_ref().key.clone();
        let kv = match self.0.is_ranged() {
            true => self.0.stored(&key),
            false => Some(v1::KeyValue {
                ttl_remaining_ms: (key == TTL_KEY).then_some(TTL_REMAINING_MS),
                expires_at_ms: None,
                key: key.clone(),
                value: b"value".to_vec(),
                create_revision: 3,
                mod_revision: 4,
                version: 2,
                lease: 0,
            }),
        };
        let response = v1::GetResponse {
            header: self.0.header(9, false),
            kv,
        };
        self.0.read("get", &request, &key, response).await
    }

    /// One event of the key: a put at revision 4 and clock `HISTORY_CLOCK_MS`, with the TTL
    /// reads of `TTL_KEY` report (counted from that clock).
    async fn history(
        &self,
        request: Request<v1::HistoryRequest>,
    ) -> Result<Response<v1::HistoryResponse>, Status> {
        let key = request.get_ref().key.clone();
        let event = v1::Event {
            revision: 4,
            key: key.clone(),
            kv: Some(v1::KeyValue {
                ttl_remaining_ms: Some(TTL_REMAINING_MS),
                expires_at_ms: Some(HISTORY_CLOCK_MS + TTL_REMAINING_MS),
                key: key.clone(),
                value: b"value".to_vec(),
                create_revision: 4,
                mod_revision: 4,
                version: 1,
                lease: 0,
            }),
            prev_kv: None,
            clock_ms: HISTORY_CLOCK_MS,
            ..v1::Event::default()
        };
        let response = v1::HistoryResponse {
            header: self.0.header(9, false),
            events: vec![event],
            compact_revision: 2,
            more: false,
            next_revision: 0,
        };
        self.0.read("history", &request, &key, response).await
    }

    type WatchStream = futures::stream::Empty<Result<v1::WatchResponse, Status>>;

    /// Not played: the client's watch is tested against real servers (tests/it/watch.rs).
    async fn watch(
        &self,
        _request: Request<v1::WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        Err(Status::unimplemented("the fake serves no watch"))
    }

    async fn watch_progress(
        &self,
        _request: Request<v1::WatchProgressRequest>,
    ) -> Result<Response<v1::WatchProgressResponse>, Status> {
        Err(Status::unimplemented("the fake serves no watch"))
    }

    async fn txn(
        &self,
        _request: Request<v1::TxnRequest>,
    ) -> Result<Response<v1::TxnResponse>, Status> {
        Err(Status::unimplemented("keel-client sends no transaction"))
    }

    async fn lease(
        &self,
        _request: Request<v1::LeaseRequest>,
    ) -> Result<Response<v1::LeaseResponse>, Status> {
        Err(Status::unimplemented("keel-client sends no lease call"))
    }

    async fn put(
        &self,
        request: Request<v1::PutRequest>,
    ) -> Result<Response<v1::PutResponse>, Status> {
        let body = request.get_ref();
        let write = Write {
            method: "put",
            request_id: body.request_id,
            ttl_ms: body.ttl_ms,
            fence: body.fence.clone(),
        };
        let ops = vec![Op::Put(body.key.clone(), body.value.clone())];
        let (applied, replayed, range) = self.0.write(&request, write, ops).await?;
        let mut response = v1::PutResponse {
            header: self.0.header(applied.revision, replayed),
            previous: None,
        };
        self.0.stamp(&mut response, &request, range);
        Ok(Response::new(response))
    }

    async fn delete(
        &self,
        request: Request<v1::DeleteRequest>,
    ) -> Result<Response<v1::DeleteResponse>, Status> {
        let body = request.get_ref();
        let write = Write {
            method: "delete",
            request_id: body.request_id,
            ttl_ms: None,
            fence: body.fence.clone(),
        };
        let ops = vec![Op::Delete(body.key.clone())];
        let (applied, replayed, range) = self.0.write(&request, write, ops).await?;
        let mut response = v1::DeleteResponse {
            header: self.0.header(applied.revision, replayed),
            deleted: true,
            previous: None,
        };
        self.0.stamp(&mut response, &request, range);
        Ok(Response::new(response))
    }

    async fn scan(
        &self,
        request: Request<v1::ScanRequest>,
    ) -> Result<Response<v1::ScanResponse>, Status> {
        let start = request.get_ref().start.clone();
        let (kvs, next_start) = self.0.scan_rows(request.get_ref());
        let response = v1::ScanResponse {
            header: self.0.header(9, false),
            kvs,
            more: next_start.is_some(),
            next_start: next_start.unwrap_or_default(),
        };
        self.0.read("scan", &request, &start, response).await
    }

    async fn batch(
        &self,
        request: Request<v1::BatchRequest>,
    ) -> Result<Response<v1::BatchResponse>, Status> {
        let body = request.get_ref();
        let ops = body.ops.iter().map(op).collect();
        let write = Write {
            method: "batch",
            request_id: body.request_id,
            ttl_ms: body.ops.iter().find_map(put_ttl_ms),
            fence: body.fence.clone(),
        };
        let (applied, replayed, range) = self.0.write(&request, write, ops).await?;
        let results = applied
            .counters
            .iter()
            .map(|counter| v1::BatchOpResult {
                counter: *counter,
                ..Default::default()
            })
            .collect();
        let mut response = v1::BatchResponse {
            header: self.0.header(applied.revision, replayed),
            results,
        };
        self.0.stamp(&mut response, &request, range);
        Ok(Response::new(response))
    }

    async fn increment(
        &self,
        request: Request<v1::IncrementRequest>,
    ) -> Result<Response<v1::IncrementResponse>, Status> {
        let body = request.get_ref();
        let write = Write {
            method: "increment",
            request_id: body.request_id,
            ttl_ms: None,
            fence: None,
        };
        let ops = vec![Op::Increment(body.key.clone(), body.delta)];
        let (applied, replayed, range) = self.0.write(&request, write, ops).await?;
        let mut response = v1::IncrementResponse {
            header: self.0.header(applied.revision, replayed),
            value: applied.counters[0].unwrap(),
        };
        self.0.stamp(&mut response, &request, range);
        Ok(Response::new(response))
    }

    async fn open_session(
        &self,
        request: Request<v1::OpenSessionRequest>,
    ) -> Result<Response<v1::OpenSessionResponse>, Status> {
        self.0.hold_if_paused("open_session", &request).await;
        let mut opened = self.0.sessions_opened.lock().unwrap();
        *opened += 1;
        Ok(Response::new(v1::OpenSessionResponse {
            client_id: *opened,
            client_started_ms: 1_000 * *opened,
        }))
    }
}

fn op(op: &v1::BatchOp) -> Op {
    match &op.op {
        Some(v1::batch_op::Op::Put(put)) => Op::Put(put.key.clone(), put.value.clone()),
        Some(v1::batch_op::Op::Delete(delete)) => Op::Delete(delete.key.clone()),
        Some(v1::batch_op::Op::Increment(increment)) => {
            Op::Increment(increment.key.clone(), increment.delta)
        }
        None => panic!("a batch op without an op"),
    }
}

fn put_ttl_ms(op: &v1::BatchOp) -> Option<i64> {
    match &op.op {
        Some(v1::batch_op::Op::Put(put)) => put.ttl_ms,
        _ => None,
    }
}
