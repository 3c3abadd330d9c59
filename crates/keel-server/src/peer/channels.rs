//! One cached, lazily connected gRPC channel per peer node, shared by every Raft group's
//! transport and by request forwarding; every connection a node opens to another comes
//! from here, so it is https with the node's certificate when TLS is on. Knows nothing of
//! Raft or the Kv semantics.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::Duration;

use keel_types::NodeId;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};

/// How long opening a TCP connection to a peer may take.
const CONNECT_TIMEOUT_MS: u64 = 1_000;
/// HTTP/2 pings keep idle peer connections alive and detect dead ones.
const KEEPALIVE_INTERVAL_MS: u64 = 10_000;

#[derive(Debug, Default)]
pub(crate) struct Peers {
    /// Node id -> (address, channel). At most one entry per cluster node.
    channels: Mutex<HashMap<NodeId, (String, Channel)>>,
    /// The address outgoing connections come from: the node's own listen IP when it names
    /// one, so a peer (or a firewall rule, as the Jepsen harness uses) sees who is calling.
    source: Option<IpAddr>,
    /// TLS to peers (the cluster CA, this node's certificate), when the cluster runs TLS.
    tls: Option<ClientTlsConfig>,
}

impl Peers {
    /// Peers reached from `source` (`None`: the OS picks), over TLS when `tls` is given.
    pub fn new(source: Option<IpAddr>, tls: Option<ClientTlsConfig>) -> Peers {
        Peers {
            channels: Mutex::default(),
            source,
            tls,
        }
    }

    /// The channel to `node` at `addr` ("host:port"; a scheme before it is replaced by
    /// this node's). A channel is replaced when the node's address changes. Connecting
    /// happens on first use.
    pub fn channel(&self, node: NodeId, addr: &str) -> Result<Channel, tonic::transport::Error> {
        let mut channels = self.channels.lock().expect("peer channels lock poisoned");
        if let Some((known, channel)) = channels.get(&node)
            && known == addr
        {
            return Ok(channel.clone());
        }
        let channel = self.endpoint(addr)?.connect_lazy();
        channels.insert(node, (addr.to_string(), channel.clone()));
        Ok(channel)
    }

    /// A channel, not kept, to an address whose node is not known yet (a join address).
    pub fn seed_channel(&self, addr: &str) -> Result<Channel, tonic::transport::Error> {
        Ok(self.endpoint(addr)?.connect_lazy())
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
            .keep_alive_while_idle(true)
            .local_address(self.source);
        match &self.tls {
            Some(tls) => endpoint.tls_config(tls.clone()),
            None => Ok(endpoint),
        }
    }
}
