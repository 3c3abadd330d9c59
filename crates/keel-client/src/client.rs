//! The client: validates input, routes each request by its key (`route`: the leader of the
//! key's range in the range table, or the cached leader of a cluster without one), and runs
//! the retry policy of `retry` within the request deadline (reads here, writes in `write`).
//! Batches are in `batch`, scans in `scan`, the Cluster service in `cluster`, the lock and
//! idempotency calls in `lock`, `idempotency` and `idempotent`, and the `LockGuard` that
//! `Client::lock` returns in `guard`. Knows nothing of server internals.

use std::future::Future;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use keel_proto::v1;
use keel_proto::v1::kv_client::KvClient;
use keel_types::{Consistency, Fence, KvError, ReadBound, Revision, SharedClock, validate};
use tokio::time::Instant;

use crate::attempt::{self, AttemptError};
use crate::endpoints::{self, Pool};
use crate::options::{self, ClientOptions, DeleteOptions, PutOptions};
use crate::range_cache::RangeCache;
use crate::results::{self, DeleteResult, GetResult, IncrementResult, PutResult, Served};
use crate::retry::{self, Decision};
use crate::session::{MonotonicClock, Sessions};
use crate::stub::{Credentials, Stub, Transport};

mod backup;
mod batch;
mod cluster;
mod guard;
mod hedge;
mod history;
mod idempotency;
mod idempotent;
mod leader_probe;
mod lock;
mod replicas;
mod route;
mod scan;
mod watch;
mod write;

pub use backup::{RangeBackup, RangeSnapshot};
pub use guard::LockGuard;
use route::{Route, RouteBy};
pub use watch::{Watch, WatchBatch, WatchOptions};

/// A handle on a Keel cluster. Cheap to clone; clones share connections, the range table and
/// the leader caches.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    /// Normalized URIs of the configured endpoints; never empty.
    endpoints: Vec<String>,
    options: ClientOptions,
    pool: Pool,
    /// The range table: which range holds a key and which node leads it.
    ranges: RangeCache,
    /// Without a range table (none yet, or an older cluster): the URI that last served a
    /// leader-only request, or that a replica named as leader.
    leader: Mutex<Option<String>>,
    /// Rotation over `endpoints`, and over a range's replicas, when the leader is unknown or
    /// unreachable.
    cursor: AtomicUsize,
    /// The client session and the request ids of writes in flight.
    sessions: Arc<Sessions>,
    /// The bearer token every request carries (`ClientOptions::token`).
    credentials: Credentials,
    /// Who this client acquires locks and begins idempotency records as, by default.
    owner: Vec<u8>,
}

/// What a request is, for routing and retrying.
#[derive(Debug, Clone, Copy)]
struct Kind {
    is_write: bool,
    /// Only the leader can serve it (every write, lease reads): its success names the
    /// leader. Linearizable reads go to the leader too when it is known, but any replica may
    /// serve them (ReadIndex), so their success names nobody.
    needs_leader: bool,
    /// How long the server may hold the call on purpose (an acquire waiting for its lock):
    /// added to the attempt's budget and to the write's deadline.
    held: Duration,
}

const WRITE: Kind = Kind {
    is_write: true,
    needs_leader: true,
    held: Duration::ZERO,
};

/// A read's staleness bound as the wire carries it, checked as the server checks it.
fn bounded_staleness_ms(bound: ReadBound) -> Result<Option<i64>, KvError> {
    let Some(ms) = bound.max_staleness_ms else {
        return Ok(None);
    };
    let ms = i64::try_from(ms).unwrap_or(i64::MAX);
    validate::check_read_bound(Some(ms), None)?;
    Ok(Some(ms))
}

/// How a read of `key` routes: a follower read to any replica, others to the leader.
fn read_route(key: &[u8], consistency: Consistency) -> RouteBy<'_> {
    match consistency {
        Consistency::Follower => RouteBy::AnyReplica(key),
        Consistency::Linearizable | Consistency::Lease => RouteBy::Key(key),
    }
}

fn read(consistency: Consistency) -> Kind {
    Kind {
        is_write: false,
        needs_leader: consistency == Consistency::Lease,
        held: Duration::ZERO,
    }
}

