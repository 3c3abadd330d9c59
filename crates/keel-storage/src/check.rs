//! Consistency checks on a store file's side: the digest of a range's state at a check's log
//! index (`keel_types::check`), computed on the file's checker thread at a bounded pace, and
//! the digests the file keeps for its leader to collect (`StateMachine::digest`).
//!
//! `StateMachine::apply` applies the entries up to a check entry, commits them, begins a
//! read transaction before it applies anything after it, and
//! queues that transaction here: every replica hashes its range as of the same log index, and
//! its serving path never waits for the hash. The digest covers the records a snapshot of the
//! range would hold (`snapshot::write_range`), each encoded as a snapshot encodes it: the
//! rows, sessions, request records, locks, fences and idempotency records in their buckets,
//! the range's facts apart. A row that does not decode makes the replica's state unreadable,
//! which counts as differing.
//!
//! The thread hashes at most `limits::CHECK_BYTES_PER_SEC`, one check at a time; at most
//! `limits::CHECK_QUEUE_MAX` wait, more are answered `NoDigest` at once. The file keeps the
//! newest `limits::CHECK_DIGESTS_KEPT` answers in memory (a restart replays the check entries
//! its state had not made durable, and forgets the rest).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use keel_types::check::Hash;
use keel_types::{CheckedRow, RangeDigest, RangeId, ReplicaAnswer, limits};
use redb::ReadTransaction;
use sha2::{Digest as _, Sha256};
use tokio::sync::watch;

use crate::codec::{FORMAT_VERSION, encode};
use crate::error::StorageError;
use crate::snapshot::{self, Record, RecordSink};

/// A check's read transaction, waiting for the checker thread.
struct Job {
    range: RangeId,
    index: u64,
    locate: Vec<u16>,
    txn: ReadTransaction,
}

enum Slot {
    Pending,
    Done(ReplicaAnswer),
}

/// The answers a file keeps, newest last, and a counter bumped on every change.
#[derive(Default)]
struct Kept {
    slots: Mutex<VecDeque<((RangeId, u64), Slot)>>,
    changed: watch::Sender<u64>,
    hashed_bytes: AtomicU64,
    stop: AtomicBool,
}

impl Kept {
    fn set(&self, range: RangeId, index: u64, slot: Slot) {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        slots.retain(|(key, _)| *key != (range, index));
        slots.push_back(((range, index), slot));
        while slots.len() > limits::CHECK_DIGESTS_KEPT {
            slots.pop_front();
        }
        drop(slots);
        self.changed.send_modify(|n| *n += 1);
    }

    /// `None`: nothing kept; `Some(None)`: pending.
    fn get(&self, range: RangeId, index: u64) -> Option<Option<ReplicaAnswer>> {
        let slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        let (_, slot) = slots.iter().find(|(key, _)| *key == (range, index))?;
        Some(match slot {
            Slot::Pending => None,
            Slot::Done(answer) => Some(answer.clone()),
        })
    }
}

