//! `Store`: one redb file shared by many ranges, the node-wide Raft log of those ranges
//! (`wal`, in the directory beside the file, `log_dir`), their writer thread and their
//! snapshot directory. Knows nothing about gRPC, placement or the network.
//!
//! A file written before the log moved out of it (format 12 and older) keeps its entries in
//! its `raft_log` table: opening moves them into the log (`migrate_log`).
//!
//! Writes go through the writer thread (`writer`); reads run redb read transactions off the
//! async workers: small reads that serve requests on the file's reader threads (`reader`,
//! `read_small`), reads whose work grows with a range's size on
//! `tokio::task::spawn_blocking` (`read`).
//!
//! Opening a file of format 1-3 counts the keys and bytes of its ranges once (in the same
//! transaction that creates missing tables). The store lists the ranges it holds
//! (`descriptors`), signals when they change (`range_events`: after a split or a snapshot
//! install) and says whether an incoming snapshot would overlap another range it holds
//! (`snapshot_overlap`). Opening checks the file and the snapshots, and refuses data that
//! fails (`StorageError::Damaged`; `open_database`, `snapshot::verify_dir`).
//!
//! The methods that hand out a range's `LogStore` and `StateMachine`, remove a replica and
//! restore ranges are `impl Store` blocks in `log_store`, `state_machine`, `remove` and
//! `restore`: those build on this module, which names none of them.

use std::collections::BTreeMap;
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;

use keel_types::{Hold, RangeDescriptor, RangeId};
use redb::{Database, DatabaseError, ReadTransaction, ReadableDatabase, ReadableTable};
use tokio::sync::{mpsc, oneshot, watch};

use crate::check::Checker;
use crate::error::StorageError;
use crate::op::{Op, Outcome};
use crate::reader::{ReadResult, Readers};
use crate::snapshot::{self, IncomingSnapshot};
use crate::snapshot_file::SnapshotFile;
use crate::tables::{
    self, Bytes, DEADLINES, FENCES, HISTORY, IDEMPOTENCY, KV, KeySpan, LEASE_KEYS, LEASES, LOCKS,
    META, RAFT_LOG, RAFT_META, REQUESTS, SESSIONS, SM_META, TTL,
};
use crate::wal::{Change, Wal};
use crate::writer::{
    self, CommitObserver, Done, Message, Request, Shared, StoreStats, Writer, panic_message,
};

/// One redb file and its writer thread. Cheap to clone; all clones share the file.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

struct Inner {
    path: PathBuf,
    snapshot_dir: PathBuf,
    /// `None` after `shutdown`.
    db: RwLock<Option<Arc<Database>>>,
    wal: Arc<Wal>,
    /// `None` after `shutdown`; dropping the last sender stops the writer thread.
    sender: Mutex<Option<mpsc::Sender<Message>>>,
    writer: Mutex<Option<JoinHandle<()>>>,
    readers: Readers,
    checker: Checker,
    shared: Arc<Shared>,
    /// The ranges held (`keel_types::Hold`), as their `sm_meta` rows say: loaded at open,
    /// kept in step by applies, installs and removals, so that a read checks it in memory.
    holds: Mutex<BTreeMap<RangeId, Hold>>,
}

impl Store {
    /// Opens (or creates) the store file at `path` and starts its writer thread. Snapshots
    /// live in `snapshot_dir`; unfinished snapshot files left there by a crash are deleted.
    ///
    /// Opening checks the data: every page of the file's committed trees against its
    /// checksum (see `open_database`) and every snapshot file in full (`snapshot::verify_dir`:
    /// a damaged one is deleted). Data that fails and cannot be done without fails the open
    /// with `StorageError::Damaged`, logged as `store is damaged; refusing to open it`.
    pub fn open(path: &Path, snapshot_dir: &Path) -> Result<Store, StorageError> {
        Store::open_with(path, snapshot_dir, StoreOptions::default())
    }

