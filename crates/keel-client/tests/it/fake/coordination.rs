//! The fake's Lock and Idempotency services: a lock table and a record table with Keel's
//! rules, simplified (no lock-delay, no range clock, no queue: a waiting acquire polls).
//! Writes take the fake's scripted replies like Kv writes do, and are applied at most once
//! per request id: a retry gets the first outcome back, marked replayed.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use keel_proto::v1;
use keel_proto::v1::idempotency_server::{Idempotency, IdempotencyServer};
use keel_proto::v1::lock_server::{Lock, LockServer};
use keel_types::KvError;
use tonic::{Code, Request, Response, Status};

use super::{Fake, Headed, Reply, Store, Write, refuse, status};

/// How often a waiting acquire looks at the lock again.
const POLL: Duration = Duration::from_millis(10);

#[derive(Default)]
pub struct State {
    locks: HashMap<Vec<u8>, Hold>,
    /// By (scope, id).
    records: HashMap<(Vec<u8>, Vec<u8>), Record>,
}

#[derive(Clone)]
struct Hold {
    owner: Vec<u8>,
    token: u64,
    expires: Instant,
}

#[derive(Clone)]
enum Record {
    InProgress {
        owner: Vec<u8>,
        token: u64,
        expires: Instant,
    },
    Completed {
        result: Vec<u8>,
        token: u64,
        expires: Instant,
    },
}

/// An applied write's outcome: the response (its header set on the way out) and revision,
/// or a refusal. `bool`: final (an acquire that found the lock busy may try again).
type Outcome<T> = (Result<(T, u64), KvError>, bool);

pub fn lock_server(fake: Arc<Fake>) -> LockServer<Locks> {
    LockServer::new(Locks(fake))
}

pub fn idempotency_server(fake: Arc<Fake>) -> IdempotencyServer<Records> {
    IdempotencyServer::new(Records(fake))
}

impl Fake {
    /// Gives the lock `name` to another owner with a new token, as if this holder's TTL had
    /// run out and someone took it.
    pub fn steal_lock(&self, name: &[u8]) {
        let mut store = self.store.lock().unwrap();
        store.revision += 1;
        let hold = Hold {
            owner: b"thief".to_vec(),
            token: store.revision,
            expires: Instant::now() + Duration::from_secs(60),
        };
        store.coordination.locks.insert(name.to_vec(), hold);
    }

    /// Writes of `method` that arrived.
    pub fn writes_of(&self, method: &str) -> Vec<Write> {
        let writes = self.writes();
        writes.into_iter().filter(|w| w.method == method).collect()
    }

    /// A coordination write of `key` (a lock name, or an idempotency record's key):
    /// recorded, routed, answered by the script first, then applied with `apply` at most
    /// once per request id (tried again every `POLL` while it is not final, for up to
    /// `wait`).
    async fn coordinate<R, T, F>(
        &self,
        method: &'static str,
        (request, key): (&Request<R>, &[u8]),
        id: Option<v1::RequestId>,
        wait: Duration,
        mut apply: F,
    ) -> Result<Response<T>, Status>
    where
        T: Headed + Clone + Send + 'static,
        F: FnMut(&mut Store) -> Outcome<T>,
    {
        let (lose, range) = self.admit(method, request, id, key).await?;
        let key = id.map(|id| (id.client_id, id.sequence));
        let first = key.and_then(|key| {
            let store = self.store.lock().unwrap();
            let answer = store.answers.get(&key)?;
            answer.downcast_ref::<Result<(T, u64), KvError>>().cloned()
        });
        let (outcome, replayed) = match first {
            Some(outcome) => (outcome, true),
            None => (self.apply_until_final(wait, &mut apply).await, false),
        };
        if let Some(key) = key.filter(|_| !replayed) {
            let answer: Box<dyn std::any::Any + Send> = Box::new(outcome.clone());
            self.store.lock().unwrap().answers.insert(key, answer);
        }
        if lose {
            return Err(Status::new(Code::Unknown, "response lost"));
        }
        let (mut response, revision) = outcome.map_err(|error| status(&error))?;
        *response.header_mut() = self.header(revision, replayed);
        self.stamp(&mut response, request, range);
        Ok(Response::new(response))
    }

