//! The `keel serve` flags and the `--config` file with the same keys, and how the two become
//! settings. Knows nothing of what a setting means: `NodeConfig::from_args` does.
//!
//! A setting is declared once, as a field of `ServeArgs`: its doc comment is its help text,
//! `#[arg]` makes it a flag, its name is its file key (`#[serde(alias)]` adds another).
//! Nothing lists the settings again. The flags and the file are each turned into a table of
//! the settings they give, and the flags' table is laid over the file's
//! (`ServeArgs::settings`). A setting with a default is used through a field of a settings
//! struct (`PlacementSettings`, `KvSettings`, `keel_raft::RaftTimings`, ...) named after
//! its key; `overlay` fills that struct by key over its `Default`, the one place of the
//! default. So a new setting is its `ServeArgs` field plus the code that uses it: a field
//! of a settings struct (and its default), or, for one that is parsed or checked, a line of
//! `from_args`. `settings_tests.rs` checks that every flag lands in one field or is read by
//! hand.
//!
//! The tables are `serde_json` values rather than `toml` ones because they hold any u64, so
//! an out-of-range number still reaches its bounds check; the file itself is read by `toml`
//! as `ServeArgs`, so a wrong key or type is refused with toml's words and serde's list of
//! the known keys. Not figment: it would lay the same serde values over each other but word
//! file errors its own way, and this layering is a screenful.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use keel_types::NodeId;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::config::ConfigError;
use crate::config::logging::LogFormat;

/// Settings by key (the keys of the `--config` file), only those given.
pub(super) type Settings = Map<String, Value>;

