//! An in-process cluster for tests: real `keel_server::Node`s with real gRPC on loopback
//! ports, data in a temporary directory, and clients that talk to them.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use keel_client::{Client, ClientOptions, GetResult, PutOptions};
use keel_proto::v1::cluster_client::ClusterClient;
use keel_proto::v1::kv_client::KvClient;
use keel_proto::v1::{RangeStatus, StatusRequest, StatusResponse};
use keel_server::{
    Access, Faults, KvSettings, LogSettings, Node, NodeConfig, PlacementSettings, RaftTimings,
};
use keel_types::{Clock, Consistency, ManualClock, NodeId, RangeId, Revision};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

use crate::pki::Pki;

/// How long a test waits for a condition (an election, replication) before it fails.
pub const WAIT_LIMIT: Duration = Duration::from_secs(30);

/// Quick elections, for tests that stop leaders on loopback.
pub fn quick_timings() -> RaftTimings {
    RaftTimings {
        heartbeat_ms: 50,
        election_timeout_ms_min: 300,
        election_timeout_ms_max: 600,
        ..RaftTimings::default()
    }
}

pub struct Cluster {
    dir: tempfile::TempDir,
    timings: RaftTimings,
    addrs: BTreeMap<NodeId, SocketAddr>,
    /// Every node serves its metrics (`--metrics-listen`) at its own address.
    metrics_addrs: BTreeMap<NodeId, SocketAddr>,
    nodes: BTreeMap<NodeId, Node>,
    /// Each node's wall clock (TTLs, sessions); they move only when a test moves them.
    clocks: BTreeMap<NodeId, Arc<ManualClock>>,
    kv: KvSettings,
    faults: Faults,
    placement: PlacementSettings,
    /// Nodes that joined the running cluster (`--join` through node 1) rather than being of
    /// the initial cluster.
    joined: BTreeSet<NodeId>,
    /// The tokens every node checks (`--auth-tokens`); none: authentication off.
    access: Option<Arc<Access>>,
    /// The admin token the harness's clients send when authentication is on.
    admin_token: Option<String>,
    /// The CA of a cluster serving TLS: each node gets a certificate it signs, clients
    /// trust it.
    pki: Option<Pki>,
    /// Each node's peer port (`--peer-listen`), when the nodes serve peers apart; empty: one
    /// port each.
    peer_addrs: BTreeMap<NodeId, SocketAddr>,
}

impl Cluster {
    /// Starts `size` nodes and waits until they agree on a leader.
    pub async fn start(size: u64) -> Cluster {
        Cluster::start_with(size, RaftTimings::default()).await
    }

    /// Starts `size` nodes with `timings` and waits until they agree on a leader.
    pub async fn start_with(size: u64, timings: RaftTimings) -> Cluster {
        Cluster::start_configured(size, timings, KvSettings::default(), Faults::default()).await
    }

    /// Starts `size` nodes placing ranges by `placement` and waits until they agree on a
    /// leader.
    pub async fn start_placed(size: u64, placement: PlacementSettings) -> Cluster {
        Cluster::start_placed_with(size, RaftTimings::default(), placement).await
    }

    /// `start_placed` with `timings`.
    pub async fn start_placed_with(
        size: u64,
        timings: RaftTimings,
        placement: PlacementSettings,
    ) -> Cluster {
        let mut cluster = Cluster::new(size, timings, KvSettings::default());
        cluster.placement = placement;
        cluster.start_all(size).await;
        cluster
    }

    /// `start_placed`, but node `later` of the `size` initial nodes is not started (the
    /// test starts it with `start_node`); waits until the others agree on a leader.
    pub async fn start_placed_without(
        size: u64,
        placement: PlacementSettings,
        later: NodeId,
    ) -> Cluster {
        let mut cluster = Cluster::new(size, RaftTimings::default(), KvSettings::default());
        cluster.placement = placement;
        for id in (1..=size).filter(|id| *id != later) {
            cluster.start_node(id).await;
        }
        cluster.leader().await;
        cluster
    }

