//! A running node: opens the store, starts the node's Raft groups (the first range, the meta
//! range and every range of its store), serves Kv, Lock, Idempotency, Cluster and Raft over
//! gRPC (on one port, or with `--peer-listen` on two: the client port without Raft, the peer
//! port for calls from other nodes only; `access/port.rs`), initializes the cluster on first start, watches its own health, and runs its
//! background tasks: cleanup of expired keys, idle sessions, free locks and expired
//! idempotency records; history compaction (`ranges/compaction.rs`); consistency checks
//! (`ranges/check.rs`); the range watcher (`ranges/watch.rs`); the descriptor publisher; the split
//! driver; heartbeats, the rebalancer and the quiescence watcher (`cluster/quiescence.rs`); the
//! `grpc.health.v1` statuses; the metrics endpoint and etcd's API (`etcd`) when configured.
//! Every gRPC request of the Keel ports passes
//! the metering layer (`metrics`). Shuts down in order. Knows nothing of request semantics
//! (see `api`).

pub(crate) mod restore;
pub(crate) mod run;

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::FutureExt;
use keel_proto::raft::raft_server::RaftServer;
use keel_proto::v1::cluster_server::ClusterServer;
use keel_proto::v1::idempotency_server::IdempotencyServer;
use keel_proto::v1::kv_server::KvServer;
use keel_proto::v1::lock_server::LockServer;
use keel_raft::Groups;
use keel_storage::{Store, StoreOptions};
use keel_types::{NodeAddr, NodeId, RangeDescriptor, RangeId, limits};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;
use tonic_health::pb::health_server::{Health, HealthServer};
use tonic_health::server::HealthReporter;
use tracing::{Instrument, info, info_span, warn};

use crate::access::port::{Port, PortGate};
use crate::access::tls::{CallerLayer, TlsSettings};
use crate::api::cluster::ClusterService;
use crate::api::health;
use crate::api::idempotency::IdempotencyService;
use crate::api::kv::KvService;
use crate::api::lock::LockService;
use crate::api::raft::{self, RaftService};
use crate::api::reflection;
use crate::api::tenant_usage;
use crate::cluster::heartbeat;
use crate::cluster::join;
use crate::cluster::quiescence;
use crate::cluster::rebalancer;
use crate::config::NodeConfig;
use crate::locks::queues::LockQueues;
use crate::metrics::{MeteredLayer, Metrics};
use crate::peer::batch::{Lane, Links};
use crate::peer::channels::Peers;
use crate::peer::transport::GrpcTransport;
use crate::ranges::meta::META_REPLICAS;
use crate::ranges::publisher;
use crate::ranges::split_driver;
use crate::ranges::{check, cleanup, compaction};
use crate::ranges::{lookup, watch};
use crate::requests::router::Audience;
use crate::shared::Shared;
use crate::shared::health::Health as NodeHealth;
use crate::shared::heartbeats::Heartbeats;
use crate::shared::leader_settling::LeaderSettling;
use crate::shared::load::LoadTracker;
use crate::shared::meta_leadership::MetaLeadership;
use crate::shared::prepared::Prepared;
use crate::shared::published::Published;
use crate::shared::range_tables::RangeTables;
use crate::shared::split_thresholds::SplitThresholds;

/// How often the node checks its store and Raft groups for a failure.
const HEALTH_CHECK_INTERVAL_MS: u64 = 100;
/// How long shutdown waits for in-flight requests before cancelling them.
const SHUTDOWN_GRACE_MS: u64 = 5_000;

/// A running node: gRPC server (Kv, Lock, Idempotency, Cluster, Raft) plus its Raft groups.
pub struct Node {
    node_id: NodeId,
    addr: SocketAddr,
    /// Where the peer port listens, when the node has one.
    peer_addr: Option<SocketAddr>,
    /// Where the metrics endpoint listens, when configured.
    metrics_addr: Option<SocketAddr>,
    etcd_addr: Option<SocketAddr>,
    shared: Arc<Shared>,
    server: JoinHandle<Result<(), tonic::transport::Error>>,
    stop_server: oneshot::Sender<()>,
    /// Health watch, cleanup, history compaction, range watcher, descriptor publisher, split driver, heartbeats,
    /// rebalancer, health statuses, metrics endpoint.
    tasks: Vec<JoinHandle<()>>,
}

