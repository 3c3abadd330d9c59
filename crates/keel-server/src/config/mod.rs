//! Node settings: the validated `NodeConfig`, built from the `keel serve` flags and the
//! optional TOML file with the same keys (`serve_args.rs`, which says how a setting is
//! added). The settings structs here name their fields after the setting keys and hold the
//! defaults; `from_args` fills them by key and reads by hand only the settings it parses or
//! checks. Knows nothing of the network, Raft or storage internals.
//!
//! The parsers here are hand-written on purpose: the initial cluster (`1=host:port,...`) and
//! join lists are Keel's own formats, and `is_host_port` checks syntax only, where
//! `ToSocketAddrs` would resolve names at start and `http::uri::Authority` would also take
//! `user@host:port`. Durations and sizes are integers with the unit in the key (`_ms`,
//! `_secs`, `_bytes`), so there is no duration or size parser to hand to a crate.

pub(crate) mod faults;
pub(crate) mod logging;
mod serve_args;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use keel_raft::RaftTimings;
use keel_types::{NodeId, SharedClock, SystemClock, limits};
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::access::Access;
use crate::access::tls::{TlsError, TlsPart, TlsSettings};
use crate::config::faults::Faults;
#[cfg(test)]
use crate::config::logging::LogFormat;
use crate::config::logging::LogSettings;
pub use crate::config::serve_args::ServeArgs;
use crate::config::serve_args::overlay;

/// A node's settings, validated.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    pub node_id: NodeId,
    /// Where the gRPC server listens; also the address peers and clients use.
    pub listen: SocketAddr,
    pub data_dir: PathBuf,
    /// Node id -> "host:port" of every node of the first cluster; empty for a node that joins
    /// a running cluster.
    pub initial_cluster: BTreeMap<NodeId, String>,
    /// Addresses of running nodes a new node joins the cluster through (instead of an
    /// initial cluster); it uses them until it knows the cluster.
    pub join: Vec<String>,
    /// The address clients use for this node ("host:port"; default: the listen address).
    /// Without `peer_listen` it is also the address peers use when the node joins (a node of
    /// the initial cluster has its peer address there).
    pub advertise: Option<String>,
    /// Where the Raft service is served, apart from `listen`; `None`: one port for clients
    /// and peers.
    pub peer_listen: Option<SocketAddr>,
    /// The address peers use for this node when it joins, with `peer_listen` (default:
    /// `peer_listen`).
    pub peer_advertise: Option<String>,
    /// How ranges are placed on nodes and healed.
    pub placement: PlacementSettings,
    pub raft: RaftTimings,
    pub kv: KvSettings,
    /// Wall-clock time for TTL stamps, TTL visibility and session starts (a seam: tests
    /// give each node a clock they control).
    pub clock: SharedClock,
    /// Test-only faults; refused unless built with the `fault-injection` feature.
    pub faults: Faults,
    /// Where to serve Prometheus metrics (`GET /metrics`); none by default.
    pub metrics_listen: Option<SocketAddr>,
    /// Where to serve etcd's v3 API (`etcd`); none by default.
    pub etcd_listen: Option<SocketAddr>,
    /// Log format and level (used by `keel serve`; a node started in-process leaves its
    /// host's logging alone).
    pub log: LogSettings,
    /// The tokens of `--auth-tokens`; `None` = authentication off (one namespace).
    pub access: Option<Arc<Access>>,
    /// The node's certificate, key and cluster CA; with them the node serves TLS only and
    /// calls its peers over TLS (mutual). None: plaintext everywhere.
    pub tls: Option<TlsSettings>,
}

/// Settings of the key-value state a node keeps, and of how it is cut into ranges. Each field
/// with a `keel serve` setting is named (in serde) after its key, and filled from it by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvSettings {
    /// How long an idle client session and its request records are kept: a retry within it
    /// is answered from the record, a retry after it gets `RequestIdExpired`.
    pub dedup_window_ms: u64,
    /// How often a leader looks for expired keys and idle sessions to remove.
    pub cleanup_interval_ms: u64,
    /// How long each replica keeps a range's events.
    pub history_retention_ms: u64,
    /// Most bytes of events each replica keeps per range.
    pub history_retention_bytes: u64,
    /// How often a leader checks that the replicas of each range it leads agree (a hash of
    /// the range at one log index on every replica); 0: never on its own.
    pub consistency_check_interval_ms: u64,
    /// When the ranges this node leads split.
    #[serde(flatten)]
    pub split: SplitSettings,
}

