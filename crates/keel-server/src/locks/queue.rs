//! The decisions of one lock's wait queue on the range's leader, without I/O: who waits in
//! which order (first come, first served, at most `LOCK_WAITERS_MAX`), what to propose next
//! on the queue's behalf (one proposal at a time), what the queue knows of the lock, and who
//! gets which answer when a proposal comes back. Knows nothing of tasks, channels, clocks or
//! gRPC: the driver (`driver.rs`) reads, proposes and answers as told, and passes the
//! node's clock in.
//!
//! Hand-over: a holder's release names the first waiter as its successor, so the lock passes
//! to it in one Raft command. A lock that frees by itself (expiry, then lock-delay) is
//! acquired for the first waiter once the clock passes `available_at_ms`. A grant that lands
//! for a waiter that has left is released again, naming the next waiter.

use std::collections::VecDeque;

use keel_types::validate::show_key;
use keel_types::{
    Acquirer, CoordinationOp, CoordinationResult, KvError, LockHold, LockPhase, RequestId,
    Revision, limits,
};

use crate::requests::coordinated::{Coordinated, unexpected};

/// One acquire waiting in the queue.
pub(crate) type WaiterId = u64;
/// One client's release waiting for the queue's proposal slot.
pub(crate) type ReleaseId = u64;

/// What the queue knows of its lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Seen {
    /// Read it from the replica before deciding.
    Unknown,
    Free,
    Held(LockHold),
}

/// A proposal made on the queue's behalf.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Proposal {
    /// Take the lock for the first waiter if it is free (no request id: an acquire by an
    /// owner that holds the lock keeps its token, so proposing it again is harmless).
    Acquire {
        waiter: WaiterId,
        acquirer: Acquirer,
    },
    /// Release `token`, handing the lock to the first waiter. `release` is the client's
    /// call; `None` when the queue gives back a grant whose waiter left.
    Release {
        release: Option<ReleaseId>,
        token: u64,
        request: Option<RequestId>,
        successor: Option<(WaiterId, Acquirer)>,
    },
}

impl Proposal {
    /// The request id and operation to propose for lock `name`.
    pub fn op(&self, name: &[u8]) -> (Option<RequestId>, CoordinationOp) {
        match self {
            Proposal::Acquire { acquirer, .. } => (
                None,
                CoordinationOp::Acquire {
                    name: name.to_vec(),
                    acquirer: acquirer.clone(),
                },
            ),
            Proposal::Release {
                token,
                request,
                successor,
                ..
            } => (
                *request,
                CoordinationOp::Release {
                    name: name.to_vec(),
                    token: *token,
                    successor: successor.as_ref().map(|(_, acquirer)| acquirer.clone()),
                },
            ),
        }
    }
}

/// What the driver does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Step {
    /// Read the lock from this replica and pass it to `observe`.
    Read,
    /// Propose this and pass its outcome to `settle`.
    Propose(Proposal),
    /// Nothing until an event, a tick, or the node's clock reading `until_ms`.
    Idle { until_ms: Option<u64> },
}

/// A waiter holds the lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Grant {
    pub hold: LockHold,
    /// The revision of the command that granted it.
    pub revision: Revision,
}

/// A client's release was applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ReleaseDone {
    /// The waiter the lock went to, if any.
    pub successor: Option<LockHold>,
    pub revision: Revision,
    pub replayed: bool,
}

/// Who gets which answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Answer {
    Granted {
        waiter: WaiterId,
        grant: Grant,
    },
    Released {
        release: ReleaseId,
        done: Result<ReleaseDone, KvError>,
    },
    /// This replica can serve nobody here any more (not the leader, or stopped): answer
    /// everyone `drain` returns with the error, and stop.
    Stop(KvError),
}

#[derive(Debug)]
struct Waiter {
    id: WaiterId,
    acquirer: Acquirer,
}

#[derive(Debug)]
struct PendingRelease {
    id: ReleaseId,
    token: u64,
    request: Option<RequestId>,
}

/// One lock's queue.
#[derive(Debug)]
pub(crate) struct LockQueue {
    name: Vec<u8>,
    waiters: VecDeque<Waiter>,
    releases: VecDeque<PendingRelease>,
    /// Tokens granted to waiters that left before they were answered; at most one per
    /// settled proposal, and each is proposed before anything else.
    orphans: VecDeque<u64>,
    in_flight: Option<Proposal>,
    seen: Seen,
    /// A proposal failed for want of a leader or quorum: propose nothing until `tick`.
    backoff: bool,
    next_id: u64,
}

