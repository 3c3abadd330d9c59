//! The one writer thread of a store file and its group commit. Knows nothing about
//! openraft's traits beyond the callbacks it fires, and nothing about async: it is a plain
//! `std::thread` fed by a bounded channel.
//!
//! The thread blocks for one request, drains up to `STORAGE_COMMIT_BATCH_MAX` more that are
//! already queued, executes them all in one redb write transaction (`op::execute`: what
//! each op does is `op`'s), commits it with `Durability::Immediate` if any of them needs
//! durability (else `Durability::None`), and only then fires every callback. Any error poisons the store: the batch and every later request
//! fail, nothing is retried. After a commit that applied a split or finished a snapshot
//! install, and before any callback, it bumps the store's range events
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
    /// Write transactions committed.
    pub commits: u64,
    /// Of those, the ones committed with `Durability::Immediate` (one fsync each).
    pub durable_commits: u64,
    /// Write requests received by the writer thread.
    pub requests: u64,
}

/// One committed write transaction, as a [`CommitObserver`] is told of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Commit {
    /// Committed with `Durability::Immediate` (one fsync).
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
    pub rx: mpsc::Receiver<Message>,
    pub shared: Arc<Shared>,
}

impl Writer {
    /// Runs until every sender is gone and the queue is empty.
    pub fn run(mut self) {
        let _guard = PanicGuard(self.shared.clone());
        let mut unsynced = false;
        while let Some(first) = self.receive() {
            let mut batch = vec![first];
            while batch.len() <= limits::STORAGE_COMMIT_BATCH_MAX {
                match self.rx.try_recv() {
                    Ok(Message::Request(request)) => batch.push(*request),
                    Ok(Message::Hold(hold)) => wait_for_release(hold),
                    Err(_) => break,
                }
            }
            unsynced = match self.process(batch) {
                Some(durable) => !durable,
                None => unsynced,
            };
        }
        if unsynced && self.shared.poisoned().is_none() {
            self.flush();
        }
    }

    /// Makes the last `Durability::None` commits durable with an empty durable commit.
    fn flush(&self) {
        if let Err(error) = self.commit(&[], true) {
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

    /// Executes and commits one batch, then fires its callbacks. Returns whether the commit
    /// was durable, or `None` if nothing was committed. The batch stops counting as
    /// outstanding once its transaction has finished, before any callback fires, so a
    /// barrier that a callback leads to finds it settled.
    fn process(&self, batch: Vec<Request>) -> Option<bool> {
        let count = u64::try_from(batch.len()).expect("batch length fits in u64");
        self.shared.requests.fetch_add(count, Ordering::Relaxed);
        let finished = || self.shared.finished(count);
        if let Some(error) = self.shared.poisoned() {
            finished();
            fail_all(batch, &error.to_string());
            return None;
        }
        if batch
            .iter()
            .all(|request| matches!(request.op, Op::Barrier))
        {
            finished();
            for request in batch {
                succeed(request.done, Outcome::Done);
            }
            return None;
        }
        let durable = batch.iter().any(|request| request.op.needs_durability());
        let committed = panic::catch_unwind(AssertUnwindSafe(|| self.commit(&batch, durable)));
        finished();
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
                Some(durable)
            }
            Ok(Err(error)) => {
                let cause = error.to_string();
                self.shared.poison(cause.clone());
                fail_all(batch, &cause);
                None
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

    fn commit(&self, batch: &[Request], durable: bool) -> Result<Vec<Outcome>, StorageError> {
        let started = Instant::now();
        let mut txn = self
            .db
            .begin_write()
            .map_err(|e| StorageError::redb("begin write", e))?;
        // The planted bug acknowledges appends, votes and purges without making them durable.
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
            .map(|request| op::execute(&txn, &request.op))
            .collect::<Result<Vec<_>, _>>()?;
        if self.shared.take_injected_failure() {
            txn.abort().map_err(|e| StorageError::redb("abort", e))?;
            return Err(StorageError::io(
                "<commit>",
                std::io::Error::other("injected commit failure"),
            ));
        }
        txn.commit().map_err(|e| StorageError::redb("commit", e))?;
        self.shared.commits.fetch_add(1, Ordering::Relaxed);
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
}

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