impl Default for KvSettings {
    fn default() -> Self {
        KvSettings {
            dedup_window_ms: 10 * 60 * 1000,
            cleanup_interval_ms: 1_000,
            history_retention_ms: 60 * 60 * 1000,
            history_retention_bytes: 64 * 1024 * 1024,
            consistency_check_interval_ms: 24 * 60 * 60 * 1000,
            split: SplitSettings::default(),
        }
    }
}

/// When a range splits by itself: the fields of `keel_meta::SplitPolicy` (same defaults,
/// checked by a test of the split driver), and how often a leader checks its ranges. Each
/// field is named (in serde) after the key of its `keel serve` setting, and filled from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SplitSettings {
    /// A range holding more bytes (keys + values) splits in two halves of about equal size.
    #[serde(rename = "range_split_bytes")]
    pub range_bytes_max: u64,
    /// A range serving more requests than this in every one of the last `load_secs` seconds
    /// splits at the median of its sampled request keys; 0 turns load splits off.
    #[serde(rename = "range_split_requests_per_sec")]
    pub requests_per_sec_max: u64,
    /// Seconds the load must last.
    #[serde(rename = "range_split_load_secs")]
    pub load_secs: u64,
    /// How often a leader checks the ranges it leads.
    #[serde(rename = "split_check_interval_ms")]
    pub check_interval_ms: u64,
}

impl Default for SplitSettings {
    /// 64 MiB, or more than 2,500 requests/s for 10 s, checked every second (see
    /// `keel_meta::SplitPolicy::default` for why).
    fn default() -> Self {
        SplitSettings {
            range_bytes_max: 64 * 1024 * 1024,
            requests_per_sec_max: 2_500,
            load_secs: 10,
            check_interval_ms: 1_000,
        }
    }
}

/// How the cluster keeps ranges replicated and balanced (on the meta range's leader). Each
/// field is named after the key of its `keel serve` setting, and filled from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlacementSettings {
    /// Voters each range should have, on distinct nodes.
    pub replication_factor: u64,
    /// A node not heard from for this long is dead: its replicas are re-created elsewhere.
    pub node_dead_after_ms: u64,
    /// How often the rebalancer looks at the cluster.
    pub rebalance_interval_ms: u64,
}

impl Default for PlacementSettings {
    /// 3 replicas (a range survives one lost node); a node is dead after 5 minutes without a
    /// heartbeat, so a restart or a short outage does not copy its ranges; a look every second.
    fn default() -> Self {
        PlacementSettings {
            replication_factor: 3,
            node_dead_after_ms: 5 * 60 * 1000,
            rebalance_interval_ms: 1_000,
        }
    }
}

/// Bounds of the placement settings.
const REPLICATION_FACTOR_MAX: u64 = 7;
const NODE_DEAD_AFTER_MS_MIN: u64 = 1_000;
const NODE_DEAD_AFTER_MS_MAX: u64 = 24 * 60 * 60 * 1000;
const REBALANCE_INTERVAL_MS_MIN: u64 = 10;
const REBALANCE_INTERVAL_MS_MAX: u64 = 60_000;