/// A store file's checker: its thread and the answers it keeps.
pub(crate) struct Checker {
    kept: Arc<Kept>,
    sender: Mutex<Option<SyncSender<Box<Job>>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Checker {
    pub fn start() -> std::io::Result<Checker> {
        let kept = Arc::new(Kept::default());
        let (sender, jobs) = mpsc::sync_channel::<Box<Job>>(limits::CHECK_QUEUE_MAX);
        let thread_kept = kept.clone();
        let thread = std::thread::Builder::new()
            .name("keel-storage-check".to_string())
            .spawn(move || {
                for job in jobs {
                    let answer = answer(&job, &thread_kept);
                    thread_kept.set(job.range, job.index, Slot::Done(answer));
                }
            })?;
        Ok(Checker {
            kept,
            sender: Mutex::new(Some(sender)),
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Records that a check at `index` is about to be applied, so a leader asking for it
    /// waits rather than hears that this replica passed it.
    pub fn expect(&self, range: RangeId, index: u64) {
        self.kept.set(range, index, Slot::Pending);
    }

    /// Queues the hashing of `txn`, or answers `NoDigest` if the checker is too far behind.
    /// `txn` must have begun after the check entry's apply committed and before anything
    /// after it was applied.
    pub fn queue(&self, range: RangeId, index: u64, locate: Vec<u16>, txn: ReadTransaction) {
        let sender = self
            .sender
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let job = Box::new(Job {
            range,
            index,
            locate,
            txn,
        });
        let refused = match sender.map(|sender| sender.try_send(job)) {
            Some(Ok(())) => return,
            Some(Err(TrySendError::Full(_))) => "this replica's checker is busy",
            Some(Err(TrySendError::Disconnected(_))) | None => "the store is closed",
        };
        self.refuse(range, index, refused);
    }

    /// Answers `NoDigest` for the check at `index`.
    pub fn refuse(&self, range: RangeId, index: u64, reason: &str) {
        let answer = ReplicaAnswer::NoDigest(reason.to_string());
        self.kept.set(range, index, Slot::Done(answer));
    }

    /// The answer for the check of `range` at `index`, waiting up to `wait` for a pending
    /// one or for one not yet applied. `applied`: the range's applied log index now, to tell
    /// a check this replica passed without a digest.
    pub async fn answer<F, Fut>(
        &self,
        range: RangeId,
        index: u64,
        wait: Duration,
        applied: F,
    ) -> ReplicaAnswer
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Option<u64>>,
    {
        let mut changed = self.kept.changed.subscribe();
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            changed.borrow_and_update();
            // Read the applied index before the kept answers: a check is expected before its
            // entry applies, so an index applied then and not kept now was passed by.
            let passed = applied().await.is_some_and(|applied| applied >= index);
            match self.kept.get(range, index) {
                Some(Some(answer)) => return answer,
                Some(None) => {}
                None if passed => {
                    return ReplicaAnswer::NoDigest(format!(
                        "this replica passed index {index} without a digest of it (a snapshot \
                         installed past it, a restart, or an older check)"
                    ));
                }
                None => {}
            }
            match tokio::time::timeout_at(deadline, changed.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) | Err(_) => {
                    return ReplicaAnswer::NoDigest(format!(
                        "no digest of index {index} within {} ms",
                        wait.as_millis()
                    ));
                }
            }
        }
    }

    /// Bytes of range state hashed since the store opened.
    pub fn hashed_bytes(&self) -> u64 {
        self.kept.hashed_bytes.load(Ordering::Relaxed)
    }

    /// Stops the thread: a digest under way ends with `NoDigest`, queued ones are answered
    /// so, and the thread lets go of their read transactions.
    pub fn shutdown(&self) {
        self.kept.stop.store(true, Ordering::SeqCst);
        drop(self.sender.lock().unwrap_or_else(|e| e.into_inner()).take());
        let thread = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(thread) = thread
            && thread.join().is_err()
        {
            tracing::error!("storage check thread had panicked");
        }
    }
}

/// What the replica answers for `job`.
fn answer(job: &Job, kept: &Kept) -> ReplicaAnswer {
    if kept.stop.load(Ordering::SeqCst) {
        return ReplicaAnswer::NoDigest("the store is closing".to_string());
    }
    let started = Instant::now();
    match digest(&job.txn, job.range, &job.locate, kept) {
        Ok(digest) => {
            tracing::info!(
                range = %job.range, index = job.index, rows = digest.rows, bytes = digest.bytes,
                elapsed_ms = started.elapsed().as_millis() as u64, "range hashed for a check"
            );
            ReplicaAnswer::Digest(digest)
        }
        Err(StorageError::Closed) => ReplicaAnswer::NoDigest("the store is closing".to_string()),
        Err(error @ StorageError::SnapshotInstalling { .. }) => {
            ReplicaAnswer::NoDigest(error.to_string())
        }
        Err(error) => {
            tracing::error!(range = %job.range, index = job.index, %error, "range state unreadable in a check");
            ReplicaAnswer::Unreadable(error.to_string())
        }
    }
}

/// The digest of `range` as `txn` reads it, listing the rows of the `locate` buckets.
/// Blocking; paced to `limits::CHECK_BYTES_PER_SEC`.
fn digest(
    txn: &ReadTransaction,
    range: RangeId,
    locate: &[u16],
    kept: &Kept,
) -> Result<RangeDigest, StorageError> {
    let mut sink = DigestSink {
        facts: Sha256::new(),
        buckets: vec![Sha256::new(); limits::CHECK_BUCKETS],
        locate: locate.to_vec(),
        located: Vec::new(),
        located_cut: false,
        rows: 0,
        bytes: 0,
        started: Instant::now(),
        kept,
    };
    snapshot::write_range(txn, range, &mut sink)?;
    Ok(sink.finish())
}

struct DigestSink<'a> {
    facts: Sha256,
    buckets: Vec<Sha256>,
    locate: Vec<u16>,
    located: Vec<(CheckedRow, Hash)>,
    located_cut: bool,
    rows: u64,
    bytes: u64,
    started: Instant,
    kept: &'a Kept,
}

impl DigestSink<'_> {
    fn finish(self) -> RangeDigest {
        let facts: Hash = self.facts.finalize().into();
        let buckets: Vec<Hash> = self
            .buckets
            .into_iter()
            .map(|b| b.finalize().into())
            .collect();
        let mut range = Sha256::new();
        range.update(facts);
        for bucket in &buckets {
            range.update(bucket);
        }
        RangeDigest {
            format: FORMAT_VERSION,
            hash: range.finalize().into(),
            facts,
            buckets,
            rows: self.rows,
            bytes: self.bytes,
            located: self.located,
            located_cut: self.located_cut,
        }
    }

