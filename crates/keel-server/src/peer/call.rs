//! The one way to call another node: a channel from the peer channels, the service's client
//! with Keel's message limits, the call within a deadline, and a failure kept as what
//! happened (`PeerError`: no channel, no answer in time, or the peer's status) for the caller
//! to read the way its call needs: `PeerError::into_kv` for a node-internal call (the peer's
//! own error when it sent one, else `Unavailable`, `Timeout` or, for a write whose answer was
//! lost, `OutcomeUnknown`), `PeerError::into_status` to relay a leader's error as it sent it.
//! `PeerCall` rides on it for the `keel.raft.v1.Raft` RPCs that carry a `NodeMessage`
//! (encode the payload, decode the reply's). `pause_before` paces a caller's tries at a
//! leader that moved. Knows nothing of what the calls do.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use keel_proto::raft::raft_client::RaftClient;
use keel_proto::raft::{NodeMessage, RaftReply};
use keel_proto::v1::cluster_client::ClusterClient;
use keel_proto::v1::idempotency_client::IdempotencyClient;
use keel_proto::v1::kv_client::KvClient;
use keel_proto::v1::lock_client::LockClient;
use keel_raft::wire;
use keel_types::{KvError, NodeAddr, NodeId, RangeId, limits};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::time::Instant;
use tonic::{Response, Status};

use crate::peer::channels::{PeerChannel, Peers};
use crate::status::{kv_error, never_sent, to_status};

/// The gRPC client of a service, made on a channel to a peer.
pub(crate) trait PeerClient: Sized {
    fn on(channel: PeerChannel) -> Self;
}

macro_rules! peer_client {
    ($($client:ident),*) => {$(
        impl PeerClient for $client<PeerChannel> {
            fn on(channel: PeerChannel) -> Self {
                $client::new(channel)
                    .max_decoding_message_size(limits::GRPC_MESSAGE_BYTES_MAX)
                    .max_encoding_message_size(limits::GRPC_MESSAGE_BYTES_MAX)
            }
        }
    )*};
}

peer_client!(
    RaftClient,
    KvClient,
    LockClient,
    IdempotencyClient,
    ClusterClient
);

/// Whom a call goes to.
#[derive(Debug, Clone, Copy)]
pub(crate) enum To<'a> {
    /// A node by id and address (its channel is kept and shared).
    Node(NodeId, &'a NodeAddr),
    /// An address whose node is not known yet (a join address; its channel is not kept).
    Seed(&'a str),
}

impl fmt::Display for To<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            To::Node(node, _) => write!(f, "node {node}"),
            To::Seed(addr) => write!(f, "join address {addr}"),
        }
    }
}

/// A call to a peer that did not come back with an answer.
#[derive(Debug)]
pub(crate) struct PeerError {
    /// Whom the call went to ("node 3", "join address …").
    pub to: String,
    pub failure: Failure,
}

#[derive(Debug)]
pub(crate) enum Failure {
    /// No channel could be made (a malformed address); nothing was sent.
    NoChannel(String),
    /// No answer within the deadline.
    Timeout(Duration),
    /// The peer, or the connection to it, answered with this status.
    Status(Status),
}

impl PeerError {
    /// The status to answer a client whose request the call forwarded: the peer's own Keel
    /// error as it sent it (code, message and detail, without the hop's transport metadata),
    /// else the status of what the failure means (`into_kv`).
    pub fn into_status(self, write: bool) -> Status {
        match &self.failure {
            Failure::Status(status) if kv_error(status).is_some() => Status::with_details(
                status.code(),
                status.message(),
                status.details().to_vec().into(),
            ),
            _ => to_status(&self.into_kv(write)),
        }
    }

    /// What the failure means to the caller: the peer's own error when it sent one;
    /// `Unavailable` when the call never left; for a `write` whose answer was lost after
    /// sending, `OutcomeUnknown`; otherwise `Timeout` or `Unavailable`.
    pub fn into_kv(self, write: bool) -> KvError {
        let to = self.to;
        match self.failure {
            Failure::NoChannel(message) => KvError::unavailable(format!("{to}: {message}")),
            Failure::Timeout(deadline) if write => KvError::OutcomeUnknown {
                message: format!("{to} did not answer within {deadline:?}"),
            },
            Failure::Timeout(deadline) => KvError::Timeout {
                message: format!("{to} did not answer within {deadline:?}"),
            },
            Failure::Status(status) => {
                if let Some(error) = kv_error(&status) {
                    return error;
                }
                let message = status.message();
                if never_sent(&status) {
                    KvError::unavailable(format!("{to} is unreachable: {message}"))
                } else if write {
                    KvError::OutcomeUnknown {
                        message: format!("connection to {to} failed after sending: {message}"),
                    }
                } else {
                    KvError::unavailable(format!("{to} failed: {message}"))
                }
            }
        }
    }
}

