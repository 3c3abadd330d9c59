//! The one writer thread of a store and its group commit. Knows nothing about openraft's
//! traits beyond the callbacks it fires, and nothing about async: it is a plain
//! `std::thread` fed by a bounded channel.
//!
//! The thread blocks for one request, drains up to `STORAGE_COMMIT_BATCH_MAX` more that are
//! already queued, and executes them all together, in three steps:
//! 1. the batch's appends and truncations of every range go to the node-wide Raft log
//!    (`wal`) in one write, made durable by one `fdatasync`;
//! 2. every other op runs in one redb write transaction (`op::execute`: what each op does
//!    is `op`'s), committed with `Durability::Immediate` if any of them needs durability
//!    (`Op::needs_durability`), if the batch purges the log, or if the last durable commit
//!    is `STORAGE_DURABLE_COMMIT_INTERVAL_MS` old; else with `Durability::None`: applies
//!    lost in a crash are applied again from the log, which keeps them until the state
//!    machine's commit that applied them is durable;
//! 3. the batch's purges and removals go to the log, durable too, after that commit.
//!
//! Only then does it fire every callback. Any error poisons the store: the batch and every
//! later request fail, nothing is retried. After a commit that applied a split or finished a
//! snapshot install, and before any callback, it bumps the store's range events
//! (`Store::range_events`).

use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use keel_types::planted::{self, PlantedBug};
use keel_types::{CommandOutcome, limits};
use redb::{Database, Durability};
use tokio::sync::{mpsc, oneshot, watch};

use crate::error::StorageError;
use crate::op::{self, Op, Outcome};
use crate::raft_types::{ApplyResponder, IoFlushed};
use crate::wal::{Change, Wal};

pub(crate) type Reply = oneshot::Sender<Result<Outcome, StorageError>>;

/// Who to tell once the op's transaction has committed (or failed).
pub(crate) enum Done {
    /// openraft's log-flush callback, and what to do after a successful commit before it
    /// fires (the log store forgets entries it kept in memory until they were on disk).
    Flushed(IoFlushed, Option<Settle>),
    Reply(Reply),
    /// Apply: each client responder gets its entry's outcome, then the caller is told.
    Applied {
        reply: Reply,
        responders: Vec<Option<ApplyResponder>>,
    },
}

/// Work to do once a request's transaction has committed.
pub(crate) type Settle = Box<dyn FnOnce() + Send>;

pub(crate) struct Request {
    pub op: Op,
    pub done: Done,
}

pub(crate) enum Message {
    Request(Box<Request>),
    /// Test seam: the writer waits until the sender is dropped, so requests pile up.
    Hold(std::sync::mpsc::Receiver<()>),
}

/// Counters of a store's writer, for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Batches committed (to the Raft log, to redb, or both).
    pub commits: u64,
    /// Of those, the ones made durable (an fsync of the log, a `Durability::Immediate`
    /// redb commit, or both).
    pub durable_commits: u64,
    /// Write requests received by the writer thread.
    pub requests: u64,
}

/// One committed write transaction, as a [`CommitObserver`] is told of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Commit {
    /// Made durable (an fsync of the log or a `Durability::Immediate` redb commit).
    pub durable: bool,
    /// Write requests executed in the transaction (0 for the flush at shutdown).
    pub requests: usize,
    /// From the start of the transaction to the end of its commit.
    pub duration: Duration,
}

/// Told of every commit, on the writer thread, before the commit's callbacks fire: it must
/// return at once (count; never block or do I/O).
pub trait CommitObserver: Send + Sync + 'static {
    fn committed(&self, commit: &Commit);
}

/// State shared by the writer thread and every handle of the store.
#[derive(Default)]
pub(crate) struct Shared {
    poison: OnceLock<String>,
    /// Bumped after every commit that applied a split or finished a snapshot install.
    range_events: watch::Sender<u64>,
    /// Test seam: 0 = off; n = the n-th commit from now fails.
    fail_commit_in: AtomicU64,
    requests: AtomicU64,
    /// Requests submitted whose transaction has not finished yet (committed or failed).
    outstanding: AtomicU64,
    commits: AtomicU64,
    durable_commits: AtomicU64,
    observer: OnceLock<Arc<dyn CommitObserver>>,
}

