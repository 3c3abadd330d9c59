//! One cached, lazily connected gRPC channel per peer node, shared by every Raft group's
//! transport and by request forwarding. Knows nothing of Raft or the Kv semantics.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::Duration;

use keel_types::NodeId;
use tonic::transport::{Channel, Endpoint};

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
}

impl Peers {
    /// Peers reached from `source` (`None`: the OS picks).
    pub fn new(source: Option<IpAddr>) -> Peers {
        Peers {
            channels: Mutex::default(),
            source,
        }
    }

    /// The channel to `node` at `addr` ("host:port" or "http://host:port"). A channel is
    /// replaced when the node's address changes. Connecting happens on first use.
    pub fn channel(&self, node: NodeId, addr: &str) -> Result<Channel, tonic::transport::Error> {
        let mut channels = self.channels.lock().expect("peer channels lock poisoned");
        if let Some((known, channel)) = channels.get(&node)
            && known == addr
        {
            return Ok(channel.clone());
        }
        let channel = endpoint(addr)?.local_address(self.source).connect_lazy();
        channels.insert(node, (addr.to_string(), channel.clone()));
        Ok(channel)
    }

    /// A channel, not kept, to an address whose node is not known yet (a join address).
    pub fn seed_channel(&self, addr: &str) -> Result<Channel, tonic::transport::Error> {
        Ok(endpoint(addr)?.local_address(self.source).connect_lazy())
    }
}

fn endpoint(addr: &str) -> Result<Endpoint, tonic::transport::Error> {
    let uri = if addr.contains("://") {
        addr.to_string()
    } else {
        format!("http://{addr}")
    };
    Ok(Endpoint::from_shared(uri)?
        .connect_timeout(Duration::from_millis(CONNECT_TIMEOUT_MS))
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_millis(KEEPALIVE_INTERVAL_MS))
        .keep_alive_while_idle(true))
}