impl Client {
    /// A client of the cluster behind `endpoints` (`host:port`, at most
    /// `CLIENT_ENDPOINTS_MAX`; `http://` or, with `options.tls`, `https://` before it is
    /// taken too). Connects lazily, on first use, inside the caller's runtime; over TLS when
    /// `options.tls` is set. A CA without a certificate is refused here.
    pub fn new(endpoints: Vec<String>, options: ClientOptions) -> Result<Client, KvError> {
        Client::with_clock(endpoints, options, MonotonicClock::shared())
    }

    /// Like `new`, with the ages of client sessions (`session_max_age`) measured by `clock`
    /// instead of a monotonic clock of the host: tests move it by hand.
    pub fn with_clock(
        endpoints: Vec<String>,
        options: ClientOptions,
        clock: SharedClock,
    ) -> Result<Client, KvError> {
        let endpoints = endpoints::normalize_all(&endpoints, options.tls.is_some())?;
        let credentials = Credentials::new(options.token.as_deref())?;
        let inner = Inner {
            credentials,
            endpoints,
            pool: Pool::new(&options)?,
            ranges: RangeCache::new(options.range_refresh_interval),
            sessions: Sessions::new(clock, options.session_max_age),
            options,
            leader: Mutex::new(None),
            cursor: AtomicUsize::new(0),
            owner: crate::random::owner(),
        };
        Ok(Client {
            inner: Arc::new(inner),
        })
    }

    /// The owner this client acquires locks and begins idempotency records as when a call
    /// names none: `host/pid/random hex`, unique per `Client` (its clones share it).
    pub fn owner(&self) -> &[u8] {
        &self.inner.owner
    }

    pub async fn get(&self, key: &[u8], consistency: Consistency) -> Result<GetResult, KvError> {
        self.get_within(key, consistency, ReadBound::default())
            .await
    }

    /// Reads `key` as `get` does, from a replica state within `bound`: a follower read from
    /// a replica known current with its leader less than `bound.max_staleness_ms` ago (an
    /// older replica catches up first; 0 always does), and any read from a state that
    /// includes revision `bound.min_revision` (`FutureRevision` when the range has not
    /// reached it).
    pub async fn get_within(
        &self,
        key: &[u8],
        consistency: Consistency,
        bound: ReadBound,
    ) -> Result<GetResult, KvError> {
        self.get_read(key, consistency, bound, None).await
    }

    /// Reads `key` as it was at `revision` of its range (`header.revision` is that revision):
    /// a replica that has not applied it catches up first, `FutureRevision` when no write has
    /// made it yet, `Compacted` when changes after it may be gone from the replica's history.
    /// A key whose TTL ran out by then but which was not removed yet reads as it was stored.
    pub async fn get_at(
        &self,
        key: &[u8],
        revision: Revision,
        consistency: Consistency,
    ) -> Result<GetResult, KvError> {
        let at = validate::check_read_revision(Some(revision))?;
        self.get_read(key, consistency, ReadBound::default(), at)
            .await
    }

    async fn get_read(
        &self,
        key: &[u8],
        consistency: Consistency,
        bound: ReadBound,
        revision: Option<Revision>,
    ) -> Result<GetResult, KvError> {
        validate::check_key(key)?;
        let request = v1::GetRequest {
            key: key.to_vec(),
            consistency: v1::Consistency::from(consistency).into(),
            no_forward: true,
            max_staleness_ms: bounded_staleness_ms(bound)?,
            min_revision: bound.min_revision,
            revision,
        };
        let timeout = self.inner.options.request_timeout;
        let by = read_route(key, consistency);
        let send = |mut kv: KvClient<Transport>, consistency: v1::Consistency| {
            let request = v1::GetRequest {
                consistency: consistency.into(),
                ..request.clone()
            };
            async move { kv.get(request).await }
        };
        let asked = v1::Consistency::from(consistency);
        let response = match self
            .call(read(consistency), by, timeout, |kv| send(kv, asked))
            .await
        {
            Err(error) if revision.is_some() => self.read_at_elsewhere(key, error, send).await?,
            answer => answer?,
        };
        results::get(response)
    }

