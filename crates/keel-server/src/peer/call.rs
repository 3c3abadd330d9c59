//! Calling one internal `keel.raft.v1.Raft` RPC of a peer that takes a `NodeMessage`: encode
//! the payload, send it within a deadline, decode the reply's payload, and turn a failure into
//! the `KvError` it means (`hop_error`). Knows nothing of what the calls do.

use std::future::Future;
use std::time::Duration;

use keel_proto::raft::raft_client::RaftClient;
use keel_proto::raft::{NodeMessage, RaftReply};
use keel_raft::wire;
use keel_types::{KvError, NodeAddr, NodeId, RangeId, limits};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tonic::Status;
use tonic::transport::Channel;

use crate::peer::channels::Peers;
use crate::status::{kv_error, never_sent};

/// One call to a peer.
pub(crate) struct PeerCall<'a, P> {
    pub node: NodeId,
    pub addr: &'a NodeAddr,
    pub range: RangeId,
    pub payload: &'a P,
    /// Whether the peer may forward it once (to a range's leader).
    pub forward: bool,
    /// A write: an answer lost after sending leaves its outcome unknown.
    pub write: bool,
    pub deadline: Duration,
}

impl<P: Serialize> PeerCall<'_, P> {
    /// Sends the call with `rpc` and decodes the reply's payload as `T`.
    pub async fn send<T, F, Fut>(self, peers: &Peers, from: NodeId, rpc: F) -> Result<T, KvError>
    where
        T: DeserializeOwned,
        F: FnOnce(RaftClient<Channel>, NodeMessage) -> Fut,
        Fut: Future<Output = Result<tonic::Response<RaftReply>, tonic::Status>>,
    {
        let node = self.node;
        let channel = peers
            .channel(node, &self.addr.addr)
            .map_err(|e| KvError::unavailable(format!("node {node}: {e}")))?;
        let client = RaftClient::new(channel)
            .max_decoding_message_size(limits::GRPC_MESSAGE_BYTES_MAX)
            .max_encoding_message_size(limits::GRPC_MESSAGE_BYTES_MAX);
        let payload = wire::encode(self.payload).map_err(|e| KvError::invalid(e.to_string()))?;
        let message = NodeMessage {
            from,
            range_id: self.range.0,
            payload,
            no_forward: !self.forward,
        };
        let deadline = self.deadline;
        let reply = match tokio::time::timeout(deadline, rpc(client, message)).await {
            Err(_) if self.write => {
                return Err(KvError::OutcomeUnknown {
                    message: format!("node {node} did not answer within {deadline:?}"),
                });
            }
            Err(_) => {
                return Err(KvError::Timeout {
                    message: format!("node {node} did not answer within {deadline:?}"),
                });
            }
            Ok(Err(status)) => return Err(hop_error(node, &status, self.write)),
            Ok(Ok(reply)) => reply.into_inner(),
        };
        wire::decode(&reply.payload).map_err(|e| KvError::OutcomeUnknown {
            message: format!("node {node} answered with {e}"),
        })
    }
}

/// The error a failed hop to `node` means: the peer's own error when it sent one;
/// `Unavailable` when the call never left; otherwise `OutcomeUnknown` for a write.
pub(crate) fn hop_error(node: NodeId, status: &Status, write: bool) -> KvError {
    if let Some(error) = kv_error(status) {
        return error;
    }
    let message = status.message();
    if never_sent(status) {
        return KvError::unavailable(format!("node {node} is unreachable: {message}"));
    }
    if write {
        return KvError::OutcomeUnknown {
            message: format!("connection to node {node} failed after sending: {message}"),
        };
    }
    KvError::unavailable(format!("node {node} failed: {message}"))
}
