//! Raft log store and state machine on redb. Knows nothing about gRPC, placement or the
//! network.
//!
//! One [`Store`] is one redb file shared by many ranges, with one writer thread that group
//! commits (see `writer`). Each range gets a [`LogStore`] (openraft's `RaftLogStorage`) and a
//! [`StateMachine`] (openraft's `RaftStateMachine`, snapshots as [`SnapshotFile`]s).
//!
//! The state machine also keeps each range's exactly-once state (client sessions and the
//! first outcome of each request, `session`), key expiry (a TTL index), locks with fencing
//! tokens, per-key fences and idempotency records (`coordination`, with a `deadlines` index
//! for reclaiming them) and a range clock that only moves forward with the times leaders
//! stamp into commands; it never reads a clock of its own.

mod apply;
mod codec;
mod coordination;
mod error;
mod install;
mod log_store;
#[cfg(feature = "fault-injection")]
pub mod lossy;
pub mod raft_types;
mod session;
mod snapshot;
mod state_machine;
mod store;
mod tables;
mod writer;

pub use error::StorageError;
pub use log_store::LogStore;
pub use snapshot::{IncomingSnapshot, SnapshotBuilder, SnapshotFile};
pub use state_machine::{RangeCounts, ScanPage, StateMachine};
#[doc(hidden)]
pub use store::WriterHold;
pub use store::{Store, StoreOptions};
pub use writer::StoreStats;
