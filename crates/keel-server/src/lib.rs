//! A Keel node process: gRPC services (Kv, Lock, Idempotency, Cluster, Raft), the one table from errors to gRPC
//! statuses, the gRPC Raft transport, configuration and cluster bootstrap. The only crate that
//! names `tonic::Status`; it knows nothing of redb (storage is behind `keel-storage`) and
//! nothing of openraft's internals (groups are behind `keel-raft`).

mod cleanup;
mod cluster_service;
mod config;
mod coordinated;
mod faults;
mod health;
mod idempotency_service;
mod kv_service;
mod lock_driver;
mod lock_queue;
mod lock_queues;
mod lock_service;
mod node;
mod peers;
mod raft_service;
mod router;
mod run;
mod shared;
pub mod status;
mod transport;

pub use config::{ConfigError, KvSettings, NodeConfig, ServeArgs, parse_initial_cluster};
pub use faults::Faults;
pub use keel_raft::RaftTimings;
pub use node::Node;
pub use run::run;