    /// Writes `value` under `key`, with a condition, a TTL, a fence or the previous state as
    /// `options` ask. Retried with one request id until answered (see the crate's docs).
    pub async fn put(
        &self,
        key: &[u8],
        value: &[u8],
        options: PutOptions,
    ) -> Result<PutResult, KvError> {
        validate::check_op(key, Some(value), options.condition.as_ref())?;
        let ttl_ms = match options.ttl.map(options::millis) {
            Some(ttl_ms) => Some(validate::check_ttl_ms(key, ttl_ms).map(|_| ttl_ms)?),
            None => None,
        };
        let request = v1::PutRequest {
            key: key.to_vec(),
            value: value.to_vec(),
            condition: options.condition.map(Into::into),
            return_previous: options.return_previous,
            no_forward: true,
            ttl_ms,
            request_id: None,
            fence: checked_fence(options.fence)?,
        };
        let response = self
            .write(
                WRITE,
                RouteBy::Key(key),
                |mut kv: KvClient<Transport>, id| {
                    let request = v1::PutRequest {
                        request_id: Some(id.into()),
                        ..request.clone()
                    };
                    async move { kv.put(request).await }
                },
            )
            .await?;
        results::put(response)
    }

    pub async fn delete(
        &self,
        key: &[u8],
        options: DeleteOptions,
    ) -> Result<DeleteResult, KvError> {
        validate::check_op(key, None, options.condition.as_ref())?;
        let request = v1::DeleteRequest {
            key: key.to_vec(),
            condition: options.condition.map(Into::into),
            return_previous: options.return_previous,
            no_forward: true,
            request_id: None,
            fence: checked_fence(options.fence)?,
        };
        let response = self
            .write(
                WRITE,
                RouteBy::Key(key),
                |mut kv: KvClient<Transport>, id| {
                    let request = v1::DeleteRequest {
                        request_id: Some(id.into()),
                        ..request.clone()
                    };
                    async move { kv.delete(request).await }
                },
            )
            .await?;
        results::delete(response)
    }

    /// Adds `delta` (negative to subtract) to the signed 64-bit decimal integer stored under
    /// `key` (absent = 0) and returns the new value. Applied exactly once however often it is
    /// retried; a value that is not such an integer fails with `NotACounter`, a sum out of
    /// range with `Overflow`. The key keeps its TTL.
    pub async fn increment(&self, key: &[u8], delta: i64) -> Result<IncrementResult, KvError> {
        validate::check_op(key, None, None)?;
        let request = v1::IncrementRequest {
            key: key.to_vec(),
            delta,
            request_id: None,
            no_forward: true,
        };
        let response = self
            .write(
                WRITE,
                RouteBy::Key(key),
                |mut kv: KvClient<Transport>, id| {
                    let request = v1::IncrementRequest {
                        request_id: Some(id.into()),
                        ..request.clone()
                    };
                    async move { kv.increment(request).await }
                },
            )
            .await?;
        results::increment(response)
    }

