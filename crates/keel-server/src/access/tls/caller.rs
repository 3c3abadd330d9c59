//! Who called, as far as the connection tells: `CallerLayer`, around the node's whole gRPC
//! server, gives every request a `Caller`, and `is_peer` reads it from any service. Knows
//! nothing of what a service does with the answer.

use std::task::{Context, Poll};

use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
use tower_layer::Layer;
use tower_service::Service;

/// What the connection of a request proves about its caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Caller {
    /// TLS is off on this node: nobody can prove who they are, so every caller is taken
    /// for a peer (a plaintext cluster trusts its network).
    Plaintext,
    /// Over TLS, with a certificate the cluster CA signed: a node of the cluster.
    Peer,
    /// Over TLS, without a certificate: an application or an operator.
    Anonymous,
}

/// Whether `request` comes from a node of the cluster: always when TLS is off (no caller
/// has an identity then), else when its connection presented a certificate the cluster CA
/// signed (the handshake refuses any other certificate). A request that did not pass
/// `CallerLayer` is not from a peer.
pub(crate) fn is_peer<T>(request: &tonic::Request<T>) -> bool {
    peer_connection(request.extensions())
}

/// `is_peer` of a request with these extensions, before tonic made it a `tonic::Request`.
pub(crate) fn peer_connection(extensions: &http::Extensions) -> bool {
    matches!(
        extensions.get::<Caller>(),
        Some(Caller::Plaintext | Caller::Peer)
    )
}

/// Puts the `Caller` of every request into its extensions, replacing any there.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CallerLayer {
    /// Whether the server accepts TLS connections only.
    tls: bool,
}

impl CallerLayer {
    pub fn new(tls: bool) -> CallerLayer {
        CallerLayer { tls }
    }
}

impl<S> Layer<S> for CallerLayer {
    type Service = CallerService<S>;

    fn layer(&self, inner: S) -> CallerService<S> {
        CallerService {
            inner,
            tls: self.tls,
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct CallerService<S> {
    inner: S,
    tls: bool,
}

impl<S, B> Service<http::Request<B>> for CallerService<S>
where
    S: Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> S::Future {
        let caller = caller(self.tls, request.extensions());
        request.extensions_mut().insert(caller);
        self.inner.call(request)
    }
}

/// The caller of a request with these extensions (tonic's connection info) on a server
/// with TLS on or off. With TLS on, a request without TLS connection info is anonymous.
pub(crate) fn caller(tls: bool, extensions: &http::Extensions) -> Caller {
    if !tls {
        return Caller::Plaintext;
    }
    let certified = extensions
        .get::<TlsConnectInfo<TcpConnectInfo>>()
        .and_then(TlsConnectInfo::peer_certs)
        .is_some_and(|certificates| !certificates.is_empty());
    if certified {
        Caller::Peer
    } else {
        Caller::Anonymous
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request_from(caller: Option<Caller>) -> tonic::Request<()> {
        let mut request = tonic::Request::new(());
        if let Some(caller) = caller {
            request.extensions_mut().insert(caller);
        }
        request
    }

    #[test]
    fn only_plaintext_callers_and_certified_peers_are_peers() {
        let cases = [
            (Some(Caller::Plaintext), true),
            (Some(Caller::Peer), true),
            (Some(Caller::Anonymous), false),
            (None, false),
        ];
        for (caller, expected) in cases {
            assert_eq!(is_peer(&request_from(caller)), expected, "{caller:?}");
        }
    }

    /// Without TLS connection info (what a plaintext connection has), a TLS server counts
    /// the caller anonymous; a plaintext server counts everyone a peer.
    #[test]
    fn a_tls_server_without_connection_info_sees_an_anonymous_caller() {
        let extensions = http::Extensions::new();
        assert_eq!(caller(true, &extensions), Caller::Anonymous);
        assert_eq!(caller(false, &extensions), Caller::Plaintext);
    }
}
