//! The fault-injecting TCP proxy of runs without root: one listener in front of each node,
//! through which every other node reaches it. A connection's source node is known by its
//! source IP (each node binds its outgoing connections to its own listen IP); connections
//! from anything else (the workload clients) are never faulted. A cut link closes the
//! connections it carries and holds new ones without a byte through (a blackhole, like an
//! iptables DROP) until it heals; a delay holds every chunk between nodes that long.
//! Knows nothing of Keel, Raft or the nemesis's plan.

use std::collections::{BTreeSet, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

/// Connections one proxy carries at once; more are refused (closed at once).
pub const CONNECTIONS_MAX: usize = 256;
/// Bytes read in one go on each side of a connection.
pub const BUFFER_BYTES: usize = 64 * 1024;
/// Time to open the connection to the node behind the proxy.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// The state of every link between nodes (by node index).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LinkState {
    /// Pairs (lower index first) that cannot talk, in either direction.
    pub cut: BTreeSet<(usize, usize)>,
    /// Delay of every chunk sent between two nodes.
    pub delay_ms: u64,
}

/// Where the node behind a proxy listens now (it may move when the node restarts).
pub type Upstream = Arc<dyn Fn() -> std::io::Result<SocketAddr> + Send + Sync>;

/// One proxy: the node it fronts, who is who by source IP, and how to reach the node.
#[derive(Clone)]
pub struct ProxyConfig {
    pub target: usize,
    pub sources: Arc<HashMap<IpAddr, usize>>,
    pub upstream: Upstream,
}

/// A running proxy; dropping it closes its listener and every connection it carries.
#[derive(Debug)]
pub struct Proxy {
    addr: SocketAddr,
    held: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Serves `listener` until dropped, under the link states `links` publishes.
    pub fn spawn(
        listener: TcpListener,
        config: ProxyConfig,
        links: watch::Receiver<LinkState>,
    ) -> std::io::Result<Proxy> {
        let addr = listener.local_addr()?;
        let held = Arc::new(AtomicUsize::new(0));
        let task = tokio::spawn(accept_loop(listener, config, links, held.clone()));
        Ok(Proxy { addr, held, task })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Connections held in a blackhole now (over a cut link).
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn accept_loop(
    listener: TcpListener,
    config: ProxyConfig,
    links: watch::Receiver<LinkState>,
    held: Arc<AtomicUsize>,
) {
    // Owned here so that aborting this task drops (and aborts) every connection's task.
    let mut connections = JoinSet::new();
    loop {
        let Ok((stream, peer)) = listener.accept().await else {
            continue;
        };
        while connections.try_join_next().is_some() {}
        if connections.len() >= CONNECTIONS_MAX {
            continue;
        }
        let source = config.sources.get(&peer.ip()).copied();
        let link = Link {
            pair: source.map(|s| (s.min(config.target), s.max(config.target))),
            between_nodes: source.is_some(),
        };
        let upstream = config.upstream.clone();
        connections.spawn(relay(stream, link, upstream, links.clone(), held.clone()));
    }
}

/// The link a connection travels: between two nodes, or from a client (never faulted).
#[derive(Debug, Clone, Copy)]
struct Link {
    pair: Option<(usize, usize)>,
    between_nodes: bool,
}

impl Link {
    fn is_cut(&self, state: &LinkState) -> bool {
        self.pair.is_some_and(|pair| state.cut.contains(&pair))
    }
}

async fn relay(
    client: TcpStream,
    link: Link,
    upstream: Upstream,
    mut links: watch::Receiver<LinkState>,
    held: Arc<AtomicUsize>,
) {
    if link.is_cut(&links.borrow_and_update()) {
        held.fetch_add(1, Ordering::Relaxed);
        blackhole(client, link, links).await;
        held.fetch_sub(1, Ordering::Relaxed);
        return;
    }
    let Ok(addr) = upstream() else { return };
    let Ok(Ok(server)) = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr)).await
    else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let delays = link.between_nodes.then(|| links.clone());
    tokio::select! {
        _ = pump(client_read, server_write, delays.clone()) => {}
        _ = pump(server_read, client_write, delays) => {}
        _ = links.wait_for(|state| link.is_cut(state)) => {}
    }
    // Returning drops both halves, which closes the connection on both sides.
}

/// Holds a connection over a cut link: reads and drops what arrives, sends nothing, and
/// closes when the link heals or the other side gives up.
async fn blackhole(mut client: TcpStream, link: Link, mut links: watch::Receiver<LinkState>) {
    let mut sink = vec![0u8; BUFFER_BYTES];
    loop {
        tokio::select! {
            read = client.read(&mut sink) => {
                if !matches!(read, Ok(n) if n > 0) {
                    return;
                }
            }
            _ = links.wait_for(|state| !link.is_cut(state)) => return,
        }
    }
}

/// Copies `from` to `to` until either ends, holding each chunk for the current delay when
/// `delays` is given (links between nodes).
async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    delays: Option<watch::Receiver<LinkState>>,
) {
    let mut buffer = vec![0u8; BUFFER_BYTES];
    loop {
        let count = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(count) => count,
        };
        let delay_ms = delays.as_ref().map_or(0, |links| links.borrow().delay_ms);
        if delay_ms > 0 {
            tokio::time::sleep(Duration::from_millis(delay_ms)).await;
        }
        if to.write_all(&buffer[..count]).await.is_err() {
            return;
        }
    }
}
