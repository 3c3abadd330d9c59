//! `LogStore`: the Raft log and vote of one range, as openraft's
//! `RaftLogStorage` and `RaftLogReader`. Knows nothing about the state machine's data,
//! gRPC or the network.
//!
//! The entries live in the store's node-wide Raft log (`wal`), the vote and the purged log
//! id a split or restore starts a range with in redb's `raft_meta`. Appends, votes,
//! truncations and purges are executed by the store's writer thread and reported only after
//! they are durable. Reads run on blocking threads.
//!
//! Most reads come right behind the appends: replication sends the entries just appended,
//! and the state machine applies the entries just committed. So the log keeps its latest
//! entries in memory (`RecentLog`), and reads take entries from there first and from the
//! node-wide log for the rest. An appended entry stays there until the writer has made it
//! durable: openraft replicates entries as soon as `append` returns. A durable one stays
//! while the durable ones fit in `DURABLE_KEPT_BYTES`.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::sync::{Arc, Mutex};

use crate::codec;
use crate::error::StorageError;
use crate::op::Op;
use crate::raft_types::{Entry, IoFlushed, LogId, LogState, TypeConfig, Vote};
use crate::store::Store;
use crate::tables::{self, RAFT_META, RAFT_PURGED, RAFT_VOTE};
use keel_types::RangeId;
use openraft::OptionalSend;
use openraft::storage::{RaftLogReader, RaftLogStorage};

/// Encoded bytes of durable entries a range's log keeps in memory at most: a commit batch of
/// small writes fits (64 puts of 256 bytes are about 20 KiB), and 1,000 ranges keep at most
/// 64 MiB. Larger entries are read back from the node-wide log.
const DURABLE_KEPT_BYTES: usize = 64 * 1024;

/// The Raft log of one range. Cheap to clone; clones share the recent entries.
#[derive(Clone)]
pub struct LogStore {
    store: Store,
    range: RangeId,
    recent: Arc<RecentLog>,
}

/// The latest entries of the log, by index: contiguous and ending at the last appended one.
/// Every entry the writer has not committed yet is here, so every appended entry is readable
/// from here or from redb.
#[derive(Default)]
struct RecentLog {
    entries: Mutex<Recent>,
}

#[derive(Default)]
struct Recent {
    entries: BTreeMap<u64, Kept>,
    /// Encoded bytes of the durable entries.
    durable_bytes: usize,
}

struct Kept {
    entry: Arc<Entry>,
    /// Encoded bytes.
    bytes: usize,
    durable: bool,
}

impl RecentLog {
    fn lock(&self) -> std::sync::MutexGuard<'_, Recent> {
        self.entries.lock().expect("recent log lock poisoned")
    }
}

impl Recent {
    fn append(&mut self, entries: &[Arc<Entry>]) {
        for entry in entries {
            let index = entry.log_id.index;
            if self
                .entries
                .last_key_value()
                .is_some_and(|(&last, _)| index > last + 1)
            {
                // The log jumped (past an installed snapshot): what is kept is durable or
                // purged, and keeping it would leave a gap reads cannot tell from the disk.
                let kept = std::mem::take(&mut self.entries);
                self.durable_bytes = 0;
                self.entries = kept.into_iter().filter(|(_, kept)| !kept.durable).collect();
            }
            let kept = Kept {
                entry: Arc::clone(entry),
                bytes: codec::encoded_len(entry.as_ref()),
                durable: false,
            };
            if let Some(replaced) = self.entries.insert(index, kept) {
                self.forget(&replaced);
            }
        }
    }

    /// Marks the committed `ids` durable, unless an entry was replaced meanwhile (truncated
    /// and appended again), then forgets the oldest durable entries beyond the budget.
    /// Commits come in log order, so the durable entries lead the map.
    fn settle(&mut self, ids: &[LogId]) {
        for id in ids {
            if let Some(kept) = self.entries.get_mut(&id.index)
                && kept.entry.log_id == *id
                && !kept.durable
            {
                kept.durable = true;
                self.durable_bytes += kept.bytes;
            }
        }
        while self.durable_bytes > DURABLE_KEPT_BYTES {
            let Some(first) = self.entries.first_entry() else {
                break;
            };
            if !first.get().durable {
                break;
            }
            let kept = first.remove();
            self.forget(&kept);
        }
    }