    /// Opens the store with `options` (test-only faults).
    pub fn open_with(
        path: &Path,
        snapshot_dir: &Path,
        options: StoreOptions,
    ) -> Result<Store, StorageError> {
        std::fs::create_dir_all(snapshot_dir).map_err(|e| StorageError::io(snapshot_dir, e))?;
        snapshot::remove_unfinished(snapshot_dir)?;
        let db = open_database(path, options)?;
        create_tables(&db)?;
        let wal = Arc::new(Wal::open(&log_dir(path), options.lose_unsynced_writes)?);
        migrate_log(&db, &wal)?;
        drop_removed_logs(&db, &wal)?;
        check_snapshots(&db, snapshot_dir)?;
        let holds = read_holds(&db)?;
        let db = Arc::new(db);
        let shared = Arc::new(Shared::default());
        let (sender, rx) = writer::channel();
        let writer = Writer {
            db: db.clone(),
            wal: wal.clone(),
            rx,
            shared: shared.clone(),
            unsynced: false,
            last_durable: std::time::Instant::now(),
        };
        let readers = Readers::start(db.clone()).map_err(|e| StorageError::io(path, e))?;
        let checker = Checker::start().map_err(|e| StorageError::io(path, e))?;
        let handle = std::thread::Builder::new()
            .name("keel-storage-writer".to_string())
            .spawn(move || writer.run())
            .map_err(|e| StorageError::io(path, e))?;
        tracing::info!(path = %path.display(), "storage opened");
        Ok(Store {
            inner: Arc::new(Inner {
                path: path.to_path_buf(),
                snapshot_dir: snapshot_dir.to_path_buf(),
                db: RwLock::new(Some(db)),
                wal,
                sender: Mutex::new(Some(sender)),
                writer: Mutex::new(Some(handle)),
                readers,
                checker,
                shared,
                holds: Mutex::new(holds),
            }),
        })
    }

    /// Why `range` is held, while it is (`Command::Hold`): it serves no reads and applies no
    /// client command.
    pub fn hold(&self, range: RangeId) -> Option<Hold> {
        let holds = self.inner.holds.lock().unwrap_or_else(|e| e.into_inner());
        holds.get(&range).cloned()
    }

    /// Records in memory what `range`'s `sm_meta` now says of its hold.
    pub(crate) fn set_hold(&self, range: RangeId, hold: Option<Hold>) {
        let mut holds = self.inner.holds.lock().unwrap_or_else(|e| e.into_inner());
        match hold {
            Some(hold) => holds.insert(range, hold),
            None => holds.remove(&range),
        };
    }

    /// The descriptor of every range of this file with applied state (not in the middle of a
    /// snapshot install or of its removal), in range-id order; the meta range's has the empty
    /// span `[[], [])`.
    pub async fn descriptors(&self) -> Result<Vec<RangeDescriptor>, StorageError> {
        self.read(|txn| {
            let sm_meta = txn
                .open_table(SM_META)
                .map_err(|e| StorageError::redb("open sm_meta", e))?;
            let mut descriptors = Vec::new();
            for range in tables::ranges_in(&sm_meta)? {
                let state = tables::read_sm_state(&sm_meta, range)?;
                let serving = state.applied.is_some() && state.installing.is_none();
                if serving && !tables::is_removing(&sm_meta, range)? {
                    descriptors.push(state.descriptor(range));
                }
            }
            Ok(descriptors)
        })
        .await
    }

    /// A counter bumped after every commit that applied a split, finished a snapshot install
    /// or began a removal: the file's ranges or their spans changed (see `descriptors`).
    pub fn range_events(&self) -> watch::Receiver<u64> {
        self.inner.shared.range_events()
    }

    /// Another range with state in this file (applied or being installed) whose span overlaps
    /// the span of `snapshot`, a snapshot of `range`; installing it would overwrite that
    /// range's data, so the caller refuses it. A snapshot file of format 1-3 has the span
    /// `range` has without a span row (`RangeId::FIRST`: the whole keyspace).
    pub async fn snapshot_overlap(
        &self,
        range: RangeId,
        snapshot: &SnapshotFile,
    ) -> Result<Option<RangeId>, StorageError> {
        self.check()?;
        let facts = snapshot::read_facts(snapshot.path(), range).await?;
        self.read(move |txn| {
            let sm_meta = txn
                .open_table(SM_META)
                .map_err(|e| StorageError::redb("open sm_meta", e))?;
            overlapping_range(&sm_meta, range, &facts.span)
        })
        .await
    }

