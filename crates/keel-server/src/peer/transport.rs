//! The gRPC `Transport`: carries Raft messages to a peer's `keel.raft.v1.Raft` service over
//! the shared per-peer channel, with a deadline per message: on the node pair's batch stream
//! (`batch`), or as a call of its own when the message is large or the peer has no stream.
//! Snapshots stream on calls of their own. Knows nothing of openraft's types.

use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use keel_proto::raft::raft_client::RaftClient;
use keel_proto::raft::{RaftRequest, SnapshotChunk};
use keel_raft::{Peer, RaftMessage, RpcKind, SnapshotReader, Transport, TransportError};
use keel_storage::SnapshotFile;
use keel_types::NodeId;
use tracing::warn;

use crate::peer::batch::{Lane, Links};
use crate::peer::call::{Failure, To, call};
use crate::peer::channels::Peers;
use crate::status::never_sent;

/// Raft traffic over gRPC; one per node, shared by all its groups.
pub(crate) struct GrpcTransport {
    peers: Arc<Peers>,
    links: Links,
}

impl GrpcTransport {
    /// The transport of node `from`.
    pub fn new(peers: Arc<Peers>, from: NodeId) -> GrpcTransport {
        GrpcTransport {
            links: Links::new(peers.clone(), from, Lane::Raft),
            peers,
        }
    }

    /// `message` as a call of its own.
    async fn call_alone(
        &self,
        target: &Peer,
        kind: RpcKind,
        message: RaftMessage,
        deadline: Duration,
    ) -> Result<Vec<u8>, TransportError> {
        let mut request = tonic::Request::new(RaftRequest {
            range_id: message.range.0,
            from: message.from,
            payload: message.payload,
        });
        request.set_timeout(deadline);
        let to = To::Node(target.id, &target.addr);
        let reply = call(
            &self.peers,
            to,
            deadline,
            |mut client: RaftClient<_>| async move {
                match kind {
                    RpcKind::AppendEntries => client.append_entries(request).await,
                    RpcKind::Vote => client.vote(request).await,
                    RpcKind::PreVote => client.pre_vote(request).await,
                    RpcKind::TransferLeader => client.transfer_leader(request).await,
                    RpcKind::ReadIndex => client.read_index(request).await,
                }
            },
        );
        let reply = reply
            .await
            .map_err(|error| transport_error(target.id, error.failure))?;
        Ok(reply.into_inner().payload)
    }
}

impl Transport for GrpcTransport {
    async fn call(
        &self,
        target: &Peer,
        kind: RpcKind,
        message: RaftMessage,
        deadline: Duration,
    ) -> Result<Vec<u8>, TransportError> {
        if !self.links.streams_to(target, message.payload.len()) {
            return self.call_alone(target, kind, message, deadline).await;
        }
        let reply = self.links.call(target, kind, message, deadline).await;
        reply.map_err(|failure| transport_error(target.id, failure))
    }

    async fn send_snapshot(
        &self,
        target: &Peer,
        message: RaftMessage,
        snapshot: SnapshotFile,
        deadline: Duration,
    ) -> Result<Vec<u8>, TransportError> {
        let reader = SnapshotReader::open(&snapshot)
            .await
            .map_err(|e| TransportError::Remote {
                target: target.id,
                message: format!("opening snapshot {}: {e}", snapshot.path().display()),
            })?;
        let mut request = tonic::Request::new(snapshot_chunks(message, reader));
        request.set_timeout(deadline);
        let to = To::Node(target.id, &target.addr);
        let install =
            |mut client: RaftClient<_>| async move { client.install_snapshot(request).await };
        let reply = call(&self.peers, to, deadline, install).await;
        let reply = reply.map_err(|error| transport_error(target.id, error.failure))?;
        Ok(reply.into_inner().payload)
    }
}

/// The snapshot as a stream of chunks: the header rides on the first, `done` on the last.
/// One chunk is read from disk at a time, as the stream is polled. A read error ends the
/// stream without `done`, which the receiver rejects.
fn snapshot_chunks(
    message: RaftMessage,
    reader: SnapshotReader,
) -> impl Stream<Item = SnapshotChunk> + Send + 'static {
    let state = (reader, Some(message.payload), false);
    futures::stream::unfold(state, move |(mut reader, header, finished)| async move {
        if finished {
            return None;
        }
        let (data, done) = match reader.next_chunk().await {
            Ok(Some(data)) => (data, false),
            Ok(None) => (Vec::new(), true),
            Err(error) => {
                warn!(range_id = message.range.0, %error, "reading snapshot to send");
                return None;
            }
        };
        if data.is_empty() && !done {
            return None;
        }
        let chunk = SnapshotChunk {
            range_id: message.range.0,
            from: message.from,
            header: header.unwrap_or_default(),
            data,
            done,
        };
        Some((chunk, (reader, None, done)))
    })
}

/// A failed call as openraft's transport sees it.
fn transport_error(target: u64, failure: Failure) -> TransportError {
    match failure {
        Failure::NoChannel(message) => TransportError::Unreachable { target, message },
        Failure::Timeout(deadline) => TransportError::Timeout { target, deadline },
        Failure::Status(status) if never_sent(&status) => TransportError::Unreachable {
            target,
            message: status.message().to_string(),
        },
        Failure::Status(status) => TransportError::Remote {
            target,
            message: format!("{:?}: {}", status.code(), status.message()),
        },
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;
    use keel_storage::Store;
    use keel_types::{RangeId, limits};

    use super::*;

    /// A file of 2.5 chunks goes out as 3 data chunks and an empty `done` chunk; only the first
    /// carries the header.
    #[tokio::test]
    async fn snapshots_stream_in_bounded_chunks() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("keel.redb"), dir.path()).unwrap();
        let mut incoming = store.incoming_snapshot(RangeId::FIRST).await.unwrap();
        let bytes = limits::SNAPSHOT_CHUNK_BYTES * 5 / 2;
        incoming.write_chunk(&vec![7u8; bytes]).await.unwrap();
        let file = incoming.finish().await.unwrap();

        let message = RaftMessage {
            range: RangeId::FIRST,
            from: 1,
            payload: b"header".to_vec(),
        };
        let reader = SnapshotReader::open(&file).await.unwrap();
        let chunks: Vec<SnapshotChunk> = snapshot_chunks(message, reader).collect().await;
        let sizes: Vec<usize> = chunks.iter().map(|c| c.data.len()).collect();
        let full = limits::SNAPSHOT_CHUNK_BYTES;
        assert_eq!(sizes, vec![full, full, full / 2, 0]);
        let headers: Vec<&[u8]> = chunks.iter().map(|c| c.header.as_slice()).collect();
        assert_eq!(headers, vec![&b"header"[..], b"", b"", b""]);
        let done: Vec<bool> = chunks.iter().map(|c| c.done).collect();
        assert_eq!(done, vec![false, false, false, true]);
        assert!(chunks.iter().all(|c| c.range_id == 1 && c.from == 1));
        store.shutdown();
    }
}
