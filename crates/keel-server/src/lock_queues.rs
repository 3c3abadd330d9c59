//! This node's lock queues: one driver task (`lock_driver.rs`) per lock that acquires wait
//! for on this leader, keyed by range and lock name, each fed by a channel of
//! `LOCK_WAITERS_MAX` events, at most `LOCK_QUEUES_MAX` at once. The Lock service waits here
//! for a busy lock, and releases here: through the lock's queue when acquires wait (the first
//! gets the lock in the same command), directly otherwise. Knows nothing of gRPC messages.
//!
//! A driver's channel is written only under the registry's lock, and a driver leaves the
//! registry under that lock after finding its channel empty, so no event is sent to a driver
//! that has gone.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use keel_raft::RaftGroup;
use keel_types::validate::show_key;
use keel_types::{
    Acquirer, Command, Coordination, CoordinationOp, CoordinationResult, KvError, RangeId,
    RequestId, limits,
};
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tracing::{Instrument, debug, info_span};

use crate::coordinated::{Coordinated, unexpected};
use crate::lock_driver::{Event, LockDriver};
use crate::lock_queue::{Grant, ReleaseDone};
use crate::shared::Shared;

/// A lock's queue: its range and its name.
pub(crate) type QueueKey = (RangeId, Vec<u8>);

pub(crate) struct LockQueues {
    shared: Arc<Shared>,
    drivers: Mutex<HashMap<QueueKey, mpsc::Sender<Event>>>,
}

impl LockQueues {
    pub fn new(shared: Arc<Shared>) -> Arc<LockQueues> {
        Arc::new(LockQueues {
            shared,
            drivers: Mutex::new(HashMap::new()),
        })
    }

    /// Queues an acquire that found lock `name` busy on this leader, behind those already
    /// waiting.
    pub fn wait(
        self: &Arc<Self>,
        group: &Arc<RaftGroup>,
        name: &[u8],
        acquirer: Acquirer,
    ) -> Result<Waiting, KvError> {
        let (reply, answer) = oneshot::channel();
        self.send(group, name, Event::Wait { acquirer, reply })?;
        Ok(Waiting {
            answer,
            queues: self.clone(),
            group: group.clone(),
            name: name.to_vec(),
        })
    }

    /// Releases lock `name` held with `token`. When acquires wait for it on this node the
    /// release goes through its queue and hands the lock to the first of them; otherwise it
    /// is proposed here, and the queue (if one started meanwhile) looks at the lock again.
    pub async fn release(
        self: &Arc<Self>,
        group: &Arc<RaftGroup>,
        name: &[u8],
        token: u64,
        request: Option<RequestId>,
    ) -> Result<ReleaseDone, KvError> {
        let (reply, done) = oneshot::channel();
        let release = Event::Release {
            token,
            request,
            reply,
        };
        if self.send_if_queued(group.range(), name, release)?.is_none() {
            return done.await.unwrap_or_else(|_| {
                Err(KvError::unavailable(format!(
                    "the queue of lock {} stopped before answering",
                    show_key(name)
                )))
            });
        }
        let released = self.release_directly(group, name, token, request).await?;
        // An acquire may have started waiting while the release was in flight.
        let _ = self.send_if_queued(group.range(), name, Event::Kick);
        Ok(released)
    }

    /// Called by a driver with nothing to do: leaves the registry unless an event arrived,
    /// which is returned for the driver to take in.
    pub fn leave(&self, key: &QueueKey, events: &mut mpsc::Receiver<Event>) -> Option<Event> {
        let mut drivers = self.drivers.lock().expect("lock queue registry poisoned");
        if let Ok(event) = events.try_recv() {
            return Some(event);
        }
        drivers.remove(key);
        None
    }

    /// Called by a driver that stops: leaves the registry and returns the events it will
    /// not take in, to be refused.
    pub fn close(&self, key: &QueueKey, events: &mut mpsc::Receiver<Event>) -> Vec<Event> {
        let mut drivers = self.drivers.lock().expect("lock queue registry poisoned");
        drivers.remove(key);
        events.close();
        let mut left = Vec::new();
        while let Ok(event) = events.try_recv() {
            left.push(event);
        }
        left
    }