    /// Ranges with persisted Raft state (a vote, a committed or purged log id, or log
    /// entries), those being removed aside. Runs a read transaction on the calling thread:
    /// call it at startup, not from an async task.
    pub fn ranges(&self) -> Result<Vec<RangeId>, StorageError> {
        self.check()?;
        let txn = self
            .db()?
            .begin_read()
            .map_err(|e| StorageError::redb("begin read", e))?;
        let meta = txn
            .open_table(RAFT_META)
            .map_err(|e| StorageError::redb("open raft_meta", e))?;
        let sm_meta = txn
            .open_table(SM_META)
            .map_err(|e| StorageError::redb("open sm_meta", e))?;
        let mut ranges = tables::ranges_in(&meta)?;
        ranges.extend(self.inner.wal.ranges());
        ranges.sort();
        ranges.dedup();
        let mut kept = Vec::with_capacity(ranges.len());
        for range in ranges {
            if !tables::is_removing(&sm_meta, range)? {
                kept.push(range);
            }
        }
        Ok(kept)
    }

    /// Ranges whose removal a crash interrupted: finish each with `remove_range` before
    /// starting groups. Runs a read transaction on the calling thread, as `ranges`.
    pub fn removals(&self) -> Result<Vec<RangeId>, StorageError> {
        self.check()?;
        let txn = self
            .db()?
            .begin_read()
            .map_err(|e| StorageError::redb("begin read", e))?;
        let sm_meta = txn
            .open_table(SM_META)
            .map_err(|e| StorageError::redb("open sm_meta", e))?;
        let mut removing = Vec::new();
        for range in tables::ranges_in(&sm_meta)? {
            if tables::is_removing(&sm_meta, range)? {
                removing.push(range);
            }
        }
        Ok(removing)
    }

    /// Whether this file once removed its replica of `range` (and has not held state of it
    /// since: a tombstone).
    pub async fn was_removed(&self, range: RangeId) -> Result<bool, StorageError> {
        self.read(move |txn| {
            let sm_meta = txn
                .open_table(SM_META)
                .map_err(|e| StorageError::redb("open sm_meta", e))?;
            let tombstone: Option<bool> =
                tables::read_meta(&sm_meta, range, tables::SM_REMOVED, "removed tombstone")?;
            Ok(tombstone.is_some() && !tables::has_sm_state(&sm_meta, range)?)
        })
        .await
    }

    /// `Err(Poisoned)` after any write failure, `Err(Closed)` after `shutdown`.
    pub fn health(&self) -> Result<(), StorageError> {
        self.check()
    }

    /// Starts receiving a snapshot of `range` from a leader into a file of the snapshot
    /// directory.
    pub async fn incoming_snapshot(
        &self,
        range: RangeId,
    ) -> Result<IncomingSnapshot, StorageError> {
        self.check()?;
        IncomingSnapshot::create(&self.inner.snapshot_dir, range).await
    }

    /// Counters of the writer thread.
    pub fn stats(&self) -> StoreStats {
        self.inner.shared.stats()
    }

    /// Tells `observer` of every commit from now on (for commit latency and batch size
    /// metrics); false, and nothing changes, when the store has an observer already.
    pub fn observe_commits(&self, observer: Arc<dyn CommitObserver>) -> bool {
        self.inner.shared.observe(observer)
    }

    /// The size of the store's file, in bytes.
    pub fn file_bytes(&self) -> Result<u64, StorageError> {
        let path = &self.inner.path;
        let metadata = std::fs::metadata(path).map_err(|e| StorageError::io(path, e))?;
        Ok(metadata.len())
    }

    /// The size of the node-wide Raft log's segments, in bytes.
    pub fn log_bytes(&self) -> u64 {
        self.inner.wal.bytes()
    }

    pub(crate) fn wal(&self) -> &Arc<Wal> {
        &self.inner.wal
    }

    /// Lets the writer and the readers finish every queued request, stops them and closes
    /// the file. Blocks until their threads have exited. Later calls fail with
    /// `StorageError::Closed`.
    pub fn shutdown(&self) {
        self.inner.readers.shutdown();
        self.inner.checker.shutdown();
        drop(lock(&self.inner.sender).take());
        let writer = lock(&self.inner.writer).take();
        if let Some(handle) = writer
            && handle.join().is_err()
        {
            tracing::error!("storage writer thread had panicked");
        }
        self.inner
            .db
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        tracing::info!(path = %self.inner.path.display(), "storage closed");
    }