impl Shared {
    pub fn poisoned(&self) -> Option<StorageError> {
        self.poison.get().map(|cause| StorageError::Poisoned {
            cause: cause.clone(),
        })
    }

    fn poison(&self, cause: String) {
        tracing::error!(%cause, "storage poisoned; refusing all further work on this file");
        let _ = self.poison.set(cause);
    }

    /// Test seam: the commit after `successes` more successful ones fails.
    pub fn fail_commit_after(&self, successes: u64) {
        self.fail_commit_in.store(successes + 1, Ordering::SeqCst);
    }

    fn take_injected_failure(&self) -> bool {
        let update = self
            .fail_commit_in
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
                left.checked_sub(1)
            });
        update == Ok(1)
    }

    pub fn range_events(&self) -> watch::Receiver<u64> {
        self.range_events.subscribe()
    }

    /// Sets the commit observer; false (and nothing changes) when one is set already.
    pub fn observe(&self, observer: Arc<dyn CommitObserver>) -> bool {
        self.observer.set(observer).is_ok()
    }

    /// Counts one request as outstanding from now until the writer has finished its
    /// transaction; the count is taken back when the guard is dropped before
    /// `Outstanding::handed_over` (the request never reached the writer's queue).
    pub fn count_outstanding(&self) -> Outstanding<'_> {
        self.outstanding.fetch_add(1, Ordering::SeqCst);
        Outstanding {
            shared: self,
            handed_over: false,
        }
    }

    /// The writer has finished the transaction of `count` requests.
    fn finished(&self, count: u64) {
        self.outstanding.fetch_sub(count, Ordering::SeqCst);
    }

    /// Whether every request queued so far has committed or failed.
    pub fn settled(&self) -> bool {
        self.outstanding.load(Ordering::SeqCst) == 0
    }

    pub fn stats(&self) -> StoreStats {
        StoreStats {
            commits: self.commits.load(Ordering::Relaxed),
            durable_commits: self.durable_commits.load(Ordering::Relaxed),
            requests: self.requests.load(Ordering::Relaxed),
        }
    }
}

/// One request counted as outstanding (`Shared::count_outstanding`).
pub(crate) struct Outstanding<'a> {
    shared: &'a Shared,
    handed_over: bool,
}

impl Outstanding<'_> {
    /// The request is in the writer's queue: from here on the writer uncounts it.
    pub fn handed_over(mut self) {
        self.handed_over = true;
    }
}

impl Drop for Outstanding<'_> {
    fn drop(&mut self) {
        if !self.handed_over {
            self.shared.finished(1);
        }
    }
}

pub(crate) fn channel() -> (mpsc::Sender<Message>, mpsc::Receiver<Message>) {
    mpsc::channel(limits::STORAGE_WRITER_QUEUE_MAX)
}

pub(crate) struct Writer {
    pub db: Arc<Database>,
    pub wal: Arc<Wal>,
    pub rx: mpsc::Receiver<Message>,
    pub shared: Arc<Shared>,
    /// redb holds commits made with `Durability::None` since its last durable one.
    pub unsynced: bool,
    pub last_durable: Instant,
}

impl Writer {
    /// Runs until every sender is gone and the queue is empty.
    pub fn run(mut self) {
        let _guard = PanicGuard(self.shared.clone());
        while let Some(first) = self.receive() {
            let mut batch = vec![first];
            while batch.len() <= limits::STORAGE_COMMIT_BATCH_MAX {
                match self.rx.try_recv() {
                    Ok(Message::Request(request)) => batch.push(*request),
                    Ok(Message::Hold(hold)) => wait_for_release(hold),
                    Err(_) => break,
                }
            }
            self.process(batch);
        }
        if self.shared.poisoned().is_none() {
            self.flush();
        }
    }

    /// Makes everything written durable: the log, and the last `Durability::None` commits
    /// with an empty durable commit.
    fn flush(&mut self) {
        let flushed = self.wal.sync().and_then(|()| match self.unsynced {
            true => self.commit_redb(&[], true).map(|_| ()),
            false => Ok(()),
        });
        if let Err(error) = flushed {
            self.shared.poison(error.to_string());
        }
    }

    fn receive(&mut self) -> Option<Request> {
        loop {
            match self.rx.blocking_recv()? {
                Message::Request(request) => return Some(*request),
                Message::Hold(hold) => wait_for_release(hold),
            }
        }
    }

