//! The network seam between Raft groups on different nodes. A `Transport` moves opaque,
//! already-encoded Raft messages to a peer and brings back its reply bytes; tests inject
//! their own. Knows nothing of openraft's types, tonic or gRPC.

use std::future::Future;
use std::time::Duration;

use keel_storage::SnapshotFile;
use keel_types::{NodeAddr, NodeId, RangeId};
use thiserror::Error;

/// The Raft calls a group makes to a peer, besides snapshots.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RpcKind {
    AppendEntries,
    Vote,
    PreVote,
    TransferLeader,
    /// A follower asks the leader for a read index (`read_index.rs`).
    ReadIndex,
}

impl RpcKind {
    pub fn name(self) -> &'static str {
        match self {
            RpcKind::AppendEntries => "append_entries",
            RpcKind::Vote => "vote",
            RpcKind::PreVote => "pre_vote",
            RpcKind::TransferLeader => "transfer_leader",
            RpcKind::ReadIndex => "read_index",
        }
    }
}

/// A node a message goes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    pub id: NodeId,
    pub addr: NodeAddr,
}

/// One Raft message: the range it belongs to, the sending node and the encoded request (for a
/// snapshot: the encoded header).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RaftMessage {
    pub range: RangeId,
    pub from: NodeId,
    pub payload: Vec<u8>,
}

/// Why a message did not get a reply.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum TransportError {
    /// No connection could be made (refused, no route, DNS failure): nothing was delivered.
    #[error("node {target} is unreachable: {message}")]
    Unreachable { target: NodeId, message: String },
    /// The deadline passed before the reply arrived; the message may have been delivered.
    #[error("no reply from node {target} within {deadline:?}")]
    Timeout { target: NodeId, deadline: Duration },
    /// The peer answered with an error (unknown range, malformed message, stopped node) or the
    /// connection broke mid-call.
    #[error("node {target} answered with an error: {message}")]
    Remote { target: NodeId, message: String },
}

/// Carries Raft messages to peers. Implementations must honour `deadline` and be cheap to
/// call concurrently from every group of the node (share connections per peer).
pub trait Transport: Send + Sync + 'static {
    /// Sends one request and returns the peer's reply bytes.
    fn call(
        &self,
        target: &Peer,
        kind: RpcKind,
        message: RaftMessage,
        deadline: Duration,
    ) -> impl Future<Output = Result<Vec<u8>, TransportError>> + Send;

    /// Streams a snapshot: `message.payload` is the encoded header, then the file's bytes in
    /// chunks of at most `limits::SNAPSHOT_CHUNK_BYTES` (read them with `SnapshotReader`, so
    /// memory stays bounded). Returns the peer's reply bytes.
    fn send_snapshot(
        &self,
        target: &Peer,
        message: RaftMessage,
        snapshot: SnapshotFile,
        deadline: Duration,
    ) -> impl Future<Output = Result<Vec<u8>, TransportError>> + Send;
}
