//! The Keel target as generic clients reach it (`--route spread`): raw gRPC calls through
//! keel-proto's generated clients, round robin over the endpoints, with `no_forward: false`
//! so the node a request reaches forwards it to its range's leader. One attempt per request:
//! no retries, no request ids; every non-OK answer counts as an error by its gRPC code.
//! Knows nothing of keel-client's routing (the preload, which is not measured, goes through
//! it).

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use keel_client::attempt::{self, AttemptError};
use keel_proto::v1;
use keel_proto::v1::kv_client::KvClient;
use keel_proto::v1::lock_client::LockClient;
use keel_types::{Condition, Consistency, KvError};
use tonic::transport::{Channel, Endpoint};

use crate::config::Config;
use crate::driver::{Outcome, Revisions, Step, Worker, done};
use crate::failure::Failure;
use crate::fanout::Payload;
use crate::{keel, keys, limits, preload};

/// One endpoint's generated clients, sharing one channel.
#[derive(Clone)]
struct Node {
    kv: KvClient<Channel>,
    lock: LockClient<Channel>,
}

/// Round robin over `len` endpoints from `first` on: each call names the next one.
#[derive(Debug, Clone)]
pub struct Turns {
    next: usize,
    len: usize,
}

impl Turns {
    pub fn new(first: usize, len: usize) -> Turns {
        assert!(len > 0, "round robin over no endpoint");
        Turns {
            next: first % len,
            len,
        }
    }

    pub fn next(&mut self) -> usize {
        let index = self.next;
        self.next = (index + 1) % self.len;
        index
    }
}

/// One task's view: one set of channels (one per endpoint), its own turn.
pub struct SpreadWorker {
    nodes: Arc<[Node]>,
    turns: Turns,
    value: Payload,
    revisions: Arc<Revisions>,
    task: usize,
    /// `max_staleness_ms` of its follower gets.
    max_staleness_ms: Option<i64>,
    lock: LockPlan,
}

/// What every acquire of a task asks for: its own owner, a TTL outlasting the run and a wait
/// as long as one op may take (as `keel::KeelWorker`'s).
struct LockPlan {
    owner: Vec<u8>,
    ttl_ms: i64,
    wait_ms: i64,
}

/// Opens `config.connections` sets of lazy channels (one per endpoint), preloads the keyspace
/// through keel-client and returns one worker per task; task i uses set i mod connections and
/// starts its round robin at endpoint i, so the tasks spread from the first request on.
pub async fn prepare(
    config: &Config,
    revisions: &Arc<Revisions>,
) -> anyhow::Result<Vec<SpreadWorker>> {
    let sets = (0..config.connections)
        .map(|_| connect(&config.endpoints))
        .collect::<anyhow::Result<Vec<Arc<[Node]>>>>()?;
    if config.preload {
        keel::preload(config, revisions).await?;
    }
    let value = Payload::new(preload::value(config.value_bytes), config.watchers > 0);
    let ttl = config.warmup + config.duration + Duration::from_secs(limits::LOCK_LEASE_SLACK_S);
    let owner = format!("keel-bench/{}", std::process::id());
    Ok((0..config.clients)
        .map(|task| SpreadWorker {
            nodes: sets[task % sets.len()].clone(),
            turns: Turns::new(task, config.endpoints.len()),
            value: value.clone(),
            revisions: revisions.clone(),
            task,
            max_staleness_ms: config.max_staleness.map(millis),
            lock: LockPlan {
                owner: format!("{owner}/task-{task}").into_bytes(),
                ttl_ms: millis(ttl),
                wait_ms: millis(limits::OP_TIMEOUT),
            },
        })
        .collect())
}

fn connect(endpoints: &[String]) -> anyhow::Result<Arc<[Node]>> {
    endpoints
        .iter()
        .map(|endpoint| {
            let url = match endpoint.contains("://") {
                true => endpoint.clone(),
                false => format!("http://{endpoint}"),
            };
            let channel = Endpoint::from_shared(url)
                .with_context(|| format!("endpoint {endpoint:?}"))?
                .connect_timeout(limits::OP_TIMEOUT)
                .connect_lazy();
            Ok(Node {
                kv: KvClient::new(channel.clone()),
                lock: LockClient::new(channel),
            })
        })
        .collect()
}

fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

impl Worker for SpreadWorker {
    async fn run(&mut self, step: Step) -> Result<Outcome, Failure> {
        match step {
            Step::Put(key) => {
                let request = self.put_request(key, None);
                let answer = self.node().kv.put(request).await;
                answer
                    .map(done)
                    .map_err(|status| Failure::from_status(&status))
            }
            Step::Get(key, consistency) => {
                let request = v1::GetRequest {
                    max_staleness_ms: self.max_staleness_ms,
                    ..get_request(key, consistency)
                };
                let answer = self.node().kv.get(request).await;
                answer
                    .map(done)
                    .map_err(|status| Failure::from_status(&status))
            }
            Step::Cas(key) => self.cas(key).await,
            Step::Increment(key) => {
                let request = v1::IncrementRequest {
                    key: keys::counter_key(key),
                    delta: 1,
                    request_id: None,
                    no_forward: false,
                };
                let answer = self.node().kv.increment(request).await;
                answer
                    .map(done)
                    .map_err(|status| Failure::from_status(&status))
            }
            Step::Lock => self.lock_release(keys::lock_name(Some(self.task))).await,
            Step::LockShared => self.lock_release(keys::lock_name(None)).await,
        }
    }

    async fn close(self) {}
}

impl SpreadWorker {
    /// The next endpoint's clients (cheap clones of its channel).
    fn node(&mut self) -> Node {
        self.nodes[self.turns.next()].clone()
    }

    fn put_request(&self, key: usize, condition: Option<Condition>) -> v1::PutRequest {
        v1::PutRequest {
            key: keys::data_key(key),
            value: self.value.bytes().into_owned(),
            condition: condition.map(v1::Condition::from),
            return_previous: false,
            no_forward: false,
            ttl_ms: None,
            request_id: None,
            fence: None,
        }
    }

    /// A put conditioned on the key's last known revision; a `ConditionFailed` answer is a
    /// conflict (its detail carries the current revision), as in `keel::KeelWorker::cas`.
    async fn cas(&mut self, key: usize) -> Result<Outcome, Failure> {
        let condition = match self.revisions.get(key) {
            0 => Condition::Absent,
            revision => Condition::Revision(revision),
        };
        let request = self.put_request(key, Some(condition));
        match self.node().kv.put(request).await {
            Ok(answer) => {
                let revision = answer.get_ref().header.as_ref().map_or(0, |h| h.revision);
                self.revisions.observe(key, revision);
                Ok(Outcome::Done)
            }
            Err(status) => match attempt::from_status(&status) {
                AttemptError::Server(KvError::ConditionFailed(failed)) => {
                    let current = failed.current.map_or(0, |kv| kv.mod_revision);
                    self.revisions.observe(key, current);
                    Ok(Outcome::Conflict)
                }
                _ => Err(Failure::from_status(&status)),
            },
        }
    }

    /// Acquire (waiting for a held lock) and release, each to the next endpoint in turn.
    async fn lock_release(&mut self, name: Vec<u8>) -> Result<Outcome, Failure> {
        let acquire = v1::AcquireRequest {
            name: name.clone(),
            owner: self.lock.owner.clone(),
            ttl_ms: self.lock.ttl_ms,
            wait_ms: self.lock.wait_ms,
            lock_delay_ms: 0,
            request_id: None,
            no_forward: false,
        };
        let acquired = self
            .node()
            .lock
            .acquire(acquire)
            .await
            .map_err(|status| Failure::from_status(&status))?
            .into_inner();
        let token = match (acquired.acquired, acquired.holder) {
            (true, Some(holder)) => holder.token,
            _ => return Err(keel::not_granted(limits::OP_TIMEOUT)),
        };
        let release = v1::ReleaseRequest {
            name,
            token,
            request_id: None,
            no_forward: false,
        };
        let released = self.node().lock.release(release).await;
        released
            .map(done)
            .map_err(|status| Failure::from_status(&status))
    }
}

fn get_request(key: usize, consistency: Consistency) -> v1::GetRequest {
    v1::GetRequest {
        key: keys::data_key(key),
        consistency: v1::Consistency::from(consistency).into(),
        no_forward: false,
        ..v1::GetRequest::default()
    }
}

#[cfg(test)]
mod tests;
