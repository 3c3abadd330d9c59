//! The storage error type. Knows nothing about gRPC; `keel-server` maps it to a status.

use std::io;
use std::path::PathBuf;

use keel_types::RangeId;
use thiserror::Error;

/// Everything that can go wrong in `keel-storage`.
///
/// `Poisoned` and `Closed` mean "this store has stopped": the node must not retry on this
/// file. The other variants are the first failure (which also poisons a write path) or a
/// problem with one read.
#[derive(Debug, Error)]
pub enum StorageError {
    /// An earlier write failed; the store refuses all further work (no retried fsync).
    #[error("storage is poisoned after an earlier failure: {cause}")]
    Poisoned { cause: String },

    /// The store was shut down.
    #[error("storage is closed")]
    Closed,

    /// redb reported an error.
    #[error("redb {context}: {source}")]
    Redb {
        context: &'static str,
        source: redb::Error,
    },

    /// A file operation failed.
    #[error("I/O error on {}: {source}", .path.display())]
    Io { path: PathBuf, source: io::Error },

    /// A persisted record carries a format version this build does not know.
    #[error("{what} has format version {version}; this build reads versions up to {known}")]
    UnknownVersion {
        what: &'static str,
        version: u8,
        known: u8,
    },

    /// A persisted record could not be decoded.
    #[error("corrupt {what}: {detail}")]
    Corrupt { what: &'static str, detail: String },

    /// A snapshot of `range` spans keys of `other`, another range with state in this file;
    /// installing it would overwrite that range's data.
    #[error("a snapshot of range {range} overlaps range {other}, which this store holds")]
    SpanOverlap { range: RangeId, other: RangeId },

    /// A restore of `range` was refused (`Store::restore_range`, `Store::restore_meta`).
    #[error("restoring range {range} refused: {detail}")]
    Restore { range: RangeId, detail: String },

    /// The range is in the middle of a snapshot install; its data is not readable yet.
    #[error("range {range} is installing a snapshot; its data is not readable yet")]
    SnapshotInstalling { range: RangeId },

    /// The store's data failed its checks when the store opened: the redb file (a page
    /// checksum, a commit slot, its length, or a last durable commit redb would have rolled
    /// back), or the snapshot file a range is in the middle of installing. The node must not
    /// serve from this store (see `Store::open`).
    #[error(
        "{} is damaged: {detail}; this node must not serve from its data: wipe its data \
         directory and add it back as a new node (a new --node-id)",
        .path.display()
    )]
    Damaged { path: PathBuf, detail: String },

    /// A snapshot file failed its checks (framing, record count, checksum): it is not
    /// installed, restored or kept.
    #[error("snapshot file {} is damaged: {detail}", .path.display())]
    SnapshotDamaged { path: PathBuf, detail: String },
}

impl StorageError {
    pub(crate) fn redb(context: &'static str, source: impl Into<redb::Error>) -> Self {
        StorageError::Redb {
            context,
            source: source.into(),
        }
    }

    pub(crate) fn io(path: impl Into<PathBuf>, source: io::Error) -> Self {
        StorageError::Io {
            path: path.into(),
            source,
        }
    }

    pub(crate) fn damaged(path: impl Into<PathBuf>, detail: impl ToString) -> Self {
        StorageError::Damaged {
            path: path.into(),
            detail: detail.to_string(),
        }
    }

    pub(crate) fn corrupt(what: &'static str, detail: impl ToString) -> Self {
        StorageError::Corrupt {
            what,
            detail: detail.to_string(),
        }
    }

    /// Whether the store has stopped (poisoned or closed) rather than one request failing.
    pub fn is_fatal(&self) -> bool {
        matches!(self, StorageError::Poisoned { .. } | StorageError::Closed)
    }
}

impl From<StorageError> for io::Error {
    fn from(error: StorageError) -> io::Error {
        let kind = match &error {
            StorageError::Io { source, .. } => source.kind(),
            StorageError::UnknownVersion { .. }
            | StorageError::Corrupt { .. }
            | StorageError::Damaged { .. }
            | StorageError::SnapshotDamaged { .. } => io::ErrorKind::InvalidData,
            _ => io::ErrorKind::Other,
        };
        io::Error::new(kind, error)
    }
}