    /// Starts `size` nodes serving TLS only, with certificates of a fresh CA (`pki`), and
    /// waits until they agree on a leader.
    pub async fn start_tls(size: u64) -> Cluster {
        let mut cluster = Cluster::new(size, RaftTimings::default(), KvSettings::default());
        cluster.pki = Some(Pki::new("keel test cluster CA"));
        cluster.start_all(size).await;
        cluster
    }

    /// Starts `size` nodes that serve peers on a port of their own (`--peer-listen`; TLS
    /// with `tls`) and waits until they agree on a leader.
    pub async fn start_peer_ports(size: u64, tls: bool) -> Cluster {
        let mut cluster = Cluster::new(size, quick_timings(), KvSettings::default());
        cluster.peer_addrs = (1..=size).map(|id| (id, free_addr())).collect();
        if tls {
            cluster.pki = Some(Pki::new("keel test cluster CA"));
        }
        cluster.start_all(size).await;
        cluster
    }

    /// Node `id`'s peer port, in a cluster started with `start_peer_ports`.
    pub fn peer_addr(&self, id: NodeId) -> SocketAddr {
        self.peer_addrs[&id]
    }

    /// Starts `size` nodes serving TLS (as `start_tls`) that check `access`'s tokens, and
    /// waits until they agree on a leader. The harness's own clients send `admin_token`.
    pub async fn start_authenticated(size: u64, access: Access, admin_token: &str) -> Cluster {
        Cluster::start_authenticated_with(size, access, admin_token, KvSettings::default()).await
    }

    /// `start_authenticated` with the nodes' `kv` settings.
    pub async fn start_authenticated_with(
        size: u64,
        access: Access,
        admin_token: &str,
        kv: KvSettings,
    ) -> Cluster {
        let mut cluster = Cluster::new(size, RaftTimings::default(), kv);
        cluster.pki = Some(Pki::new("keel test cluster CA"));
        cluster.access = Some(Arc::new(access));
        cluster.admin_token = Some(admin_token.to_string());
        cluster.start_all(size).await;
        cluster
    }

    /// The CA of a cluster started with `start_tls`.
    pub fn pki(&self) -> &Pki {
        self.pki.as_ref().expect("the cluster serves TLS")
    }

    /// Starts `size` nodes with every setting given and waits until they agree on a leader.
    pub async fn start_configured(
        size: u64,
        timings: RaftTimings,
        kv: KvSettings,
        faults: Faults,
    ) -> Cluster {
        let mut cluster = Cluster::new(size, timings, kv);
        cluster.faults = faults;
        cluster.start_all(size).await;
        cluster
    }

    /// A cluster of `size` initial nodes, none started yet.
    fn new(size: u64, timings: RaftTimings, kv: KvSettings) -> Cluster {
        init_logs();
        let addrs = (1..=size).map(|id| (id, free_addr())).collect();
        let metrics_addrs = (1..=size).map(|id| (id, free_addr())).collect();
        let start_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        Cluster {
            dir: tempfile::tempdir().unwrap(),
            timings,
            addrs,
            metrics_addrs,
            nodes: BTreeMap::new(),
            clocks: (1..=size)
                .map(|id| (id, ManualClock::new(start_ms)))
                .collect(),
            kv,
            faults: Faults::default(),
            placement: PlacementSettings::default(),
            joined: BTreeSet::new(),
            access: None,
            admin_token: None,
            pki: None,
            peer_addrs: BTreeMap::new(),
        }
    }

    async fn start_all(&mut self, size: u64) {
        for id in 1..=size {
            self.start_node(id).await;
        }
        self.leader().await;
    }

    /// Starts a new node `id` that joins the running cluster through node 1.
    pub async fn join_node(&mut self, id: NodeId) {
        assert!(!self.addrs.contains_key(&id), "node {id} exists");
        self.addrs.insert(id, free_addr());
        self.metrics_addrs.insert(id, free_addr());
        if !self.peer_addrs.is_empty() {
            self.peer_addrs.insert(id, free_addr());
        }
        let start_ms = self.clocks[&1].now_ms();
        self.clocks.insert(id, ManualClock::new(start_ms));
        self.joined.insert(id);
        self.start_node(id).await;
    }