impl Node {
    /// Binds `config.listen` (and `config.peer_listen`) and starts the node. The first start of a fresh cluster
    /// initializes it (on the node with the smallest id); a restart reuses the data dir.
    pub async fn start(config: NodeConfig) -> anyhow::Result<Node> {
        let listener = TcpListener::bind(config.listen)
            .await
            .with_context(|| format!("binding {}", config.listen))?;
        Node::start_on(config, listener).await
    }

    /// Starts the node on an already bound listener (tests bind port 0 first to learn the
    /// addresses of the initial cluster); the peer port, when configured, is bound here.
    pub async fn start_on(config: NodeConfig, listener: TcpListener) -> anyhow::Result<Node> {
        config.validate()?;
        let node_id = config.node_id;
        let addr = listener.local_addr()?;
        let peer_listener = match config.peer_listen {
            Some(peer_listen) => Some(
                TcpListener::bind(peer_listen)
                    .await
                    .with_context(|| format!("binding the peer address {peer_listen}"))?,
            ),
            None => None,
        };
        let peer_addr = peer_listener
            .as_ref()
            .map(TcpListener::local_addr)
            .transpose()?;
        let span = info_span!("node", node_id);
        let metrics_listener = bind_optional(config.metrics_listen, "metrics").await?;
        let metrics_addr = metrics_listener
            .as_ref()
            .map(TcpListener::local_addr)
            .transpose()?;
        let etcd_listener = bind_optional(config.etcd_listen, "etcd").await?;
        let etcd_addr = etcd_listener
            .as_ref()
            .map(TcpListener::local_addr)
            .transpose()?;
        let (store, stored) = open_store(&config).instrument(span.clone()).await?;
        let metrics = Metrics::new(config.clock.clone(), &reflection::served());
        store.observe_commits(metrics.storage.clone());
        let awaits_bootstrap = awaited_ranges(&config, &store, &stored).await?;
        let dialling_from = config.peer_listen.unwrap_or(config.listen);
        let source = Some(dialling_from.ip()).filter(|ip| !ip.is_unspecified());
        let peer_tls = config.tls.as_ref().map(TlsSettings::peer_config);
        let peers = Arc::new(Peers::new(node_id, source, peer_tls));
        let transport = Arc::new(GrpcTransport::new(peers.clone(), node_id));
        let groups = Groups::on_store(node_id, store.clone(), config.raft.clone(), transport);
        let shared = Arc::new(Shared {
            node_id,
            addr: config.addr()?,
            client_addr: config.client_addr()?,
            peer_port: config.peer_listen.is_some(),
            cluster: config.initial_cluster.clone(),
            join: config.join.clone(),
            awaits_bootstrap,
            groups,
            store: store.clone(),
            ranges: RangeTables::default(),
            load: LoadTracker::new(config.clock.clone()),
            published: Published::default(),
            forwards: Links::new(peers.clone(), node_id, Lane::Forward),
            peers,
            health: NodeHealth::new(store),
            heartbeats: Heartbeats::default(),
            settling: LeaderSettling::new(node_id, Instant::now()),
            prepared: Prepared::default(),
            meta_leadership: MetaLeadership::default(),
            placement: config.placement,
            timings: config.raft.clone(),
            kv: config.kv,
            split: SplitThresholds::new(config.kv.split),
            clock: config.clock.clone(),
            faults: config.faults,
            metrics,
            events: Default::default(),
            lock_waiters: Default::default(),
            watch_pages: Default::default(),
            watch_ids: Default::default(),
            checks: Default::default(),
            access: config.access.clone(),
            tls: config.tls.clone(),
        });
        let started = start_groups(&shared, &stored)
            .instrument(span.clone())
            .await;
        if let Err(error) = started {
            shared.groups.shutdown().await;
            shared.store.shutdown();
            return Err(error.context("starting raft groups"));
        }
        let (reporter, health) = tonic_health::server::health_reporter();
        health::not_serving(&reporter).await;
        let (stop_server, stopped) = oneshot::channel();
        let listeners = Listeners {
            client: listener,
            peer: peer_listener,
        };
        let serving = serve(shared.clone(), listeners, health, stopped);
        let server = tokio::spawn(serving.instrument(span.clone()));
        // The listener was bound before the groups started: peers reach the node from now on.
        quiescence::start_hold_clock(&shared);
        let listeners = Extra {
            metrics: metrics_listener,
            etcd: etcd_listener,
        };
        let tasks = spawn_tasks(&shared, reporter, listeners, &span);
        let node = Node {
            node_id,
            addr,
            peer_addr,
            metrics_addr,
            etcd_addr,
            shared,
            server,
            stop_server,
            tasks,
        };
        if let Err(error) = bootstrap(&config, &node.shared)
            .instrument(span.clone())
            .await
        {
            node.shutdown().await?;
            return Err(error.context("bootstrapping the cluster"));
        }
        if !config.join.is_empty() {
            let joining = join::run(node.shared.clone()).instrument(span);
            let mut node = node;
            node.tasks.push(tokio::spawn(joining));
            info!(node_id, %addr, "node started; joining the cluster");
            return Ok(node);
        }
        info!(node_id, %addr, "node started");
        Ok(node)
    }

