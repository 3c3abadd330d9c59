//! `SnapshotFile`: a complete snapshot file on disk, the snapshot data openraft carries
//! (`raft_types::Snapshot`). Knows nothing of what the file holds: writing, reading and
//! checking its records is `snapshot`'s (`SnapshotFile::verify` is there).

use std::io;
use std::path::{Path, PathBuf};

/// A complete snapshot file on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotFile {
    pub(crate) path: PathBuf,
    pub(crate) len_bytes: u64,
}

impl SnapshotFile {
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn len_bytes(&self) -> u64 {
        self.len_bytes
    }

    /// Opens the file for streaming it to a follower. Fails with `NotFound` if a newer
    /// snapshot has replaced it since; ask for the current snapshot again.
    pub async fn open_reader(&self) -> io::Result<tokio::fs::File> {
        tokio::fs::File::open(&self.path).await
    }
}