    /// Test seam: the next write transaction fails as if its commit had hit an I/O error.
    #[doc(hidden)]
    pub fn inject_commit_failure(&self) {
        self.inject_commit_failure_after(0);
    }

    /// Test seam: the write transaction after `successes` more successful commits fails as
    /// if its commit had hit an I/O error.
    #[doc(hidden)]
    pub fn inject_commit_failure_after(&self, successes: u64) {
        self.inner.shared.fail_commit_after(successes);
    }

    /// Test seam: the writer stops taking requests until the returned guard is dropped, so
    /// requests queue up and are committed together.
    #[doc(hidden)]
    pub async fn hold_writer(&self) -> Result<WriterHold, StorageError> {
        let (release, hold) = std::sync::mpsc::channel();
        self.send(Message::Hold(hold)).await?;
        Ok(WriterHold { _release: release })
    }

    pub(crate) fn snapshot_dir(&self) -> &Path {
        &self.inner.snapshot_dir
    }

    /// Queues a write; `done` fires after its transaction commits (or fails).
    pub(crate) async fn submit(&self, op: Op, done: Done) -> Result<(), StorageError> {
        // Counted before it can reach the writer, which uncounts it; taken back if it never
        // gets there (a send error, or this future dropped while the queue is full).
        let counted = self.inner.shared.count_outstanding();
        self.send(Message::Request(Box::new(Request { op, done })))
            .await?;
        counted.handed_over();
        Ok(())
    }

    /// Returns once every write queued before it has committed: at once when none is
    /// outstanding, else after a barrier has passed through the writer's queue.
    pub(crate) async fn barrier(&self) -> Result<(), StorageError> {
        self.check()?;
        if self.inner.shared.settled() {
            return Ok(());
        }
        self.call(Op::Barrier).await.map(|_| ())
    }

    /// Queues a write and waits for its commit.
    pub(crate) async fn call(&self, op: Op) -> Result<Outcome, StorageError> {
        let (reply, outcome) = oneshot::channel();
        self.submit(op, Done::Reply(reply)).await?;
        self.wait(outcome).await
    }

    /// Waits for a reply of the writer thread.
    pub(crate) async fn wait<T>(
        &self,
        reply: oneshot::Receiver<Result<T, StorageError>>,
    ) -> Result<T, StorageError> {
        match reply.await {
            Ok(result) => result,
            Err(_) => Err(self.stopped()),
        }
    }

    /// Runs `read` in a redb read transaction on a blocking thread of its own: for reads
    /// whose work grows with a range's size (a pass over a range, counts, plans).
    pub(crate) async fn read<T, F>(&self, read: F) -> Result<T, StorageError>
    where
        T: Send + 'static,
        F: FnOnce(&ReadTransaction) -> Result<T, StorageError> + Send + 'static,
    {
        self.check()?;
        let db = self.db()?;
        let task = tokio::task::spawn_blocking(move || {
            let txn = db
                .begin_read()
                .map_err(|e| StorageError::redb("begin read", e))?;
            read(&txn)
        });
        match task.await {
            Ok(result) => result,
            Err(join) => std::panic::resume_unwind(join.into_panic()),
        }
    }

    /// Runs `read` on the file's reader threads, possibly in one read transaction with other
    /// reads queued at the same time (begun after `read` was queued): for reads of bounded
    /// work that serve requests (a key, a page), which must not wait behind a long one.
    pub(crate) async fn read_small<T, F>(&self, read: F) -> Result<T, StorageError>
    where
        T: Send + 'static,
        F: FnOnce(&ReadTransaction) -> Result<T, StorageError> + Send + 'static,
    {
        self.check()?;
        let result: ReadResult<T> = self.inner.readers.read(read).await;
        result.unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    }

    /// A handle to the database for a blocking reader (snapshot building).
    pub(crate) fn checker(&self) -> &Checker {
        &self.inner.checker
    }

    /// Bytes of range state this file's checker has hashed for consistency checks since the
    /// store opened.
    pub fn check_hashed_bytes(&self) -> u64 {
        self.inner.checker.hashed_bytes()
    }

    pub(crate) fn db(&self) -> Result<Arc<Database>, StorageError> {
        let db = self.inner.db.read().unwrap_or_else(|e| e.into_inner());
        db.clone().ok_or(StorageError::Closed)
    }