    pub fn node_id(&self) -> NodeId {
        self.node_id
    }

    /// The address the gRPC server listens on (the client port, with a peer port).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The address the peer port listens on, when the node has one.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.peer_addr
    }

    /// The address the metrics endpoint listens on, when the node serves metrics.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    /// The address etcd's API listens on, when the node serves it.
    pub fn etcd_addr(&self) -> Option<SocketAddr> {
        self.etcd_addr
    }

    /// Resolves with the reason once the node has stopped serving (storage failure, a Raft
    /// group stopped). The node stays up, answering `Fatal`, until `shutdown`.
    pub async fn failed(&self) -> String {
        self.shared.health.stopped().await
    }

    /// Test hook: makes the store's next commit fail, as a disk error would. The node then
    /// stops serving (requests get `Fatal`, status says unhealthy, `failed` resolves).
    #[doc(hidden)]
    pub fn inject_storage_failure(&self) {
        self.shared.store.inject_commit_failure();
    }

    /// Test hook: the node's local range table (the ranges with state it routes keys to).
    #[doc(hidden)]
    pub fn local_ranges(&self) -> Vec<RangeDescriptor> {
        self.shared.ranges.local_ranges()
    }

    /// Test hook: replaces the node's local range table, as if it had not yet seen the
    /// store's latest range event (a stale table until the next event or a `KeyOutOfRange`).
    #[doc(hidden)]
    pub fn set_local_ranges(&self, ranges: Vec<RangeDescriptor>) {
        self.shared.ranges.set_local(ranges);
    }

    /// Stops accepting requests, lets in-flight ones finish (bounded), stops the Raft groups
    /// and flushes the store.
    pub async fn shutdown(self) -> anyhow::Result<()> {
        let node_id = self.node_id;
        self.shared.health.set_closing();
        let _ = self.stop_server.send(());
        let mut server = self.server;
        let grace = Duration::from_millis(SHUTDOWN_GRACE_MS);
        match tokio::time::timeout(grace, &mut server).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(error))) => warn!(node_id, %error, "grpc server failed"),
            Ok(Err(error)) => warn!(node_id, %error, "grpc server task failed"),
            Err(_) => {
                warn!(
                    node_id,
                    ?grace,
                    "in-flight requests did not finish; cancelling them"
                );
                server.abort();
            }
        }
        for task in &self.tasks {
            task.abort();
        }
        // Wait until each is gone, so what it held (the metrics listener) is released and a
        // restart on the same addresses can bind them.
        for task in self.tasks {
            let _ = task.await;
        }
        self.shared.groups.shutdown().await;
        let store = self.shared.store.clone();
        tokio::task::spawn_blocking(move || store.shutdown())
            .await
            .context("flushing the store")?;
        info!(node_id, "node stopped");
        Ok(())
    }
}

/// Binds `addr`, the node's `what` address, when it has one.
async fn bind_optional(
    addr: Option<SocketAddr>,
    what: &str,
) -> anyhow::Result<Option<TcpListener>> {
    let Some(addr) = addr else {
        return Ok(None);
    };
    let listener = TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding the {what} address {addr}"))?;
    Ok(Some(listener))
}

/// The listeners of what a node serves besides gRPC, when it serves them.
struct Extra {
    metrics: Option<TcpListener>,
    etcd: Option<TcpListener>,
}