    /// Sleeps while the bytes hashed run ahead of `limits::CHECK_BYTES_PER_SEC`; `Closed`
    /// once the store closes.
    fn pace(&self) -> Result<(), StorageError> {
        if self.kept.stop.load(Ordering::Relaxed) {
            return Err(StorageError::Closed);
        }
        let due = Duration::from_secs_f64(self.bytes as f64 / limits::CHECK_BYTES_PER_SEC as f64);
        let ahead = due.saturating_sub(self.started.elapsed());
        if ahead >= Duration::from_millis(10) {
            std::thread::sleep(ahead);
        }
        Ok(())
    }
}

impl RecordSink for DigestSink<'_> {
    fn write(&mut self, record: &Record) -> Result<(), StorageError> {
        let body = encode(record);
        let length = (body.len() as u64).to_be_bytes();
        self.bytes += body.len() as u64;
        self.kept
            .hashed_bytes
            .fetch_add(body.len() as u64, Ordering::Relaxed);
        match checked_row(record) {
            None => {
                self.facts.update(length);
                self.facts.update(&body);
            }
            Some(row) => {
                self.rows += 1;
                let bucket = row.bucket();
                let hasher = &mut self.buckets[usize::from(bucket)];
                hasher.update(length);
                hasher.update(&body);
                if self.locate.contains(&bucket) {
                    match self.located.len() < limits::CHECK_LOCATE_ROWS_MAX {
                        true => self.located.push((row, Sha256::digest(&body).into())),
                        false => self.located_cut = true,
                    }
                }
            }
        }
        if self.bytes % (64 * 1024) < body.len() as u64 {
            self.pace()?;
        }
        Ok(())
    }
}

/// The row a record holds, or `None` for the range's facts.
fn checked_row(record: &Record) -> Option<CheckedRow> {
    Some(match record {
        Record::Row(row)
        | Record::ExpiringRow { row, .. }
        | Record::VersionedRow { row, .. }
        | Record::LeasedRow { row, .. } => CheckedRow::Key(row.key.clone()),
        Record::Lock { name, .. } => CheckedRow::Lock(name.clone()),
        Record::Fence { key, .. } => CheckedRow::Fence(key.clone()),
        Record::Idempotency { key, .. } => CheckedRow::Idempotency(key.clone()),
        Record::Lease { key, .. } => CheckedRow::Lease(key.clone()),
        Record::Session { client_id, .. } | Record::OwnedSession { client_id, .. } => {
            CheckedRow::Session {
                client_id: *client_id,
            }
        }
        Record::Request {
            client_id,
            sequence,
            ..
        }
        | Record::DigestedRequest {
            client_id,
            sequence,
            ..
        }
        | Record::VersionedRequest {
            client_id,
            sequence,
            ..
        }
        | Record::LeasedRequest {
            client_id,
            sequence,
            ..
        } => CheckedRow::Request {
            client_id: *client_id,
            sequence: *sequence,
        },
        Record::Header(_)
        | Record::End { .. }
        | Record::SealedEnd { .. }
        | Record::Clock { .. }
        | Record::Hold(_)
        | Record::Range(_)
        | Record::MetaRange(_)
        | Record::MetaNode(_)
        | Record::MetaNextRangeId(_)
        | Record::MetaNodeState(..) => return None,
    })
}

#[cfg(test)]
mod tests;
