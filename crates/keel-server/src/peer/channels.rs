//! One cached, lazily connected gRPC channel per peer node, shared by every Raft group's
//! transport and by request forwarding; every connection a node opens to another comes
//! from here, so it is https with the node's certificate when TLS is on, and every call on
//! it carries the peer marker (`access::port::PEER_MARKER`: the node's id), which a node's
//! peer port asks for. Knows nothing of Raft or the Kv semantics.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::Duration;

use keel_types::NodeId;
use tonic::metadata::AsciiMetadataValue;
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};

use crate::access::port::PEER_MARKER;

/// How long opening a TCP connection to a peer may take.
const CONNECT_TIMEOUT_MS: u64 = 1_000;
/// HTTP/2 pings keep idle peer connections alive and detect dead ones: a connection whose
/// ping is not answered within `KEEPALIVE_TIMEOUT_MS` is closed, and the next call opens a
/// new one. Without it, a connection that lost packets for a few seconds (a partition) stays
/// open with TCP's retransmission timer backed off to seconds, so after the partition heals
/// calls on it still time out for seconds: a deposed leader did not hear of its successor,
/// and the elections it held up waited with it.
const KEEPALIVE_INTERVAL_MS: u64 = 1_000;
const KEEPALIVE_TIMEOUT_MS: u64 = 2_000;

/// A channel to a peer whose every call carries the peer marker.
pub(crate) type PeerChannel = InterceptedService<Channel, Marker>;

/// Puts the peer marker, this node's id, on every call.
#[derive(Debug, Clone)]
pub(crate) struct Marker(AsciiMetadataValue);

impl Interceptor for Marker {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        request.metadata_mut().insert(PEER_MARKER, self.0.clone());
        Ok(request)
    }
}

#[derive(Debug)]
pub(crate) struct Peers {
    /// Node id -> (address, channel). At most one entry per cluster node.
    channels: Mutex<HashMap<NodeId, (String, PeerChannel)>>,
    /// The marker of this node's calls.
    marker: Marker,
    /// The address outgoing connections come from: the node's own listen IP when it names
    /// one, so a peer (or a firewall rule, as the Jepsen harness uses) sees who is calling.
    source: Option<IpAddr>,
    /// TLS to peers (the cluster CA, this node's certificate), when the cluster runs TLS.
    tls: Option<ClientTlsConfig>,
}

impl Peers {
    /// The peers of node `node`, reached from `source` (`None`: the OS picks), over TLS
    /// when `tls` is given.
    pub fn new(node: NodeId, source: Option<IpAddr>, tls: Option<ClientTlsConfig>) -> Peers {
        Peers {
            channels: Mutex::default(),
            marker: Marker(AsciiMetadataValue::from(node)),
            source,
            tls,
        }
    }

    /// The channel to `node` at `addr` ("host:port"; a scheme before it is replaced by
    /// this node's). A channel is replaced when the node's address changes. Connecting
    /// happens on first use.
    pub fn channel(
        &self,
        node: NodeId,
        addr: &str,
    ) -> Result<PeerChannel, tonic::transport::Error> {
        let mut channels = self.channels.lock().expect("peer channels lock poisoned");
        if let Some((known, channel)) = channels.get(&node)
            && known == addr
        {
            return Ok(channel.clone());
        }
        let channel = self.marked(self.endpoint(addr)?.connect_lazy());
        channels.insert(node, (addr.to_string(), channel.clone()));
        Ok(channel)
    }

    /// A channel, not kept, to an address whose node is not known yet (a join address).
    pub fn seed_channel(&self, addr: &str) -> Result<PeerChannel, tonic::transport::Error> {
        Ok(self.marked(self.endpoint(addr)?.connect_lazy()))
    }

    fn marked(&self, channel: Channel) -> PeerChannel {
        InterceptedService::new(channel, self.marker.clone())
    }

    /// `addr` as an endpoint: https with the TLS settings when the node has them (the
    /// server name checked is the address's host), else http.
    fn endpoint(&self, addr: &str) -> Result<Endpoint, tonic::transport::Error> {
        let authority = addr.split_once("://").map_or(addr, |(_, rest)| rest);
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let endpoint = Endpoint::from_shared(format!("{scheme}://{authority}"))?
            .connect_timeout(Duration::from_millis(CONNECT_TIMEOUT_MS))
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_millis(KEEPALIVE_INTERVAL_MS))
            .keep_alive_timeout(Duration::from_millis(KEEPALIVE_TIMEOUT_MS))
            .keep_alive_while_idle(true)
            .local_address(self.source);
        match &self.tls {
            Some(tls) => endpoint.tls_config(tls.clone()),
            None => Ok(endpoint),
        }
    }
}