/// Shortest dedup window a node accepts: a client must be able to retry within it.
const DEDUP_WINDOW_MS_MIN: u64 = 1_000;
/// Bounds of the cleanup interval.
const CLEANUP_INTERVAL_MS_MIN: u64 = 10;
const CLEANUP_INTERVAL_MS_MAX: u64 = 60_000;
/// Longest `--consistency-check-interval-ms`: 30 days.
const CHECK_INTERVAL_MS_MAX: u64 = 30 * 24 * 60 * 60 * 1000;
/// Bounds of the split size: below 1 KiB a range splits on almost every write; above 64 GiB
/// a new replica waits for a snapshot of that size.
const RANGE_SPLIT_BYTES_MIN: u64 = 1024;
const RANGE_SPLIT_BYTES_MAX: u64 = 64 * 1024 * 1024 * 1024;
/// Longest sustained load a split may wait for: the seconds a node keeps per range
/// (`keel_meta::limits::LOAD_WINDOW_SECS`, checked by a test of the split driver).
pub(crate) const RANGE_SPLIT_LOAD_SECS_MAX: u64 = 60;
/// Bounds of the split check interval.
const SPLIT_CHECK_INTERVAL_MS_MIN: u64 = 10;
const SPLIT_CHECK_INTERVAL_MS_MAX: u64 = 60_000;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ConfigError {
    #[error("missing setting {0}: pass --{1} or set {0} in the config file")]
    Missing(&'static str, &'static str),
    #[error("reading config file {path}: {message}")]
    File { path: PathBuf, message: String },
    #[error("a path setting is not UTF-8; keel serve takes UTF-8 paths only")]
    PathNotUtf8,
    #[error("initial cluster entry {entry:?} is malformed: {message}")]
    Entry { entry: String, message: String },
    #[error("initial cluster is empty")]
    EmptyCluster,
    #[error(
        "missing setting initial_cluster or join: pass --initial-cluster to start a cluster or --join to join one"
    )]
    NoCluster,
    #[error("initial_cluster and join are both set: a node starts a cluster or joins one")]
    ClusterAndJoin,
    #[error("join address {0:?} is not host:port")]
    JoinAddress(String),
    #[error(
        "advertised address {0:?} cannot be dialled: give --advertise host:port (or a listen address with a specific IP and port)"
    )]
    Advertise(String),
    #[error(
        "advertised peer address {0:?} cannot be dialled: give --peer-advertise host:port (or a peer listen address with a specific IP and port)"
    )]
    PeerAdvertise(String),
    #[error("replication factor is {0}; it must be 1 to {REPLICATION_FACTOR_MAX}")]
    ReplicationFactor(u64),
    #[error(
        "node dead timeout is {0} ms; it must be {NODE_DEAD_AFTER_MS_MIN} ms to {NODE_DEAD_AFTER_MS_MAX} ms (1 day)"
    )]
    NodeDeadAfter(u64),
    #[error(
        "rebalance interval is {0} ms; it must be {REBALANCE_INTERVAL_MS_MIN} to {REBALANCE_INTERVAL_MS_MAX} ms"
    )]
    RebalanceInterval(u64),
    #[error(
        "initial cluster has {count} nodes; limit is {} nodes",
        limits::CLUSTER_NODES_MAX
    )]
    TooManyNodes { count: usize },
    #[error("node {0} appears twice in the initial cluster")]
    DuplicateNode(NodeId),
    #[error("address {addr} is given to nodes {first} and {second}")]
    DuplicateAddress {
        addr: String,
        first: NodeId,
        second: NodeId,
    },
    #[error("node id {0} is not in the initial cluster")]
    NotInCluster(NodeId),
    #[error("listen address {listen} does not match this node's cluster address {cluster}")]
    ListenMismatch { listen: SocketAddr, cluster: String },
    #[error(
        "peer listen address {peer_listen} does not match this node's cluster address {cluster}: with peer_listen (--peer-listen) the initial cluster names peer addresses"
    )]
    PeerListenMismatch {
        peer_listen: SocketAddr,
        cluster: String,
    },
    #[error(
        "peer listen address {0} is the client listen address; peers and clients need a port each (or leave out peer_listen for one shared port)"
    )]
    PeerListenIsListen(SocketAddr),
    #[error("peer_advertise (--peer-advertise) needs peer_listen (--peer-listen)")]
    PeerAdvertiseWithoutPeerListen,
    #[error("invalid raft timings: {0}")]
    Timings(String),
    #[error(
        "dedup window is {0} ms; it must be {DEDUP_WINDOW_MS_MIN} ms to {max} ms (1 day)",
        max = limits::DEDUP_WINDOW_MS_MAX
    )]
    DedupWindow(u64),
    #[error(
        "cleanup interval is {0} ms; it must be {CLEANUP_INTERVAL_MS_MIN} to {CLEANUP_INTERVAL_MS_MAX} ms"
    )]
    CleanupInterval(u64),
    #[error(
        "history retention is {0} ms; it must be {min} ms to {max} ms (30 days)",
        min = limits::HISTORY_RETENTION_MS_MIN,
        max = limits::HISTORY_RETENTION_MS_MAX
    )]
    HistoryRetention(u64),
    #[error(
        "consistency check interval is {0} ms; it must be 0 (off) or {min} ms to {max} ms (30 days)",
        min = limits::CHECK_INTERVAL_MS_MIN,
        max = CHECK_INTERVAL_MS_MAX
    )]
    ConsistencyCheckInterval(u64),
    #[error(
        "history retention is {0} bytes per range; it must be {min} bytes (1 KiB) to {max} bytes (64 GiB)",
        min = limits::HISTORY_RETENTION_BYTES_MIN,
        max = limits::HISTORY_RETENTION_BYTES_MAX
    )]
    HistoryRetentionBytes(u64),
    #[error(
        "range split size is {0} bytes; it must be {RANGE_SPLIT_BYTES_MIN} bytes (1 KiB) to {RANGE_SPLIT_BYTES_MAX} bytes (64 GiB)"
    )]
    RangeSplitBytes(u64),
    #[error(
        "range split load is {0} s; it must be 1 to {RANGE_SPLIT_LOAD_SECS_MAX} s of sustained load"
    )]
    RangeSplitLoadSecs(u64),
    #[error(
        "split check interval is {0} ms; it must be {SPLIT_CHECK_INTERVAL_MS_MIN} to {SPLIT_CHECK_INTERVAL_MS_MAX} ms"
    )]
    SplitCheckInterval(u64),
    #[error("{0}")]
    Faults(String),
    #[error("log level {level:?} is not a filter: {message}")]
    LogLevel { level: String, message: String },
    #[error("metrics address {0} is the gRPC listen address; give the metrics their own port")]
    MetricsListen(SocketAddr),
    #[error(
        "etcd address {0} is another listen address of the node; give the etcd API its own port"
    )]
    EtcdListen(SocketAddr),
    #[error("{0}")]
    AuthTokens(String),
    #[error(
        "auth_tokens (--auth-tokens) needs TLS (--tls-cert, --tls-key, --tls-ca): without it tokens cross the network in clear and nodes cannot tell a peer from a client"
    )]
    AuthWithoutTls,
    #[error(
        "TLS needs tls_cert, tls_key and tls_ca together (--tls-cert, --tls-key, --tls-ca); missing: {0}"
    )]
    TlsIncomplete(String),
    #[error("{setting} file {path}: {message}")]
    TlsFile {
        setting: &'static str,
        path: PathBuf,
        message: String,
    },
    #[error("{message} (tls_cert {cert}, tls_key {key}, tls_ca {ca})")]
    TlsUnusable {
        message: String,
        cert: PathBuf,
        key: PathBuf,
        ca: PathBuf,
    },
}

