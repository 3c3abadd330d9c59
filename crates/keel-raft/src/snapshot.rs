//! Reading a snapshot file in bounded chunks for sending, and the header that travels in
//! front of the chunks. Knows nothing of the transport that carries them.

use keel_storage::SnapshotFile;
use keel_storage::raft_types::{SnapshotMeta, Vote};
use keel_types::limits;
use serde::{Deserialize, Serialize};
use tokio::io::AsyncReadExt;

/// What a receiver needs besides the bytes: the sender's vote and the snapshot's metadata.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct SnapshotHeader {
    pub vote: Vote,
    pub meta: SnapshotMeta,
}

/// Reads a snapshot file one chunk of at most `limits::SNAPSHOT_CHUNK_BYTES` at a time.
pub struct SnapshotReader {
    file: tokio::fs::File,
}

impl SnapshotReader {
    pub async fn open(snapshot: &SnapshotFile) -> std::io::Result<SnapshotReader> {
        Ok(SnapshotReader {
            file: snapshot.open_reader().await?,
        })
    }

    /// The next chunk; `None` at the end of the file. Every chunk but the last is full.
    pub async fn next_chunk(&mut self) -> std::io::Result<Option<Vec<u8>>> {
        let mut chunk = vec![0u8; limits::SNAPSHOT_CHUNK_BYTES];
        let mut filled = 0;
        while filled < chunk.len() {
            let read = self.file.read(&mut chunk[filled..]).await?;
            if read == 0 {
                break;
            }
            filled += read;
        }
        if filled == 0 {
            return Ok(None);
        }
        chunk.truncate(filled);
        Ok(Some(chunk))
    }
}