    pub(crate) fn check(&self) -> Result<(), StorageError> {
        if let Some(poisoned) = self.inner.shared.poisoned() {
            return Err(poisoned);
        }
        self.db().map(|_| ())
    }

    async fn send(&self, message: Message) -> Result<(), StorageError> {
        self.check()?;
        let sender = lock(&self.inner.sender)
            .clone()
            .ok_or(StorageError::Closed)?;
        sender.send(message).await.map_err(|_| self.stopped())
    }

    /// The error for a writer that went away: poisoned if it failed, else closed.
    fn stopped(&self) -> StorageError {
        self.inner.shared.poisoned().unwrap_or(StorageError::Closed)
    }
}

/// Keeps the writer thread waiting while alive (test seam, see `Store::hold_writer`).
#[doc(hidden)]
pub struct WriterHold {
    _release: std::sync::mpsc::Sender<()>,
}

/// How a store opens its file.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreOptions {
    /// Test-only (feature `fault-injection`): keep writes in memory until redb syncs, so a
    /// killed process loses what it had not synced, as after a power loss (`lossy`).
    pub lose_unsynced_writes: bool,
}

/// Opens the redb file with every page of its committed trees verified against its checksum
/// (`set_check_integrity_on_open`), so a file altered outside redb is refused
/// (`StorageError::Damaged`) rather than trusted: a plain open of a file closed cleanly
/// reads pages unverified, and may serve altered data or panic.
///
/// One case is let through: a last durable commit that does not verify while the commit
/// before it does. Keel commits in one phase (one fsync), so that is what a power loss in the
/// middle of a commit leaves, and redb rolls the file back to the commit before, which holds
/// everything the node acknowledged. Damage confined to the last commit's own pages looks the
/// same and is rolled back the same way; it is logged (`store's last commit did not verify;
/// rolled back to the commit before`), and docs/CONSISTENCY.md says what it costs.
fn open_database(path: &Path, options: StoreOptions) -> Result<Database, StorageError> {
    let rollback = Arc::new(AtomicBool::new(false));
    let mut builder = Database::builder();
    builder.set_check_integrity_on_open(true);
    let seen = rollback.clone();
    builder.set_repair_callback(move |session| {
        if session.progress() == REDB_PRIMARY_FAILED_PROGRESS {
            seen.store(true, Ordering::Relaxed);
        }
    });
    let opened = panic::catch_unwind(AssertUnwindSafe(|| {
        if options.lose_unsynced_writes {
            open_lossy(path, &builder)
        } else {
            builder.create(path).map_err(|e| open_error(path, e))
        }
    }));
    let opened = opened.unwrap_or_else(|panic| {
        let detail = format!("redb panicked checking it: {}", panic_message(&*panic));
        Err(StorageError::damaged(path, detail))
    });
    match &opened {
        Err(StorageError::Damaged { detail, .. }) => {
            tracing::error!(path = %path.display(), %detail, "store is damaged; refusing to open it");
        }
        Ok(_) if rollback.load(Ordering::Relaxed) => tracing::warn!(
            path = %path.display(),
            "store's last commit did not verify; rolled back to the commit before (as after a \
             power loss)"
        ),
        _ => {}
    }
    opened
}

/// The progress redb reports to the repair callback of an open right after finding that the
/// last commit does not verify (`Database::do_repair` in redb 4.6), so the open can log the
/// rollback. Only the warning depends on it: a redb that reports another value still rolls
/// back, silently (`tests/it/damage.rs` damages such a commit).
const REDB_PRIMARY_FAILED_PROGRESS: f64 = 0.3;

/// The error of a failed open: `Damaged` when the file failed a check, else `Redb`.
fn open_error(path: &Path, error: DatabaseError) -> StorageError {
    match error {
        DatabaseError::Storage(redb::StorageError::Corrupted(detail)) => {
            StorageError::damaged(path, detail)
        }
        // "Not a redb database" (a changed magic number), or a page past the end of the file
        // (a file cut short).
        DatabaseError::Storage(redb::StorageError::Io(io))
            if matches!(
                io.kind(),
                std::io::ErrorKind::InvalidData | std::io::ErrorKind::UnexpectedEof
            ) =>
        {
            StorageError::damaged(path, io)
        }
        error => StorageError::redb("open", error),
    }
}

