//! A consistent snapshot of one range for a backup, taken on its leader: leadership confirmed
//! with a quorum (ReadIndex), so every write acknowledged before the request is applied here;
//! then the current snapshot if it covers everything applied, else a fresh one. The snapshot
//! is one read transaction of the state machine, so it is consistent in itself and carries
//! the range's revision. Knows nothing of how the bytes travel or where they are kept.

use std::time::Duration;

use keel_storage::SnapshotSummary;
use keel_types::{Consistency, KvError};
use openraft::async_runtime::WatchReceiver;
use openraft::storage::RaftStateMachine;

use crate::group::RaftGroup;
use crate::snapshot::SnapshotReader;

/// Times a backup looks for a covering snapshot: a newer one may replace it (and delete its
/// file) between the lookup and the open.
const BACKUP_SNAPSHOT_LOOKUPS_MAX: u32 = 3;

/// A snapshot of a range, opened for reading in chunks.
pub struct BackupSnapshot {
    /// The range, revision and log index the snapshot holds.
    pub summary: SnapshotSummary,
    pub len_bytes: u64,
    /// The snapshot's bytes, `limits::SNAPSHOT_CHUNK_BYTES` at a time. The file stays
    /// readable while open even if a newer snapshot replaces it.
    pub reader: SnapshotReader,
}

impl RaftGroup {
    /// A snapshot of everything this replica, which must lead, has applied once its
    /// leadership is confirmed (see the module doc). `NotLeader` on a follower; `Unavailable`
    /// when no covering snapshot is built within `timeout`.
    pub async fn backup_snapshot(&self, timeout: Duration) -> Result<BackupSnapshot, KvError> {
        self.check_leader()?;
        self.read_barrier(Consistency::Linearizable).await?;
        let applied = self.applied_index();
        for _ in 0..BACKUP_SNAPSHOT_LOOKUPS_MAX {
            let covered = self.snapshot_index() >= applied;
            if !covered {
                let what = "a snapshot for a backup";
                self.build_snapshot_covering(applied, timeout, what).await?;
            }
            if let Some(snapshot) = self.open_current(applied).await? {
                return Ok(snapshot);
            }
        }
        Err(KvError::unavailable(format!(
            "range {}: no snapshot covering log index {applied} could be opened after {} tries",
            self.range(),
            BACKUP_SNAPSHOT_LOOKUPS_MAX
        )))
    }

    /// The log index the latest snapshot openraft knows of covers (0: none).
    fn snapshot_index(&self) -> u64 {
        let metrics = self.raft().metrics();
        let metrics = metrics.borrow_watched();
        metrics.snapshot.map_or(0, |id| id.index)
    }

    /// The current snapshot opened, if it covers log index `applied` and is still there.
    async fn open_current(&self, applied: u64) -> Result<Option<BackupSnapshot>, KvError> {
        let range = self.range();
        let stored = |e: &dyn std::fmt::Display| KvError::fatal(format!("range {range}: {e}"));
        let mut state_machine = self.state_machine().clone();
        let current = state_machine
            .get_current_snapshot()
            .await
            .map_err(|e| stored(&e))?;
        let Some(current) = current else {
            return Ok(None);
        };
        if current.meta.last_log_id.map_or(0, |id| id.index) < applied {
            return Ok(None);
        }
        let file = current.snapshot;
        let reader = match SnapshotReader::open(&file).await {
            Ok(reader) => reader,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(stored(&e)),
        };
        let summary = match file.summary(range).await {
            Ok(summary) => summary,
            Err(keel_storage::StorageError::Io { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                return Ok(None);
            }
            Err(e) => return Err(stored(&e)),
        };
        Ok(Some(BackupSnapshot {
            summary,
            len_bytes: file.len_bytes(),
            reader,
        }))
    }
}