    /// Forgets every entry from `first` on.
    fn truncate(&mut self, first: u64) {
        for kept in self.entries.split_off(&first).into_values() {
            self.forget(&kept);
        }
    }

    /// Forgets every entry up to and including `last`.
    fn purge(&mut self, last: u64) {
        let kept = self.entries.split_off(&(last + 1));
        for purged in std::mem::replace(&mut self.entries, kept).into_values() {
            self.forget(&purged);
        }
    }

    fn forget(&mut self, kept: &Kept) {
        if kept.durable {
            self.durable_bytes -= kept.bytes;
        }
    }
}

impl Store {
    /// The Raft log of one range.
    pub fn log_store(&self, range: RangeId) -> LogStore {
        LogStore::new(self.clone(), range)
    }
}

impl LogStore {
    fn new(store: Store, range: RangeId) -> LogStore {
        LogStore {
            store,
            range,
            recent: Arc::default(),
        }
    }

    /// The range this log belongs to.
    pub fn range(&self) -> RangeId {
        self.range
    }

    async fn read_entries(&self, start: u64, end: Option<u64>) -> Result<Vec<Entry>, StorageError> {
        self.store.check()?;
        let (range, wal) = (self.range, self.store.wal().clone());
        let task = tokio::task::spawn_blocking(move || wal.read(range, start, end));
        let entries = match task.await {
            Ok(result) => result?,
            Err(join) => std::panic::resume_unwind(join.into_panic()),
        };
        for pair in entries.windows(2) {
            assert_eq!(
                pair[1].log_id.index,
                pair[0].log_id.index + 1,
                "range {range}: raft log has a gap"
            );
        }
        Ok(entries)
    }