#[cfg(feature = "fault-injection")]
fn open_lossy(path: &Path, builder: &redb::Builder) -> Result<Database, StorageError> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|e| StorageError::io(path, e))?;
    let backend = crate::lossy::LossyBackend::new(file).map_err(|e| StorageError::io(path, e))?;
    builder
        .create_with_backend(backend)
        .map_err(|e| open_error(path, e))
}

#[cfg(not(feature = "fault-injection"))]
fn open_lossy(path: &Path, _builder: &redb::Builder) -> Result<Database, StorageError> {
    Err(StorageError::io(
        path,
        std::io::Error::other("losing unsynced writes needs the `fault-injection` feature"),
    ))
}

/// The directory of the node-wide Raft log of the store file at `path`: beside it, named
/// after it (`keel.redb` → `keel.raft-log`).
pub(crate) fn log_dir(path: &Path) -> PathBuf {
    path.with_extension("raft-log")
}

/// Moves the entries a file of format 12 or older keeps in its `raft_log` table into the
/// node-wide log, durably, then deletes them from the file in a durable commit. A crash in
/// between moves them again on the next open: the same entries appended again replace
/// themselves. Each range's purged log id stays in `raft_meta`, where `LogStore` reads it.
fn migrate_log(db: &Database, wal: &Wal) -> Result<(), StorageError> {
    let by_range = {
        let txn = db
            .begin_read()
            .map_err(|e| StorageError::redb("begin read", e))?;
        let log = txn
            .open_table(RAFT_LOG)
            .map_err(|e| StorageError::redb("open raft_log", e))?;
        tables::read_all_entries(&log)?
    };
    if by_range.is_empty() {
        return Ok(());
    }
    let entries: usize = by_range.values().map(Vec::len).sum();
    let mut changes = Vec::new();
    for (range, range_entries) in &by_range {
        if let Some(first) = range_entries.first() {
            changes.push(Change::Truncate {
                range: *range,
                first_removed: first.log_id.index,
            });
        }
        changes.push(Change::Append {
            range: *range,
            entries: range_entries,
        });
    }
    wal.write(&changes)?;
    wal.sync()?;
    let txn = db
        .begin_write()
        .map_err(|e| StorageError::redb("begin write", e))?;
    {
        let mut log = txn
            .open_table(RAFT_LOG)
            .map_err(|e| StorageError::redb("open raft_log", e))?;
        log.retain(|_, _| false)
            .map_err(|e| StorageError::redb("clear raft_log", e))?;
    }
    txn.commit().map_err(|e| StorageError::redb("commit", e))?;
    tracing::info!(
        ranges = by_range.len(),
        entries,
        "raft log entries moved out of the store file into the node-wide log"
    );
    Ok(())
}

/// Drops from the log the removed replicas the file holds nothing else of (the removed
/// tombstone, no `raft_meta` row, no state-machine state): a removal whose last step
/// (`Op::RemoveFinish`, dropping the range from the log after its durable commit) a crash
/// cut short. A replica added again saves a vote or installs a snapshot before it appends.
fn drop_removed_logs(db: &Database, wal: &Wal) -> Result<(), StorageError> {
    let txn = db
        .begin_read()
        .map_err(|e| StorageError::redb("begin read", e))?;
    let raft_meta = txn
        .open_table(RAFT_META)
        .map_err(|e| StorageError::redb("open raft_meta", e))?;
    let sm_meta = txn
        .open_table(SM_META)
        .map_err(|e| StorageError::redb("open sm_meta", e))?;
    let with_meta = tables::ranges_in(&raft_meta)?;
    let mut drops = Vec::new();
    for range in wal.ranges() {
        let tombstone: Option<bool> =
            tables::read_meta(&sm_meta, range, tables::SM_REMOVED, "removed tombstone")?;
        if tombstone.is_some()
            && !with_meta.contains(&range)
            && !tables::has_sm_state(&sm_meta, range)?
        {
            drops.push(Change::Drop { range });
        }
    }
    if !drops.is_empty() {
        wal.write(&drops)?;
        wal.sync()?;
        tracing::info!(
            ranges = drops.len(),
            "log entries of removed replicas dropped"
        );
    }
    Ok(())
}