/// Starts the node's background tasks, each in the node's span: health watch, cleanup,
/// history compaction, consistency checks, range watcher, publisher, split driver, heartbeats, rebalancer, health statuses and the
/// metrics endpoint and etcd's API (when it has their listeners).
fn spawn_tasks(
    shared: &Arc<Shared>,
    reporter: HealthReporter,
    listeners: Extra,
    span: &tracing::Span,
) -> Vec<JoinHandle<()>> {
    let mut tasks = vec![
        tokio::spawn(watch_health(shared.clone()).instrument(span.clone())),
        tokio::spawn(cleanup::run(shared.clone()).instrument(span.clone())),
        tokio::spawn(compaction::run(shared.clone()).instrument(span.clone())),
        tokio::spawn(check::run(shared.clone()).instrument(span.clone())),
        tokio::spawn(watch::watch(shared.clone()).instrument(span.clone())),
        tokio::spawn(publisher::run(shared.clone()).instrument(span.clone())),
        tokio::spawn(split_driver::run(shared.clone()).instrument(span.clone())),
        tokio::spawn(heartbeat::run(shared.clone()).instrument(span.clone())),
        tokio::spawn(heartbeat::ping(shared.clone()).instrument(span.clone())),
        tokio::spawn(rebalancer::run(shared.clone()).instrument(span.clone())),
        tokio::spawn(quiescence::watch(shared.clone()).instrument(span.clone())),
        tokio::spawn(health::run(shared.clone(), reporter).instrument(span.clone())),
    ];
    if let Some(access) = &shared.access {
        let counting = tenant_usage::run(shared.clone(), access.clone());
        tasks.push(tokio::spawn(counting.instrument(span.clone())));
    }
    if let Some(listener) = listeners.metrics {
        let addr = listener.local_addr().ok();
        let serving = crate::api::metrics::serve(listener, shared.clone());
        tasks.push(tokio::spawn(serving.instrument(span.clone())));
        info!(metrics = ?addr, "serving metrics at /metrics");
    }
    if let Some(listener) = listeners.etcd {
        let addr = listener.local_addr().ok();
        let serving = crate::etcd::serve(shared.clone(), listener, std::future::pending());
        let serving = async move {
            if let Err(error) = serving.await {
                warn!(%error, "etcd API server failed");
            }
        };
        tasks.push(tokio::spawn(serving.instrument(span.clone())));
        info!(etcd = ?addr, "serving etcd's API");
    }
    tasks
}

/// The ranges a store held when the node opened it.
struct Stored {
    /// Ranges with persisted Raft state.
    raft: BTreeSet<RangeId>,
    /// Ranges whose removal a crash interrupted.
    removals: Vec<RangeId>,
}

impl Stored {
    fn has(&self, range: RangeId) -> bool {
        self.raft.contains(&range)
    }
}

/// Of the first range and the meta range, those this node waits to receive from the
/// bootstrap's log: it is one of their initial replicas (every node of the initial cluster
/// for the first range, the first `META_REPLICAS` for the meta range) and its store has
/// never held state of them (no state now, and none removed).
async fn awaited_ranges(
    config: &NodeConfig,
    store: &Store,
    stored: &Stored,
) -> anyhow::Result<BTreeSet<RangeId>> {
    let initial: Vec<NodeId> = config.initial_cluster.keys().copied().collect();
    let meta_replicas = &initial[..initial.len().min(META_REPLICAS)];
    let mut awaited = BTreeSet::new();
    for (range, replicas) in [
        (RangeId::FIRST, &initial[..]),
        (RangeId::META, meta_replicas),
    ] {
        let fresh = !stored.has(range) && !store.was_removed(range).await?;
        if fresh && replicas.contains(&config.node_id) {
            awaited.insert(range);
        }
    }
    Ok(awaited)
}

/// Opens DATA_DIR/keel.redb (creating the directories) and lists the ranges with Raft state
/// in it, off the async workers.
async fn open_store(config: &NodeConfig) -> anyhow::Result<(Store, Stored)> {
    let path = config.store_path();
    let snapshot_dir = config.snapshot_dir();
    let options = StoreOptions {
        lose_unsynced_writes: config.faults.lose_unsynced_writes,
    };
    let unfinished = config.data_dir.join(crate::node::restore::RESTORE_MARKER);
    tokio::task::spawn_blocking(move || -> anyhow::Result<(Store, Stored)> {
        if unfinished.exists() {
            anyhow::bail!(
                "{} holds a restore that did not finish ({} is there): delete the data dir and run keel restore again",
                unfinished.parent().map_or_else(String::new, |dir| dir.display().to_string()),
                crate::node::restore::RESTORE_MARKER
            );
        }
        std::fs::create_dir_all(&snapshot_dir)
            .with_context(|| format!("creating {}", snapshot_dir.display()))?;
        let store = Store::open_with(&path, &snapshot_dir, options)
            .with_context(|| format!("opening {}", path.display()))?;
        let raft = store.ranges()?.into_iter().collect();
        let removals = store.removals()?;
        Ok((store, Stored { raft, removals }))
    })
    .await?
}