    /// Executes and commits one batch, then fires its callbacks. The batch stops counting
    /// as outstanding once it is committed, before any callback fires, so a barrier that a
    /// callback leads to finds it settled.
    fn process(&mut self, batch: Vec<Request>) {
        let count = u64::try_from(batch.len()).expect("batch length fits in u64");
        self.shared.requests.fetch_add(count, Ordering::Relaxed);
        let finished = || self.shared.finished(count);
        if let Some(error) = self.shared.poisoned() {
            finished();
            fail_all(batch, &error.to_string());
            return;
        }
        if batch
            .iter()
            .all(|request| matches!(request.op, Op::Barrier))
        {
            finished();
            for request in batch {
                succeed(request.done, Outcome::Done);
            }
            return;
        }
        let committed = panic::catch_unwind(AssertUnwindSafe(|| self.commit(&batch)));
        self.shared.finished(count);
        match committed {
            Ok(Ok(outcomes)) => {
                let ranges_changed = batch
                    .iter()
                    .zip(&outcomes)
                    .any(|(request, outcome)| changes_ranges(&request.op, outcome));
                if ranges_changed {
                    self.shared.range_events.send_modify(|events| *events += 1);
                }
                for (request, outcome) in batch.into_iter().zip(outcomes) {
                    succeed(request.done, outcome);
                }
            }
            Ok(Err(error)) => {
                let cause = error.to_string();
                self.shared.poison(cause.clone());
                fail_all(batch, &cause);
            }
            Err(panic) => {
                // A failed assert on a persisted invariant: poison before anyone hears of the
                // failure, then let the thread die loudly.
                let cause = format!("storage writer panicked: {}", panic_message(&*panic));
                self.shared.poison(cause.clone());
                fail_all(batch, &cause);
                panic::resume_unwind(panic)
            }
        }
    }

