//! The range table a client shares among its clones and tasks, and when to refresh it: one
//! refresh at a time (callers that need one while it runs share it), at most one fetch per
//! `interval`. Knows nothing of tonic: fetching is a closure the caller passes in, and time
//! comes in from tokio's clock, which tests can pause.

use std::future::Future;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use keel_types::RangeId;
use tokio::time::Instant;

use crate::range_table::{Picked, RangeTable, Spans};

/// The client's range table.
#[derive(Debug)]
pub(crate) struct RangeCache {
    state: Mutex<State>,
    /// Held while a refresh runs.
    refreshing: tokio::sync::Mutex<()>,
    /// Least time between two fetches.
    interval: Duration,
}

/// What the client knows of the cluster's ranges.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Mode {
    /// No table yet: never fetched, or every fetch failed.
    Unknown,
    /// The cluster answered `Cluster.Ranges` with UNIMPLEMENTED: an older server with one
    /// range. Requests go to the cached leader, as before ranges.
    Unsupported,
    Known(RangeTable),
}

/// The result of one fetch.
#[derive(Debug)]
pub(crate) enum Fetched {
    Table(RangeTable),
    Unsupported,
    /// No node answered; the cache keeps what it had.
    Failed,
}

/// How much a caller needs the refresh.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Urgency {
    /// An answer refused the request as routed by a stale table: wait for the refresh, and
    /// for the interval since the last fetch, within the caller's deadline.
    Wait,
    /// The table is only suspected stale (or missing): refresh if a fetch is allowed now and
    /// no other refresh runs, else go on with what there is.
    IfAllowed,
}

/// What a refresh does, decided from the time and the cache's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Plan {
    /// Another caller refreshed after this one looked at the table: use it.
    Done,
    Fetch,
    /// Fetch after this pause (the interval since the last fetch has not passed).
    WaitThenFetch(Duration),
    /// Leave the table as it is.
    Skip,
}

#[derive(Debug)]
struct State {
    mode: Mode,
    /// Fetches completed (whatever they found); a caller that saw generation `g` and needs a
    /// refresh is served by any fetch that completes later.
    generation: u64,
    fetched_at: Option<Instant>,
    /// An answer suggested the table is out of date; the next request refreshes it if allowed.
    stale: bool,
}

/// Decides a refresh. `seen`: the generation the caller routed with; `now`, `deadline`:
/// tokio time.
pub(crate) fn plan_refresh(
    now: Instant,
    fetched_at: Option<Instant>,
    interval: Duration,
    (seen, generation): (u64, u64),
    urgency: Urgency,
    deadline: Instant,
) -> Plan {
    if generation > seen {
        return Plan::Done;
    }
    let allowed_at = match fetched_at {
        Some(fetched_at) => fetched_at + interval,
        None => return Plan::Fetch,
    };
    if now >= allowed_at {
        return Plan::Fetch;
    }
    match urgency {
        Urgency::Wait if allowed_at < deadline => Plan::WaitThenFetch(allowed_at - now),
        Urgency::Wait | Urgency::IfAllowed => Plan::Skip,
    }
}

impl RangeCache {
    pub fn new(interval: Duration) -> RangeCache {
        RangeCache {
            state: Mutex::new(State {
                mode: Mode::Unknown,
                generation: 0,
                fetched_at: None,
                stale: false,
            }),
            refreshing: tokio::sync::Mutex::new(()),
            interval,
        }
    }

    pub fn generation(&self) -> u64 {
        self.lock().generation
    }

    /// Whether a request should try a refresh before routing: no table yet, or one suspected
    /// stale. `Some(Urgency::Wait)` before the very first fetch, so that concurrent first
    /// requests share it.
    pub fn wanted(&self) -> Option<Urgency> {
        let state = self.lock();
        match (&state.mode, state.fetched_at, state.stale) {
            (Mode::Unknown, None, _) => Some(Urgency::Wait),
            (Mode::Unknown, Some(_), _) | (_, _, true) => Some(Urgency::IfAllowed),
            _ => None,
        }
    }

    /// Marks the table suspected stale: the next request refreshes it if a fetch is allowed.
    pub fn mark_stale(&self) {
        self.lock().stale = true;
    }

