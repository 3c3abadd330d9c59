//! This node's lock queues: one driver task (`driver.rs`) per lock that acquires wait for on
//! this leader, keyed by range and lock name, each fed by a channel of `LOCK_WAITERS_MAX`
//! events, at most `LOCK_QUEUES_MAX` at once (`registry.rs`). The Lock service waits here
//! for a busy lock, and releases here: through the lock's queue when acquires wait (the first
//! gets the lock in the same command), directly otherwise. Knows nothing of gRPC messages.

use std::sync::Arc;

use keel_raft::RaftGroup;
use keel_types::validate::show_key;
use keel_types::{
    Acquirer, Command, Coordination, CoordinationOp, CoordinationResult, KvError, RangeId,
    RequestId,
};
use tokio::sync::oneshot;
use tokio::time::Instant;
use tracing::{Instrument, debug, info_span};

use crate::locks::driver::LockDriver;
use crate::locks::queue::{Grant, ReleaseDone};
use crate::locks::registry::{Event, QueueKey, Registry};
use crate::requests::coordinated::{Coordinated, unexpected};
use crate::shared::Shared;

pub(crate) struct LockQueues {
    shared: Arc<Shared>,
    registry: Arc<Registry>,
}

impl LockQueues {
    pub fn new(shared: Arc<Shared>) -> Arc<LockQueues> {
        Arc::new(LockQueues {
            shared,
            registry: Arc::default(),
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

    /// Sends `event` to the lock's driver, starting one if there is none.
    fn send(
        self: &Arc<Self>,
        group: &Arc<RaftGroup>,
        name: &[u8],
        event: Event,
    ) -> Result<(), KvError> {
        let key: QueueKey = (group.range(), name.to_vec());
        let node_id = self.shared.node_id;
        let Some(events) = self.registry.offer_or_register(&key, event, node_id)? else {
            return Ok(());
        };
        let span = info_span!("lock_queue", node_id, range_id = key.0.0);
        let registry = self.registry.clone();
        let driver = LockDriver::new(self.shared.clone(), group.clone(), registry, key, events);
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
        self.registry.offer(&(range, name.to_vec()), event)
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
