//! Raft log store and state machine on redb. Knows nothing about gRPC, placement or the
//! network.
//!
//! One [`Store`] is one redb file shared by many ranges, with one writer thread that group
//! commits (see `writer`). Each range gets a [`LogStore`] (openraft's `RaftLogStorage`) and a
//! [`StateMachine`] (openraft's `RaftStateMachine`, snapshots as [`SnapshotFile`]s).

mod apply;
mod codec;
mod error;
mod install;
mod log_store;
pub mod raft_types;
mod snapshot;
mod state_machine;
mod store;
mod tables;
mod writer;

pub use error::StorageError;
pub use log_store::LogStore;
pub use snapshot::{IncomingSnapshot, SnapshotBuilder, SnapshotFile};
pub use state_machine::{ScanPage, StateMachine};
pub use store::Store;
#[doc(hidden)]
pub use store::WriterHold;
pub use writer::StoreStats;
