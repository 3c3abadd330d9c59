//! The etcd target, through `etcd-client`: connections, preload and one worker per task.
//! Built only with the `etcd` feature. Knows nothing of Keel.

use std::sync::Arc;

use anyhow::Context;
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, KeyValue, LockOptions, Txn,
    TxnOp, TxnOpResponse, TxnResponse, WatchOptions, WatchStream,
};
use keel_types::Consistency;

use crate::config::{Config, Op};
use crate::driver::{Outcome, Revisions, Step, Worker, done};
use crate::failure::{Failure, code_name};
use crate::fanout::{self, Feed, Payload};
use crate::keys;
use crate::limits;
use crate::preload;

/// One task's view: a clone of one of the run's clients, and its lock session's lease.
pub struct EtcdWorker {
    client: Client,
    value: Payload,
    revisions: Arc<Revisions>,
    task: usize,
    /// The lease of the task's lock session (lock ops only).
    lease: Option<i64>,
}

/// Connects `config.connections` clients (each balances over all endpoints, as etcd's own
/// clients do), preloads the keyspace and returns one worker per task.
pub async fn prepare(
    config: &Config,
    revisions: &Arc<Revisions>,
) -> anyhow::Result<Vec<EtcdWorker>> {
    let mut clients = Vec::with_capacity(config.connections);
    for index in 0..config.connections {
        clients.push(connect(&preload::rotate(&config.endpoints, index)).await?);
    }
    if config.preload {
        preload_keyspace(&clients[0], config, revisions).await?;
    }
    let value = Payload::new(preload::value(config.value_bytes), config.watchers > 0);
    let locks = matches!(config.op, Op::Lock | Op::LockContended);
    let lease_ttl_s =
        (config.warmup + config.duration).as_secs() as i64 + limits::LOCK_LEASE_SLACK_S as i64;
    let mut workers = Vec::with_capacity(config.clients);
    for task in 0..config.clients {
        let mut client = clients[task % clients.len()].clone();
        let lease = match locks {
            true => Some(
                client
                    .lease_grant(lease_ttl_s, None)
                    .await
                    .context("etcd lease grant")?
                    .id(),
            ),
            false => None,
        };
        workers.push(EtcdWorker {
            client,
            value: value.clone(),
            revisions: revisions.clone(),
            task,
            lease,
        });
    }
    Ok(workers)
}

async fn connect(endpoints: &[String]) -> anyhow::Result<Client> {
    let urls: Vec<String> = endpoints
        .iter()
        .map(|endpoint| match endpoint.contains("://") {
            true => endpoint.clone(),
            false => format!("http://{endpoint}"),
        })
        .collect();
    let options = ConnectOptions::new()
        .with_connect_timeout(limits::OP_TIMEOUT)
        .with_timeout(limits::OP_TIMEOUT);
    let connecting = Client::connect(urls, Some(options));
    tokio::time::timeout(limits::SETUP_TIMEOUT, connecting)
        .await
        .context("connecting to etcd timed out")?
        .context("connecting to etcd")
}

async fn preload_keyspace(
    client: &Client,
    config: &Config,
    revisions: &Arc<Revisions>,
) -> anyhow::Result<()> {
    let value = preload::value(config.value_bytes);
    let chunks = preload::chunks(config.keyspace, config.value_bytes);
    preload::run(chunks, |chunk| {
        let (mut client, value, revisions) = (client.clone(), value.clone(), revisions.clone());
        async move {
            let puts: Vec<TxnOp> = chunk
                .clone()
                .map(|index| TxnOp::put(keys::data_key(index), value.clone(), None))
                .collect();
            let response = client
                .txn(Txn::new().and_then(puts))
                .await
                .map_err(|error| error.to_string())?;
            let revision = revision_of(&response)?;
            chunk.for_each(|index| revisions.observe(index, revision));
            Ok(())
        }
    })
    .await
}

impl Worker for EtcdWorker {
    async fn run(&mut self, step: Step) -> Result<Outcome, Failure> {
        match step {
            Step::Put(key) => {
                let put =
                    self.client
                        .put(keys::data_key(key), self.value.bytes().into_owned(), None);
                put.await.map(done).map_err(failure)
            }
            Step::Get(key, Consistency::Linearizable) => {
                let get = self.client.get(keys::data_key(key), None);
                get.await.map(done).map_err(failure)
            }
            Step::Get(key, Consistency::Follower) => {
                let get = self.client.get(
                    keys::data_key(key),
                    Some(GetOptions::new().with_serializable()),
                );
                get.await.map(done).map_err(failure)
            }
            Step::Get(_, Consistency::Lease) => Err("etcd has no leader-lease reads".into()),
            Step::Cas(key) => self.cas(key).await,
            Step::Increment(key) => self.increment(key).await,
            Step::Lock => self.lock_unlock(keys::lock_name(Some(self.task))).await,
            Step::LockShared => self.lock_unlock(keys::lock_name(None)).await,
        }
    }

    async fn close(mut self) {
        if let Some(lease) = self.lease {
            let _ = self.client.lease_revoke(lease).await;
        }
    }
}