impl LockQueue {
    pub fn new(name: Vec<u8>) -> LockQueue {
        LockQueue {
            name,
            waiters: VecDeque::new(),
            releases: VecDeque::new(),
            orphans: VecDeque::new(),
            in_flight: None,
            seen: Seen::Unknown,
            backoff: false,
            next_id: 1,
        }
    }

    /// Queues an acquire behind the others; `Overloaded` at `LOCK_WAITERS_MAX`. The lock
    /// is read again before the next decision, in case a release raced the enqueue.
    pub fn enqueue(&mut self, acquirer: Acquirer) -> Result<WaiterId, KvError> {
        self.check_room(self.waiters.len(), "acquires waiting")?;
        let id = self.take_id();
        self.waiters.push_back(Waiter { id, acquirer });
        self.seen = Seen::Unknown;
        Ok(id)
    }

    /// Queues a holder's release of `token`; `Overloaded` at `LOCK_WAITERS_MAX` pending.
    pub fn release(
        &mut self,
        token: u64,
        request: Option<RequestId>,
    ) -> Result<ReleaseId, KvError> {
        self.check_room(self.releases.len(), "releases pending")?;
        let id = self.take_id();
        self.releases
            .push_back(PendingRelease { id, token, request });
        Ok(id)
    }

    /// The lock may have changed under the queue (a release served without it): read it.
    pub fn kick(&mut self) {
        self.seen = Seen::Unknown;
    }

    /// Removes a waiter whose call ended; whether it was queued. A grant already proposed
    /// for it is given back when it lands.
    pub fn remove_waiter(&mut self, waiter: WaiterId) -> bool {
        let before = self.waiters.len();
        self.waiters.retain(|queued| queued.id != waiter);
        self.waiters.len() != before
    }

    /// A grant reached a waiter that had left already: release it next.
    pub fn orphan(&mut self, token: u64) {
        self.orphans.push_back(token);
    }

    /// A tick of the driver's timer: proposals may be tried again after a failure.
    pub fn tick(&mut self) {
        self.backoff = false;
    }

    /// What to do now, at node clock `now_ms`.
    pub fn step(&mut self, now_ms: u64) -> Step {
        if self.in_flight.is_some() || self.backoff {
            return Step::Idle { until_ms: None };
        }
        if let Some(token) = self.orphans.pop_front() {
            let successor = self.first();
            return self.propose(Proposal::Release {
                release: None,
                token,
                request: None,
                successor,
            });
        }
        if let Some(release) = self.releases.pop_front() {
            let successor = self.first();
            return self.propose(Proposal::Release {
                release: Some(release.id),
                token: release.token,
                request: release.request,
                successor,
            });
        }
        let Some((waiter, acquirer)) = self.first() else {
            return Step::Idle { until_ms: None };
        };
        match &self.seen {
            Seen::Unknown => Step::Read,
            Seen::Free => self.propose(Proposal::Acquire { waiter, acquirer }),
            Seen::Held(hold) if hold.phase(now_ms) == LockPhase::Free => {
                // Its time has passed unless it was renewed meanwhile: look before proposing.
                self.seen = Seen::Unknown;
                Step::Read
            }
            Seen::Held(hold) => Step::Idle {
                until_ms: Some(hold.available_at_ms()),
            },
        }
    }

    /// The lock as this replica read it at node clock `now_ms` (`None`: free).
    pub fn observe(&mut self, hold: Option<LockHold>, now_ms: u64) {
        self.seen = match hold {
            Some(hold) if hold.phase(now_ms) != LockPhase::Free => Seen::Held(hold),
            _ => Seen::Free,
        };
    }

    /// The outcome of the proposal in flight, and who gets which answer.
    pub fn settle(&mut self, outcome: Result<Coordinated, KvError>) -> Vec<Answer> {
        let proposal = self
            .in_flight
            .take()
            .expect("an outcome is settled only for a proposal in flight");
        match proposal {
            Proposal::Acquire { waiter, .. } => self.settle_acquire(waiter, outcome),
            Proposal::Release {
                release, successor, ..
            } => self.settle_release(release, successor.map(|(id, _)| id), outcome),
        }
    }

    /// Everyone still waiting for an answer (the client release in flight included), for a
    /// `Stop`; the queue is empty afterwards.
    pub fn drain(&mut self) -> (Vec<WaiterId>, Vec<ReleaseId>) {
        let waiters = self.waiters.drain(..).map(|waiter| waiter.id).collect();
        let mut releases: Vec<ReleaseId> = self.releases.drain(..).map(|r| r.id).collect();
        if let Some(Proposal::Release {
            release: Some(id), ..
        }) = self.in_flight.take()
        {
            releases.push(id);
        }
        self.orphans.clear();
        (waiters, releases)
    }