/// Finishes the removals a crash interrupted, starts the groups of every range of the store
/// (held: their leaders may list them as quiet, see `cluster/quiescence.rs`) and of the ranges this
/// node awaits from the bootstrap, and reads the store's ranges into the local range table.
async fn start_groups(shared: &Shared, stored: &Stored) -> anyhow::Result<()> {
    for range in &stored.removals {
        info!(%range, "finishing the removal of a replica");
        shared.store.remove_range(*range).await?;
    }
    for range in &stored.raft {
        quiescence::hold(shared, &*shared.groups.ensure(*range).await?);
    }
    for range in &shared.awaits_bootstrap {
        shared.groups.ensure(*range).await?;
    }
    lookup::refresh_local(shared).await?;
    Ok(())
}

/// Initializes the first range and the meta range exactly once: only on the node with the
/// smallest id, only for a range its store has never held (no Raft state, not removed). The
/// first range gets every initial member as a voter, the meta range the first
/// `META_REPLICAS` by id. Every other node waits to be contacted by the leaders. A store of a
/// release before the meta range (a first range, no meta range) gets its meta range on the
/// next start of that node.
async fn bootstrap(config: &NodeConfig, shared: &Shared) -> anyhow::Result<()> {
    let bootstrap_node = config.bootstrap_node();
    if bootstrap_node != Some(config.node_id) {
        if shared.awaits_bootstrap.contains(&RangeId::FIRST) {
            info!(
                ?bootstrap_node,
                "fresh node; waiting for the cluster to contact it"
            );
        } else {
            info!("rejoining the cluster");
        }
        return Ok(());
    }
    let members: BTreeMap<NodeId, NodeAddr> = config
        .initial_cluster
        .iter()
        .map(|(id, addr)| (*id, NodeAddr::new(addr.clone())))
        .collect();
    let meta_members = members
        .iter()
        .take(META_REPLICAS)
        .map(|(id, addr)| (*id, addr.clone()))
        .collect();
    for (range, members) in [(RangeId::FIRST, members), (RangeId::META, meta_members)] {
        if !shared.awaits_bootstrap.contains(&range) {
            info!(%range, "held before; rejoining");
            continue;
        }
        let group = shared.groups.ensure(range).await?;
        if group.is_initialized().await? {
            continue;
        }
        info!(%range, members = members.len(), "initializing");
        group.initialize(members).await?;
    }
    Ok(())
}

/// The sockets the node serves on: its client port (its one port without `--peer-listen`)
/// and its peer port.
struct Listeners {
    client: TcpListener,
    peer: Option<TcpListener>,
}

/// Serves the node's gRPC services until `stopped`: on one port every service; with a peer
/// port, the client port without Raft and the peer port with Raft and the services other
/// nodes call, each behind its `PortGate`. Both share the metering and the shutdown.
async fn serve<H: Health>(
    shared: Arc<Shared>,
    listeners: Listeners,
    health: HealthServer<H>,
    stopped: oneshot::Receiver<()>,
) -> Result<(), tonic::transport::Error> {
    let stop = stopped.map(drop).shared();
    // One set of lock queues for the node: an acquire waits in it and a release hands the
    // lock on through it whichever port or stream each came in by.
    let queues = LockQueues::new(shared.clone());
    let Some(peer_listener) = listeners.peer else {
        let port = Served {
            gate: Port::Shared,
            audience: Audience::Peers,
            raft: true,
            faults: true,
        };
        return serve_port(&shared, &queues, port, listeners.client, health, stop).await;
    };
    let node = shared.node_id;
    let clients = Served {
        gate: Port::Client {
            node,
            peer_addr: shared.addr.clone(),
        },
        audience: Audience::Clients,
        raft: false,
        faults: true,
    };
    let peers = Served {
        gate: Port::Peer {
            node,
            addr: shared.addr.clone(),
            client_addr: shared.client_addr.clone(),
            tls: shared.tls.is_some(),
        },
        audience: Audience::Peers,
        raft: true,
        faults: false,
    };
    let client_port = serve_port(
        &shared,
        &queues,
        clients,
        listeners.client,
        health.clone(),
        stop.clone(),
    );
    let peer_port = serve_port(&shared, &queues, peers, peer_listener, health, stop);
    tokio::try_join!(client_port, peer_port).map(drop)
}

