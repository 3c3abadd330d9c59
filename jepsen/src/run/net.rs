//! The network of a run: where each node listens and is reached, and how partitions are made
//! (iptables rules inside the run's namespace, or the runner's own proxy). Knows nothing of
//! node processes or workloads.
//!
//! Address plan. In a namespace node i (id i, from 1) listens on its alias 127.0.0.(10+i) at
//! `NODE_PORT`, and that is its cluster address. Without one, node i listens on 127.o.0.(10+i)
//! (o from the runner's pid, so concurrent runs do not meet) with a port the kernel picks,
//! and its cluster address is its proxy's, 127.0.0.1:p: every node reaches it through the
//! proxy, which knows the caller by its source IP. The cluster's membership holds one address
//! per node (the first node's `--initial-cluster`), so one proxy per target node is what
//! works; the pair a connection belongs to comes from the source IP.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::run::listeners;
use crate::run::netns::Iptables;
use crate::run::plan;
use crate::run::proxy::{LinkState, Proxy, ProxyConfig, Upstream};

/// The port every node listens on inside a namespace.
pub const NODE_PORT: u16 = 7000;
/// The port every node serves etcd's API on inside a namespace (`--clients etcd`).
pub const ETCD_PORT: u16 = 2379;

/// Where one node listens and where the others (and clients) reach it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeAddress {
    /// `--listen`.
    pub listen: SocketAddr,
    /// Its entry in `--initial-cluster`, the address everyone dials.
    pub cluster: SocketAddr,
    /// `--etcd-listen`, when the run's clients speak etcd's API (namespace runs only).
    pub etcd: Option<SocketAddr>,
}

/// The etcd API address of the node whose cluster address is `endpoint` (inside a
/// namespace, its alias at `ETCD_PORT`).
pub fn etcd_endpoint(endpoint: &str) -> anyhow::Result<String> {
    let addr: SocketAddr = endpoint
        .parse()
        .map_err(|e| anyhow::anyhow!("node address {endpoint:?}: {e}"))?;
    Ok(SocketAddr::new(addr.ip(), ETCD_PORT).to_string())
}

/// How partitions are made.
#[derive(Debug)]
pub enum Network {
    Iptables(Iptables),
    Proxy {
        links: watch::Sender<LinkState>,
        proxies: Vec<Proxy>,
    },
}

/// The loopback alias of node `index` (0-based) inside a namespace: 127.0.0.(11+index).
pub fn alias(index: usize) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, 0, 11 + index as u8)
}

/// The address plan inside a namespace, and its iptables partitions.
pub fn in_namespace(nodes: usize) -> (Network, Vec<NodeAddress>) {
    let aliases: Vec<Ipv4Addr> = (0..nodes).map(alias).collect();
    let addresses = aliases
        .iter()
        .map(|ip| {
            let addr = SocketAddr::new(IpAddr::V4(*ip), NODE_PORT);
            NodeAddress {
                listen: addr,
                cluster: addr,
                etcd: None,
            }
        })
        .collect();
    (Network::Iptables(Iptables::new(aliases)), addresses)
}

/// The address plan without a namespace: one proxy per node on 127.0.0.1, started here.
pub async fn proxied(nodes: usize) -> std::io::Result<(Network, Vec<NodeAddress>)> {
    let octet = 1 + (std::process::id() % 250) as u8;
    let ips: Vec<Ipv4Addr> = (0..nodes)
        .map(|index| Ipv4Addr::new(127, octet, 0, 11 + index as u8))
        .collect();
    let sources: Arc<HashMap<IpAddr, usize>> = Arc::new(
        ips.iter()
            .enumerate()
            .map(|(index, ip)| (IpAddr::V4(*ip), index))
            .collect(),
    );
    let (links, _) = watch::channel(LinkState::default());
    let mut proxies = Vec::new();
    let mut addresses = Vec::new();
    for (target, ip) in ips.iter().copied().enumerate() {
        let upstream: Upstream = Arc::new(move || listeners::find_listener(ip));
        let config = ProxyConfig {
            target,
            sources: sources.clone(),
            upstream,
        };
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let proxy = Proxy::spawn(listener, config, links.subscribe())?;
        addresses.push(NodeAddress {
            listen: SocketAddr::new(IpAddr::V4(ip), 0),
            cluster: proxy.addr(),
            etcd: None,
        });
        proxies.push(proxy);
    }
    Ok((Network::Proxy { links, proxies }, addresses))
}

impl Network {
    /// Cuts every link between nodes of different `sides` (by index).
    pub async fn partition(&self, sides: &[Vec<usize>]) -> anyhow::Result<()> {
        let pairs = plan::cut_pairs(sides);
        match self {
            Network::Iptables(iptables) => iptables.cut(&pairs).await,
            Network::Proxy { links, .. } => {
                links.send_modify(|state| state.cut.extend(pairs));
                Ok(())
            }
        }
    }

    /// Restores every link.
    pub async fn heal(&self) -> anyhow::Result<()> {
        match self {
            Network::Iptables(iptables) => iptables.heal().await,
            Network::Proxy { links, .. } => {
                links.send_modify(|state| state.cut.clear());
                Ok(())
            }
        }
    }

    pub fn describe(&self) -> &'static str {
        match self {
            Network::Iptables(_) => "network namespace + iptables",
            Network::Proxy { .. } => "TCP proxy (no namespace)",
        }
    }
}