impl NodeConfig {
    /// The settings of `args`, merged over the `--config` file when one is named, validated.
    pub fn from_args(args: &ServeArgs) -> Result<NodeConfig, ConfigError> {
        let settings = args.settings()?;
        let args = ServeArgs::from_settings(&settings);
        let tls = tls_settings(&args)?;
        let (initial_cluster, join) = match (&args.initial_cluster, &args.join) {
            (Some(_), Some(_)) => return Err(ConfigError::ClusterAndJoin),
            (None, None) => return Err(ConfigError::NoCluster),
            (Some(cluster), None) => (parse_initial_cluster(cluster)?, Vec::new()),
            (None, Some(join)) => (BTreeMap::new(), parse_join(join)?),
        };
        let config = NodeConfig {
            node_id: args
                .node_id
                .ok_or(ConfigError::Missing("node_id", "node-id"))?,
            listen: args
                .listen
                .ok_or(ConfigError::Missing("listen", "listen"))?,
            data_dir: args
                .data_dir
                .ok_or(ConfigError::Missing("data_dir", "data-dir"))?,
            initial_cluster,
            join,
            advertise: args.advertise.clone(),
            peer_listen: args.peer_listen,
            peer_advertise: args.peer_advertise.clone(),
            placement: overlay(PlacementSettings::default(), &settings),
            raft: overlay(RaftTimings::default(), &settings),
            kv: overlay(KvSettings::default(), &settings),
            clock: SystemClock::shared(),
            faults: overlay(Faults::default(), &settings),
            metrics_listen: args.metrics_listen,
            etcd_listen: args.etcd_listen,
            log: overlay(LogSettings::default(), &settings),
            access: match &args.auth_tokens {
                Some(path) => Some(Arc::new(
                    Access::load(path).map_err(ConfigError::AuthTokens)?,
                )),
                None => None,
            },
            tls,
        };
        config.validate()?;
        Ok(config)
    }

