//! A running node: opens the store, starts the node's Raft groups, serves Kv, Lock,
//! Idempotency, Cluster and Raft over gRPC, initializes the cluster on first start, watches its
//! own health, runs the cleanup of expired keys, idle sessions, free locks and expired
//! idempotency records, and shuts down in order. Knows nothing of request semantics (see the
//! `*_service` modules).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use keel_proto::raft::raft_server::RaftServer;
use keel_proto::v1::cluster_server::ClusterServer;
use keel_proto::v1::idempotency_server::IdempotencyServer;
use keel_proto::v1::kv_server::KvServer;
use keel_proto::v1::lock_server::LockServer;
use keel_raft::{Groups, RaftGroup};
use keel_storage::{Store, StoreOptions};
use keel_types::{NodeAddr, NodeId, RangeId, limits};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;
use tracing::{Instrument, info, info_span, warn};

use crate::cleanup;
use crate::cluster_service::ClusterService;
use crate::config::NodeConfig;
use crate::health::Health;
use crate::idempotency_service::IdempotencyService;
use crate::kv_service::KvService;
use crate::lock_service::LockService;
use crate::peers::Peers;
use crate::raft_service::RaftService;
use crate::shared::Shared;
use crate::transport::GrpcTransport;

/// How often the node checks its store and Raft groups for a failure.
const HEALTH_CHECK_INTERVAL_MS: u64 = 100;
/// How long shutdown waits for in-flight requests before cancelling them.
const SHUTDOWN_GRACE_MS: u64 = 5_000;

/// A running node: gRPC server (Kv, Lock, Idempotency, Cluster, Raft) plus its Raft groups.
pub struct Node {
    node_id: NodeId,
    addr: SocketAddr,
    shared: Arc<Shared>,
    server: JoinHandle<Result<(), tonic::transport::Error>>,
    stop_server: oneshot::Sender<()>,
    watcher: JoinHandle<()>,
    cleaner: JoinHandle<()>,
}

impl Node {
    /// Binds `config.listen` and starts the node. The first start of a fresh cluster
    /// initializes it (on the node with the smallest id); a restart reuses the data dir.
    pub async fn start(config: NodeConfig) -> anyhow::Result<Node> {
        let listener = TcpListener::bind(config.listen)
            .await
            .with_context(|| format!("binding {}", config.listen))?;
        Node::start_on(config, listener).await
    }

    /// Starts the node on an already bound listener (tests bind port 0 first to learn the
    /// addresses of the initial cluster).
    pub async fn start_on(config: NodeConfig, listener: TcpListener) -> anyhow::Result<Node> {
        config.validate()?;
        let node_id = config.node_id;
        let addr = listener.local_addr()?;
        let span = info_span!("node", node_id);
        let (store, has_state) = open_store(&config).instrument(span.clone()).await?;
        let source = Some(config.listen.ip()).filter(|ip| !ip.is_unspecified());
        let peers = Arc::new(Peers::new(source));
        let transport = Arc::new(GrpcTransport::new(peers.clone()));
        let groups = Groups::new();
        let group = RaftGroup::start(node_id, RangeId::FIRST, &store, &config.raft, transport)
            .await
            .context("starting raft group")?;
        let group = groups.insert(group)?;
        let shared = Arc::new(Shared {
            node_id,
            addr: config.initial_cluster[&node_id].clone(),
            groups,
            store: store.clone(),
            peers,
            health: Health::new(store),
            timings: config.raft.clone(),
            kv: config.kv,
            clock: config.clock.clone(),
            faults: config.faults,
        });
        let (stop_server, stopped) = oneshot::channel();
        let server =
            tokio::spawn(serve(shared.clone(), listener, stopped).instrument(span.clone()));
        let watcher = tokio::spawn(watch_health(shared.clone()).instrument(span.clone()));
        let cleaner = tokio::spawn(cleanup::run(shared.clone()).instrument(span.clone()));
        let node = Node {
            node_id,
            addr,
            shared,
            server,
            stop_server,
            watcher,
            cleaner,
        };
        if let Err(error) = bootstrap(&config, has_state, &group).instrument(span).await {
            drop(group);
            node.shutdown().await?;
            return Err(error.context("bootstrapping the cluster"));
        }
        info!(node_id, %addr, "node started");
        Ok(node)
    }

