//! Client sessions and request ids: which session a new write belongs to, its sequence, and
//! the lowest sequence still in flight (`completed_below`). Knows nothing of tonic or of
//! endpoints: opening a session is a closure the caller passes in.
//!
//! A session is replaced before the next write when it is older than `session_max_age` (by
//! the client's clock seam) or when `REQUESTS_PER_SESSION_MAX` sequences separate the next
//! one from the lowest still in flight (the server would refuse more with `Overloaded`).
//! Requests of a replaced session keep their ids until they end.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use keel_types::{Clock, KvError, RequestId, SharedClock, limits};

/// The sessions of one `Client`, shared by all its clones and tasks.
#[derive(Debug)]
pub(crate) struct Sessions {
    state: Mutex<State>,
    /// Held while a session is being opened, so that concurrent first writes open one.
    opening: tokio::sync::Mutex<()>,
    clock: SharedClock,
    max_age_ms: u64,
}

/// The id of a write in flight. Dropping it (answered, abandoned or cancelled) lets
/// `completed_below` pass its sequence.
#[derive(Debug)]
pub(crate) struct Pending {
    sessions: Arc<Sessions>,
    id: RequestId,
}

impl Sessions {
    pub fn new(clock: SharedClock, max_age: Duration) -> Arc<Sessions> {
        Arc::new(Sessions {
            state: Mutex::new(State::default()),
            opening: tokio::sync::Mutex::new(()),
            clock,
            max_age_ms: u64::try_from(max_age.as_millis()).unwrap_or(u64::MAX),
        })
    }

    /// An id for a new write. Opens a session with `open` (returning `client_id` and
    /// `client_started_ms`) when there is no usable one.
    pub async fn begin<F, Fut>(self: &Arc<Self>, open: F) -> Result<Pending, KvError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<(u64, u64), KvError>>,
    {
        if let Some(id) = self.assign() {
            return Ok(self.pending(id));
        }
        let _opening = self.opening.lock().await;
        // Another task may have opened one while this one waited.
        if let Some(id) = self.assign() {
            return Ok(self.pending(id));
        }
        let (client_id, started_ms) = open().await?;
        let now_ms = self.clock.now_ms();
        let id = self.lock().open(client_id, started_ms, now_ms);
        Ok(self.pending(id))
    }

    /// Stops using the session of `expired` (the server refused one of its ids as expired),
    /// unless it has been replaced already; the next `begin` opens a new one.
    pub fn retire(&self, expired: &RequestId) {
        let mut state = self.lock();
        if state
            .current
            .as_ref()
            .is_some_and(|session| session.client_id == expired.client_id)
        {
            state.current = None;
        }
    }

    fn assign(&self) -> Option<RequestId> {
        let now_ms = self.clock.now_ms();
        self.lock().assign(now_ms, self.max_age_ms)
    }

    fn pending(self: &Arc<Self>, id: RequestId) -> Pending {
        Pending {
            sessions: self.clone(),
            id,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("session lock poisoned")
    }
}

impl Pending {
    pub fn id(&self) -> RequestId {
        self.id
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        // Never panic in drop; a poisoned lock means a panic is unwinding already.
        if let Ok(mut state) = self.sessions.state.lock() {
            state.finish(&self.id);
        }
    }
}

/// The current session, if any. Pure: time comes in as arguments.
#[derive(Debug, Default)]
struct State {
    current: Option<Session>,
}

#[derive(Debug)]
struct Session {
    client_id: u64,
    started_ms: u64,
    /// The client's clock when the session was opened.
    opened_ms: u64,
    next_sequence: u64,
    in_flight: BTreeSet<u64>,
}

impl Session {
    /// The lowest sequence still in flight, or the next one if none is.
    fn completed_below(&self) -> u64 {
        self.in_flight
            .first()
            .copied()
            .unwrap_or(self.next_sequence)
    }

    fn usable(&self, now_ms: u64, max_age_ms: u64) -> bool {
        let young = now_ms.saturating_sub(self.opened_ms) <= max_age_ms;
        let window = self.next_sequence - self.completed_below();
        young && window < limits::REQUESTS_PER_SESSION_MAX
    }

    fn next_id(&mut self) -> RequestId {
        let sequence = self.next_sequence;
        self.next_sequence += 1;
        self.in_flight.insert(sequence);
        RequestId {
            client_id: self.client_id,
            client_started_ms: self.started_ms,
            sequence,
            completed_below: self.completed_below(),
        }
    }
}

impl State {
    /// The next id of the current session, or `None` when a new session is needed.
    fn assign(&mut self, now_ms: u64, max_age_ms: u64) -> Option<RequestId> {
        let session = self.current.as_mut()?;
        session
            .usable(now_ms, max_age_ms)
            .then(|| session.next_id())
    }

    /// Makes a newly opened session current and returns its first id.
    fn open(&mut self, client_id: u64, started_ms: u64, now_ms: u64) -> RequestId {
        let session = self.current.insert(Session {
            client_id,
            started_ms,
            opened_ms: now_ms,
            next_sequence: 1,
            in_flight: BTreeSet::new(),
        });
        session.next_id()
    }

    /// The write `id` ended. Ids of replaced sessions are no longer tracked.
    fn finish(&mut self, id: &RequestId) {
        if let Some(session) = self.current.as_mut()
            && session.client_id == id.client_id
            && session.started_ms == id.client_started_ms
        {
            session.in_flight.remove(&id.sequence);
        }
    }
}

/// The default clock of session ages: monotonic (immune to wall-clock steps), reported in
/// Unix milliseconds from the instant it was made.
#[derive(Debug)]
pub(crate) struct MonotonicClock {
    origin_ms: u64,
    origin: Instant,
    offset_ms: AtomicI64,
}

impl MonotonicClock {
    pub fn shared() -> SharedClock {
        let origin_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| u64::try_from(since.as_millis()).unwrap_or(0));
        Arc::new(MonotonicClock {
            origin_ms,
            origin: Instant::now(),
            offset_ms: AtomicI64::new(0),
        })
    }
}

impl Clock for MonotonicClock {
    fn now_ms(&self) -> u64 {
        let elapsed = u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX);
        let now_ms = self.origin_ms.saturating_add(elapsed);
        now_ms.saturating_add_signed(self.offset_ms.load(Ordering::SeqCst))
    }

    fn set_offset_ms(&self, offset_ms: i64) {
        self.offset_ms.store(offset_ms, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests;
