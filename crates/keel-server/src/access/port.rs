//! Which calls a port of the node takes (`PortGate`, a layer in front of a whole gRPC
//! server). With `--peer-listen` a node serves two ports: the client port refuses
//! `keel.raft.v1.Raft`, and the peer port refuses every call but a health check that does not
//! carry the peer marker (`PEER_MARKER`, which every call a node makes to another carries)
//! and, with TLS on, every call whose connection showed no node certificate. Without
//! `--peer-listen` the one port takes every call, as before. Knows nothing of what the
//! services do.
//!
//! The marker is not authentication: anyone can send the header. It keeps clients that
//! dialled the wrong port from being served there by mistake; what keeps strangers off the
//! peer port is the firewall, or TLS with node certificates.

use std::task::{Context, Poll};

use futures::future::{Either, Ready, ready};
use keel_types::NodeId;
use tonic::Status;
use tower_layer::Layer;
use tower_service::Service;

use crate::access::tls::peer_connection;

/// The metadata key every call from one node to another carries; its value is the caller's
/// node id.
pub(crate) const PEER_MARKER: &str = "keel-peer-node";

/// The path prefix of the Raft service's methods.
const RAFT_PATH: &str = "/keel.raft.v1.Raft/";
/// The path prefix of the gRPC health service, served to anyone on every port.
const HEALTH_PATH: &str = "/grpc.health.v1.Health/";

/// What a server of the node takes.
#[derive(Debug, Clone)]
pub(crate) enum Port {
    /// The one port of a node without `--peer-listen`: every call.
    Shared,
    /// The client port of a node with `--peer-listen`: every call but the Raft service's.
    Client { node: NodeId, peer_addr: String },
    /// The peer port: calls carrying the peer marker (with TLS on, over a connection that
    /// showed a node certificate), and health checks.
    Peer {
        node: NodeId,
        addr: String,
        client_addr: String,
        tls: bool,
    },
}

impl Port {
    /// Why a call to `path` with these headers and extensions (the caller, from
    /// `CallerLayer`) is refused here; `None` when it is taken.
    pub fn refusal(
        &self,
        path: &str,
        headers: &http::HeaderMap,
        extensions: &http::Extensions,
    ) -> Option<Status> {
        match self {
            Port::Shared => None,
            Port::Client { node, peer_addr } if path.starts_with(RAFT_PATH) => {
                Some(Status::permission_denied(format!(
                    "node {node} serves keel.raft.v1.Raft only on its peer port {peer_addr}"
                )))
            }
            Port::Client { .. } => None,
            Port::Peer { .. } if path.starts_with(HEALTH_PATH) => None,
            Port::Peer {
                node,
                addr,
                client_addr,
                tls,
            } => {
                if !headers.contains_key(PEER_MARKER) {
                    return Some(Status::permission_denied(format!(
                        "{addr} is the peer port of node {node}; clients connect to {client_addr}"
                    )));
                }
                if *tls && !peer_connection(extensions) {
                    return Some(Status::permission_denied(format!(
                        "{addr} is the peer port of node {node} and serves cluster nodes only: this connection presented no certificate signed by the cluster CA"
                    )));
                }
                None
            }
        }
    }
}

/// Refuses, before any service runs, the calls its `Port` does not take.
#[derive(Debug, Clone)]
pub(crate) struct PortGate {
    port: Port,
}

impl PortGate {
    pub fn new(port: Port) -> PortGate {
        PortGate { port }
    }
}

impl<S> Layer<S> for PortGate {
    type Service = Gated<S>;

    fn layer(&self, inner: S) -> Gated<S> {
        Gated {
            inner,
            port: self.port.clone(),
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Gated<S> {
    inner: S,
    port: Port,
}

impl<S, B, R> Service<http::Request<B>> for Gated<S>
where
    S: Service<http::Request<B>, Response = http::Response<R>>,
    R: Default,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Either<Ready<Result<S::Response, S::Error>>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let path = request.uri().path();
        match self
            .port
            .refusal(path, request.headers(), request.extensions())
        {
            Some(status) => Either::Left(ready(Ok(status.into_http()))),
            None => Either::Right(self.inner.call(request)),
        }
    }
}

#[cfg(test)]
mod tests {
    use tonic::Code;

    use super::*;
    use crate::access::tls::Caller;

    fn check(port: &Port, path: &str, marked: bool, caller: Caller, expected: Option<&str>) {
        let mut headers = http::HeaderMap::new();
        if marked {
            headers.insert(PEER_MARKER, http::HeaderValue::from_static("2"));
        }
        let mut extensions = http::Extensions::new();
        extensions.insert(caller);
        let refusal = port.refusal(path, &headers, &extensions);
        match (refusal, expected) {
            (None, None) => {}
            (Some(status), Some(message)) => {
                assert_eq!(status.code(), Code::PermissionDenied, "{path}");
                assert!(status.message().contains(message), "{}", status.message());
            }
            (refusal, expected) => panic!("{path}: {refusal:?}, expected {expected:?}"),
        }
    }

    #[test]
    fn each_port_takes_its_own_calls() {
        let client = Port::Client {
            node: 1,
            peer_addr: "127.0.0.1:7101".to_string(),
        };
        let peer = |tls| Port::Peer {
            node: 1,
            addr: "127.0.0.1:7101".to_string(),
            client_addr: "127.0.0.1:7001".to_string(),
            tls,
        };
        let raft = "/keel.raft.v1.Raft/Heartbeat";
        let kv = "/keel.v1.Kv/Put";
        let health = "/grpc.health.v1.Health/Check";
        let plain = Caller::Plaintext;
        let anonymous = Caller::Anonymous;
        let wrong_port =
            "127.0.0.1:7101 is the peer port of node 1; clients connect to 127.0.0.1:7001";
        check(&Port::Shared, raft, false, plain, None);
        check(&Port::Shared, kv, false, plain, None);
        check(&client, kv, false, plain, None);
        check(
            &client,
            raft,
            true,
            plain,
            Some("only on its peer port 127.0.0.1:7101"),
        );
        check(&peer(false), kv, false, plain, Some(wrong_port));
        check(&peer(false), raft, false, plain, Some(wrong_port));
        check(&peer(false), kv, true, plain, None);
        check(&peer(false), raft, true, plain, None);
        check(&peer(false), health, false, plain, None);
        check(&peer(true), raft, true, anonymous, Some("no certificate"));
        check(&peer(true), raft, true, Caller::Peer, None);
        check(&peer(true), health, false, anonymous, None);
    }
}
