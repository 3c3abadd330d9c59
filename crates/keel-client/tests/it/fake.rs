//! A scripted, in-process Kv server: answers each call with the next scripted reply (or
//! success once the script is empty) and records which listener got which call.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use keel_proto::v1;
use keel_proto::v1::kv_server::{Kv, KvServer};
use keel_types::KvError;
use prost::Message;
use tonic::transport::server::TcpIncoming;
use tonic::{Code, Request, Response, Status};

/// What the fake does with one call.
pub enum Reply {
    Error(KvError),
    /// Never answers.
    Hang,
}

pub struct Fake {
    node_id: u64,
    replies: Mutex<VecDeque<Reply>>,
    /// (method, port of the listener that took the call), in arrival order.
    calls: Mutex<Vec<(&'static str, u16)>>,
}

impl Fake {
    pub fn new(node_id: u64, replies: Vec<Reply>) -> Arc<Fake> {
        Arc::new(Fake {
            node_id,
            replies: Mutex::new(replies.into()),
            calls: Mutex::new(Vec::new()),
        })
    }

    /// Adds a reply to the end of the script.
    pub fn replies_push(&self, reply: Reply) {
        self.replies.lock().unwrap().push_back(reply);
    }

    pub fn calls(&self) -> Vec<(&'static str, u16)> {
        self.calls.lock().unwrap().clone()
    }

    /// Serves the fake on a new loopback port; returns its address.
    pub async fn serve(self: &Arc<Fake>) -> SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let service = KvServer::new(Service(self.clone()));
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(TcpIncoming::from(listener)),
        );
        addr
    }

    async fn answer<T, R>(
        &self,
        method: &'static str,
        request: &Request<R>,
        ok: T,
    ) -> Result<Response<T>, Status> {
        let port = request.local_addr().map(|addr| addr.port()).unwrap_or(0);
        self.calls.lock().unwrap().push((method, port));
        let reply = self.replies.lock().unwrap().pop_front();
        match reply {
            None => Ok(Response::new(ok)),
            Some(Reply::Error(error)) => Err(status(&error)),
            Some(Reply::Hang) => std::future::pending().await,
        }
    }

    fn header(&self, revision: u64) -> Option<v1::ResponseHeader> {
        Some(v1::ResponseHeader {
            revision,
            served_by: self.node_id,
            range_id: 1,
            term: 1,
        })
    }
}

/// A status as a Keel server sends it: a code and the encoded `ErrorDetail`.
pub fn status(error: &KvError) -> Status {
    let code = match error {
        KvError::InvalidArgument { .. } => Code::InvalidArgument,
        KvError::NotLeader { .. } | KvError::ConditionFailed(_) => Code::FailedPrecondition,
        KvError::Unavailable { .. } => Code::Unavailable,
        KvError::Timeout { .. } => Code::DeadlineExceeded,
        KvError::OutcomeUnknown { .. } => Code::Unknown,
        KvError::Fatal { .. } => Code::Internal,
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
        let kv = v1::KeyValue {
            key: request.get_ref().key.clone(),
            value: b"value".to_vec(),
            create_revision: 3,
            mod_revision: 4,
        };
        let response = v1::GetResponse {
            header: self.0.header(9),
            kv: Some(kv),
        };
        self.0.answer("get", &request, response).await
    }

    async fn put(
        &self,
        request: Request<v1::PutRequest>,
    ) -> Result<Response<v1::PutResponse>, Status> {
        let response = v1::PutResponse {
            header: self.0.header(10),
            previous: None,
        };
        self.0.answer("put", &request, response).await
    }

    async fn delete(
        &self,
        request: Request<v1::DeleteRequest>,
    ) -> Result<Response<v1::DeleteResponse>, Status> {
        let response = v1::DeleteResponse {
            header: self.0.header(11),
            deleted: true,
            previous: None,
        };
        self.0.answer("delete", &request, response).await
    }

    async fn scan(
        &self,
        request: Request<v1::ScanRequest>,
    ) -> Result<Response<v1::ScanResponse>, Status> {
        let response = v1::ScanResponse {
            header: self.0.header(9),
            kvs: Vec::new(),
            more: false,
            next_start: Vec::new(),
        };
        self.0.answer("scan", &request, response).await
    }

    async fn batch(
        &self,
        request: Request<v1::BatchRequest>,
    ) -> Result<Response<v1::BatchResponse>, Status> {
        let results = vec![v1::BatchOpResult::default(); request.get_ref().ops.len()];
        let response = v1::BatchResponse {
            header: self.0.header(12),
            results,
        };
        self.0.answer("batch", &request, response).await
    }
}
