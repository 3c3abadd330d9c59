//! The gRPC `Transport`: carries Raft messages to a peer's `keel.raft.v1.Raft` service over
//! the shared per-peer channel, with a deadline per call. Knows nothing of openraft's types.

use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use keel_proto::raft::raft_client::RaftClient;
use keel_proto::raft::{RaftRequest, SnapshotChunk};
use keel_raft::{Peer, RaftMessage, RpcKind, SnapshotReader, Transport, TransportError};
use keel_storage::SnapshotFile;
use keel_types::limits;
use tonic::Status;
use tonic::transport::Channel;
use tracing::warn;

use crate::peer::channels::Peers;
use crate::status::never_sent;

/// Raft traffic over gRPC; one per node, shared by all its groups.
pub(crate) struct GrpcTransport {
    peers: Arc<Peers>,
}

impl GrpcTransport {
    pub fn new(peers: Arc<Peers>) -> GrpcTransport {
        GrpcTransport { peers }
    }

    fn client(&self, target: &Peer) -> Result<RaftClient<Channel>, TransportError> {
        let channel = self
            .peers
            .channel(target.id, &target.addr.addr)
            .map_err(|e| TransportError::Unreachable {
                target: target.id,
                message: e.to_string(),
            })?;
        Ok(RaftClient::new(channel)
            .max_decoding_message_size(limits::GRPC_MESSAGE_BYTES_MAX)
            .max_encoding_message_size(limits::GRPC_MESSAGE_BYTES_MAX))
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
        let mut client = self.client(target)?;
        let mut request = tonic::Request::new(RaftRequest {
            range_id: message.range.0,
            from: message.from,
            payload: message.payload,
        });
        request.set_timeout(deadline);
        let reply = async move {
            match kind {
                RpcKind::AppendEntries => client.append_entries(request).await,
                RpcKind::Vote => client.vote(request).await,
                RpcKind::PreVote => client.pre_vote(request).await,
                RpcKind::TransferLeader => client.transfer_leader(request).await,
            }
        };
        match tokio::time::timeout(deadline, reply).await {
            Err(_) => Err(TransportError::Timeout {
                target: target.id,
                deadline,
            }),
            Ok(Ok(reply)) => Ok(reply.into_inner().payload),
            Ok(Err(status)) => Err(transport_error(target.id, &status)),
        }
    }

    async fn send_snapshot(
        &self,
        target: &Peer,
        message: RaftMessage,
        snapshot: SnapshotFile,
        deadline: Duration,
    ) -> Result<Vec<u8>, TransportError> {
        let mut client = self.client(target)?;
        let reader = SnapshotReader::open(&snapshot)
            .await
            .map_err(|e| TransportError::Remote {
                target: target.id,
                message: format!("opening snapshot {}: {e}", snapshot.path().display()),
            })?;
        let mut request = tonic::Request::new(snapshot_chunks(message, reader));
        request.set_timeout(deadline);
        match tokio::time::timeout(deadline, client.install_snapshot(request)).await {
            Err(_) => Err(TransportError::Timeout {
                target: target.id,
                deadline,
            }),
            Ok(Ok(reply)) => Ok(reply.into_inner().payload),
            Ok(Err(status)) => Err(transport_error(target.id, &status)),
        }
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

fn transport_error(target: u64, status: &Status) -> TransportError {
    if never_sent(status) {
        TransportError::Unreachable {
            target,
            message: status.message().to_string(),
        }
    } else {
        TransportError::Remote {
            target,
            message: format!("{:?}: {}", status.code(), status.message()),
        }
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;
    use keel_storage::Store;
    use keel_types::RangeId;

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