    async fn read_raft_meta<T>(
        &self,
        kind: u8,
        what: &'static str,
    ) -> Result<Option<T>, StorageError>
    where
        T: serde::de::DeserializeOwned + Send + 'static,
    {
        let range = self.range;
        self.store
            .read(move |txn| {
                let meta = txn
                    .open_table(RAFT_META)
                    .map_err(|e| StorageError::redb("open raft_meta", e))?;
                tables::read_meta(&meta, range, kind, what)
            })
            .await
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, io::Error> {
        let start = match range.start_bound() {
            Bound::Included(&index) => index,
            Bound::Excluded(&index) => index.saturating_add(1),
            Bound::Unbounded => 0,
        };
        let end = match range.end_bound() {
            Bound::Included(&index) => index.checked_add(1),
            Bound::Excluded(&index) => Some(index),
            Bound::Unbounded => None,
        };
        if end.is_some_and(|end| end <= start) {
            return Ok(Vec::new());
        }
        // Recent entries first: one forgotten after this copy is on disk by then, and the
        // disk read below stops where the recent ones start.
        let recent: Vec<Entry> = {
            let recent = self.recent.lock();
            let upper = end.map_or(Bound::Unbounded, Bound::Excluded);
            let span = (Bound::Included(start), upper);
            recent
                .entries
                .range(span)
                .map(|(_, kept)| Entry::clone(&kept.entry))
                .collect()
        };
        let disk_end = match (recent.first(), end) {
            (Some(first), _) => Some(first.log_id.index),
            (None, end) => end,
        };
        if disk_end.is_some_and(|disk_end| disk_end <= start) {
            return Ok(recent);
        }
        let mut entries = self.read_entries(start, disk_end).await?;
        entries.extend(recent);
        Ok(entries)
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, io::Error> {
        Ok(self.read_raft_meta(RAFT_VOTE, "vote").await?)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    /// The purged log id is the later of the log's and the one a split, a restore or a file
    /// of format 12 left in `raft_meta`.
    async fn get_log_state(&mut self) -> Result<LogState, io::Error> {
        let started: Option<LogId> = self.read_raft_meta(RAFT_PURGED, "purged log id").await?;
        let (purged, last) = self.store.wal().state(self.range);
        let last_purged_log_id = later(purged, started);
        let last_log_id = later(last, last_purged_log_id);
        let recent_last =
            (self.recent.lock().entries.values().next_back()).map(|kept| kept.entry.log_id);
        Ok(LogState {
            last_purged_log_id,
            last_log_id: recent_last.or(last_log_id),
        })
    }

    async fn get_log_reader(&mut self) -> LogStore {
        self.clone()
    }

    /// Returns after the vote is durable.
    async fn save_vote(&mut self, vote: &Vote) -> Result<(), io::Error> {
        let op = Op::SaveVote {
            range: self.range,
            vote: *vote,
        };
        self.store.call(op).await?;
        Ok(())
    }

    /// Writes nothing: the state machine stores its applied log id with the data it applied,
    /// in the same transaction, and openraft starts from that id after a restart (a committed
    /// id written here would be no more durable: it would go out with the next append's
    /// fsync, as the applies do). While the writer has requests outstanding it waits for
    /// them (a barrier, no transaction): that paces the Raft loop to the writer's commits, so
    /// the client writes that arrive meanwhile go out as one append. Without the wait puts
    /// at 64 clients fell 21-37 % (smaller appends, more fsyncs); with a transaction of its
    /// own each write costs one more commit. With nothing outstanding there is nothing to
    /// pace, and it answers at once (a lone write skips a round trip to the writer thread).
    async fn save_committed(&mut self, _committed: Option<LogId>) -> Result<(), io::Error> {
        self.store.barrier().await?;
        Ok(())
    }

    /// None: the committed log id is not stored (see `save_committed`). Files written by
    /// earlier builds hold one, not durably; it is ignored like a lost one: openraft starts
    /// from the applied id and learns what else is committed from the leader.
    async fn read_committed(&mut self) -> Result<Option<LogId>, io::Error> {
        Ok(None)
    }

    /// Returns once the entries are queued; `callback` fires after their durable commit.
    async fn append<I>(&mut self, entries: I, callback: IoFlushed) -> Result<(), io::Error>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        // Shared with the writer: the recent copy costs a reference count, not a copy.
        let entries: Vec<Arc<Entry>> = entries.into_iter().map(Arc::new).collect();
        if entries.is_empty() {
            callback.io_completed(Ok(()));
            return Ok(());
        }
        let ids: Vec<LogId> = entries.iter().map(|entry| entry.log_id).collect();
        self.recent.lock().append(&entries);
        let recent = self.recent.clone();
        let settle: crate::writer::Settle = Box::new(move || recent.lock().settle(&ids));
        let op = Op::Append {
            range: self.range,
            entries,
        };
        let done = crate::writer::Done::Flushed(callback, Some(settle));
        self.store.submit(op, done).await?;
        Ok(())
    }

    /// Deletes every entry after `last_log_id` (all of them for `None`); returns after the
    /// deletion is durable.
    async fn truncate_after(&mut self, last_log_id: Option<LogId>) -> Result<(), io::Error> {
        let first_removed = last_log_id.map_or(0, |last| last.index + 1);
        self.recent.lock().truncate(first_removed);
        let op = Op::TruncateAfter {
            range: self.range,
            last: last_log_id,
        };
        self.store.call(op).await?;
        Ok(())
    }

    /// Deletes every entry up to and including `log_id`; returns after it is durable.
    async fn purge(&mut self, log_id: LogId) -> Result<(), io::Error> {
        self.recent.lock().purge(log_id.index);
        let op = Op::Purge {
            range: self.range,
            upto: log_id,
        };
        self.store.call(op).await?;
        Ok(())
    }
}

/// The one of two log ids with the higher index (`a` when they are level).
fn later(a: Option<LogId>, b: Option<LogId>) -> Option<LogId> {
    match (a, b) {
        (Some(a), Some(b)) if b.index > a.index => Some(b),
        (None, b) => b,
        (a, _) => a,
    }
}

#[cfg(test)]
mod tests;
