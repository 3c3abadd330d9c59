//! etcd's `KV` service on Keel: each call is translated (`convert`) and made on this node's
//! `keel.v1.Kv` service in-process, with the caller's metadata, so routing, forwarding to the
//! leader, admission, tenancy and errors are Keel's own. A put is a Keel put; a delete, a
//! transaction and every read inside one are a Keel transaction on the range holding the
//! etcd namespace, whose revision is etcd's. A range read pages through the namespace with
//! Keel scans, every page after the first at the first one's revision, and sorts, filters
//! and cuts what it read as a transaction's read would (`keel_types::txn::Selection`).

use keel_proto::etcd::etcdserverpb::kv_server::Kv as EtcdKvApi;
use keel_proto::etcd::etcdserverpb::response_op::Response as Op;
use keel_proto::etcd::etcdserverpb::{
    CompactionRequest, CompactionResponse, DeleteRangeRequest, DeleteRangeResponse, PutRequest,
    PutResponse, RangeRequest, RangeResponse, ResponseHeader, TxnRequest, TxnResponse,
};
use keel_proto::v1::kv_server::Kv;
use keel_proto::v1::{self, Consistency, GetRequest, ScanRequest};
use keel_types::limits;
use keel_types::txn::Selection;
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status};

use keel_proto::convert as wire;

use super::convert;
use crate::api::kv::KvService;

pub(crate) struct EtcdKv {
    kv: KvService,
    node_id: u64,
}

impl EtcdKv {
    pub fn new(kv: KvService, node_id: u64) -> EtcdKv {
        EtcdKv { kv, node_id }
    }

    /// The etcd header of an answer Keel gave with `header`.
    fn header(&self, header: Option<v1::ResponseHeader>) -> ResponseHeader {
        let header = header.unwrap_or_default();
        convert::header(self.node_id, header.revision, header.term)
    }

    /// Runs `txn` as a Keel transaction for a caller with `metadata`.
    async fn transact(
        &self,
        metadata: &MetadataMap,
        txn: v1::Txn,
    ) -> Result<(ResponseHeader, v1::TxnResult), Status> {
        let request = v1::TxnRequest {
            txn: Some(txn),
            request_id: None,
            no_forward: false,
        };
        let answer = self.kv.txn(keel_request(metadata, request)).await;
        let answer = answer.map_err(convert::status)?.into_inner();
        Ok((
            self.header(answer.header),
            answer.result.unwrap_or_default(),
        ))
    }

    /// Runs `op` alone as a Keel transaction; etcd's answer to it.
    async fn transact_one(&self, metadata: &MetadataMap, op: v1::txn_op::Op) -> Result<Op, Status> {
        let txn = v1::Txn {
            success: vec![v1::TxnOp { op: Some(op) }],
            ..v1::Txn::default()
        };
        let (header, result) = self.transact(metadata, txn).await?;
        let answer = convert::responses(result, &header).pop();
        answer
            .and_then(|answer| answer.response)
            .ok_or_else(|| Status::internal("a transaction of one op answered none"))
    }

    /// Reads the span of `request` a scan page at a time, all at one revision.
    async fn scan(
        &self,
        metadata: &MetadataMap,
        request: &RangeRequest,
        read: &v1::TxnRead,
    ) -> Result<RangeResponse, Status> {
        let query = wire::txn::txn_read(read.clone()).map_err(|e| convert::kv_status(&e))?;
        let mut selection = Selection::new(&query);
        let span = read.span.clone().unwrap_or_default();
        let mut page = ScanRequest {
            start: span.key,
            end: span.end.unwrap_or_default(),
            limit: limits::SCAN_LIMIT_MAX,
            consistency: consistency(request) as i32,
            revision: positive(request.revision),
            ..ScanRequest::default()
        };
        let mut first: Option<v1::ResponseHeader> = None;
        for _ in 0..limits::ETCD_RANGE_PAGES_MAX {
            let answer = self.kv.scan(keel_request(metadata, page.clone())).await;
            let answer = answer.map_err(convert::status)?.into_inner();
            let header = answer.header.unwrap_or_default();
            match &first {
                None => first = Some(header),
                Some(first) if first.range_id != header.range_id => {
                    return Err(split_namespace());
                }
                Some(_) => {}
            }
            selection.push(answer.kvs.into_iter().map(keel_types::KeyValue::from));
            if selection.bytes() > limits::GRPC_MESSAGE_BYTES_MAX {
                return Err(Status::resource_exhausted(format!(
                    "etcdserver: the range returns more than {}; ask for fewer keys with limit",
                    limits::human_bytes(limits::GRPC_MESSAGE_BYTES_MAX)
                )));
            }
            if !answer.more {
                let result = selection.finish();
                return Ok(convert::range_response(self.header(first), result));
            }
            // Every later page reads the state the first one did.
            page.start = answer.next_start;
            page.revision = first.as_ref().map(|header| header.revision);
            page.consistency = Consistency::Follower as i32;
        }
        Err(Status::resource_exhausted(format!(
            "etcdserver: the range covers more than {} keys; ask for a smaller one",
            limits::ETCD_RANGE_PAGES_MAX * limits::SCAN_LIMIT_MAX as usize
        )))
    }
}