    /// Checks the cluster (size, duplicates, this node in it, listen address), the
    /// placement settings and the timings.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.placement.validate()?;
        if !self.join.is_empty() {
            if !self.initial_cluster.is_empty() {
                return Err(ConfigError::ClusterAndJoin);
            }
            self.addr()?;
            return self.validate_settings();
        }
        if self.initial_cluster.is_empty() {
            return Err(ConfigError::EmptyCluster);
        }
        if self.initial_cluster.len() > limits::CLUSTER_NODES_MAX {
            return Err(ConfigError::TooManyNodes {
                count: self.initial_cluster.len(),
            });
        }
        let mut seen: BTreeMap<&str, NodeId> = BTreeMap::new();
        for (id, addr) in &self.initial_cluster {
            if let Some(first) = seen.insert(addr, *id) {
                return Err(ConfigError::DuplicateAddress {
                    addr: addr.clone(),
                    first,
                    second: *id,
                });
            }
        }
        let own = self
            .initial_cluster
            .get(&self.node_id)
            .ok_or(ConfigError::NotInCluster(self.node_id))?;
        match self.peer_listen {
            Some(peer_listen) => {
                check_listen(peer_listen, own).map_err(|_| ConfigError::PeerListenMismatch {
                    peer_listen,
                    cluster: own.clone(),
                })?
            }
            None => check_listen(self.listen, own)?,
        }
        self.validate_settings()
    }

    /// The address peers use for this node (the one in Raft membership and the meta range's
    /// node records): its entry in the initial cluster; else, with a peer port,
    /// `peer_advertise` or else `peer_listen`; without one, the client address.
    pub fn addr(&self) -> Result<String, ConfigError> {
        if let Some(addr) = self.initial_cluster.get(&self.node_id) {
            return Ok(addr.clone());
        }
        match self.peer_listen {
            Some(peer_listen) => advertised(
                self.peer_advertise.as_deref(),
                peer_listen,
                ConfigError::PeerAdvertise,
            ),
            None => advertised(
                self.advertise.as_deref(),
                self.listen,
                ConfigError::Advertise,
            ),
        }
    }

    /// The address clients use for this node: without a peer port the one address of
    /// `addr`; with one, `advertise`, else the listen address (which must name an IP and a
    /// port).
    pub fn client_addr(&self) -> Result<String, ConfigError> {
        if self.peer_listen.is_none() {
            return self.addr();
        }
        advertised(
            self.advertise.as_deref(),
            self.listen,
            ConfigError::Advertise,
        )
    }

    /// Checks the timings, key-value, observability and fault settings.
    fn validate_settings(&self) -> Result<(), ConfigError> {
        if let Err(message) = crate::config::logging::check_level(&self.log.level) {
            return Err(ConfigError::LogLevel {
                level: self.log.level.clone(),
                message,
            });
        }
        if self.access.is_some() && self.tls.is_none() {
            return Err(ConfigError::AuthWithoutTls);
        }
        if let Some(metrics) = self.metrics_listen
            && (metrics == self.listen || Some(metrics) == self.peer_listen)
            && metrics.port() != 0
        {
            return Err(ConfigError::MetricsListen(metrics));
        }
        if let Some(etcd) = self.etcd_listen
            && (etcd == self.listen
                || Some(etcd) == self.peer_listen
                || Some(etcd) == self.metrics_listen)
            && etcd.port() != 0
        {
            return Err(ConfigError::EtcdListen(etcd));
        }
        if self.peer_advertise.is_some() && self.peer_listen.is_none() {
            return Err(ConfigError::PeerAdvertiseWithoutPeerListen);
        }
        if let Some(peer_listen) = self.peer_listen
            && peer_listen == self.listen
            && peer_listen.port() != 0
        {
            return Err(ConfigError::PeerListenIsListen(peer_listen));
        }
        self.client_addr()?;
        self.raft
            .openraft_config()
            .map_err(|e| ConfigError::Timings(e.to_string()))?;
        let window = self.kv.dedup_window_ms;
        if !(DEDUP_WINDOW_MS_MIN..=limits::DEDUP_WINDOW_MS_MAX).contains(&window) {
            return Err(ConfigError::DedupWindow(window));
        }
        let interval = self.kv.cleanup_interval_ms;
        if !(CLEANUP_INTERVAL_MS_MIN..=CLEANUP_INTERVAL_MS_MAX).contains(&interval) {
            return Err(ConfigError::CleanupInterval(interval));
        }
        let retention = self.kv.history_retention_ms;
        if !(limits::HISTORY_RETENTION_MS_MIN..=limits::HISTORY_RETENTION_MS_MAX)
            .contains(&retention)
        {
            return Err(ConfigError::HistoryRetention(retention));
        }
        let bytes = self.kv.history_retention_bytes;
        if !(limits::HISTORY_RETENTION_BYTES_MIN..=limits::HISTORY_RETENTION_BYTES_MAX)
            .contains(&bytes)
        {
            return Err(ConfigError::HistoryRetentionBytes(bytes));
        }
        let checks = self.kv.consistency_check_interval_ms;
        if checks != 0 && !(limits::CHECK_INTERVAL_MS_MIN..=CHECK_INTERVAL_MS_MAX).contains(&checks)
        {
            return Err(ConfigError::ConsistencyCheckInterval(checks));
        }
        self.kv.split.validate()?;
        self.faults.validate().map_err(ConfigError::Faults)
    }

    /// The node that initializes the cluster on first start: the smallest id.
    pub fn bootstrap_node(&self) -> Option<NodeId> {
        self.initial_cluster.keys().next().copied()
    }

    /// The redb file of this node.
    pub fn store_path(&self) -> PathBuf {
        store_path_in(&self.data_dir)
    }

    /// Where snapshots are built and received.
    pub fn snapshot_dir(&self) -> PathBuf {
        snapshot_dir_in(&self.data_dir)
    }
}

