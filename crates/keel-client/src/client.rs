//! The client: validates input, routes each request to the cached leader, and runs the retry
//! policy of `retry` within the request deadline (reads here, writes in `write`). The lock
//! and idempotency calls live in `lock`, `idempotency` and `idempotent`. Knows nothing of
//! server internals.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use keel_proto::v1;
use keel_proto::v1::cluster_client::ClusterClient;
use keel_proto::v1::kv_client::KvClient;
use keel_types::{
    BatchOp, Consistency, Fence, KvError, NodeId, RangeId, SharedClock, limits, validate,
};
use tokio::time::Instant;
use tonic::transport::Channel;

use crate::attempt::{self, AttemptError};
use crate::endpoints::{self, Pool};
use crate::options::{self, BatchOptions, ClientOptions, DeleteOptions, PutOptions};
use crate::results::{
    self, BatchResult, DeleteResult, GetResult, IncrementResult, PutResult, ScanResult,
};
use crate::retry::{self, Decision, Target};
use crate::session::{MonotonicClock, Sessions};
use crate::stub::Stub;

mod idempotency;
mod idempotent;
mod lock;
mod write;

/// A handle on a Keel cluster. Cheap to clone; clones share connections and the leader cache.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    /// Normalized URIs of the configured endpoints; never empty.
    endpoints: Vec<String>,
    options: ClientOptions,
    pool: Pool,
    /// The URI that last served a leader-only request, or that a replica named as leader.
    leader: Mutex<Option<String>>,
    /// Rotation over `endpoints` when the leader is unknown or unreachable.
    cursor: AtomicUsize,
    /// The client session and the request ids of writes in flight.
    sessions: Arc<Sessions>,
    /// Who this client acquires locks and begins idempotency records as, by default.
    owner: Vec<u8>,
}

/// What a request is, for routing and retrying.
#[derive(Debug, Clone, Copy)]
struct Kind {
    is_write: bool,
    /// Only the leader can serve it (every write and read but follower reads).
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

fn read(consistency: Consistency) -> Kind {
    Kind {
        is_write: false,
        needs_leader: consistency != Consistency::Follower,
        held: Duration::ZERO,
    }
}

impl Client {
    /// A client of the cluster behind `endpoints` (`host:port` or `http://host:port`, at most
    /// `CLIENT_ENDPOINTS_MAX`). Connects lazily, on first use, inside the caller's runtime.
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
        let endpoints = endpoints::normalize_all(&endpoints)?;
        let inner = Inner {
            endpoints,
            pool: Pool::new(options.clone()),
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
        validate::check_key(key)?;
        let request = v1::GetRequest {
            key: key.to_vec(),
            consistency: v1::Consistency::from(consistency).into(),
            no_forward: true,
        };
        let timeout = self.inner.options.request_timeout;
        let response = self
            .call(read(consistency), timeout, |mut kv: KvClient<Channel>| {
                let request = request.clone();
                async move { kv.get(request).await }
            })
            .await?;
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
            .write(WRITE, |mut kv: KvClient<Channel>, id| {
                let request = v1::PutRequest {
                    request_id: Some(id.into()),
                    ..request.clone()
                };
                async move { kv.put(request).await }
            })
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
            .write(WRITE, |mut kv: KvClient<Channel>, id| {
                let request = v1::DeleteRequest {
                    request_id: Some(id.into()),
                    ..request.clone()
                };
                async move { kv.delete(request).await }
            })
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
            .write(WRITE, |mut kv: KvClient<Channel>, id| {
                let request = v1::IncrementRequest {
                    request_id: Some(id.into()),
                    ..request.clone()
                };
                async move { kv.increment(request).await }
            })
            .await?;
        results::increment(response)
    }

    /// One page of the keys of `[start, end)` (empty `end` = to the end of the keyspace), at
    /// most `limit` rows (0 = the default). Follow `next_start` for the next page.
    pub async fn scan(
        &self,
        start: &[u8],
        end: &[u8],
        limit: u32,
        consistency: Consistency,
    ) -> Result<ScanResult, KvError> {
        let limit = validate::check_scan(start, end, limit)?;
        let request = v1::ScanRequest {
            start: start.to_vec(),
            end: end.to_vec(),
            limit,
            consistency: v1::Consistency::from(consistency).into(),
            no_forward: true,
        };
        let timeout = self.inner.options.request_timeout;
        let response = self
            .call(read(consistency), timeout, |mut kv: KvClient<Channel>| {
                let request = request.clone();
                async move { kv.scan(request).await }
            })
            .await?;
        results::scan(response)
    }

