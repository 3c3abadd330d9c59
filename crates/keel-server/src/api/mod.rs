//! The node's front doors: one file per service it serves. The public gRPC services (Kv,
//! Lock, Idempotency, Cluster), the peers' Raft service, `grpc.health.v1`, reflection, the
//! test-only Faults service, the backup stream, tenant usage reports, the metrics
//! endpoint and the console it serves. A service checks who calls (`access`), turns a request into calls of the rooms
//! below (`requests` for routing, admission and coordination, `locks`, `ranges`, `cluster`)
//! and the answer into a message; `status` maps errors to gRPC statuses. Nothing below
//! imports this room; `node` starts what is here.

pub(crate) mod backup;
pub(crate) mod cluster;
pub(crate) mod console;
#[cfg(feature = "fault-injection")]
pub(crate) mod faults;
pub(crate) mod health;
pub(crate) mod idempotency;
pub(crate) mod kv;
pub(crate) mod lock;
pub(crate) mod metrics;
pub(crate) mod raft;
pub(crate) mod reflection;
pub(crate) mod tenant_usage;
pub(crate) mod watch;