/// The redb file of the node whose data dir is `data_dir`.
pub(crate) fn store_path_in(data_dir: &Path) -> PathBuf {
    data_dir.join("keel.redb")
}

/// The snapshot directory of the node whose data dir is `data_dir`.
pub(crate) fn snapshot_dir_in(data_dir: &Path) -> PathBuf {
    data_dir.join("snapshots")
}

impl PlacementSettings {
    /// Checks each setting against its bounds.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(1..=REPLICATION_FACTOR_MAX).contains(&self.replication_factor) {
            return Err(ConfigError::ReplicationFactor(self.replication_factor));
        }
        if !(NODE_DEAD_AFTER_MS_MIN..=NODE_DEAD_AFTER_MS_MAX).contains(&self.node_dead_after_ms) {
            return Err(ConfigError::NodeDeadAfter(self.node_dead_after_ms));
        }
        let interval = self.rebalance_interval_ms;
        if !(REBALANCE_INTERVAL_MS_MIN..=REBALANCE_INTERVAL_MS_MAX).contains(&interval) {
            return Err(ConfigError::RebalanceInterval(interval));
        }
        Ok(())
    }
}

/// The TLS settings of the three files `args` names (all three or none), each read and
/// checked; an error names the file.
fn tls_settings(args: &ServeArgs) -> Result<Option<TlsSettings>, ConfigError> {
    let (cert, key, ca) = match (&args.tls_cert, &args.tls_key, &args.tls_ca) {
        (None, None, None) => return Ok(None),
        (Some(cert), Some(key), Some(ca)) => (cert, key, ca),
        (cert, key, ca) => {
            let given = [
                (TlsPart::Cert, cert),
                (TlsPart::Key, key),
                (TlsPart::Ca, ca),
            ];
            let missing: Vec<&str> = given
                .iter()
                .filter(|(_, path)| path.is_none())
                .map(|(part, _)| part.setting())
                .collect();
            return Err(ConfigError::TlsIncomplete(missing.join(", ")));
        }
    };
    let pems = (
        read_pem(TlsPart::Cert, cert)?,
        read_pem(TlsPart::Key, key)?,
        read_pem(TlsPart::Ca, ca)?,
    );
    TlsSettings::from_pem(pems.0, pems.1, pems.2)
        .map(Some)
        .map_err(|error| match error {
            TlsError::Pem { part, .. } => ConfigError::TlsFile {
                setting: part.setting(),
                path: match part {
                    TlsPart::Cert => cert.clone(),
                    TlsPart::Key => key.clone(),
                    TlsPart::Ca => ca.clone(),
                },
                message: error.to_string(),
            },
            TlsError::Unusable(_) => ConfigError::TlsUnusable {
                message: error.to_string(),
                cert: cert.clone(),
                key: key.clone(),
                ca: ca.clone(),
            },
        })
}

/// The bytes of one PEM file, at most `TLS_PEM_BYTES_MAX`.
fn read_pem(part: TlsPart, path: &Path) -> Result<Vec<u8>, ConfigError> {
    let failed = |message: String| ConfigError::TlsFile {
        setting: part.setting(),
        path: path.to_path_buf(),
        message,
    };
    let file = std::fs::File::open(path).map_err(|e| failed(e.to_string()))?;
    let limit = limits::TLS_PEM_BYTES_MAX;
    let mut bytes = Vec::new();
    file.take(limit as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| failed(e.to_string()))?;
    if bytes.len() > limit {
        return Err(failed(format!(
            "longer than {}, the limit of a PEM file",
            limits::human_bytes(limit)
        )));
    }
    Ok(bytes)
}