    /// Applies `ops` (puts, deletes, increments) atomically at one revision, or none of them.
    pub async fn batch(&self, ops: Vec<BatchOp>) -> Result<BatchResult, KvError> {
        self.batch_with(ops, BatchOptions::default()).await
    }

    /// Like `batch`, with the options of the whole batch (a fence guarding every key it
    /// writes).
    pub async fn batch_with(
        &self,
        ops: Vec<BatchOp>,
        options: BatchOptions,
    ) -> Result<BatchResult, KvError> {
        validate::check_ops(&ops)?;
        let count = ops.len();
        let request = v1::BatchRequest {
            ops: ops.into_iter().map(Into::into).collect(),
            no_forward: true,
            request_id: None,
            fence: checked_fence(options.fence)?,
        };
        let response = self
            .write(WRITE, |mut kv: KvClient<Channel>, id| {
                let request = v1::BatchRequest {
                    request_id: Some(id.into()),
                    ..request.clone()
                };
                async move { kv.batch(request).await }
            })
            .await?;
        results::batch(response, count)
    }

    /// The cluster as the node at `endpoint` sees it. One attempt, to that node only: the
    /// answer is about the node asked.
    pub async fn status(&self, endpoint: &str) -> Result<v1::StatusResponse, KvError> {
        self.cluster_call(endpoint, |mut cluster| async move {
            cluster.status(v1::StatusRequest {}).await
        })
        .await
    }

    /// Asks the leader of `range` to hand leadership to its voter `node`. Any node accepts
    /// the request and forwards it to the leader; the endpoints are tried in turn, one
    /// attempt each. Returns once the hand-over has started.
    pub async fn transfer_leader(&self, range: RangeId, node: NodeId) -> Result<(), KvError> {
        let request = v1::TransferLeaderRequest {
            range_id: range.0,
            node_id: node,
            no_forward: false,
        };
        let mut last = KvError::unavailable("the client has no endpoints");
        for endpoint in &self.inner.endpoints {
            let answer = self
                .cluster_call(endpoint, |mut cluster| async move {
                    cluster.transfer_leader(request).await
                })
                .await;
            match answer {
                Ok(_) => return Ok(()),
                Err(error @ KvError::InvalidArgument { .. }) => return Err(error),
                Err(error) => last = error,
            }
        }
        Err(last)
    }

    /// One call of the Cluster service at `endpoint`, within the request timeout.
    async fn cluster_call<T, F, Fut>(&self, endpoint: &str, call: F) -> Result<T, KvError>
    where
        F: FnOnce(ClusterClient<Channel>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let uri = endpoints::normalize(endpoint)?;
        let channel = self.inner.pool.channel(&uri)?;
        let cluster =
            ClusterClient::new(channel).max_decoding_message_size(limits::GRPC_MESSAGE_BYTES_MAX);
        let timeout = self.inner.options.request_timeout;
        match tokio::time::timeout(timeout, call(cluster)).await {
            Ok(Ok(response)) => Ok(response.into_inner()),
            Ok(Err(status)) => Err(retry::final_error(&locate(
                &uri,
                attempt::from_status(&status),
            ))),
            Err(_) => Err(retry::final_error(&timed_out(&uri, timeout))),
        }
    }

    /// Runs the read `send` against the leader (or the next endpoint) until it succeeds or
    /// the retry policy gives up, within `timeout`.
    async fn call<S, T, F, Fut>(
        &self,
        kind: Kind,
        timeout: Duration,
        mut send: F,
    ) -> Result<T, KvError>
    where
        S: Stub,
        F: FnMut(S) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let deadline = Instant::now() + timeout;
        let mut uri = self.first_target();
        // Endpoints that failed to connect or answer during this request; at most one per
        // attempt.
        let mut unreachable: Vec<String> = Vec::new();
        let mut attempt = 0;
        loop {
            attempt += 1;
            let error = match self.attempt(&uri, kind, deadline, &mut send).await {
                Ok(response) => {
                    if kind.needs_leader {
                        self.set_leader(Some(uri));
                    }
                    return Ok(response);
                }
                Err(error) => error,
            };
            tracing::debug!(%uri, attempt, %error, "keel request attempt failed");
            let target = match retry::decide_read(&error, attempt) {
                Decision::GiveUp(error) => return Err(error),
                Decision::Retry { target } => target,
            };
            self.note_failure(&uri, &error, &target, &mut unreachable);
            let target = retry::skip_stale_hint(target, &unreachable);
            let remaining = deadline.saturating_duration_since(Instant::now());
            let pause = retry::read_backoff(&error, &target, attempt, remaining);
            if pause >= remaining {
                return Err(retry::read_deadline_passed(&error, timeout));
            }
            tokio::time::sleep(pause).await;
            uri = self.retarget(target, uri, &unreachable);
        }
    }