    /// The three steps of the module's doc; one outcome per request.
    fn commit(&mut self, batch: &[Request]) -> Result<Vec<Outcome>, StorageError> {
        let started = Instant::now();
        if self.shared.take_injected_failure() {
            return Err(StorageError::io(
                "<commit>",
                std::io::Error::other("injected commit failure"),
            ));
        }
        let (forgets, adds): (Vec<&Op>, Vec<&Op>) = batch
            .iter()
            .map(|request| &request.op)
            .filter(|op| op.log_change().is_some())
            .partition(|op| op.forgets_log());
        let log_synced = self.write_log(&adds)?;
        let stateful = batch.iter().any(|request| !request.op.is_log_only());
        let durable = !forgets.is_empty()
            || batch.iter().any(|request| request.op.needs_durability())
            || (stateful && self.last_durable.elapsed() >= DURABLE_COMMIT_INTERVAL);
        let outcomes = if stateful || (durable && self.unsynced) {
            self.commit_redb(batch, durable)?
        } else {
            batch.iter().map(|_| Outcome::Done).collect()
        };
        if self.write_log(&forgets)? {
            self.wal.collect_garbage()?;
        }
        self.shared.commits.fetch_add(1, Ordering::Relaxed);
        let durable = durable || log_synced || !forgets.is_empty();
        if durable {
            self.shared.durable_commits.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(observer) = self.shared.observer.get() {
            observer.committed(&Commit {
                durable,
                requests: batch.len(),
                duration: started.elapsed(),
            });
        }
        Ok(outcomes)
    }

    /// Writes the log changes of `ops` in one write and syncs them; whether there were any.
    fn write_log(&self, ops: &[&Op]) -> Result<bool, StorageError> {
        let changes: Vec<Change<'_>> = ops.iter().filter_map(|op| op.log_change()).collect();
        if changes.is_empty() {
            return Ok(false);
        }
        self.wal.write(&changes)?;
        // The planted bug acknowledges appends, truncations and purges without an fsync.
        if !planted::active(PlantedBug::AckBeforeFsync) {
            self.wal.sync()?;
        }
        Ok(true)
    }

    /// Runs the ops of `batch` that touch redb in one transaction and commits it; the
    /// others (the log's) answer `Done`.
    fn commit_redb(
        &mut self,
        batch: &[Request],
        durable: bool,
    ) -> Result<Vec<Outcome>, StorageError> {
        let mut txn = self
            .db
            .begin_write()
            .map_err(|e| StorageError::redb("begin write", e))?;
        // The planted bug acknowledges votes and installs without making them durable.
        let durable = durable && !planted::active(PlantedBug::AckBeforeFsync);
        let durability = if durable {
            Durability::Immediate
        } else {
            Durability::None
        };
        txn.set_durability(durability)
            .map_err(|e| StorageError::redb("set durability", e))?;
        let outcomes = batch
            .iter()
            .map(|request| match request.op.is_log_only() {
                true => Ok(Outcome::Done),
                false => op::execute(&txn, &request.op),
            })
            .collect::<Result<Vec<_>, _>>()?;
        // A split is durable before the child's group can start and append to the log: the
        // child's entries never outlive the state they apply to.
        let ranges_changed = (batch.iter().zip(&outcomes))
            .any(|(request, outcome)| changes_ranges(&request.op, outcome));
        let durable = durable || (ranges_changed && !planted::active(PlantedBug::AckBeforeFsync));
        if durable {
            txn.set_durability(Durability::Immediate)
                .map_err(|e| StorageError::redb("set durability", e))?;
        }
        txn.commit().map_err(|e| StorageError::redb("commit", e))?;
        self.unsynced = !durable;
        if durable {
            self.last_durable = Instant::now();
        }
        Ok(outcomes)
    }
}

/// `limits::STORAGE_DURABLE_COMMIT_INTERVAL_MS`.
const DURABLE_COMMIT_INTERVAL: Duration =
    Duration::from_millis(limits::STORAGE_DURABLE_COMMIT_INTERVAL_MS);

/// Whether a committed op changed the file's ranges or their spans: an apply that split a
/// range, the end of a snapshot install, or the start of a removal.
fn changes_ranges(op: &Op, outcome: &Outcome) -> bool {
    match (op, outcome) {
        (
            Op::InstallFinish { .. }
            | Op::RestoreFinish { .. }
            | Op::RestoreMeta { .. }
            | Op::RemoveBegin { .. },
            _,
        ) => true,
        (_, Outcome::Applied(outcomes)) => outcomes
            .iter()
            .any(|outcome| matches!(outcome, CommandOutcome::Split { .. })),
        _ => false,
    }
}

fn succeed(done: Done, outcome: Outcome) {
    match (done, outcome) {
        (Done::Flushed(callback, settle), _) => {
            if let Some(settle) = settle {
                settle();
            }
            callback.io_completed(Ok(()))
        }
        (Done::Reply(reply), outcome) => {
            let _ = reply.send(Ok(outcome));
        }
        (Done::Applied { reply, responders }, Outcome::Applied(outcomes)) => {
            assert_eq!(
                responders.len(),
                outcomes.len(),
                "one outcome per applied entry"
            );
            for (responder, outcome) in responders.into_iter().zip(outcomes) {
                if let Some(responder) = responder {
                    responder.send(outcome);
                }
            }
            let _ = reply.send(Ok(Outcome::Done));
        }
        (Done::Applied { .. }, _) => unreachable!("an apply op always yields Outcome::Applied"),
    }
}

fn fail_all(batch: Vec<Request>, cause: &str) {
    for request in batch {
        let error = StorageError::Poisoned {
            cause: cause.to_string(),
        };
        match request.done {
            Done::Flushed(callback, _) => callback.io_completed(Err(error.into())),
            Done::Reply(reply) | Done::Applied { reply, .. } => {
                let _ = reply.send(Err(error));
            }
        }
    }
}

pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> &str {
    if let Some(message) = panic.downcast_ref::<String>() {
        message
    } else if let Some(message) = panic.downcast_ref::<&str>() {
        message
    } else {
        "unknown panic"
    }
}

fn wait_for_release(hold: std::sync::mpsc::Receiver<()>) {
    // Returns when the test drops its end.
    let _ = hold.recv();
}

/// Poisons the store if the writer thread unwinds (a failed `assert!` on a persisted
/// invariant), so callers see an error instead of a silently closed store.
struct PanicGuard(Arc<Shared>);

impl Drop for PanicGuard {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.poison("storage writer thread panicked".to_string());
        }
    }
}
