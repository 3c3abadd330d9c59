//! Errors of group management and of serving peers' Raft messages. Client-facing errors are
//! `keel_types::KvError`; these are for the node's own plumbing.

use keel_storage::StorageError;
use keel_types::RangeId;
use thiserror::Error;

use crate::wire::WireError;

/// Creating, starting or stopping a Raft group failed.
#[derive(Debug, Error)]
pub enum GroupError {
    #[error("invalid raft settings: {0}")]
    Config(String),
    #[error("starting raft of range {range}: {message}")]
    Start { range: RangeId, message: String },
    #[error("initializing range {range}: {message}")]
    Initialize { range: RangeId, message: String },
    /// The node is shutting down: no group starts any more.
    #[error("range {0} not started: the node is shutting down")]
    ShuttingDown(RangeId),
    /// The node is removing its replica of the range.
    #[error("range {0} not started: its replica is being removed from this node")]
    Retired(RangeId),
    #[error(transparent)]
    Storage(#[from] StorageError),
}

/// A Raft message from a peer could not be handled.
#[derive(Debug, Error)]
pub enum InboundError {
    /// This node hosts no replica of the range (yet, or any more).
    #[error("range {0} is not hosted on this node")]
    UnknownRange(RangeId),
    #[error("malformed raft message: {0}")]
    Malformed(#[from] WireError),
    /// The snapshot stream ended early or carried no header.
    #[error("malformed snapshot stream: {0}")]
    SnapshotStream(String),
    #[error("writing an incoming snapshot: {0}")]
    Io(#[from] std::io::Error),
    /// Installing the snapshot of `range` would overwrite keys of `other`, a range with state
    /// on this node whose span overlaps the snapshot's (`other` has not applied the split
    /// that made `range` yet). The leader sends it again later.
    #[error("snapshot of range {range} overlaps range {other} on this node; refused")]
    Overlap { range: RangeId, other: RangeId },
    #[error(transparent)]
    Storage(#[from] StorageError),
}
