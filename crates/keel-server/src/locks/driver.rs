//! The task that runs one lock's wait queue on this leader. It takes waits, releases and kicks
//! from a bounded channel, reads the lock from this replica and proposes through the Raft
//! group as `LockQueue` decides (one proposal at a time), answers callers through one-shot
//! channels, and every tick drops waiters whose calls ended and checks that this node still
//! leads the range in the same term, still serves, and (after a split) that the range still
//! holds the lock's name (else everyone is answered and it stops). It ends when the queue is
//! idle. It posts who waits to the node's lock waiters (`Shared::lock_waiters`) as it goes.
//! Knows nothing of gRPC messages.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use keel_raft::RaftGroup;
use keel_types::{CommandOutcome, KvError, validate::show_key};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::{Interval, MissedTickBehavior};
use tracing::debug;

use crate::locks::queue::{
    Answer, Grant, LockQueue, Proposal, ReleaseDone, ReleaseId, Step, WaiterId,
};
use crate::locks::registry::{Event, QueueKey, Registry};
use crate::requests::coordinated::{self, Coordinated};
use crate::shared::Shared;

/// How often a driver looks at the node's clock (a lock whose time passed), at its callers
/// (calls that ended) and at its leadership. Also the pause after a failed proposal.
pub(crate) const LOCK_QUEUE_TICK_MS: u64 = 50;

/// Reads of the lock per decision; a read always leaves the queue able to decide.
const READS_PER_STEP_MAX: usize = 2;

/// The store's range events from now on.
fn range_events_of(group: &RaftGroup) -> watch::Receiver<u64> {
    let mut events = group.store().range_events();
    events.mark_unchanged();
    events
}

type Outcome = BoxFuture<'static, Result<CommandOutcome, KvError>>;

/// What the queue does after its immediate steps.
enum Next {
    Propose(Outcome),
    Idle { until_ms: Option<u64> },
}

/// One lock's queue and the callers waiting on it.
pub(crate) struct LockDriver {
    shared: Arc<Shared>,
    group: Arc<RaftGroup>,
    registry: Arc<Registry>,
    key: QueueKey,
    /// The term this node led the range in when the queue started.
    term: u64,
    queue: LockQueue,
    waiters: HashMap<WaiterId, oneshot::Sender<Result<Grant, KvError>>>,
    releases: HashMap<ReleaseId, oneshot::Sender<Result<ReleaseDone, KvError>>>,
    events: mpsc::Receiver<Event>,
    /// The store's range events: after one, the queue checks its lock's name is still in
    /// its range (a split may have moved it to another range, with another queue).
    range_events: watch::Receiver<u64>,
}

impl LockDriver {
    pub fn new(
        shared: Arc<Shared>,
        group: Arc<RaftGroup>,
        registry: Arc<Registry>,
        key: QueueKey,
        events: mpsc::Receiver<Event>,
    ) -> LockDriver {
        LockDriver {
            range_events: range_events_of(&group),
            term: group.term(),
            queue: LockQueue::new(key.1.clone()),
            shared,
            group,
            registry,
            key,
            waiters: HashMap::new(),
            releases: HashMap::new(),
            events,
        }
    }

    /// Runs until the queue is idle, or until this node can no longer serve it.
    pub async fn run(mut self) {
        debug!(lock = %show_key(&self.key.1), "lock queue started");
        let mut tick = tokio::time::interval(Duration::from_millis(LOCK_QUEUE_TICK_MS));
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut proposal: Option<Outcome> = None;
        let mut wake_ms = None;
        let stopped = loop {
            if proposal.is_none() {
                match self.advance().await {
                    Ok(Next::Propose(outcome)) => proposal = Some(outcome),
                    Ok(Next::Idle { until_ms }) => wake_ms = until_ms,
                    Err(error) => break error,
                }
            }
            let waiting = self
                .queue
                .waiting()
                .map(|acquirer| acquirer.owner.as_slice());
            self.shared.lock_waiters.post(&self.key, waiting);
            if proposal.is_none() && self.queue.is_idle() {
                if self.leave() {
                    debug!(lock = %show_key(&self.key.1), "lock queue idle; stopping");
                    return;
                }
                // An event arrived as the queue was leaving: decide again.
                continue;
            }
            let wake = wake_ms.filter(|_| proposal.is_none());
            if let Err(error) = self.next_wake(&mut tick, &mut proposal, wake).await {
                break error;
            }
        };
        self.stop(stopped);
    }

    /// Waits for one thing to happen (an event, the proposal's outcome, a tick, the node's
    /// clock reaching `wake_ms`) and takes it in; an error means the queue must stop.
    async fn next_wake(
        &mut self,
        tick: &mut Interval,
        proposal: &mut Option<Outcome>,
        wake_ms: Option<u64>,
    ) -> Result<(), KvError> {
        // The node's clock may be moved by hand (tests, fault injection): the tick looks at it
        // again at least every LOCK_QUEUE_TICK_MS.
        let now_ms = self.shared.clock.now_ms();
        let delay = wake_ms.map(|wake| Duration::from_millis(wake.saturating_sub(now_ms)));
        tokio::select! {
            event = self.events.recv() => match event {
                Some(event) => self.accept(event),
                None => return Err(KvError::unavailable("the lock queue was closed")),
            },
            outcome = async { proposal.as_mut().expect("branch runs with a proposal").await },
                if proposal.is_some() => {
                *proposal = None;
                let answers = self.queue.settle(outcome.and_then(Coordinated::from_outcome));
                self.answer(answers)?;
            }
            () = tokio::time::sleep(delay.unwrap_or_default()), if delay.is_some() => {}
            _ = tick.tick() => {
                self.housekeep()?;
                self.check_span().await?;
            }
        }
        Ok(())
    }