    pub fn ids(&self) -> Vec<NodeId> {
        self.addrs.keys().copied().collect()
    }

    pub fn endpoint(&self, id: NodeId) -> String {
        self.addrs[&id].to_string()
    }

    /// Where node `id` serves `GET /metrics`.
    pub fn metrics_addr(&self, id: NodeId) -> SocketAddr {
        self.metrics_addrs[&id]
    }

    /// A client that knows every node (trusting the cluster's CA when it serves TLS).
    pub fn client(&self) -> Client {
        let endpoints = self.ids().iter().map(|id| self.endpoint(*id)).collect();
        Client::new(endpoints, self.client_options()).unwrap()
    }

    /// Default client options, with TLS when the cluster serves it and the admin token when
    /// it checks tokens.
    pub fn client_options(&self) -> ClientOptions {
        ClientOptions {
            tls: self.pki.as_ref().map(Pki::client_tls),
            token: self.admin_token.clone(),
            ..ClientOptions::default()
        }
    }

    /// A raw gRPC client of node `id`'s Kv service, for tests that control every field of a
    /// request (request ids, retries).
    pub async fn kv(&self, id: NodeId) -> KvClient<Channel> {
        KvClient::connect(format!("http://{}", self.endpoint(id)))
            .await
            .unwrap()
    }

    /// A TLS channel to node `id` of a cluster started with `start_tls` or
    /// `start_authenticated`, for raw gRPC calls (a 10 s deadline on each).
    pub async fn tls_channel(&self, id: NodeId) -> Channel {
        self.tls_channel_to(&self.endpoint(id)).await
    }

    /// A TLS channel to node `id`'s etcd API (every node serves it on a port of its own).
    pub async fn etcd_tls_channel(&self, id: NodeId) -> Channel {
        let addr = self
            .node(id)
            .etcd_addr()
            .expect("harness nodes serve etcd's API");
        self.tls_channel_to(&addr.to_string()).await
    }

    async fn tls_channel_to(&self, addr: &str) -> Channel {
        let ca = Certificate::from_pem(self.pki().ca_pem());
        let tls = ClientTlsConfig::new().ca_certificate(ca);
        Endpoint::from_shared(format!("https://{addr}"))
            .unwrap()
            .timeout(Duration::from_secs(10))
            .tls_config(tls)
            .unwrap()
            .connect()
            .await
            .unwrap()
    }

    /// A client that knows only node `id` (it may still follow leader hints elsewhere).
    pub fn client_of(&self, id: NodeId) -> Client {
        Client::new(vec![self.endpoint(id)], self.client_options()).unwrap()
    }

    pub fn config(&self, id: NodeId) -> NodeConfig {
        let joins = self.joined.contains(&id);
        // Peers are named by their peer ports when they have them.
        let peers = match self.peer_addrs.is_empty() {
            true => &self.addrs,
            false => &self.peer_addrs,
        };
        let initial_cluster = peers
            .iter()
            .filter(|(id, _)| !joins && !self.joined.contains(id))
            .map(|(id, addr)| (*id, addr.to_string()))
            .collect();
        let join = match joins {
            true => vec![peers[&1].to_string()],
            false => Vec::new(),
        };
        NodeConfig {
            node_id: id,
            listen: self.addrs[&id],
            data_dir: self.dir.path().join(format!("node-{id}")),
            initial_cluster,
            join,
            advertise: None,
            peer_listen: self.peer_addrs.get(&id).copied(),
            peer_advertise: None,
            placement: self.placement,
            raft: self.timings.clone(),
            kv: self.kv,
            clock: self.clocks[&id].clone(),
            faults: self.faults,
            metrics_listen: Some(self.metrics_addrs[&id]),
            etcd_listen: Some(SocketAddr::from(([127, 0, 0, 1], 0))),
            log: LogSettings::default(),
            access: self.access.clone(),
            tls: self.pki.as_ref().map(Pki::node_settings),
        }
    }