    pub fn node_id(&self) -> NodeId {
        self.node_id
    }

    /// The address the gRPC server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
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
        self.watcher.abort();
        self.cleaner.abort();
        self.shared.groups.shutdown().await;
        let store = self.shared.store.clone();
        tokio::task::spawn_blocking(move || store.shutdown())
            .await
            .context("flushing the store")?;
        info!(node_id, "node stopped");
        Ok(())
    }
}

/// Opens DATA_DIR/keel.redb (creating the directories) and says whether the first range
/// already has Raft state, off the async workers.
async fn open_store(config: &NodeConfig) -> anyhow::Result<(Store, bool)> {
    let path = config.store_path();
    let snapshot_dir = config.snapshot_dir();
    let options = StoreOptions {
        lose_unsynced_writes: config.faults.lose_unsynced_writes,
    };
    tokio::task::spawn_blocking(move || -> anyhow::Result<(Store, bool)> {
        std::fs::create_dir_all(&snapshot_dir)
            .with_context(|| format!("creating {}", snapshot_dir.display()))?;
        let store = Store::open_with(&path, &snapshot_dir, options)
            .with_context(|| format!("opening {}", path.display()))?;
        let has_state = store.ranges()?.contains(&RangeId::FIRST);
        Ok((store, has_state))
    })
    .await?
}

/// Initializes the first range exactly once: only on the node with the smallest id, only when
/// its store holds no Raft state. Every other node waits to be contacted by the leader.
async fn bootstrap(config: &NodeConfig, has_state: bool, group: &RaftGroup) -> anyhow::Result<()> {
    if has_state {
        info!("raft state found; rejoining the cluster");
        return Ok(());
    }
    let bootstrap_node = config.bootstrap_node();
    if bootstrap_node != Some(config.node_id) {
        info!(
            ?bootstrap_node,
            "fresh node; waiting for the cluster to contact it"
        );
        return Ok(());
    }
    if group.is_initialized().await? {
        return Ok(());
    }
    let members: BTreeMap<NodeId, NodeAddr> = config
        .initial_cluster
        .iter()
        .map(|(id, addr)| (*id, NodeAddr::new(addr.clone())))
        .collect();
    info!(members = members.len(), "initializing the cluster");
    group.initialize(members).await?;
    Ok(())
}

async fn serve(
    shared: Arc<Shared>,
    listener: TcpListener,
    stopped: oneshot::Receiver<()>,
) -> Result<(), tonic::transport::Error> {
    let kv = KvServer::new(KvService::new(shared.clone()))
        .max_decoding_message_size(limits::GRPC_MESSAGE_BYTES_MAX)
        .max_encoding_message_size(limits::GRPC_MESSAGE_BYTES_MAX);
    let lock = LockServer::new(LockService::new(shared.clone()))
        .max_decoding_message_size(limits::GRPC_MESSAGE_BYTES_MAX)
        .max_encoding_message_size(limits::GRPC_MESSAGE_BYTES_MAX);
    let idempotency = IdempotencyServer::new(IdempotencyService::new(shared.clone()))
        .max_decoding_message_size(limits::GRPC_MESSAGE_BYTES_MAX)
        .max_encoding_message_size(limits::GRPC_MESSAGE_BYTES_MAX);
    let cluster = ClusterServer::new(ClusterService::new(shared.clone()));
    let raft = RaftServer::new(RaftService::new(shared.groups.clone()))
        .max_decoding_message_size(limits::GRPC_MESSAGE_BYTES_MAX)
        .max_encoding_message_size(limits::GRPC_MESSAGE_BYTES_MAX);
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    let router = Server::builder()
        .add_service(kv)
        .add_service(lock)
        .add_service(idempotency)
        .add_service(cluster)
        .add_service(raft);
    #[cfg(feature = "fault-injection")]
    let router = router.add_service(keel_proto::test::v1::faults_server::FaultsServer::new(
        crate::faults::service::FaultsService::new(shared.clone()),
    ));
    router
        .serve_with_incoming_shutdown(incoming, async {
            let _ = stopped.await;
        })
        .await
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