    /// Where to send a request for `key` (`None`: any node), and which range that is; the
    /// URI is `None` when the table knows no reachable node (or there is no table). A key
    /// in a gap of the table marks it stale.
    pub fn pick(
        &self,
        key: Option<&[u8]>,
        preferred: &[String],
        unreachable: &[String],
        rotation: usize,
    ) -> (Picked, Option<String>, u64) {
        let mut state = self.lock();
        let generation = state.generation;
        let (picked, uri) = match (&state.mode, key) {
            (_, None) | (Mode::Unknown, _) => (Picked::Unrouted, None),
            (Mode::Unsupported, Some(_)) => (Picked::Whole, None),
            (Mode::Known(table), Some(key)) => {
                match table.pick(key, preferred, unreachable, rotation) {
                    Some((range, uri)) => (Picked::Range(range), uri),
                    None => {
                        state.stale = true;
                        (Picked::Unrouted, None)
                    }
                }
            }
        };
        (picked, uri, generation)
    }

    /// The URIs of `range`'s replicas the table knows (none without a table).
    pub fn replica_uris(&self, range: RangeId) -> Vec<String> {
        match &self.lock().mode {
            Mode::Known(table) => table.replica_uris(range),
            Mode::Unknown | Mode::Unsupported => Vec::new(),
        }
    }

    /// The two first ranges `keys` fall in, if more than one.
    pub fn spans(&self, keys: &[&[u8]]) -> Option<Spans> {
        match &self.lock().mode {
            Mode::Known(table) => table.spans(keys),
            Mode::Unknown | Mode::Unsupported => None,
        }
    }

    /// The indexes of `keys` grouped by range (all in one group without a table).
    pub fn group(&self, keys: &[&[u8]]) -> Vec<Vec<usize>> {
        match &self.lock().mode {
            Mode::Known(table) => table.group(keys),
            Mode::Unknown | Mode::Unsupported if keys.is_empty() => Vec::new(),
            Mode::Unknown | Mode::Unsupported => vec![(0..keys.len()).collect()],
        }
    }

    /// Applies `change` to the table, if there is one.
    pub fn update(&self, change: impl FnOnce(&mut RangeTable)) {
        if let Mode::Known(table) = &mut self.lock().mode {
            change(table);
        }
    }

    /// A copy of the mode, for tests and for callers that show it.
    #[cfg(test)]
    pub fn mode(&self) -> Mode {
        self.lock().mode.clone()
    }

    /// Installs a table fetched outside a refresh (`Client::ranges`).
    pub fn install(&self, table: RangeTable) {
        let mut state = self.lock();
        state.finish(Fetched::Table(table), Instant::now());
    }

    /// Refreshes the table as `plan_refresh` decides, fetching with `fetch`.
    pub async fn refresh<F, Fut>(&self, seen: u64, urgency: Urgency, deadline: Instant, fetch: F)
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Fetched>,
    {
        let _running = match urgency {
            Urgency::Wait => self.refreshing.lock().await,
            Urgency::IfAllowed => match self.refreshing.try_lock() {
                Ok(running) => running,
                Err(_) => return,
            },
        };
        let plan = {
            let state = self.lock();
            let generations = (seen, state.generation);
            let now = Instant::now();
            plan_refresh(
                now,
                state.fetched_at,
                self.interval,
                generations,
                urgency,
                deadline,
            )
        };
        match plan {
            Plan::Done | Plan::Skip => return,
            Plan::WaitThenFetch(pause) => tokio::time::sleep(pause).await,
            Plan::Fetch => {}
        }
        let fetched = fetch().await;
        self.lock().finish(fetched, Instant::now());
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().expect("range cache lock poisoned")
    }
}

impl State {
    /// Records a fetch. A failed one counts for the rate limit but leaves the table, and
    /// its staleness, as they were.
    fn finish(&mut self, fetched: Fetched, now: Instant) {
        match fetched {
            Fetched::Table(table) => {
                self.mode = Mode::Known(table);
                self.stale = false;
            }
            Fetched::Unsupported => {
                self.mode = Mode::Unsupported;
                self.stale = false;
            }
            Fetched::Failed => {}
        }
        self.generation += 1;
        self.fetched_at = Some(now);
    }
}

#[cfg(test)]
mod tests;