/// `keel serve` flags. `--config keel.toml` reads the same keys from a file (snake_case);
/// flags given on the command line win over the file. A flag not given is `None` (or `false`,
/// a switch not thrown) and leaves the file's setting. The file may hold no other key
/// (`config` neither).
#[derive(Debug, Clone, Default, PartialEq, Eq, clap::Args, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServeArgs {
    /// This node's id; must appear in the initial cluster.
    #[arg(long)]
    pub node_id: Option<NodeId>,
    /// Address to listen on, e.g. 127.0.0.1:7001.
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Directory for keel.redb, keel.raft-log/ and snapshots/.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Every node of the first cluster: "1=127.0.0.1:7001,2=127.0.0.1:7002,...".
    #[arg(long, conflicts_with = "join")]
    pub initial_cluster: Option<String>,
    /// Join a running cluster through these nodes ("host:port", comma-separated) instead of
    /// starting one with --initial-cluster; the node registers itself and the rebalancer
    /// moves replicas to it.
    #[arg(long)]
    pub join: Option<String>,
    /// The address clients use for this node (default: --listen). Without --peer-listen it is
    /// also the address peers use when the node joins.
    #[arg(long)]
    pub advertise: Option<String>,
    /// Serve the Raft service on this address only, e.g. 127.0.0.1:7101, apart from the
    /// client port (--listen), so it can be firewalled; --initial-cluster and --join then
    /// name peer addresses. Off unless given: one port for clients and peers.
    #[arg(long)]
    pub peer_listen: Option<SocketAddr>,
    /// The address peers use for this node when it joins, with --peer-listen (default:
    /// --peer-listen).
    #[arg(long, requires = "peer_listen")]
    pub peer_advertise: Option<String>,
    /// Voters each range should have, on distinct nodes (default 3; 1 to 7).
    #[arg(long)]
    pub replication_factor: Option<u64>,
    /// A node not heard from for this long is dead and its replicas are re-created on other
    /// nodes (default 300000, 5 minutes; 1000 ms to 1 day).
    #[arg(long)]
    pub node_dead_after_ms: Option<u64>,
    /// How often the meta range's leader looks for replicas to add, move or remove (default
    /// 1000 ms; 10 to 60000).
    #[arg(long)]
    pub rebalance_interval_ms: Option<u64>,
    /// A TOML file with the same settings.
    #[arg(long)]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// Serve Prometheus metrics at http://ADDR/metrics, e.g. 127.0.0.1:9101 (off unless
    /// given).
    #[arg(long)]
    pub metrics_listen: Option<SocketAddr>,
    /// Serve etcd's v3 gRPC API (KV, Watch, Lease, Cluster, Maintenance, Auth) on ADDR, e.g. 127.0.0.1:2379, from the keys
    /// under etcd/ (off unless given; see docs/ETCD.md).
    #[arg(long)]
    pub etcd_listen: Option<SocketAddr>,
    /// Log lines as text (default) or json (one object per line, with span fields).
    #[arg(long, value_enum)]
    pub log_format: Option<LogFormat>,
    /// Log filter in RUST_LOG syntax, e.g. info or keel_server=debug,info (default info);
    /// RUST_LOG wins when set.
    #[arg(long)]
    pub log_level: Option<String>,
    /// A TOML file of bearer tokens: [[admin]] and [[tenant]] entries (see
    /// docs/OPERATIONS.md). Every request must then carry one; each tenant is confined to
    /// its own namespace and quotas. Off unless given.
    #[arg(long)]
    pub auth_tokens: Option<PathBuf>,
    /// PEM certificate chain of this node (its certificate first), signed by --tls-ca: the
    /// server certificate for clients and peers, and the client certificate this node shows
    /// its peers. It must name the address others dial (an IP SAN for an IP, a DNS SAN for a
    /// host name). With --tls-key and --tls-ca (all three or none) the node serves TLS only.
    #[arg(long, value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, value_name = "FILE")]
    pub tls_key: Option<PathBuf>,
    /// PEM certificate of the CA that signed every node's certificate: peers are checked
    /// against it, and a caller showing a certificate it signed is taken for a node.
    #[arg(long, value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,
    /// Leader heartbeat interval.
    #[arg(long)]
    pub heartbeat_ms: Option<u64>,
    /// Lower bound of the randomized election timeout.
    #[arg(long)]
    pub election_timeout_ms_min: Option<u64>,
    /// Upper bound of the randomized election timeout.
    #[arg(long)]
    pub election_timeout_ms_max: Option<u64>,
    /// A range its leader has not used for this long, fully replicated, goes quiet: no Raft
    /// heartbeats or election timers until it is used again (default 3000; 0 = never; at
    /// most 1 day).
    #[arg(long)]
    pub quiesce_after_ms: Option<u64>,
    /// How long an idle client session and its request records are kept (default 600000,
    /// 10 minutes): retries within it are answered from the record, never applied twice.
    #[arg(long)]
    pub dedup_window_ms: Option<u64>,
    /// How long each replica keeps a range's events (history, for `Kv.History`): older
    /// ones are compacted away (default 3600000, 1 hour; 1 s to 30 days).
    #[arg(long)]
    pub history_retention_ms: Option<u64>,
    /// Most bytes of events each replica keeps per range (keys, values before and after
    /// each change): the oldest go first (default 67108864, 64 MiB; 1 KiB to 64 GiB).
    #[arg(long)]
    pub history_retention_bytes: Option<u64>,
    /// How often the leader of each range checks that its replicas agree: every replica
    /// hashes the range at one log index and the leader compares (default 86400000, a day;
    /// 0 turns periodic checks off; else 1 s to 30 days). `keel cluster check` runs one now.
    #[arg(long)]
    pub consistency_check_interval_ms: Option<u64>,
    /// A range holding more bytes than this (keys + values) splits in two halves of about
    /// equal size (default 67108864, 64 MiB; 1 KiB to 64 GiB).
    #[arg(long)]
    pub range_split_bytes: Option<u64>,
    /// A range serving more requests per second than this for --range-split-load-secs
    /// splits at the median of its sampled request keys (default 2500; 0 = no load splits).
    #[arg(long, visible_alias = "range-split-rps")]
    #[serde(alias = "range_split_rps")]
    pub range_split_requests_per_sec: Option<u64>,
    /// Seconds the load must last before a range splits for load (default 10; 1 to 60).
    #[arg(long)]
    pub range_split_load_secs: Option<u64>,
    /// How often a leader checks its ranges' size and load for a split (default 1000 ms;
    /// 10 to 60000).
    #[arg(long)]
    pub split_check_interval_ms: Option<u64>,
    /// Test-only: drop the response of this percentage of Kv mutations after applying them,
    /// as a lossy network would.
    #[cfg(feature = "fault-injection")]
    #[arg(long, hide = true)]
    pub fault_response_loss_percent: Option<u32>,
    /// Test-only: keep storage writes in memory until synced, so kill -9 loses unsynced
    /// writes as a power loss would.
    #[cfg(feature = "fault-injection")]
    #[arg(long, hide = true)]
    #[serde(default)]
    pub fault_lose_unsynced_writes: bool,
    /// Test-only: break one guarantee on purpose (stale-read, ack-before-fsync,
    /// double-apply, lock-no-expiry, idem-stale-complete, split-drops-inflight, stale-span,
    /// snapshot-skip-tail, unbounded-read), to show the Jepsen-style checkers catch it.
    #[cfg(feature = "planted-bugs")]
    #[arg(long, hide = true)]
    pub planted_bug: Option<String>,
}