    /// Takes the queue's steps that need no waiting: reads of the lock, then a proposal to
    /// start, or nothing to do until an event or the node's clock reads `until_ms`.
    async fn advance(&mut self) -> Result<Next, KvError> {
        for _ in 0..READS_PER_STEP_MAX {
            let now_ms = self.shared.clock.now_ms();
            match self.queue.step(now_ms) {
                Step::Read => {
                    let (hold, _) = self
                        .group
                        .state_machine()
                        .lock(&self.key.1, now_ms)
                        .await
                        .map_err(|e| KvError::fatal(e.to_string()))?;
                    self.queue.observe(hold, now_ms);
                }
                Step::Propose(proposal) => return Ok(Next::Propose(self.propose(&proposal))),
                Step::Idle { until_ms } => return Ok(Next::Idle { until_ms }),
            }
        }
        Ok(Next::Idle { until_ms: None })
    }

    fn propose(&self, proposal: &Proposal) -> Outcome {
        let (request, op) = proposal.op(&self.key.1);
        let command = coordinated::command(self.shared.clock.as_ref(), request, op);
        let group = self.group.clone();
        Box::pin(async move { group.write(command).await })
    }

    fn accept(&mut self, event: Event) {
        match event {
            Event::Wait { acquirer, reply } => match self.queue.enqueue(acquirer) {
                Ok(id) => drop(self.waiters.insert(id, reply)),
                Err(error) => drop(reply.send(Err(error))),
            },
            Event::Release {
                token,
                request,
                reply,
            } => match self.queue.release(token, request) {
                Ok(id) => drop(self.releases.insert(id, reply)),
                Err(error) => drop(reply.send(Err(error))),
            },
            Event::Kick => self.queue.kick(),
        }
    }

    /// Hands out answers; a grant whose caller has gone is given back. `Err`: stop.
    fn answer(&mut self, answers: Vec<Answer>) -> Result<(), KvError> {
        for answer in answers {
            match answer {
                Answer::Granted { waiter, grant } => {
                    let token = grant.hold.token;
                    let taken = self
                        .waiters
                        .remove(&waiter)
                        .is_some_and(|reply| reply.send(Ok(grant)).is_ok());
                    if !taken {
                        self.queue.orphan(token);
                    }
                }
                Answer::Released { release, done } => {
                    if let Some(reply) = self.releases.remove(&release) {
                        drop(reply.send(done));
                    }
                }
                Answer::Stop(error) => return Err(error),
            }
        }
        Ok(())
    }

    /// A tick: proposals may be retried, waiters whose calls ended leave, and the queue
    /// stops if this node no longer leads the range (in the same term) or serves.
    fn housekeep(&mut self) -> Result<(), KvError> {
        self.queue.tick();
        let ended: Vec<WaiterId> = self
            .waiters
            .iter()
            .filter(|(_, reply)| reply.is_closed())
            .map(|(id, _)| *id)
            .collect();
        for id in ended {
            self.waiters.remove(&id);
            self.queue.remove_waiter(id);
        }
        self.shared.health.check()?;
        if self.shared.health.is_closing() {
            return Err(KvError::unavailable(format!(
                "node {} is shutting down",
                self.shared.node_id
            )));
        }
        self.check_leader()
    }

    /// After a range event of the store: `KeyOutOfRange` when the lock's name left this
    /// queue's range, so everyone waiting goes to the range holding it now.
    async fn check_span(&mut self) -> Result<(), KvError> {
        if !self.range_events.has_changed().unwrap_or(false) {
            return Ok(());
        }
        self.range_events.mark_unchanged();
        let range = self.group.descriptor().await?;
        if range.contains(&self.key.1) {
            return Ok(());
        }
        Err(KvError::KeyOutOfRange {
            key: self.key.1.clone(),
            range: Box::new(range),
        })
    }

    fn check_leader(&self) -> Result<(), KvError> {
        let node_id = self.shared.node_id;
        let leader = self.group.leader();
        if leader.as_ref().map(|(id, _)| *id) == Some(node_id) && self.group.term() == self.term {
            return Ok(());
        }
        Err(KvError::NotLeader {
            range_id: self.group.range(),
            leader: leader.filter(|(id, _)| *id != node_id),
        })
    }

    /// Leaves the registry if no event arrived meanwhile (one that did is taken in).
    fn leave(&mut self) -> bool {
        match self.registry.leave(&self.key, &mut self.events) {
            Some(event) => {
                self.accept(event);
                false
            }
            None => true,
        }
    }

    /// Answers everyone still waiting with `error` and leaves the registry.
    fn stop(mut self, error: KvError) {
        debug!(lock = %show_key(&self.key.1), %error, "lock queue stopping");
        self.shared.lock_waiters.clear(&self.key);
        let (waiters, releases) = self.queue.drain();
        for id in waiters {
            if let Some(reply) = self.waiters.remove(&id) {
                drop(reply.send(Err(error.clone())));
            }
        }
        for id in releases {
            if let Some(reply) = self.releases.remove(&id) {
                drop(reply.send(Err(error.clone())));
            }
        }
        for event in self.registry.close(&self.key, &mut self.events) {
            event.refuse(error.clone());
        }
    }
}