    /// Runs the read `send` against the node `by` routes to (the leader, or another replica
    /// of the key's range) until it succeeds or the retry policy gives up, within `timeout`.
    async fn call<S, T, F, Fut>(
        &self,
        kind: Kind,
        by: RouteBy<'_>,
        timeout: Duration,
        send: F,
    ) -> Result<T, KvError>
    where
        S: Stub,
        T: Served,
        F: FnMut(S) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        self.call_with(kind, by, timeout, retry::decide_read, send)
            .await
    }

    /// `call` with the retry policy `decide` (attempt number, 1 for the first).
    async fn call_with<S, T, F, Fut>(
        &self,
        kind: Kind,
        by: RouteBy<'_>,
        timeout: Duration,
        decide: fn(&AttemptError, u32) -> Decision,
        mut send: F,
    ) -> Result<T, KvError>
    where
        S: Stub,
        T: Served,
        F: FnMut(S) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let deadline = Instant::now() + timeout;
        self.prepare_routing(&by, deadline).await;
        // Endpoints that failed to connect or answer during this request; at most one per
        // attempt.
        let mut unreachable: Vec<String> = Vec::new();
        let mut route = self.route(&by, &unreachable);
        let mut attempt = 0;
        // Whether an attempt of a write may have been applied: a call given up afterwards
        // cannot say it was not.
        let mut maybe_applied = false;
        loop {
            attempt += 1;
            let error = match self.attempt(&route, &by, kind, deadline, &mut send).await {
                Ok(response) => {
                    self.served(&route, response.range_id(), kind.needs_leader);
                    return Ok(response);
                }
                Err(error) => error,
            };
            tracing::debug!(uri = %route.uri, attempt, %error, "keel request attempt failed");
            maybe_applied |= kind.is_write && retry::may_have_applied(&error);
            let target = match decide(&error, attempt) {
                Decision::GiveUp(error) => return Err(retry::settled(error, maybe_applied)),
                Decision::Retry { target } => target,
            };
            let target = self.note_failure(&route, &error, target, &mut unreachable);
            let remaining = deadline.saturating_duration_since(Instant::now());
            let pause = retry::read_backoff(&error, &target, attempt, remaining);
            if pause >= remaining {
                let given_up = retry::read_deadline_passed(&error, timeout);
                return Err(retry::settled(given_up, maybe_applied));
            }
            tokio::time::sleep(pause).await;
            route = self
                .reroute(route, target, &by, deadline, &unreachable)
                .await;
        }
    }

    /// One attempt at `route`, bounded by the deadline and by the attempt budget (plus the
    /// time the server may hold the call), and given up early if another replica names a
    /// new leader meanwhile (`leader_probe`).
    async fn attempt<S, T, F, Fut>(
        &self,
        route: &Route,
        by: &RouteBy<'_>,
        kind: Kind,
        deadline: Instant,
        send: &mut F,
    ) -> Result<T, AttemptError>
    where
        S: Stub,
        F: FnMut(S) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let uri = route.uri.as_str();
        let channel = self.inner.pool.channel(uri).map_err(AttemptError::Server)?;
        let options = &self.inner.options;
        let attempt_timeout = match kind.is_write {
            true => options.write_attempt_timeout,
            false => options.read_attempt_timeout,
        };
        let budget = deadline
            .saturating_duration_since(Instant::now())
            .min(attempt_timeout.saturating_add(kind.held));
        let started = Instant::now();
        let call =
            tokio::time::timeout(budget, send(S::on(channel, self.inner.credentials.clone())));
        tokio::select! {
            biased;
            answer = call => match answer {
                Ok(Ok(response)) => Ok(response.into_inner()),
                Ok(Err(status)) => Err(locate(uri, attempt::from_status(&status))),
                Err(_) => Err(timed_out(uri, budget)),
            },
            leader = self.leader_moved(route, by) => Err(AttemptError::Superseded {
                message: format!(
                    "{uri} did not answer within {} ms, and another replica names {} the leader",
                    started.elapsed().as_millis(),
                    leader.addr
                ),
                leader,
            }),
        }
    }
}

/// A fence checked before it is sent, in its wire form.
fn checked_fence(fence: Option<Fence>) -> Result<Option<v1::Fence>, KvError> {
    let Some(fence) = fence else { return Ok(None) };
    validate::check_fence(&fence)?;
    Ok(Some(options::wire_fence(fence)))
}

/// Names the endpoint in client-side failures; server errors already say who answered.
fn locate(uri: &str, error: AttemptError) -> AttemptError {
    match error {
        AttemptError::Server(error) => AttemptError::Server(error),
        superseded @ AttemptError::Superseded { .. } => superseded,
        AttemptError::NotSent(message) => AttemptError::NotSent(format!("{uri}: {message}")),
        AttemptError::Lost(message) => AttemptError::Lost(format!("{uri}: {message}")),
        AttemptError::TimedOut(message) => AttemptError::TimedOut(format!("{uri}: {message}")),
    }
}

fn timed_out(uri: &str, budget: Duration) -> AttemptError {
    AttemptError::TimedOut(format!(
        "{uri} did not answer within {} ms",
        budget.as_millis()
    ))
}