    async fn apply_until_final<T, F>(
        &self,
        wait: Duration,
        apply: &mut F,
    ) -> Result<(T, u64), KvError>
    where
        F: FnMut(&mut Store) -> Outcome<T>,
    {
        let deadline = Instant::now() + wait;
        loop {
            let (outcome, last) = apply(&mut self.store.lock().unwrap());
            if last || Instant::now() >= deadline {
                return outcome;
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Records a coordination write of `key`, routes it, and takes its scripted reply:
    /// `true` to apply it and lose the answer, `false` to apply it and answer; and the range.
    async fn admit<R>(
        &self,
        method: &'static str,
        request: &Request<R>,
        request_id: Option<v1::RequestId>,
        key: &[u8],
    ) -> Result<(bool, u64), Status> {
        self.record(method, request);
        let write = Write {
            method,
            request_id,
            ttl_ms: None,
            fence: None,
        };
        self.writes.lock().unwrap().push(write);
        self.arrived.send_modify(|n| *n += 1);
        let range = self
            .route(request, &[key])
            .map_err(|error| status(&error))?;
        let lose = match self.next_reply() {
            None => false,
            Some(Reply::Lose) => true,
            Some(Reply::Gate(gate)) => {
                gate.notified().await;
                false
            }
            Some(reply) => return Err(refuse(reply).await),
        };
        Ok((lose, range))
    }
}

/// The key an idempotency record is stored and routed under.
fn record_key(scope: &[u8], id: &[u8]) -> Vec<u8> {
    keel_types::coordination::idempotency_key(scope, id)
}

fn left_ms(expires: Instant, now: Instant) -> u64 {
    expires.saturating_duration_since(now).as_millis() as u64
}

fn holder(hold: &Hold, now: Instant) -> v1::LockHolder {
    v1::LockHolder {
        owner: hold.owner.clone(),
        token: hold.token,
        ttl_remaining_ms: left_ms(hold.expires, now),
        expires_at_ms: 0,
        lock_delay_ms: 0,
    }
}

fn live_hold(state: &State, name: &[u8], now: Instant) -> Option<Hold> {
    state
        .locks
        .get(name)
        .filter(|hold| hold.expires > now)
        .cloned()
}

fn not_held(state: &State, name: &[u8], token: u64, now: Instant) -> KvError {
    KvError::LockNotHeld {
        name: name.to_vec(),
        token,
        current_token: live_hold(state, name, now).map(|hold| hold.token),
    }
}

fn acquire(store: &mut Store, request: &v1::AcquireRequest) -> Outcome<v1::AcquireResponse> {
    let now = Instant::now();
    let live = live_hold(&store.coordination, &request.name, now);
    if let Some(hold) = live.as_ref().filter(|hold| hold.owner != request.owner) {
        let busy = v1::AcquireResponse {
            header: None,
            acquired: false,
            holder: Some(holder(hold, now)),
            available_in_ms: left_ms(hold.expires, now),
        };
        return (Ok((busy, store.revision)), false);
    }
    store.revision += 1;
    let hold = Hold {
        owner: request.owner.clone(),
        token: live.map_or(store.revision, |hold| hold.token),
        expires: now + Duration::from_millis(request.ttl_ms as u64),
    };
    let granted = v1::AcquireResponse {
        header: None,
        acquired: true,
        holder: Some(holder(&hold, now)),
        available_in_ms: 0,
    };
    store.coordination.locks.insert(request.name.clone(), hold);
    (Ok((granted, store.revision)), true)
}

fn renew(store: &mut Store, request: &v1::RenewRequest) -> Outcome<v1::RenewResponse> {
    let now = Instant::now();
    let state = &mut store.coordination;
    let Some(mut hold) = live_hold(state, &request.name, now).filter(|h| h.token == request.token)
    else {
        return (
            Err(not_held(state, &request.name, request.token, now)),
            true,
        );
    };
    store.revision += 1;
    hold.expires = now + Duration::from_millis(request.ttl_ms as u64);
    let renewed = v1::RenewResponse {
        header: None,
        holder: Some(holder(&hold, now)),
    };
    state.locks.insert(request.name.clone(), hold);
    (Ok((renewed, store.revision)), true)
}

fn release(store: &mut Store, request: &v1::ReleaseRequest) -> Outcome<v1::ReleaseResponse> {
    let now = Instant::now();
    let state = &mut store.coordination;
    let held = state.locks.get(&request.name).map(|hold| hold.token) == Some(request.token);
    if !held {
        return (
            Err(not_held(state, &request.name, request.token, now)),
            true,
        );
    }
    state.locks.remove(&request.name);
    store.revision += 1;
    let released = v1::ReleaseResponse {
        header: None,
        successor: None,
    };
    (Ok((released, store.revision)), true)
}

pub struct Locks(Arc<Fake>);

#[tonic::async_trait]
impl Lock for Locks {
    async fn acquire(
        &self,
        request: Request<v1::AcquireRequest>,
    ) -> Result<Response<v1::AcquireResponse>, Status> {
        let body = request.get_ref().clone();
        let wait = Duration::from_millis(body.wait_ms as u64);
        let apply = |store: &mut Store| acquire(store, &body);
        self.0
            .coordinate(
                "acquire",
                (&request, &body.name),
                body.request_id,
                wait,
                apply,
            )
            .await
    }

    async fn renew(
        &self,
        request: Request<v1::RenewRequest>,
    ) -> Result<Response<v1::RenewResponse>, Status> {
        let body = request.get_ref().clone();
        let apply = |store: &mut Store| renew(store, &body);
        self.0
            .coordinate(
                "renew",
                (&request, &body.name),
                body.request_id,
                Duration::ZERO,
                apply,
            )
            .await
    }

    async fn release(
        &self,
        request: Request<v1::ReleaseRequest>,
    ) -> Result<Response<v1::ReleaseResponse>, Status> {
        let body = request.get_ref().clone();
        let apply = |store: &mut Store| release(store, &body);
        self.0
            .coordinate(
                "release",
                (&request, &body.name),
                body.request_id,
                Duration::ZERO,
                apply,
            )
            .await
    }

    async fn inspect(
        &self,
        request: Request<v1::InspectRequest>,
    ) -> Result<Response<v1::InspectResponse>, Status> {
        let now = Instant::now();
        let response = {
            let store = self.0.store.lock().unwrap();
            let live = live_hold(&store.coordination, &request.get_ref().name, now);
            v1::InspectResponse {
                header: self.0.header(store.revision, false),
                available_in_ms: live.as_ref().map_or(0, |hold| left_ms(hold.expires, now)),
                holder: live.map(|hold| holder(&hold, now)),
            }
        };
        let name = request.get_ref().name.clone();
        self.0.read("inspect", &request, &name, response).await
    }
}

fn live_record(state: &State, key: &(Vec<u8>, Vec<u8>), now: Instant) -> Option<Record> {
    let record = state.records.get(key)?;
    let expires = match record {
        Record::InProgress { expires, .. } | Record::Completed { expires, .. } => *expires,
    };
    (expires > now).then(|| record.clone())
}

fn not_owned(key: &(Vec<u8>, Vec<u8>), token: u64, current: Option<&Record>) -> KvError {
    KvError::RecordNotOwned {
        scope: key.0.clone(),
        id: key.1.clone(),
        token,
        current_token: current.map(|record| match record {
            Record::InProgress { token, .. } | Record::Completed { token, .. } => *token,
        }),
    }
}

fn begin(store: &mut Store, request: &v1::BeginRequest) -> Outcome<v1::BeginResponse> {
    use v1::begin_response::State as Answer;
    let now = Instant::now();
    let key = (request.scope.clone(), request.id.clone());
    let answer = match live_record(&store.coordination, &key, now) {
        Some(Record::InProgress { owner, expires, .. }) => Answer::InProgress(v1::InProgress {
            owner,
            ttl_remaining_ms: left_ms(expires, now),
        }),
        Some(Record::Completed {
            result, expires, ..
        }) => Answer::Completed(v1::Completed {
            result,
            ttl_remaining_ms: left_ms(expires, now),
        }),
        None => {
            store.revision += 1;
            let record = Record::InProgress {
                owner: request.owner.clone(),
                token: store.revision,
                expires: now + Duration::from_millis(request.ttl_ms as u64),
            };
            store.coordination.records.insert(key, record);
            Answer::Started(v1::Started {
                token: store.revision,
                ttl_remaining_ms: request.ttl_ms as u64,
            })
        }
    };
    let response = v1::BeginResponse {
        header: None,
        state: Some(answer),
    };
    (Ok((response, store.revision)), true)
}

fn complete(store: &mut Store, request: &v1::CompleteRequest) -> Outcome<v1::CompleteResponse> {
    let now = Instant::now();
    let key = (request.scope.clone(), request.id.clone());
    let stored = store.coordination.records.get(&key).cloned();
    match stored {
        Some(Record::InProgress { token, .. }) if token == request.token => {
            store.revision += 1;
            let expires = now + Duration::from_millis(request.result_ttl_ms as u64);
            let record = Record::Completed {
                result: request.result.clone(),
                token,
                expires,
            };
            store.coordination.records.insert(key, record);
            let completed = v1::Completed {
                result: request.result.clone(),
                ttl_remaining_ms: left_ms(expires, now),
            };
            let response = v1::CompleteResponse {
                header: None,
                completed: Some(completed),
            };
            (Ok((response, store.revision)), true)
        }
        other => (Err(not_owned(&key, request.token, other.as_ref())), true),
    }
}

fn abort(store: &mut Store, request: &v1::AbortRequest) -> Outcome<v1::AbortResponse> {
    let key = (request.scope.clone(), request.id.clone());
    let stored = store.coordination.records.get(&key).cloned();
    match stored {
        Some(Record::InProgress { token, .. }) if token == request.token => {
            store.coordination.records.remove(&key);
            store.revision += 1;
            let response = v1::AbortResponse { header: None };
            (Ok((response, store.revision)), true)
        }
        other => (Err(not_owned(&key, request.token, other.as_ref())), true),
    }
}

pub struct Records(Arc<Fake>);

#[tonic::async_trait]
impl Idempotency for Records {
    async fn begin(
        &self,
        request: Request<v1::BeginRequest>,
    ) -> Result<Response<v1::BeginResponse>, Status> {
        let body = request.get_ref().clone();
        let apply = |store: &mut Store| begin(store, &body);
        self.0
            .coordinate(
                "begin",
                (&request, &record_key(&body.scope, &body.id)),
                body.request_id,
                Duration::ZERO,
                apply,
            )
            .await
    }

    async fn complete(
        &self,
        request: Request<v1::CompleteRequest>,
    ) -> Result<Response<v1::CompleteResponse>, Status> {
        let body = request.get_ref().clone();
        let apply = |store: &mut Store| complete(store, &body);
        self.0
            .coordinate(
                "complete",
                (&request, &record_key(&body.scope, &body.id)),
                body.request_id,
                Duration::ZERO,
                apply,
            )
            .await
    }

    async fn abort(
        &self,
        request: Request<v1::AbortRequest>,
    ) -> Result<Response<v1::AbortResponse>, Status> {
        let body = request.get_ref().clone();
        let apply = |store: &mut Store| abort(store, &body);
        self.0
            .coordinate(
                "abort",
                (&request, &record_key(&body.scope, &body.id)),
                body.request_id,
                Duration::ZERO,
                apply,
            )
            .await
    }

    async fn get(
        &self,
        request: Request<v1::IdempotencyGetRequest>,
    ) -> Result<Response<v1::IdempotencyGetResponse>, Status> {
        use v1::idempotency_get_response::State as Answer;
        let now = Instant::now();
        let key = (
            request.get_ref().scope.clone(),
            request.get_ref().id.clone(),
        );
        let response = {
            let store = self.0.store.lock().unwrap();
            let state = live_record(&store.coordination, &key, now).map(|record| match record {
                Record::InProgress { owner, expires, .. } => Answer::InProgress(v1::InProgress {
                    owner,
                    ttl_remaining_ms: left_ms(expires, now),
                }),
                Record::Completed {
                    result, expires, ..
                } => Answer::Completed(v1::Completed {
                    result,
                    ttl_remaining_ms: left_ms(expires, now),
                }),
            });
            v1::IdempotencyGetResponse {
                header: self.0.header(store.revision, false),
                state,
            }
        };
        let record = record_key(&request.get_ref().scope, &request.get_ref().id);
        self.0
            .read("idempotency get", &request, &record, response)
            .await
    }
}
