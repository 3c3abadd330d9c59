//! Raft groups on a node: start groups (never from a peer's message), split them, the network
//! seam (`Transport`), snapshot streaming, consistent snapshots for backups and linearizable
//! reads on followers (ReadIndex). Knows nothing
//! of tonic, gRPC or client-facing routing; the server crate plugs a real network in through
//! `Transport` and serves `Groups` to its peers.
//!
//! openraft types stay behind this crate: callers write and read through `RaftGroup`, whose
//! errors are already `KvError`s.

mod backup;
mod error;
mod freshness;
mod group;
mod groups;
mod network;
pub mod quiescence;
mod quiet;
mod quiet_state;
mod read_bound;
mod read_calls;
mod read_index;
mod replicas;
mod role;
mod snapshot;
mod timings;
mod transport;
pub mod wire;

pub use backup::BackupSnapshot;
pub use error::{GroupError, InboundError};
pub use group::{GroupStatus, Member, RaftGroup};
pub use groups::{Groups, Starter};
pub use quiet_state::{Parked, Proposed};
pub use read_calls::ReadIndexCounts;
pub use replicas::MembershipView;
pub use role::Role;
pub use snapshot::SnapshotReader;
pub use timings::RaftTimings;
pub use transport::{Peer, RaftMessage, RpcKind, Transport, TransportError};
pub use wire::WireError;