/// The address others use for a node: `advertise` when given (it must read "host:port"),
/// else `listen` (which must name an IP and a port); `refused` names the setting at fault.
fn advertised(
    advertise: Option<&str>,
    listen: SocketAddr,
    refused: fn(String) -> ConfigError,
) -> Result<String, ConfigError> {
    if let Some(addr) = advertise {
        return if is_host_port(addr) {
            Ok(addr.to_string())
        } else {
            Err(refused(addr.to_string()))
        };
    }
    if listen.ip().is_unspecified() || listen.port() == 0 {
        return Err(refused(listen.to_string()));
    }
    Ok(listen.to_string())
}

/// Parses "127.0.0.1:7001,127.0.0.1:7002".
fn parse_join(text: &str) -> Result<Vec<String>, ConfigError> {
    let mut seeds = Vec::new();
    for addr in text.split(',').map(str::trim).filter(|a| !a.is_empty()) {
        if !is_host_port(addr) {
            return Err(ConfigError::JoinAddress(addr.to_string()));
        }
        seeds.push(addr.to_string());
    }
    if seeds.is_empty() {
        return Err(ConfigError::JoinAddress(text.to_string()));
    }
    Ok(seeds)
}

impl SplitSettings {
    /// Checks each setting against its bounds.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(RANGE_SPLIT_BYTES_MIN..=RANGE_SPLIT_BYTES_MAX).contains(&self.range_bytes_max) {
            return Err(ConfigError::RangeSplitBytes(self.range_bytes_max));
        }
        if !(1..=RANGE_SPLIT_LOAD_SECS_MAX).contains(&self.load_secs) {
            return Err(ConfigError::RangeSplitLoadSecs(self.load_secs));
        }
        let interval = self.check_interval_ms;
        if !(SPLIT_CHECK_INTERVAL_MS_MIN..=SPLIT_CHECK_INTERVAL_MS_MAX).contains(&interval) {
            return Err(ConfigError::SplitCheckInterval(interval));
        }
        Ok(())
    }
}

/// Parses "1=127.0.0.1:7001,2=127.0.0.1:7002".
pub fn parse_initial_cluster(text: &str) -> Result<BTreeMap<NodeId, String>, ConfigError> {
    let mut cluster = BTreeMap::new();
    let mut ids = BTreeSet::new();
    for entry in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let malformed = |message: &str| ConfigError::Entry {
            entry: entry.to_string(),
            message: message.to_string(),
        };
        let (id, addr) = entry
            .split_once('=')
            .ok_or_else(|| malformed("expected id=host:port"))?;
        let id: NodeId = id
            .trim()
            .parse()
            .map_err(|_| malformed("node id is not a number"))?;
        let addr = addr.trim();
        if !is_host_port(addr) {
            return Err(malformed("address is not host:port"));
        }
        if !ids.insert(id) {
            return Err(ConfigError::DuplicateNode(id));
        }
        cluster.insert(id, addr.to_string());
    }
    if cluster.is_empty() {
        return Err(ConfigError::EmptyCluster);
    }
    Ok(cluster)
}

/// Whether `addr` reads "host:port": a host (a name or an IP, not resolved here) and a port
/// number.
fn is_host_port(addr: &str) -> bool {
    match addr.rsplit_once(':') {
        Some((host, port)) => !host.is_empty() && port.parse::<u16>().is_ok(),
        None => false,
    }
}

