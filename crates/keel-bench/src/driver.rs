//! The closed loop: every task repeats its operation until the measured window ends, records
//! what completes inside the window, and the tallies are merged. Knows nothing of which
//! system it drives: a `Worker` sends the requests.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use keel_types::Consistency;
use tokio::time::Instant;

use crate::config::{Config, Op};
use crate::failure::Failure;
use crate::keys::{KeyChooser, Rng};
use crate::limits;
use crate::mover::Moves;
use crate::report::Tally;

/// One request (or request sequence) a worker sends, with the key index it applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Put(usize),
    Get(usize, Consistency),
    Cas(usize),
    Increment(usize),
    /// Acquire and release the task's own lock.
    Lock,
    /// Acquire and release the lock every task shares.
    LockShared,
}

/// How a completed step ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Done,
    /// A compare-and-set found another revision (it completed; the caller learnt the new one).
    Conflict,
}

/// Maps any successful answer to `Outcome::Done`.
pub fn done<T>(_answer: T) -> Outcome {
    Outcome::Done
}

/// One task's handle on the target. Each task owns one; they share connections.
pub trait Worker: Send + 'static {
    fn run(&mut self, step: Step) -> impl Future<Output = Result<Outcome, Failure>> + Send;

    /// Releases what the worker holds (an etcd lease); bounded by the caller.
    fn close(self) -> impl Future<Output = ()> + Send;
}

/// The latest revision seen of every data key, shared by the tasks of a run (`cas` conditions
/// on it). 0 = absent or unknown.
pub struct Revisions {
    by_key: Vec<AtomicU64>,
}

impl Revisions {
    pub fn new(keyspace: usize) -> Arc<Revisions> {
        Arc::new(Revisions {
            by_key: (0..keyspace).map(|_| AtomicU64::new(0)).collect(),
        })
    }

    pub fn get(&self, key: usize) -> u64 {
        self.by_key[key].load(Ordering::Relaxed)
    }

    /// Records `revision` unless a newer one is already known.
    pub fn observe(&self, key: usize, revision: u64) {
        self.by_key[key].fetch_max(revision, Ordering::Relaxed);
    }
}

/// Start and end of the measured window.
#[derive(Debug, Clone, Copy)]
pub struct Window {
    pub start: Instant,
    pub end: Instant,
}

impl Window {
    /// The window of a run starting now: after the warm-up, for the duration.
    pub fn from_now(config: &Config) -> Window {
        let start = Instant::now() + config.warmup;
        Window {
            start,
            end: start + config.duration,
        }
    }
}

/// What the tasks counted, by whether each operation completed soon after a round of leader
/// moves (`mover`) or not; without moves, everything is steady.
#[derive(Debug, Clone)]
pub struct Phased {
    pub steady: Tally,
    pub after_move: Tally,
}

impl Phased {
    fn new() -> Phased {
        Phased {
            steady: Tally::new(),
            after_move: Tally::new(),
        }
    }

    fn merge(&mut self, other: Phased) {
        self.steady.merge(other.steady);
        self.after_move.merge(other.after_move);
    }

    /// Both phases together.
    pub fn total(&self) -> Tally {
        let mut total = self.steady.clone();
        total.merge(self.after_move.clone());
        total
    }
}

/// Runs one task per worker until `window` ends and merges their tallies, sorting each
/// operation by `moves` when given.
pub async fn drive<W: Worker>(
    workers: Vec<W>,
    config: &Config,
    window: Window,
    moves: Option<Arc<Moves>>,
) -> Phased {
    let chooser = Arc::new(KeyChooser::new(config.distribution, config.keyspace));
    let mut tasks = Vec::with_capacity(workers.len());
    for (index, worker) in workers.into_iter().enumerate() {
        let rng = Rng::new(config.seed.wrapping_add(index as u64));
        let (chooser, op, read_ratio) = (chooser.clone(), config.op, config.read_ratio);
        let moves = moves.clone();
        tasks.push(tokio::spawn(async move {
            run_task(worker, rng, &chooser, op, read_ratio, window, moves).await
        }));
    }
    let mut total = Phased::new();
    for task in tasks {
        match task.await {
            Ok(phased) => total.merge(phased),
            Err(error) => total
                .steady
                .record_error(Failure::bench(format!("a client task failed: {error}"))),
        }
    }
    total
}

/// The step of `op` to send next.
pub fn next_step(op: Op, chooser: &KeyChooser, rng: &mut Rng, read_ratio: f64) -> Step {
    match op {
        Op::Put => Step::Put(chooser.choose(rng)),
        Op::GetLinearizable => Step::Get(chooser.choose(rng), Consistency::Linearizable),
        Op::GetLease => Step::Get(chooser.choose(rng), Consistency::Lease),
        Op::GetFollower => Step::Get(chooser.choose(rng), Consistency::Follower),
        Op::Cas => Step::Cas(chooser.choose(rng)),
        Op::Increment => Step::Increment(chooser.choose(rng)),
        Op::Lock => Step::Lock,
        Op::LockContended => Step::LockShared,
        Op::Mixed => {
            let key = chooser.choose(rng);
            match rng.next_f64() < read_ratio {
                true => Step::Get(key, Consistency::Linearizable),
                false => Step::Put(key),
            }
        }
    }
}

async fn run_task<W: Worker>(
    mut worker: W,
    mut rng: Rng,
    chooser: &KeyChooser,
    op: Op,
    read_ratio: f64,
    window: Window,
    moves: Option<Arc<Moves>>,
) -> Phased {
    let mut phased = Phased::new();
    for _ in 0..limits::OPS_PER_CLIENT_MAX {
        if Instant::now() >= window.end {
            break;
        }
        let step = next_step(op, chooser, &mut rng, read_ratio);
        let sent = Instant::now();
        let outcome = tokio::time::timeout(limits::OP_TIMEOUT, worker.run(step)).await;
        let done = Instant::now();
        if done < window.start || done >= window.end {
            continue;
        }
        let tally = match &moves {
            Some(moves) if moves.soon_after_move(done) => &mut phased.after_move,
            _ => &mut phased.steady,
        };
        match outcome {
            Ok(Ok(outcome)) => {
                tally.record(done - sent);
                tally.conflicts += u64::from(outcome == Outcome::Conflict);
            }
            Ok(Err(failure)) => tally.record_error(failure),
            Err(_) => tally.record_error(Failure::timed_out(limits::OP_TIMEOUT.as_millis())),
        }
    }
    let _ = tokio::time::timeout(limits::SETUP_TIMEOUT, worker.close()).await;
    phased
}

#[cfg(test)]
mod tests;
