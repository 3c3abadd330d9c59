//! Keel's integration tests, one binary made of modules (link time matters on two cores).
//! In-process clusters run real gRPC servers on loopback ports; nothing here reaches past
//! 127.0.0.1.

mod catch_up;
mod cluster;
mod consistency;
mod console;
mod dashboards;
mod deps;
mod etcd_auth;
#[cfg(feature = "etcd-client")]
mod etcd_client;
mod etcd_lease;
mod etcd_lock;
mod exactly_once;
mod faults;
mod follower_reads;
mod forward_stream;
mod forwarding;
mod harness;
mod history;
mod idempotency;
mod locks;
mod modules;
mod nodes;
mod observability;
mod peer_port;
mod pki;
mod placement;
mod prometheus;
mod quiescence;
mod raft_stream;
mod ranges;
mod splits;
mod tenant_metrics;
mod tenant_quotas;
mod tenant_replay;
mod tenants;
mod tls;
mod ttl;
mod watch;