    /// One attempt at `uri`, bounded by the deadline and by the attempt budget (plus the
    /// time the server may hold the call).
    async fn attempt<S, T, F, Fut>(
        &self,
        uri: &str,
        kind: Kind,
        deadline: Instant,
        send: &mut F,
    ) -> Result<T, AttemptError>
    where
        S: Stub,
        F: FnMut(S) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let channel = self.inner.pool.channel(uri).map_err(AttemptError::Server)?;
        let options = &self.inner.options;
        let attempt_timeout = match kind.is_write {
            true => options.write_attempt_timeout,
            false => options.read_attempt_timeout,
        };
        let budget = deadline
            .saturating_duration_since(Instant::now())
            .min(attempt_timeout.saturating_add(kind.held));
        match tokio::time::timeout(budget, send(S::on(channel))).await {
            Ok(Ok(response)) => Ok(response.into_inner()),
            Ok(Err(status)) => Err(locate(uri, attempt::from_status(&status))),
            Err(_) => Err(timed_out(uri, budget)),
        }
    }

    fn first_target(&self) -> String {
        if let Some(leader) = self.leader() {
            return leader;
        }
        let endpoints = &self.inner.endpoints;
        endpoints[self.inner.cursor.load(Ordering::Relaxed) % endpoints.len()].clone()
    }

    /// After a failed attempt at `uri` that will be retried: stop sending there first unless
    /// it is to be asked again, and remember it if it could not be reached or did not answer.
    /// A lost answer does not make a node unreachable: it may be the leader, and a
    /// follower's hint must lead back to it (a crashed node shows as unreachable at the
    /// next connection attempt).
    fn note_failure(
        &self,
        uri: &str,
        error: &AttemptError,
        target: &Target,
        unreachable: &mut Vec<String>,
    ) {
        if *target != Target::Same {
            self.forget_leader(uri);
        }
        if matches!(error, AttemptError::NotSent(_) | AttemptError::TimedOut(_)) {
            unreachable.push(uri.to_string());
        }
    }

    /// The URI of `target`, `current` being the last one tried. Rotation passes over
    /// endpoints that were unreachable during this request while others remain, so attempts
    /// are not spent on a crashed node.
    fn retarget(&self, target: Target, current: String, unreachable: &[String]) -> String {
        match target {
            Target::Same => return current,
            Target::Hinted(addr) => {
                // `skip_stale_hint` turned unparsable hints into `Next`; this is a second guard.
                if let Ok(uri) = endpoints::normalize(&addr.addr) {
                    self.set_leader(Some(uri.clone()));
                    return uri;
                }
            }
            Target::Next => {}
        }
        let endpoints = &self.inner.endpoints;
        let mut next = String::new();
        for _ in 0..endpoints.len() {
            let index = self.inner.cursor.fetch_add(1, Ordering::Relaxed) + 1;
            next = endpoints[index % endpoints.len()].clone();
            if !unreachable.contains(&next) {
                break;
            }
        }
        next
    }

    fn leader(&self) -> Option<String> {
        self.inner
            .leader
            .lock()
            .expect("leader lock poisoned")
            .clone()
    }

    fn set_leader(&self, uri: Option<String>) {
        *self.inner.leader.lock().expect("leader lock poisoned") = uri;
    }

    /// After a failure at `uri`, stop sending there first if it was the cached leader.
    fn forget_leader(&self, uri: &str) {
        let mut leader = self.inner.leader.lock().expect("leader lock poisoned");
        if leader.as_deref() == Some(uri) {
            *leader = None;
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