    /// Sends `event` to the lock's driver, starting one if there is none.
    fn send(
        self: &Arc<Self>,
        group: &Arc<RaftGroup>,
        name: &[u8],
        event: Event,
    ) -> Result<(), KvError> {
        let key: QueueKey = (group.range(), name.to_vec());
        let mut drivers = self.drivers.lock().expect("lock queue registry poisoned");
        let Some(event) = offer(&mut drivers, &key, event)? else {
            return Ok(());
        };
        if drivers.len() >= limits::LOCK_QUEUES_MAX {
            return Err(KvError::Overloaded {
                message: format!(
                    "node {} queues acquires for {} locks; limit is {}",
                    self.shared.node_id,
                    drivers.len(),
                    limits::LOCK_QUEUES_MAX
                ),
            });
        }
        let (sender, events) = mpsc::channel(limits::LOCK_WAITERS_MAX);
        if sender.try_send(event).is_err() {
            unreachable!("a new channel has room for its first event");
        }
        drivers.insert(key.clone(), sender);
        let span = info_span!(
            "lock_queue",
            node_id = self.shared.node_id,
            range_id = key.0.0
        );
        let driver = LockDriver::new(
            self.shared.clone(),
            group.clone(),
            self.clone(),
            key,
            events,
        );
        tokio::spawn(driver.run().instrument(span));
        Ok(())
    }

    /// Sends `event` to the lock's driver if it has one; otherwise returns it.
    fn send_if_queued(
        &self,
        range: RangeId,
        name: &[u8],
        event: Event,
    ) -> Result<Option<Event>, KvError> {
        let key: QueueKey = (range, name.to_vec());
        let mut drivers = self.drivers.lock().expect("lock queue registry poisoned");
        offer(&mut drivers, &key, event)
    }

    async fn release_directly(
        &self,
        group: &RaftGroup,
        name: &[u8],
        token: u64,
        request: Option<RequestId>,
    ) -> Result<ReleaseDone, KvError> {
        let command = Command::Coordinate(Coordination {
            request,
            now_ms: self.shared.clock.now_ms(),
            op: CoordinationOp::Release {
                name: name.to_vec(),
                token,
                successor: None,
            },
        });
        let done = Coordinated::from_outcome(group.write(command).await?)?;
        match done.result {
            CoordinationResult::Released { successor } => Ok(ReleaseDone {
                successor,
                revision: done.revision,
                replayed: done.replayed,
            }),
            _ => Err(unexpected(done.replayed)),
        }
    }
}

/// Sends `event` to the driver of `key` if there is one (`Ok(None)`); returns it when there
/// is none (or it has gone). A full channel is `Overloaded`.
fn offer(
    drivers: &mut HashMap<QueueKey, mpsc::Sender<Event>>,
    key: &QueueKey,
    event: Event,
) -> Result<Option<Event>, KvError> {
    let Some(sender) = drivers.get(key) else {
        return Ok(Some(event));
    };
    match sender.try_send(event) {
        Ok(()) => Ok(None),
        Err(TrySendError::Full(_)) => Err(KvError::Overloaded {
            message: format!(
                "the queue of lock {} has {} events waiting; limit is {}",
                show_key(&key.1),
                limits::LOCK_WAITERS_MAX,
                limits::LOCK_WAITERS_MAX
            ),
        }),
        Err(TrySendError::Closed(event)) => {
            // Its driver ended without leaving (it panicked): start afresh.
            drivers.remove(key);
            Ok(Some(event))
        }
    }
}

/// An acquire waiting in a lock's queue. Dropped without taking a grant that reached it (the
/// call went away), it gives the lock back.
pub(crate) struct Waiting {
    answer: oneshot::Receiver<Result<Grant, KvError>>,
    queues: Arc<LockQueues>,
    group: Arc<RaftGroup>,
    name: Vec<u8>,
}

impl Waiting {
    /// The grant or the error, or `None` once `deadline` passes: the waiter then leaves the
    /// queue (at the driver's next tick), and a grant that raced the deadline is kept.
    pub async fn until(&mut self, deadline: Instant) -> Option<Result<Grant, KvError>> {
        match tokio::time::timeout_at(deadline, &mut self.answer).await {
            Ok(Ok(answer)) => Some(answer),
            Ok(Err(_)) => Some(Err(KvError::unavailable(format!(
                "the queue of lock {} stopped before answering",
                show_key(&self.name)
            )))),
            Err(_) => {
                self.answer.close();
                self.answer.try_recv().ok()
            }
        }
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.answer.close();
        let Ok(Ok(grant)) = self.answer.try_recv() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (queues, group, name) = (self.queues.clone(), self.group.clone(), self.name.clone());
        runtime.spawn(async move {
            let token = grant.hold.token;
            if let Err(error) = queues.release(&group, &name, token, None).await {
                debug!(lock = %show_key(&name), token, %error, "giving back an unanswered grant failed");
            }
        });
    }
}