#[tonic::async_trait]
impl EtcdKvApi for EtcdKv {
    async fn range(
        &self,
        request: Request<RangeRequest>,
    ) -> Result<Response<RangeResponse>, Status> {
        let (metadata, _, request) = request.into_parts();
        let read = convert::read(&request)?;
        let single = read.span.as_ref().is_some_and(|span| span.end.is_none());
        if !single {
            return self
                .scan(&metadata, &request, &read)
                .await
                .map(Response::new);
        }
        let get = GetRequest {
            key: read.span.clone().unwrap_or_default().key,
            consistency: consistency(&request) as i32,
            revision: positive(request.revision),
            ..GetRequest::default()
        };
        let answer = self.kv.get(keel_request(&metadata, get)).await;
        let answer = answer.map_err(convert::status)?.into_inner();
        let query = wire::txn::txn_read(read).map_err(|e| convert::kv_status(&e))?;
        let result = query.select(
            answer
                .kv
                .into_iter()
                .map(keel_types::KeyValue::from)
                .collect(),
        );
        Ok(Response::new(convert::range_response(
            self.header(answer.header),
            result,
        )))
    }

    /// A Keel put, or a transaction of one put when it names a lease or keeps the key's
    /// value or lease (Keel's put knows none of them; a put without a lease detaches).
    async fn put(&self, request: Request<PutRequest>) -> Result<Response<PutResponse>, Status> {
        let (metadata, _, request) = request.into_parts();
        let put = convert::put(&request)?;
        if put.lease != 0 || put.ignore_value || put.ignore_lease {
            return match self
                .transact_one(&metadata, v1::txn_op::Op::Put(put))
                .await?
            {
                Op::ResponsePut(put) => Ok(Response::new(put)),
                _ => Err(Status::internal("a put's transaction answered no put")),
            };
        }
        let keel = v1::PutRequest {
            key: put.key,
            value: put.value,
            return_previous: put.return_previous,
            ..v1::PutRequest::default()
        };
        let answer = self.kv.put(keel_request(&metadata, keel)).await;
        let answer = answer.map_err(convert::status)?.into_inner();
        Ok(Response::new(PutResponse {
            header: Some(self.header(answer.header)),
            prev_kv: answer.previous.map(convert::key_value),
        }))
    }

    async fn delete_range(
        &self,
        request: Request<DeleteRangeRequest>,
    ) -> Result<Response<DeleteRangeResponse>, Status> {
        let (metadata, _, request) = request.into_parts();
        let op = v1::txn_op::Op::Delete(convert::delete(&request)?);
        match self.transact_one(&metadata, op).await? {
            Op::ResponseDeleteRange(deleted) => Ok(Response::new(deleted)),
            _ => Err(Status::internal(
                "a delete's transaction answered no delete",
            )),
        }
    }

    async fn txn(&self, request: Request<TxnRequest>) -> Result<Response<TxnResponse>, Status> {
        let (metadata, _, request) = request.into_parts();
        let txn = convert::txn(&request)?;
        let (header, result) = self.transact(&metadata, txn).await?;
        Ok(Response::new(TxnResponse {
            header: Some(header),
            succeeded: result.succeeded,
            responses: convert::responses(result, &header),
        }))
    }

    /// Keel keeps history by retention (`--history-retention-ms`, `--history-retention-bytes`)
    /// and compacts it by itself: a compaction is accepted for any revision the namespace has
    /// reached and changes nothing.
    async fn compact(
        &self,
        request: Request<CompactionRequest>,
    ) -> Result<Response<CompactionResponse>, Status> {
        let (metadata, _, request) = request.into_parts();
        let get = GetRequest {
            key: convert::key(b"\0"),
            ..GetRequest::default()
        };
        let answer = self.kv.get(keel_request(&metadata, get)).await;
        let answer = answer.map_err(convert::status)?.into_inner();
        let header = self.header(answer.header);
        if request.revision > header.revision {
            return Err(Status::out_of_range(
                "etcdserver: mvcc: required revision is a future revision",
            ));
        }
        Ok(Response::new(CompactionResponse {
            header: Some(header),
        }))
    }
}

/// A Keel request carrying the etcd caller's metadata (its credentials).
fn keel_request<T>(metadata: &MetadataMap, message: T) -> Request<T> {
    let mut request = Request::new(message);
    *request.metadata_mut() = metadata.clone();
    request
}

/// Serializable reads are Keel's follower reads; the rest are linearizable.
fn consistency(request: &RangeRequest) -> Consistency {
    match request.serializable {
        true => Consistency::Follower,
        false => Consistency::Linearizable,
    }
}

/// etcd's revision to read at: 0 (or less) is the current one.
fn positive(revision: i64) -> Option<u64> {
    u64::try_from(revision)
        .ok()
        .filter(|revision| *revision > 0)
}

fn split_namespace() -> Status {
    Status::failed_precondition(
        "etcdserver: the etcd namespace spans more than one Keel range; keep it in one (see docs/ETCD.md)",
    )
}