impl EtcdWorker {
    /// A txn putting the value if the key's mod_revision is the last one seen, else reading
    /// the key to learn the current one.
    async fn cas(&mut self, key: usize) -> Result<Outcome, Failure> {
        let name = keys::data_key(key);
        let expected = i64::try_from(self.revisions.get(key)).map_err(|error| error.to_string())?;
        let txn = Txn::new()
            .when([Compare::mod_revision(
                name.clone(),
                CompareOp::Equal,
                expected,
            )])
            .and_then([TxnOp::put(
                name.clone(),
                self.value.bytes().into_owned(),
                None,
            )])
            .or_else([TxnOp::get(name, None)]);
        let response = self.client.txn(txn).await.map_err(failure)?;
        if response.succeeded() {
            self.revisions.observe(key, revision_of(&response)?);
            return Ok(Outcome::Done);
        }
        let current = read_in_txn(&response).map_or(0, |kv| kv.mod_revision());
        self.revisions
            .observe(key, u64::try_from(current).unwrap_or(0));
        Ok(Outcome::Conflict)
    }

    /// etcd has no increment: a linearizable get, then a txn writing value + 1 if the key's
    /// mod_revision is unchanged, else reading it again; repeated until it applies.
    async fn increment(&mut self, key: usize) -> Result<Outcome, Failure> {
        let name = keys::counter_key(key);
        let read = self.client.get(name.clone(), None).await.map_err(failure)?;
        let mut current = counter_of(read.kvs().first())?;
        for _ in 0..limits::INCREMENT_ATTEMPTS_MAX {
            let (value, revision) = current;
            let next = value.checked_add(1).ok_or("counter overflow")?;
            let txn = Txn::new()
                .when([Compare::mod_revision(
                    name.clone(),
                    CompareOp::Equal,
                    revision,
                )])
                .and_then([TxnOp::put(name.clone(), next.to_string(), None)])
                .or_else([TxnOp::get(name.clone(), None)]);
            let response = self.client.txn(txn).await.map_err(failure)?;
            if response.succeeded() {
                return Ok(Outcome::Done);
            }
            current = counter_of(read_in_txn(&response).as_ref())?;
        }
        Err(Failure::bench(format!(
            "increment conflicted {} times",
            limits::INCREMENT_ATTEMPTS_MAX
        )))
    }

    /// Lock (waits until granted) and Unlock, on the task's session lease. The lease is
    /// granted before the run with a TTL that outlasts it, which stands in for the keep-alive
    /// stream of etcd's concurrency session (one cheap message per TTL/3, off the hot path).
    async fn lock_unlock(&mut self, name: Vec<u8>) -> Result<Outcome, Failure> {
        let lease = self.lease.ok_or("a lock op without a session lease")?;
        let options = LockOptions::new().with_lease(lease);
        let locked = self
            .client
            .lock(name, Some(options))
            .await
            .map_err(failure)?;
        self.client
            .unlock(locked.key().to_vec())
            .await
            .map_err(failure)?;
        Ok(Outcome::Done)
    }
}

/// An etcd client error, counted by the gRPC code of etcd's answer when it is one. The code
/// is taken by number: etcd-client may build on another tonic than keel-bench's.
fn failure(error: etcd_client::Error) -> Failure {
    match &error {
        etcd_client::Error::GRpcStatus(status) => {
            let code = tonic::Code::from_i32(status.code() as i32);
            Failure::new(code_name(code), error.to_string())
        }
        _ => Failure::new("etcd_client", error.to_string()),
    }
}

fn revision_of(response: &TxnResponse) -> Result<u64, String> {
    let header = response
        .header()
        .ok_or("an etcd response without a header")?;
    u64::try_from(header.revision()).map_err(|error| error.to_string())
}

/// The key the txn's else-branch get read; `None` when absent.
fn read_in_txn(response: &TxnResponse) -> Option<KeyValue> {
    response.op_responses().into_iter().find_map(|op| match op {
        TxnOpResponse::Get(get) => get.kvs().first().cloned(),
        _ => None,
    })
}

/// (value, mod_revision) of a counter key; (0, 0) when absent, as Keel counts it.
fn counter_of(kv: Option<&KeyValue>) -> Result<(i64, i64), String> {
    match kv {
        Some(kv) => Ok((parse_counter(kv.value())?, kv.mod_revision())),
        None => Ok((0, 0)),
    }
}

fn parse_counter(value: &[u8]) -> Result<i64, String> {
    std::str::from_utf8(value)
        .ok()
        .and_then(|text| text.parse().ok())
        .ok_or_else(|| "a counter key holds a non-decimal value".to_string())
}

/// One watch of the data keys through etcd-client (`fanout`).
pub struct EtcdFeed {
    stream: WatchStream,
}

/// Opens `config.watchers` watches of the data keys over `config.connections` clients of
/// their own, from now on.
pub async fn feeds(config: &Config) -> anyhow::Result<Vec<EtcdFeed>> {
    let mut clients = Vec::with_capacity(config.connections);
    for index in 0..config.connections {
        clients.push(connect(&preload::rotate(&config.endpoints, index)).await?);
    }
    let mut feeds = Vec::with_capacity(config.watchers);
    for index in 0..config.watchers {
        let mut client = clients[index % clients.len()].clone();
        let options = WatchOptions::new().with_prefix();
        let stream = client
            .watch(fanout::WATCHED_PREFIX, Some(options))
            .await
            .context("etcd watch")?;
        feeds.push(EtcdFeed { stream });
    }
    Ok(feeds)
}

impl Feed for EtcdFeed {
    async fn next(&mut self) -> Option<Result<Vec<Vec<u8>>, Failure>> {
        let response = match self.stream.message().await {
            Ok(response) => response?,
            Err(error) => return Some(Err(failure(error))),
        };
        let puts = response
            .events()
            .iter()
            .filter(|event| event.event_type() == EventType::Put)
            .filter_map(|event| event.kv());
        Some(Ok(puts.map(|kv| kv.value().to_vec()).collect()))
    }
}