/// Calls `rpc` on `to`'s service `C`, within `deadline`.
pub(crate) async fn call<C, T, F, Fut>(
    peers: &Peers,
    to: To<'_>,
    deadline: Duration,
    rpc: F,
) -> Result<Response<T>, PeerError>
where
    C: PeerClient,
    F: FnOnce(C) -> Fut,
    Fut: Future<Output = Result<Response<T>, Status>>,
{
    let failed = |failure| PeerError {
        to: to.to_string(),
        failure,
    };
    let channel = match to {
        To::Node(node, addr) => peers.channel(node, &addr.addr),
        To::Seed(addr) => peers.seed_channel(addr),
    };
    let channel = channel.map_err(|e| failed(Failure::NoChannel(e.to_string())))?;
    match tokio::time::timeout(deadline, rpc(C::on(channel))).await {
        Err(_) => Err(failed(Failure::Timeout(deadline))),
        Ok(Err(status)) => Err(failed(Failure::Status(status))),
        Ok(Ok(response)) => Ok(response),
    }
}

/// One call to a peer of a `keel.raft.v1.Raft` RPC that takes a `NodeMessage`.
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
    /// Sends the call from node `from` with `rpc` and decodes the reply's payload as `T`.
    pub async fn send<T, F, Fut>(self, peers: &Peers, from: NodeId, rpc: F) -> Result<T, KvError>
    where
        T: DeserializeOwned,
        F: FnOnce(RaftClient<PeerChannel>, NodeMessage) -> Fut,
        Fut: Future<Output = Result<Response<RaftReply>, Status>>,
    {
        let payload = wire::encode(self.payload).map_err(|e| KvError::invalid(e.to_string()))?;
        let message = NodeMessage {
            from,
            range_id: self.range.0,
            payload,
            no_forward: !self.forward,
        };
        let to = To::Node(self.node, self.addr);
        let reply = call(peers, to, self.deadline, |client| rpc(client, message))
            .await
            .map_err(|error| error.into_kv(self.write))?;
        wire::decode(&reply.into_inner().payload).map_err(|e| KvError::OutcomeUnknown {
            message: format!("{to} answered with {e}"),
        })
    }
}

/// Sleeps for `pause` (doubled for the next time, up to `FORWARD_BACKOFF_MAX_MS`), unless
/// that would pass `deadline`: then returns false at once.
pub(crate) async fn pause_before(pause: &mut Duration, deadline: Instant) -> bool {
    let wake = Instant::now() + *pause;
    if wake >= deadline {
        return false;
    }
    tokio::time::sleep_until(wake).await;
    let longest = Duration::from_millis(limits::FORWARD_BACKOFF_MAX_MS);
    *pause = (*pause * 2).min(longest);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failed(failure: Failure) -> PeerError {
        PeerError {
            to: "node 3".to_string(),
            failure,
        }
    }

    #[test]
    fn a_peers_own_error_passes_through_and_may_be_relayed() {
        let refused = KvError::unavailable("node 3 is shutting down");
        let sent = to_status(&refused);
        let relayed = failed(Failure::Status(sent.clone())).into_status(true);
        assert_eq!(
            (relayed.code(), relayed.message()),
            (sent.code(), sent.message())
        );
        assert_eq!(relayed.details(), sent.details());
        assert_eq!(failed(Failure::Status(sent)).into_kv(true), refused);
    }

    #[test]
    fn a_lost_answer_leaves_a_write_unknown_and_a_read_retryable() {
        let lost = || failed(Failure::Timeout(Duration::from_millis(5)));
        assert!(matches!(
            lost().into_kv(true),
            KvError::OutcomeUnknown { .. }
        ));
        assert!(matches!(lost().into_kv(false), KvError::Timeout { .. }));
        let broken = || failed(Failure::Status(Status::unknown("stream reset")));
        let relayed = broken().into_status(true);
        assert_eq!(relayed.code(), to_status(&broken().into_kv(true)).code());
        assert!(matches!(
            broken().into_kv(true),
            KvError::OutcomeUnknown { .. }
        ));
        assert!(matches!(
            broken().into_kv(false),
            KvError::Unavailable { .. }
        ));
    }

    #[test]
    fn a_call_that_never_left_is_unavailable_even_for_a_write() {
        let error = failed(Failure::NoChannel("invalid uri".to_string()));
        let KvError::Unavailable { message } = error.into_kv(true) else {
            panic!("a call without a channel must be Unavailable");
        };
        assert!(message.starts_with("node 3: "), "{message}");
    }

    #[tokio::test]
    async fn a_malformed_address_fails_before_sending() {
        let peers = Peers::new(1, None, None);
        let addr = NodeAddr::new("not an address");
        let never = |mut client: ClusterClient<_>| async move {
            client
                .ranges(keel_proto::v1::RangesRequest::default())
                .await
        };
        let error = call(&peers, To::Node(3, &addr), Duration::from_secs(1), never)
            .await
            .expect_err("no channel to a malformed address");
        assert!(matches!(error.failure, Failure::NoChannel(_)), "{error:?}");
    }
}