fn create_tables(db: &Database) -> Result<(), StorageError> {
    let txn = db
        .begin_write()
        .map_err(|e| StorageError::redb("begin write", e))?;
    // A file of an older format gains the tables it lacks here, so read transactions (which
    // cannot create tables) find every table.
    let all = [
        RAFT_LOG,
        RAFT_META,
        SM_META,
        KV,
        TTL,
        SESSIONS,
        REQUESTS,
        LOCKS,
        FENCES,
        IDEMPOTENCY,
        DEADLINES,
        LEASES,
        LEASE_KEYS,
        META,
    ];
    for table in all {
        txn.open_table(table)
            .map_err(|e| StorageError::redb("create table", e))?;
    }
    txn.open_table(HISTORY)
        .map_err(|e| StorageError::redb("create table", e))?;
    {
        // A file of format 1-3 has no key and byte counts: count them once.
        let mut sm_meta = txn
            .open_table(SM_META)
            .map_err(|e| StorageError::redb("open sm_meta", e))?;
        let kv = txn
            .open_table(KV)
            .map_err(|e| StorageError::redb("open kv", e))?;
        for range in tables::count_unrecorded_kv(&mut sm_meta, &kv)? {
            tracing::info!(%range, "counted the keys and bytes of a range of an older format");
        }
        // A file of format 1-5 has no coordination byte counts: count them once.
        let open = |table| {
            txn.open_table(table)
                .map_err(|e| StorageError::redb("open table", e))
        };
        let (locks, fences, records) = (open(LOCKS)?, open(FENCES)?, open(IDEMPOTENCY)?);
        tables::count_unrecorded_coordination(&mut sm_meta, [&locks, &fences, &records])?;
        // A file of format 1-7 has no history: start it at each range's revision.
        tables::start_unrecorded_history(&mut sm_meta)?;
    }
    txn.commit().map_err(|e| StorageError::redb("commit", e))
}

/// The hold of every range held in this file.
fn read_holds(db: &Database) -> Result<BTreeMap<RangeId, Hold>, StorageError> {
    let txn = db
        .begin_read()
        .map_err(|e| StorageError::redb("begin read", e))?;
    let sm_meta = txn
        .open_table(SM_META)
        .map_err(|e| StorageError::redb("open sm_meta", e))?;
    let mut holds = BTreeMap::new();
    for range in tables::ranges_in(&sm_meta)? {
        if let Some(hold) = tables::read_sm_state(&sm_meta, range)?.hold {
            holds.insert(range, hold);
        }
    }
    Ok(holds)
}

/// Checks the snapshot files (`snapshot::verify_dir`), telling it which ranges are in the
/// middle of installing a snapshot.
fn check_snapshots(db: &Database, snapshot_dir: &Path) -> Result<(), StorageError> {
    let txn = db
        .begin_read()
        .map_err(|e| StorageError::redb("begin read", e))?;
    let sm_meta = txn
        .open_table(SM_META)
        .map_err(|e| StorageError::redb("open sm_meta", e))?;
    let installing = |range| Ok(tables::read_sm_state(&sm_meta, range)?.installing.is_some());
    let checked = snapshot::verify_dir(snapshot_dir, installing);
    if let Err(StorageError::Damaged { path, detail }) = &checked {
        tracing::error!(path = %path.display(), %detail, "store is damaged; refusing to open it");
    }
    checked
}

/// A range other than `range` whose rows in this file (`tables::owned_span`) overlap `span`.
/// A range whose first snapshot is being installed owns no span until the install finishes
/// (it has neither a span row nor an applied log id); for the first range this matters: its
/// unrecorded span is the whole keyspace, which would refuse every other range's snapshot
/// on a new node receiving several replicas at once.
pub(crate) fn overlapping_range<R>(
    sm_meta: &R,
    range: RangeId,
    span: &KeySpan,
) -> Result<Option<RangeId>, StorageError>
where
    R: ReadableTable<Bytes, Bytes>,
{
    for other in tables::ranges_in(sm_meta)? {
        if other == range {
            continue;
        }
        let owned = tables::owned_span(sm_meta, other)?;
        if owned.is_some_and(|owned| owned.overlaps(span)) {
            return Ok(Some(other));
        }
    }
    Ok(None)
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests;