    /// Moves every node's wall clock forward by `ms`.
    pub fn advance_clocks_ms(&self, ms: u64) {
        for clock in self.clocks.values() {
            clock.advance_ms(ms);
        }
    }

    pub async fn start_node(&mut self, id: NodeId) {
        assert!(!self.nodes.contains_key(&id), "node {id} is running");
        let node = Node::start(self.config(id)).await.unwrap();
        self.nodes.insert(id, node);
    }

    pub async fn stop_node(&mut self, id: NodeId) {
        let node = self.nodes.remove(&id).expect("node is running");
        node.shutdown().await.unwrap();
    }

    pub fn running(&self) -> Vec<NodeId> {
        self.nodes.keys().copied().collect()
    }

    /// Node `id`'s view of the first data range.
    pub async fn range_status(&self, id: NodeId) -> RangeStatus {
        let status = self.client().status(&self.endpoint(id)).await.unwrap();
        first_range(&status.ranges)
            .cloned()
            .expect("the node serves the first data range")
    }

    /// Waits until node `leader` has purged its log of the first data range past `index`: a
    /// node that applied only up to `index` can catch up from a snapshot alone.
    pub async fn purged_past(&self, leader: NodeId, index: u64) {
        eventually(
            "the leader purges the log the lagging node needs",
            || async {
                let status = self.range_status(leader).await;
                (status.purged_index > index).then_some(())
            },
        )
        .await;
    }

    /// A 3-node cluster (quick timings, a snapshot every 20 entries, no log kept after one)
    /// in which one follower received the first range by snapshot: it was stopped after the
    /// put of `snap/0` and missed those of `snap/1` to `snap/40`, so its history starts at
    /// the snapshot while the others keep every event. The cluster, that follower, and the
    /// revision of `snap/0`.
    pub async fn with_a_replica_that_keeps_less_history() -> (Cluster, NodeId, Revision) {
        let timings = RaftTimings {
            snapshot_logs_since_last: 20,
            logs_kept_after_snapshot: 0,
            ..quick_timings()
        };
        let mut cluster = Cluster::start_with(3, timings).await;
        let leader = cluster.leader().await;
        let lagging = cluster.ids().into_iter().find(|id| *id != leader).unwrap();
        let lagging_last = cluster.range_status(lagging).await.last_log_index;
        let client = cluster.client();
        let first = client.put(b"snap/0", b"0", PutOptions::default()).await;
        cluster.stop_node(lagging).await;
        for i in 1..=40 {
            let key = format!("snap/{i}");
            let put = client.put(key.as_bytes(), b"v", PutOptions::default());
            put.await.unwrap();
        }
        cluster.purged_past(leader, lagging_last).await;
        cluster.start_node(lagging).await;
        cluster.applied_on(lagging, b"snap/40").await;
        (cluster, lagging, first.unwrap().revision)
    }

    /// Node `id`'s view of `range`, if it runs a group for it.
    pub async fn range_status_of(&self, id: NodeId, range: RangeId) -> Option<RangeStatus> {
        let status = self.status(id).await;
        status.ranges.into_iter().find(|r| r.range_id == range.0)
    }

    /// The running node `id` itself (its test hooks).
    pub fn node(&self, id: NodeId) -> &Node {
        &self.nodes[&id]
    }

    /// A raw gRPC client of node `id`'s Cluster service.
    pub async fn cluster_client(&self, id: NodeId) -> ClusterClient<Channel> {
        ClusterClient::connect(format!("http://{}", self.endpoint(id)))
            .await
            .unwrap()
    }

    /// Node `id`'s `Cluster.Status`.
    pub async fn status(&self, id: NodeId) -> StatusResponse {
        let mut client = self.cluster_client(id).await;
        client.status(StatusRequest {}).await.unwrap().into_inner()
    }

    /// Stops every node and starts them again on the same addresses and data dirs.
    pub async fn restart(mut self) -> Cluster {
        let ids = self.running();
        for id in &ids {
            self.stop_node(*id).await;
        }
        for id in ids {
            self.start_node(id).await;
        }
        self
    }

