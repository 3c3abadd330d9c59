//! Raft log store and state machine on redb. Knows nothing about gRPC, placement or the
//! network.
//!
//! One [`Store`] is one redb file shared by many ranges, with one writer thread that group
//! commits (see `writer`). Each range gets a [`LogStore`] (openraft's `RaftLogStorage`) and a
//! [`StateMachine`] (openraft's `RaftStateMachine`, snapshots as [`SnapshotFile`]s).
//!
//! Ranges share the file's data tables and own disjoint key spans, recorded with each
//! range's state: a split (`split`) is applied in one transaction that shrinks the parent and
//! creates the child, and every read and apply takes the span from the state it reads. The
//! meta range (range 0) owns no key; it keeps the cluster's range descriptors, nodes and range
//! id allocator (`meta`). `Store::descriptors` and `Store::range_events` tell the layers above
//! which ranges the file holds and when that changed.
//!
//! The state machine also keeps each range's exactly-once state (client sessions and the
//! first outcome of each request, `session`), key expiry (a TTL index), locks with fencing
//! tokens, per-key fences and idempotency records (`coordination`, with a `deadlines` index
//! for reclaiming them) and a range clock that only moves forward with the times leaders
//! stamp into commands; it never reads a clock of its own.

mod apply;
mod check;
mod codec;
mod coordination;
mod error;
mod install;
mod log_store;
#[cfg(feature = "fault-injection")]
pub mod lossy;
mod meta;
mod op;
pub mod raft_types;
mod reader;
mod remove;
mod restore;
mod session;
mod snapshot;
mod snapshot_file;
mod split;
mod state_machine;
mod store;
mod tables;
#[cfg(test)]
mod test_entries;
mod upkeep;
mod wal;
mod writer;

pub use error::StorageError;
pub use log_store::LogStore;
pub use restore::SnapshotSummary;
pub use snapshot::IncomingSnapshot;
pub use snapshot_file::SnapshotFile;
pub use state_machine::{
    AtRevision, HistoryCounts, HistoryRead, HistoryRetention, KeyRead, QuotaCounts, RangeCounts,
    RangeEventsPage, RangeRead, ScanPage, SnapshotBuilder, SpanEventsPage, StateMachine,
    Unreadable,
};
#[doc(hidden)]
pub use store::WriterHold;
pub use store::{Store, StoreOptions};
pub use upkeep::Upkeep;
pub use writer::{Commit, CommitObserver, StoreStats};
