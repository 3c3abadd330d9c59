//! The registry of this node's running lock queues: the channel into each queue's driver,
//! by range and lock name, at most `LOCK_QUEUES_MAX` at once, and the events callers send
//! through them. A driver's channel is written only under the registry's lock, and a driver
//! leaves the registry under that lock after finding its channel empty, so no event is sent
//! to a driver that has gone. Knows nothing of what a driver does with its events.

use std::collections::HashMap;
use std::sync::Mutex;

use keel_types::validate::show_key;
use keel_types::{Acquirer, KvError, NodeId, RangeId, RequestId, limits};
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::{mpsc, oneshot};

use crate::locks::queue::{Grant, ReleaseDone};

/// A lock's queue: its range and its name.
pub(crate) type QueueKey = (RangeId, Vec<u8>);

/// What callers send a lock's driver.
pub(crate) enum Event {
    /// An acquire that found the lock busy waits for it.
    Wait {
        acquirer: Acquirer,
        reply: oneshot::Sender<Result<Grant, KvError>>,
    },
    /// A holder releases `token`; the lock goes to the first waiter.
    Release {
        token: u64,
        request: Option<RequestId>,
        reply: oneshot::Sender<Result<ReleaseDone, KvError>>,
    },
    /// The lock was freed without the queue (a release when nobody waited).
    Kick,
}

impl Event {
    /// Answers the caller behind the event with `error`.
    pub fn refuse(self, error: KvError) {
        match self {
            Event::Wait { reply, .. } => drop(reply.send(Err(error))),
            Event::Release { reply, .. } => drop(reply.send(Err(error))),
            Event::Kick => {}
        }
    }
}

/// The channels into the running drivers.
#[derive(Default)]
pub(crate) struct Registry {
    drivers: Mutex<HashMap<QueueKey, mpsc::Sender<Event>>>,
}

impl Registry {
    /// Sends `event` to the driver of `key` if one runs (`Ok(None)`); returns it otherwise.
    pub fn offer(&self, key: &QueueKey, event: Event) -> Result<Option<Event>, KvError> {
        offer(&mut self.lock(), key, event)
    }

    /// Sends `event` to the driver of `key` if one runs (`Ok(None)`); otherwise registers a
    /// new channel holding it and returns its receiving end, for a driver the caller starts.
    /// `Overloaded` past `LOCK_QUEUES_MAX` queues on node `node_id`.
    pub fn offer_or_register(
        &self,
        key: &QueueKey,
        event: Event,
        node_id: NodeId,
    ) -> Result<Option<mpsc::Receiver<Event>>, KvError> {
        let mut drivers = self.lock();
        let Some(event) = offer(&mut drivers, key, event)? else {
            return Ok(None);
        };
        if drivers.len() >= limits::LOCK_QUEUES_MAX {
            return Err(KvError::Overloaded {
                message: format!(
                    "node {node_id} queues acquires for {} locks; limit is {}",
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
        Ok(Some(events))
    }

    /// Called by a driver with nothing to do: leaves the registry unless an event arrived,
    /// which is returned for the driver to take in.
    pub fn leave(&self, key: &QueueKey, events: &mut mpsc::Receiver<Event>) -> Option<Event> {
        let mut drivers = self.lock();
        if let Ok(event) = events.try_recv() {
            return Some(event);
        }
        drivers.remove(key);
        None
    }

    /// Called by a driver that stops: leaves the registry and returns the events it will
    /// not take in, to be refused.
    pub fn close(&self, key: &QueueKey, events: &mut mpsc::Receiver<Event>) -> Vec<Event> {
        let mut drivers = self.lock();
        drivers.remove(key);
        events.close();
        let mut left = Vec::new();
        while let Ok(event) = events.try_recv() {
            left.push(event);
        }
        left
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<QueueKey, mpsc::Sender<Event>>> {
        self.drivers.lock().expect("lock queue registry poisoned")
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