/// What one server of the node serves: who its gate lets in, whom its answers are for, and
/// whether it serves Raft.
struct Served {
    gate: Port,
    audience: Audience,
    raft: bool,
    /// The test faults (feature `fault-injection`), which a harness calls as a client.
    #[cfg_attr(not(feature = "fault-injection"), allow(dead_code))]
    faults: bool,
}

async fn serve_port<H: Health>(
    shared: &Arc<Shared>,
    queues: &Arc<LockQueues>,
    served: Served,
    listener: TcpListener,
    health: HealthServer<H>,
    stop: impl Future<Output = ()> + Send + 'static,
) -> Result<(), tonic::transport::Error> {
    let audience = served.audience;
    let kv = KvServer::new(KvService::new(shared.clone(), audience))
        .max_decoding_message_size(limits::GRPC_MESSAGE_BYTES_MAX)
        .max_encoding_message_size(limits::GRPC_MESSAGE_BYTES_MAX);
    let lock = LockServer::new(LockService::new(shared.clone(), audience, queues.clone()))
        .max_decoding_message_size(limits::GRPC_MESSAGE_BYTES_MAX)
        .max_encoding_message_size(limits::GRPC_MESSAGE_BYTES_MAX);
    let idempotency = IdempotencyServer::new(IdempotencyService::new(shared.clone(), audience))
        .max_decoding_message_size(limits::GRPC_MESSAGE_BYTES_MAX)
        .max_encoding_message_size(limits::GRPC_MESSAGE_BYTES_MAX);
    let cluster = ClusterServer::new(ClusterService::new(shared.clone(), audience));
    let raft = served.raft.then(|| {
        let raft = RaftServer::new(RaftService::new(shared.clone(), queues.clone()))
            .max_decoding_message_size(limits::GRPC_MESSAGE_BYTES_MAX)
            .max_encoding_message_size(limits::GRPC_MESSAGE_BYTES_MAX);
        InterceptedService::new(raft, raft::peers_only)
    });
    let reflection = reflection::v1_service().expect("the built-in descriptor sets are valid");
    let reflection_alpha =
        reflection::v1alpha_service().expect("the built-in descriptor sets are valid");
    let metered = MeteredLayer::new(shared.metrics.requests.clone(), shared.node_id);
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    let mut server = Server::builder();
    if let Some(tls) = &shared.tls {
        server = server.tls_config(tls.server_config())?;
    }
    // Outermost first: the caller is known before the metering and the gate look.
    let router = server
        .layer(CallerLayer::new(shared.tls.is_some()))
        .layer(metered)
        .layer(PortGate::new(served.gate))
        .add_service(kv)
        .add_service(lock)
        .add_service(idempotency)
        .add_service(cluster)
        .add_optional_service(raft)
        .add_service(health)
        .add_service(reflection)
        .add_service(reflection_alpha);
    // The test faults are for a harness, a client: on the client port or the one port.
    #[cfg(feature = "fault-injection")]
    let router = router.add_optional_service(served.faults.then(|| {
        let faults = crate::api::faults::FaultsService::new(shared.clone());
        keel_proto::test::v1::faults_server::FaultsServer::new(faults)
    }));
    router.serve_with_incoming_shutdown(incoming, stop).await
}

/// Marks the node failed as soon as its store is poisoned or a group's Raft stops.
async fn watch_health(shared: Arc<Shared>) {
    let mut tick = tokio::time::interval(Duration::from_millis(HEALTH_CHECK_INTERVAL_MS));
    loop {
        tick.tick().await;
        if shared.health.check().is_err() {
            return;
        }
        if let Some(reason) = shared.groups.all().iter().find_map(|g| g.failure()) {
            shared.health.fail(reason);
            return;
        }
    }
}
