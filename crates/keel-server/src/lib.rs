//! A Keel node process: gRPC services (Kv, Lock, Idempotency, Cluster, Raft), the one table
//! from errors to gRPC statuses, the gRPC Raft transport, configuration, cluster bootstrap,
//! routing by key to ranges, splits and the tasks that keep the meta range informed, the
//! backup stream of a range (`Cluster.Backup`) and the offline restore of a backup file into
//! a new node's data dir (`keel restore`), and what makes it operable: Prometheus metrics,
//! `grpc.health.v1`, reflection, log settings. Of the crates that run a node, the only one
//! that names `tonic::Status`; it knows nothing of redb (storage is behind `keel-storage`)
//! and nothing of openraft's internals (groups are behind `keel-raft`).
//!
//! The modules are rooms, each importing only the rooms below it (from the top: `node`,
//! `api`, `locks`, `requests`, `cluster`, `ranges`, `shared`, then the leaves `peer`,
//! `config`, `access`, `metrics` and `status`); docs/ARCHITECTURE.md says what each owns.

mod access;
mod api;
mod cluster;
mod config;
mod etcd;
mod locks;
mod metrics;
mod node;
mod peer;
mod ranges;
mod requests;
mod shared;
pub mod status;

pub use access::Access;
pub use access::tls::{TlsError, TlsPart, TlsSettings};
pub use config::faults::Faults;
pub use config::logging::{LogFormat, LogSettings};
pub use config::{
    ConfigError, KvSettings, NodeConfig, PlacementSettings, ServeArgs, parse_initial_cluster,
};
pub use keel_raft::RaftTimings;
pub use node::Node;
pub use node::restore::{RestoreArgs, RestoreError, RestoreProgress, RestoreSummary, restore};
pub use node::run::{data_damaged, run};