impl ServeArgs {
    /// The settings of these flags over those of the `--config` file, when one is named: a
    /// setting given as a flag wins over the file's, one given in neither place is absent.
    pub(super) fn settings(&self) -> Result<Settings, ConfigError> {
        let mut settings = match &self.config {
            Some(path) => read_file(path)?.given()?,
            None => Settings::new(),
        };
        settings.extend(self.given()?);
        Ok(settings)
    }

    /// The flags of `settings` (a setting absent is a flag not given), to read one by name.
    pub(super) fn from_settings(settings: &Settings) -> ServeArgs {
        serde_json::from_value(Value::Object(settings.clone()))
            .expect("a table of settings reads back as the flags it came from")
    }

    /// The settings given here, by key: a flag left out (`None`, or a switch not thrown) is
    /// absent.
    fn given(&self) -> Result<Settings, ConfigError> {
        let table = match serde_json::to_value(self) {
            Ok(Value::Object(table)) => table,
            Ok(other) => unreachable!("flags serialize to a table, not {other}"),
            // The one setting that cannot be written as text: a path that is not UTF-8.
            Err(_) => return Err(ConfigError::PathNotUtf8),
        };
        let given = |value: &Value| !matches!(value, Value::Null | Value::Bool(false));
        Ok(table
            .into_iter()
            .filter(|(_, value)| given(value))
            .collect())
    }
}

/// `defaults`, with each field named (in serde) after a setting of `settings` taken from it:
/// how a settings struct (`PlacementSettings`, `RaftTimings`, ...) gets its values, its
/// `Default` holding the defaults.
pub(super) fn overlay<T: Serialize + DeserializeOwned>(defaults: T, settings: &Settings) -> T {
    let mut fields = match serde_json::to_value(defaults) {
        Ok(Value::Object(fields)) => fields,
        other => unreachable!("a settings struct serializes to a table, not {other:?}"),
    };
    for (key, field) in fields.iter_mut() {
        if let Some(setting) = settings.get(key) {
            field.clone_from(setting);
        }
    }
    serde_json::from_value(Value::Object(fields))
        .expect("a setting has the type of the field named after it")
}

/// The settings of the `--config` file at `path`.
fn read_file(path: &Path) -> Result<ServeArgs, ConfigError> {
    let file_error = |message: String| ConfigError::File {
        path: path.to_path_buf(),
        message,
    };
    let text = std::fs::read_to_string(path).map_err(|e| file_error(e.to_string()))?;
    toml::from_str(&text).map_err(|e| file_error(e.to_string()))
}
