//! The reader threads of a store file: they run the small reads that serve requests (a
//! point read, one page of a scan) in redb read transactions, off the async workers. Knows
//! nothing about what is read, nor about async beyond the reply it sends.
//!
//! Reads arrive in bursts (the reads a read index answer releases together, the gets of
//! many clients), and a blocking thread woken for each one costs more CPU than the read
//! itself. So a thread that wakes takes every read queued (up to `STORAGE_READ_BATCH_MAX`)
//! and runs them in one read transaction begun after it took them (each read then sees every
//! commit that came before it was queued); a submitter wakes another thread only when none is
//! awake or the queue has grown past `STORAGE_READ_QUEUE_PER_READER` per awake thread. A
//! panic in a read is caught and handed to its caller; the thread goes on.

use std::any::Any;
use std::collections::VecDeque;
use std::panic::{self, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;

use keel_types::limits;
use redb::{Database, ReadTransaction, ReadableDatabase};
use tokio::sync::oneshot;

use crate::error::StorageError;

/// What a read's caller gets: its result, or the payload of the panic it raised.
pub(crate) type ReadResult<T> = Result<Result<T, StorageError>, Box<dyn Any + Send>>;

/// One queued read.
trait Job: Send {
    /// Runs the read in `txn` and sends its result (or its panic) to the caller.
    fn run(self: Box<Self>, txn: &ReadTransaction);
    /// Tells the caller the read could not run.
    fn fail(self: Box<Self>, error: StorageError);
}

struct Read<F, T> {
    read: F,
    reply: oneshot::Sender<ReadResult<T>>,
}

impl<F, T> Job for Read<F, T>
where
    T: Send + 'static,
    F: FnOnce(&ReadTransaction) -> Result<T, StorageError> + Send + 'static,
{
    fn run(self: Box<Self>, txn: &ReadTransaction) {
        let Read { read, reply } = *self;
        let result = panic::catch_unwind(AssertUnwindSafe(|| read(txn)));
        // A caller that went away wants no answer.
        let _ = reply.send(result);
    }

    fn fail(self: Box<Self>, error: StorageError) {
        let _ = self.reply.send(Ok(Err(error)));
    }
}

/// The reader threads of one file and their queue.
pub(crate) struct Readers {
    shared: Arc<Shared>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

struct Shared {
    state: Mutex<State>,
    wake: Condvar,
    threads: usize,
}

#[derive(Default)]
struct State {
    queue: VecDeque<Box<dyn Job>>,
    /// Threads waiting for work.
    idle: usize,
    /// Wake-ups sent and not yet taken by a waiting thread.
    wakes: usize,
    /// No more reads are taken; the threads finish the queue and exit.
    closed: bool,
}

impl Readers {
    /// Starts the reader threads of `db`: as many as the machine has cores, within
    /// `STORAGE_READERS_MIN..=STORAGE_READERS_MAX`.
    pub(crate) fn start(db: Arc<Database>) -> std::io::Result<Readers> {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let count = cores.clamp(limits::STORAGE_READERS_MIN, limits::STORAGE_READERS_MAX);
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            wake: Condvar::new(),
            threads: count,
        });
        let readers = Readers {
            shared: shared.clone(),
            threads: Mutex::new(Vec::with_capacity(count)),
        };
        for _ in 0..count {
            let (shared, db) = (shared.clone(), db.clone());
            let handle = std::thread::Builder::new()
                .name("keel-storage-reader".to_string())
                .spawn(move || shared.run(&db));
            match handle {
                Ok(handle) => lock(&readers.threads).push(handle),
                Err(error) => {
                    readers.close();
                    return Err(error);
                }
            }
        }
        Ok(readers)
    }

    /// Queues `read` and waits for its result; `Closed` once the readers were closed.
    pub(crate) async fn read<T, F>(&self, read: F) -> ReadResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&ReadTransaction) -> Result<T, StorageError> + Send + 'static,
    {
        let (reply, result) = oneshot::channel();
        self.shared.submit(Box::new(Read { read, reply }));
        // The job always answers (run or fail) before it is dropped.
        result.await.unwrap_or(Ok(Err(StorageError::Closed)))
    }

    /// Stops taking reads; the threads finish what is queued and exit.
    pub(crate) fn close(&self) {
        lock(&self.shared.state).closed = true;
        self.shared.wake.notify_all();
    }

    /// `close`, then waits until every thread has exited.
    pub(crate) fn shutdown(&self) {
        self.close();
        let threads = std::mem::take(&mut *lock(&self.threads));
        for handle in threads {
            if handle.join().is_err() {
                tracing::error!("storage reader thread had panicked");
            }
        }
    }
}

impl Drop for Readers {
    fn drop(&mut self) {
        self.close();
    }
}

impl Shared {
    fn submit(&self, job: Box<dyn Job>) {
        let mut state = self.lock();
        if state.closed {
            drop(state);
            job.fail(StorageError::Closed);
            return;
        }
        state.queue.push_back(job);
        let awake = self.threads - state.idle + state.wakes;
        let behind = state.queue.len() > awake * limits::STORAGE_READ_QUEUE_PER_READER;
        if state.idle > state.wakes && (awake == 0 || behind) {
            state.wakes += 1;
            drop(state);
            self.wake.notify_one();
        }
    }

    /// A thread's loop: take the queued reads, run them in one transaction, until closed
    /// with an empty queue.
    fn run(&self, db: &Database) {
        while let Some(batch) = self.take() {
            let mut txn = None;
            for job in batch {
                if txn.is_none() {
                    match db.begin_read() {
                        Ok(begun) => txn = Some(begun),
                        Err(error) => {
                            job.fail(StorageError::redb("begin read", error));
                            continue;
                        }
                    }
                }
                if let Some(txn) = &txn {
                    job.run(txn);
                }
            }
        }
    }

    /// The next reads to run (at most `STORAGE_READ_BATCH_MAX`), waiting for some; `None`
    /// once closed and drained.
    fn take(&self) -> Option<Vec<Box<dyn Job>>> {
        let mut state = self.lock();
        loop {
            if !state.queue.is_empty() {
                let count = state.queue.len().min(limits::STORAGE_READ_BATCH_MAX);
                let batch = state.queue.drain(..count).collect();
                // What this batch left behind goes to another thread, if one is idle.
                if !state.queue.is_empty() && state.idle > state.wakes {
                    state.wakes += 1;
                    self.wake.notify_one();
                }
                return Some(batch);
            }
            if state.closed {
                return None;
            }
            state.idle += 1;
            while state.wakes == 0 && !state.closed {
                state = self
                    .wake
                    .wait(state)
                    .unwrap_or_else(PoisonError::into_inner);
            }
            state.idle -= 1;
            state.wakes = state.wakes.saturating_sub(1);
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests;