/// The listen address must be the one peers use, except that a wildcard IP or port 0 (the
/// OS picks; tests) matches any.
fn check_listen(listen: SocketAddr, cluster: &str) -> Result<(), ConfigError> {
    let mismatch = || ConfigError::ListenMismatch {
        listen,
        cluster: cluster.to_string(),
    };
    if listen.port() == 0 {
        return Ok(());
    }
    let (host, port) = cluster.rsplit_once(':').ok_or_else(mismatch)?;
    if port.parse::<u16>().ok() != Some(listen.port()) {
        return Err(mismatch());
    }
    let host = host.trim_start_matches('[').trim_end_matches(']');
    match host.parse::<std::net::IpAddr>() {
        Ok(ip) if !listen.ip().is_unspecified() && ip != listen.ip() => Err(mismatch()),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod split_settings_tests {
    //! The split settings: flags, file keys, defaults and bounds.

    use std::io::Write;

    use super::*;

    fn args(split: ServeArgs) -> ServeArgs {
        ServeArgs {
            node_id: Some(1),
            listen: Some("127.0.0.1:7001".parse().unwrap()),
            data_dir: Some(PathBuf::from("/tmp/keel")),
            initial_cluster: Some("1=127.0.0.1:7001".to_string()),
            ..split
        }
    }

    #[test]
    fn split_settings_default_and_are_bounded() {
        let default = NodeConfig::from_args(&args(ServeArgs::default())).unwrap();
        assert_eq!(default.kv.split, SplitSettings::default());
        assert_eq!(default.kv.split.range_bytes_max, 64 * 1024 * 1024);
        let cases: Vec<(ServeArgs, Result<SplitSettings, &str>)> = vec![
            (
                ServeArgs {
                    range_split_bytes: Some(1024),
                    range_split_requests_per_sec: Some(0),
                    range_split_load_secs: Some(60),
                    split_check_interval_ms: Some(10),
                    ..ServeArgs::default()
                },
                Ok(SplitSettings {
                    range_bytes_max: 1024,
                    requests_per_sec_max: 0,
                    load_secs: 60,
                    check_interval_ms: 10,
                }),
            ),
            (
                ServeArgs {
                    range_split_bytes: Some(1023),
                    ..ServeArgs::default()
                },
                Err("range split size is 1023 bytes; it must be 1024 bytes (1 KiB)"),
            ),
            (
                ServeArgs {
                    range_split_bytes: Some(RANGE_SPLIT_BYTES_MAX + 1),
                    ..ServeArgs::default()
                },
                Err("to 68719476736 bytes (64 GiB)"),
            ),
            (
                ServeArgs {
                    range_split_load_secs: Some(0),
                    ..ServeArgs::default()
                },
                Err("range split load is 0 s; it must be 1 to 60 s"),
            ),
            (
                ServeArgs {
                    range_split_load_secs: Some(61),
                    ..ServeArgs::default()
                },
                Err("range split load is 61 s"),
            ),
            (
                ServeArgs {
                    split_check_interval_ms: Some(9),
                    ..ServeArgs::default()
                },
                Err("split check interval is 9 ms; it must be 10 to 60000 ms"),
            ),
        ];
        for (split, expected) in cases {
            let result = NodeConfig::from_args(&args(split.clone()));
            match expected {
                Ok(settings) => assert_eq!(result.unwrap().kv.split, settings, "{split:?}"),
                Err(message) => {
                    let error = result.expect_err(message).to_string();
                    assert!(error.contains(message), "{error:?} lacks {message:?}");
                }
            }
        }
    }

    #[test]
    fn split_settings_come_from_flags_over_the_file() {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        writeln!(
            file,
            "range_split_bytes = 4096\nrange_split_rps = 50\nrange_split_load_secs = 3\n\
             split_check_interval_ms = 200"
        )
        .unwrap();
        let from_file = args(ServeArgs {
            config: Some(file.path().to_path_buf()),
            ..ServeArgs::default()
        });
        let config = NodeConfig::from_args(&from_file).unwrap();
        let expected = SplitSettings {
            range_bytes_max: 4096,
            requests_per_sec_max: 50,
            load_secs: 3,
            check_interval_ms: 200,
        };
        assert_eq!(config.kv.split, expected);
        let overridden = ServeArgs {
            range_split_requests_per_sec: Some(70),
            range_split_load_secs: Some(5),
            ..from_file
        };
        let config = NodeConfig::from_args(&overridden).unwrap();
        let expected = SplitSettings {
            requests_per_sec_max: 70,
            load_secs: 5,
            ..expected
        };
        assert_eq!(config.kv.split, expected);
    }

    #[test]
    fn split_flags_parse() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            serve: ServeArgs,
        }
        let cli = Cli::try_parse_from([
            "keel",
            "--range-split-bytes",
            "2048",
            "--range-split-rps",
            "9",
            "--range-split-load-secs",
            "4",
            "--split-check-interval-ms",
            "250",
        ])
        .unwrap();
        assert_eq!(cli.serve.range_split_bytes, Some(2048));
        assert_eq!(cli.serve.range_split_requests_per_sec, Some(9));
        assert_eq!(cli.serve.range_split_load_secs, Some(4));
        assert_eq!(cli.serve.split_check_interval_ms, Some(250));
        let long = Cli::try_parse_from(["keel", "--range-split-requests-per-sec", "11"]).unwrap();
        assert_eq!(long.serve.range_split_requests_per_sec, Some(11));
    }
}
