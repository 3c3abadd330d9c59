//! Removing a range's replica from this file, once its group has left the range: its Raft
//! log and metadata, its exactly-once state and the rows, locks, fences and idempotency
//! records of its span are deleted. Knows nothing of why the replica was removed or who
//! decided it.
//!
//! Crash safety: the removal runs in several transactions (writer ops: `op::remove`, and an
//! install's `op::install::clear`), so a crash can leave it half done. Therefore:
//! 1. a durable commit writes a *removing* marker into `sm_meta`; from then on the range is
//!    listed neither by `Store::ranges` nor by `Store::descriptors` (no group starts for it,
//!    no request is routed to it), but its span still counts as owned, so a snapshot of
//!    another range overlapping it is refused until the end;
//! 2. bounded transactions delete its request records, sessions and span (as a snapshot
//!    install clears them; a range caught mid-install also has the span of the snapshot it
//!    was installing cleared);
//! 3. one durable commit deletes its log, its `raft_meta` and its `sm_meta` rows, the
//!    marker among them, and leaves a *removed* tombstone (`Store::was_removed`), so the
//!    node never takes the range for one it has yet to receive from a bootstrap; then its
//!    snapshot files are deleted.
//!
//! `Store::removals` lists ranges whose removal a crash interrupted; the node finishes them
//! with `Store::remove_range` before it starts any group.

use keel_types::RangeId;

use crate::error::StorageError;
use crate::op::{Op, Outcome};
use crate::snapshot;
use crate::store::Store;
use crate::tables::{self, KeySpan, SM_META};

impl Store {
    /// Deletes this file's replica of `range`: its log, Raft and state-machine metadata,
    /// exactly-once state, and the rows, locks, fences and idempotency records of its span
    /// (see the module doc: crash-safe, in bounded transactions). Its group must be stopped
    /// first. Idempotent: a removal interrupted by a crash is finished by calling it again;
    /// a range the file does not hold is a no-op.
    pub async fn remove_range(&self, range: RangeId) -> Result<(), StorageError> {
        let installing = self
            .read(move |txn| {
                let sm_meta = txn
                    .open_table(SM_META)
                    .map_err(|e| StorageError::redb("open sm_meta", e))?;
                Ok(tables::read_sm_state(&sm_meta, range)?.installing.is_some())
            })
            .await?;
        let span = match installing {
            true => installing_span(self, range).await?,
            false => KeySpan::none(),
        };
        self.call(Op::RemoveBegin { range }).await?;
        let clear = || Op::InstallClear {
            range,
            span: span.clone(),
        };
        while let Outcome::More(true) = self.call(clear()).await? {}
        self.call(Op::RemoveFinish { range }).await?;
        let dir = self.snapshot_dir().to_path_buf();
        tokio::task::spawn_blocking(move || snapshot::remove_all(&dir, range))
            .await
            .map_err(|e| StorageError::io(self.snapshot_dir(), std::io::Error::other(e)))??;
        self.set_hold(range, None);
        tracing::info!(%range, "replica removed from this store");
        Ok(())
    }
}

/// The span of the snapshot an interrupted install was writing (its current snapshot).
async fn installing_span(store: &Store, range: RangeId) -> Result<KeySpan, StorageError> {
    match snapshot::current(store.snapshot_dir(), range).await? {
        Some(current) => Ok(snapshot::read_facts(current.snapshot.path(), range)
            .await?
            .span),
        None => Ok(KeySpan::none()),
    }
}
