//! A Keel node process: gRPC services (Kv, Lock, Idempotency, Cluster, Raft), the one table
//! from errors to gRPC statuses, the gRPC Raft transport, configuration, cluster bootstrap,
//! routing by key to ranges, splits and the tasks that keep the meta range informed, the
//! backup stream of a range (`Cluster.Backup`) and the offline restore of a backup file into
//! a new node's data dir (`restore`, for `keel restore`), and what makes it operable:
//! Prometheus metrics, `grpc.health.v1`, reflection, log settings. The only crate that
//! names `tonic::Status`; it knows nothing of redb (storage is behind `keel-storage`) and
//! nothing of openraft's internals (groups are behind `keel-raft`).

mod access;
mod admission;
mod applied_cache;
mod backup;
mod cleanup;
mod cluster_nodes;
mod cluster_service;
mod config;
mod coordinated;
mod faults;
mod health;
mod health_service;
mod heartbeat;
mod idempotency_service;
mod join;
mod kv_service;
mod load;
mod lock_driver;
mod lock_queue;
mod lock_queues;
mod lock_service;
mod logging;
mod meta_client;
mod metrics;
mod node;
mod peer_rpc;
mod peers;
mod placement;
mod publisher;
mod quiescence;
mod quota;
mod raft_service;
mod ranges;
mod rebalancer;
mod reflection;
mod replicas;
mod restore;
mod router;
mod run;
mod shared;
mod split_driver;
mod splits;
pub mod status;
mod tenancy;
mod tenant_usage;
mod tls;
mod transport;

pub use access::Access;
pub use config::{
    ConfigError, KvSettings, NodeConfig, PlacementSettings, ServeArgs, parse_initial_cluster,
};
pub use faults::Faults;
pub use keel_raft::RaftTimings;
pub use logging::{LogFormat, LogSettings};
pub use node::Node;
pub use restore::{RestoreArgs, RestoreError, RestoreProgress, RestoreSummary, restore};
pub use run::{data_damaged, run};
pub use tls::{TlsError, TlsPart, TlsSettings};