    /// Waits until node `id` has applied some write of `key`, and returns its follower read.
    pub async fn applied_on(&self, id: NodeId, key: &[u8]) -> GetResult {
        let client = self.client_of(id);
        eventually("the node applies the write", || async {
            let got = client.get(key, Consistency::Follower).await.ok()?;
            got.kv.is_some().then_some(got)
        })
        .await
    }

    /// Waits until every running node names the same leader of the first range and routes
    /// keys to it, and returns it: a follower learns the leader from the first append,
    /// before it applies the range's first entries and puts the range in its local table.
    pub async fn leader(&self) -> NodeId {
        let leader = self.leader_of(RangeId::FIRST).await;
        eventually(
            "every running node routes keys to the first range",
            || async {
                let routes = |id: &NodeId| {
                    let local = self.node(*id).local_ranges();
                    local.iter().any(|range| range.id == RangeId::FIRST)
                };
                self.running().iter().all(routes).then_some(())
            },
        )
        .await;
        leader
    }

    /// Waits until every running node names the same running leader of `range`, and
    /// returns it.
    pub async fn leader_of(&self, range: RangeId) -> NodeId {
        let client = self.client();
        eventually("the running nodes agree on a leader", || async {
            let mut leaders = Vec::new();
            for id in self.running() {
                let status = client.status(&self.endpoint(id)).await.ok()?;
                let found = status.ranges.iter().find(|r| r.range_id == range.0);
                leaders.push(found?.leader_id?);
            }
            let leader = *leaders.first()?;
            let agreed = leaders.iter().all(|other| *other == leader);
            (agreed && self.nodes.contains_key(&leader)).then_some(leader)
        })
        .await
    }

    pub async fn shutdown(mut self) {
        for id in self.running() {
            self.stop_node(id).await;
        }
    }
}

/// The status of the first data range (`RangeId::FIRST`) among a node's ranges.
pub fn first_range(ranges: &[RangeStatus]) -> Option<&RangeStatus> {
    ranges
        .iter()
        .find(|range| range.range_id == RangeId::FIRST.0)
}

/// `message` carrying `authorization: Bearer token`, for raw gRPC calls.
pub fn with_bearer<T>(token: &str, message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    let bearer = format!("Bearer {token}").parse().unwrap();
    request.metadata_mut().insert("authorization", bearer);
    request
}

/// Polls `probe` until it returns `Some`, failing the test after `WAIT_LIMIT`.
pub async fn eventually<T, F, Fut>(what: &str, probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    eventually_within(WAIT_LIMIT, what, probe).await
}

/// Polls `probe` until it returns `Some`, failing the test after `limit`.
pub async fn eventually_within<T, F, Fut>(limit: Duration, what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + limit;
    let mut ticks = tokio::time::interval(Duration::from_millis(25));
    loop {
        ticks.tick().await;
        if let Some(value) = probe().await {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "gave up waiting after {limit:?}: {what}"
        );
    }
}

/// With `KEEL_TEST_LOG` set (a `RUST_LOG`-style filter), the nodes' logs go to the test's
/// output.
fn init_logs() {
    if let Ok(filter) = std::env::var("KEEL_TEST_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_test_writer()
            .try_init();
    }
}

/// A free loopback address whose port lies below the kernel's ephemeral range: a stopped
/// node restarts on its address, and an outgoing connection (which takes an ephemeral port)
/// could otherwise hold it by then. Calls walk the ports from a start drawn once per
/// process, so two calls never return the same port.
fn free_addr() -> SocketAddr {
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    let ephemeral_start = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32_768);
    let low = 10_000u16.min(ephemeral_start / 2);
    let span = u32::from(ephemeral_start - low);
    let start = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |now| now.subsec_nanos())
        ^ std::process::id();
    let _ = NEXT.compare_exchange(u32::MAX, start % span, Ordering::SeqCst, Ordering::SeqCst);
    for _ in 0..span {
        let port = low + (NEXT.fetch_add(1, Ordering::SeqCst) % span) as u16;
        if let Ok(listener) = TcpListener::bind(("127.0.0.1", port)) {
            return listener.local_addr().unwrap();
        }
    }
    panic!("no free port below the ephemeral range");
}