    /// The acquires waiting, first in line first.
    pub fn waiting(&self) -> impl ExactSizeIterator<Item = &Acquirer> {
        self.waiters.iter().map(|waiter| &waiter.acquirer)
    }

    /// Nothing waits, nothing is pending or in flight: the driver may go.
    pub fn is_idle(&self) -> bool {
        self.waiters.is_empty()
            && self.releases.is_empty()
            && self.orphans.is_empty()
            && self.in_flight.is_none()
    }

    fn first(&self) -> Option<(WaiterId, Acquirer)> {
        let waiter = self.waiters.front()?;
        Some((waiter.id, waiter.acquirer.clone()))
    }

    fn propose(&mut self, proposal: Proposal) -> Step {
        self.in_flight = Some(proposal.clone());
        Step::Propose(proposal)
    }

    fn take_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    fn check_room(&self, queued: usize, what: &str) -> Result<(), KvError> {
        if queued >= limits::LOCK_WAITERS_MAX {
            return Err(KvError::Overloaded {
                message: format!(
                    "lock {} has {queued} {what} on this leader; limit is {}",
                    show_key(&self.name),
                    limits::LOCK_WAITERS_MAX
                ),
            });
        }
        Ok(())
    }

    fn settle_acquire(
        &mut self,
        waiter: WaiterId,
        outcome: Result<Coordinated, KvError>,
    ) -> Vec<Answer> {
        match outcome {
            Ok(Coordinated {
                revision,
                result: CoordinationResult::Acquired(hold),
                ..
            }) => {
                self.seen = Seen::Held(hold.clone());
                self.grant(waiter, Grant { hold, revision })
                    .into_iter()
                    .collect()
            }
            Ok(Coordinated {
                result: CoordinationResult::Busy(hold),
                ..
            }) => {
                self.seen = Seen::Held(hold);
                Vec::new()
            }
            Ok(other) => self.fail(unexpected(other.replayed)),
            Err(error) => self.fail(error),
        }
    }

    fn settle_release(
        &mut self,
        release: Option<ReleaseId>,
        successor: Option<WaiterId>,
        outcome: Result<Coordinated, KvError>,
    ) -> Vec<Answer> {
        let mut answers = Vec::new();
        let done = match outcome {
            Ok(Coordinated {
                revision,
                result: CoordinationResult::Released { successor: hold },
                replayed,
            }) => {
                // A replay's successor was chosen by its first application, not now.
                self.seen = match (&hold, replayed) {
                    (_, true) => Seen::Unknown,
                    (Some(hold), false) => Seen::Held(hold.clone()),
                    (None, false) => Seen::Free,
                };
                if let (Some(waiter), Some(hold), false) = (successor, &hold, replayed) {
                    let grant = Grant {
                        hold: hold.clone(),
                        revision,
                    };
                    answers.extend(self.grant(waiter, grant));
                }
                Ok(ReleaseDone {
                    successor: hold,
                    revision,
                    replayed,
                })
            }
            Ok(other) => Err(unexpected(other.replayed)),
            Err(error) => Err(error),
        };
        let failed = done.as_ref().err().cloned();
        if let Some(release) = release {
            answers.push(Answer::Released { release, done });
        }
        if let Some(error) = failed {
            answers.extend(self.fail(error));
        }
        answers
    }

    /// The lock went to `waiter`; if it left meanwhile, the grant is given back next.
    fn grant(&mut self, waiter: WaiterId, grant: Grant) -> Option<Answer> {
        if self.remove_waiter(waiter) {
            return Some(Answer::Granted { waiter, grant });
        }
        self.orphan(grant.hold.token);
        None
    }

    /// A proposal failed: the lock must be read again; without a leader or quorum, wait for
    /// a tick; on another leader or a stopped node, stop.
    fn fail(&mut self, error: KvError) -> Vec<Answer> {
        self.seen = Seen::Unknown;
        match error {
            // The lock's name left this range (it split): the queue belongs to the leader
            // of the range holding the name now, where its callers go next.
            KvError::NotLeader { .. } | KvError::Fatal { .. } | KvError::KeyOutOfRange { .. } => {
                vec![Answer::Stop(error)]
            }
            KvError::Unavailable { .. }
            | KvError::Timeout { .. }
            | KvError::OutcomeUnknown { .. } => {
                self.backoff = true;
                Vec::new()
            }
            _ => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests;
