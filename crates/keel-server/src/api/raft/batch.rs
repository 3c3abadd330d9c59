//! The receiving end of the node-pair streams `Raft.Batch` (the Raft messages of every range
//! from one peer) and `Raft.Forward` (the client requests a peer sends on to a leader here).
//! Each request is served as a call of its own would be (`Groups::handle`, or
//! `forwarded::Services::serve`), many at once, up to `limits::RAFT_BATCH_IN_FLIGHT_MAX`
//! (no more of the stream is read until some are answered); replies go back as they are
//! ready, those ready together in one batch. The stream ends when the peer ends its side, breaks it, or
//! this node shuts down (the requests already taken are answered first).

use std::future::Future;
use std::pin::Pin;

use futures::stream::FuturesUnordered;
use futures::{FutureExt, Stream, StreamExt};
use keel_proto::raft::{BatchedReply, BatchedRequest, RaftBatch, RaftBatchReply};
use keel_raft::Groups;
use keel_types::{RangeId, limits};
use tokio::sync::mpsc;
use tonic::{Code, Status, Streaming};
use tracing::debug;

use super::inbound_status;
use crate::peer::batch::rpc_kind;

/// Reply batches ready to go, not yet taken by the connection.
const REPLY_BATCHES_QUEUED: usize = 64;

/// The replies of a batch stream.
pub(crate) type Replies = Pin<Box<dyn Stream<Item = Result<RaftBatchReply, Status>> + Send>>;

/// Serves the requests of `incoming` with `serve_one` until it ends or `closing` resolves.
pub(crate) fn serve<S, Fut>(
    serve_one: S,
    incoming: Streaming<RaftBatch>,
    closing: impl Future<Output = ()> + Send + 'static,
) -> Replies
where
    S: Fn(BatchedRequest) -> Fut + Send + 'static,
    Fut: Future<Output = BatchedReply> + Send + 'static,
{
    let (ready, replies) = mpsc::channel(REPLY_BATCHES_QUEUED);
    tokio::spawn(answer(serve_one, incoming, closing, ready));
    Box::pin(futures::stream::unfold(replies, |mut replies| async move {
        let batch = replies.recv().await?;
        Some((Ok(batch), replies))
    }))
}

async fn answer<S, Fut>(
    serve_one: S,
    mut incoming: Streaming<RaftBatch>,
    closing: impl Future<Output = ()> + Send,
    ready: mpsc::Sender<RaftBatchReply>,
) where
    S: Fn(BatchedRequest) -> Fut,
    Fut: Future<Output = BatchedReply>,
{
    let mut running = FuturesUnordered::new();
    let mut reading = true;
    let mut from = None;
    tokio::pin!(closing);
    loop {
        let room = running.len() < limits::RAFT_BATCH_IN_FLIGHT_MAX;
        tokio::select! {
            () = &mut closing, if reading => reading = false,
            next = incoming.message(), if reading && room => match next {
                Ok(Some(batch)) => {
                    from = Some(batch.from);
                    running.extend(batch.requests.into_iter().map(&serve_one));
                }
                Ok(None) => reading = false,
                Err(status) => {
                    debug!(?from, %status, "Raft batch stream from a peer broke");
                    reading = false;
                }
            },
            Some(first) = running.next() => {
                let mut replies = vec![first];
                while let Some(Some(reply)) = running.next().now_or_never() {
                    replies.push(reply);
                }
                if ready.send(RaftBatchReply { replies }).await.is_err() {
                    return;
                }
            }
            else => return,
        }
    }
}

/// One Raft message, served as `Raft.<kind>` would serve it.
pub(crate) fn serve_raft(
    groups: &Groups,
    request: BatchedRequest,
) -> impl Future<Output = BatchedReply> + use<> {
    let groups = groups.clone();
    async move {
        let id = request.id;
        let served = match rpc_kind(request.kind) {
            None => Err(Status::invalid_argument(format!(
                "batched Raft request {id} has no known kind ({})",
                request.kind
            ))),
            Some(kind) => groups
                .handle(RangeId(request.range_id), kind, &request.payload)
                .await
                .map_err(|e| inbound_status(&e)),
        };
        reply(id, served)
    }
}

/// The reply to request `id`: its payload, or the status it was refused with.
pub(crate) fn reply(id: u64, served: Result<Vec<u8>, Status>) -> BatchedReply {
    match served {
        Ok(payload) => BatchedReply {
            id,
            code: Code::Ok as i32,
            payload,
            message: String::new(),
            details: Vec::new(),
        },
        Err(status) => BatchedReply {
            id,
            code: status.code() as i32,
            payload: Vec::new(),
            message: status.message().to_string(),
            details: status.details().to_vec(),
        },
    }
}
