//! The Keel target, through `keel-client` only: connections, preload and one worker per task.
//! Knows nothing of Keel's servers.

use std::sync::Arc;

use anyhow::Context;
use std::time::Duration;

use keel_client::{
    AcquireOptions, BatchOptions, Client, ClientOptions, PutOptions, Watch, WatchOptions,
};
use keel_types::{BatchOp, Condition, KvError, ReadBound};

use crate::config::Config;
use crate::driver::{Outcome, Revisions, Step, Worker, done};
use crate::failure::Failure;
use crate::fanout::{self, Feed, Payload};
use crate::preload;
use crate::{keys, limits};

/// One task's view: a clone of one of the run's clients.
pub struct KeelWorker {
    client: Client,
    value: Payload,
    revisions: Arc<Revisions>,
    task: usize,
    /// The bound of its follower gets (`--max-staleness`).
    bound: ReadBound,
    /// The task's lock options: its own owner (tasks share clients, and an owner acquiring
    /// a lock it holds would get it again), a TTL outlasting the run as etcd's session
    /// lease does, and a wait as long as one op may take.
    lock: AcquireOptions,
}

/// The bound of a run's follower gets.
pub fn read_bound(config: &Config) -> ReadBound {
    ReadBound {
        max_staleness_ms: config
            .max_staleness
            .map(|bound| u64::try_from(bound.as_millis()).unwrap_or(u64::MAX)),
        min_revision: None,
    }
}

/// Connects `config.connections` clients, preloads the keyspace and returns one worker per
/// task, the tasks spread round-robin over the clients.
pub async fn prepare(
    config: &Config,
    revisions: &Arc<Revisions>,
) -> anyhow::Result<Vec<KeelWorker>> {
    let clients = (0..config.connections)
        .map(|index| {
            // Each client tries a different endpoint first, so follower reads spread over
            // the replicas; leader-only requests find the leader either way.
            let endpoints = preload::rotate(&config.endpoints, index);
            Client::new(endpoints, ClientOptions::default()).context("keel endpoints")
        })
        .collect::<anyhow::Result<Vec<Client>>>()?;
    if config.preload {
        preload_keyspace(&clients[0], config, revisions).await?;
    }
    let value = Payload::new(preload::value(config.value_bytes), config.watchers > 0);
    let lock_ttl =
        config.warmup + config.duration + Duration::from_secs(limits::LOCK_LEASE_SLACK_S);
    Ok((0..config.clients)
        .map(|task| {
            let client = clients[task % clients.len()].clone();
            let mut owner = client.owner().to_vec();
            owner.extend_from_slice(format!("/task-{task}").as_bytes());
            KeelWorker {
                client,
                value: value.clone(),
                revisions: revisions.clone(),
                task,
                bound: read_bound(config),
                lock: AcquireOptions {
                    owner: Some(owner),
                    ttl: lock_ttl,
                    wait: limits::OP_TIMEOUT,
                    lock_delay: Duration::ZERO,
                },
            }
        })
        .collect())
}

/// Preloads the keyspace through a keel-client of its own (`--route spread` measures raw
/// calls, but writes the keyspace the same way as `--route leader`).
pub async fn preload(config: &Config, revisions: &Arc<Revisions>) -> anyhow::Result<()> {
    let client = Client::new(config.endpoints.clone(), ClientOptions::default())
        .context("keel endpoints")?;
    preload_keyspace(&client, config, revisions).await
}

async fn preload_keyspace(
    client: &Client,
    config: &Config,
    revisions: &Arc<Revisions>,
) -> anyhow::Result<()> {
    let value = preload::value(config.value_bytes);
    let chunks = preload::chunks(config.keyspace, config.value_bytes);
    preload::run(chunks, |chunk| {
        let (client, value, revisions) = (client.clone(), value.clone(), revisions.clone());
        async move {
            let ops = chunk
                .clone()
                .map(|index| BatchOp::Put {
                    key: keys::data_key(index),
                    value: value.clone(),
                    condition: None,
                    return_previous: false,
                    ttl_ms: None,
                })
                .collect();
            // Atomic per range only: the keyspace may be split into several ranges.
            let result = client
                .batch_non_atomic(ops, BatchOptions::default())
                .await
                .map_err(|error| error.to_string())?;
            for part in result.parts {
                let revision = part.revision.map_err(|error| error.to_string())?;
                for op in part.ops {
                    revisions.observe(chunk.start + op, revision);
                }
            }
            Ok(())
        }
    })
    .await
}

impl Worker for KeelWorker {
    async fn run(&mut self, step: Step) -> Result<Outcome, Failure> {
        let result = match step {
            Step::Put(key) => {
                let key = keys::data_key(key);
                let options = PutOptions::default();
                let value = self.value.bytes();
                self.client.put(&key, &value, options).await.map(done)
            }
            Step::Get(key, consistency) => {
                let key = keys::data_key(key);
                let bound = self.bound;
                let got = self.client.get_within(&key, consistency, bound).await;
                got.map(done)
            }
            Step::Cas(key) => return self.cas(key).await,
            Step::Increment(key) => {
                let key = keys::counter_key(key);
                self.client.increment(&key, 1).await.map(done)
            }
            Step::Lock => return self.lock_release(keys::lock_name(Some(self.task))).await,
            Step::LockShared => return self.lock_release(keys::lock_name(None)).await,
        };
        result.map_err(|error| Failure::from_kv(&error))
    }

    async fn close(self) {}
}

impl KeelWorker {
    /// Acquire (waiting, first come first served, for a held lock) and release.
    async fn lock_release(&self, name: Vec<u8>) -> Result<Outcome, Failure> {
        let acquired = self
            .client
            .acquire(&name, self.lock.clone())
            .await
            .map_err(|error| Failure::from_kv(&error))?;
        let holder = match (acquired.acquired, acquired.holder) {
            (true, Some(holder)) => holder,
            _ => return Err(not_granted(self.lock.wait)),
        };
        self.client
            .release(&name, holder.token)
            .await
            .map_err(|error| Failure::from_kv(&error))?;
        Ok(Outcome::Done)
    }

    /// A put conditioned on the key's last known revision (absent when none is known).
    async fn cas(&self, key: usize) -> Result<Outcome, Failure> {
        let condition = match self.revisions.get(key) {
            0 => Condition::Absent,
            revision => Condition::Revision(revision),
        };
        let options = PutOptions {
            condition: Some(condition),
            ..PutOptions::default()
        };
        match self
            .client
            .put(&keys::data_key(key), &self.value.bytes(), options)
            .await
        {
            Ok(result) => {
                self.revisions.observe(key, result.revision);
                Ok(Outcome::Done)
            }
            Err(KvError::ConditionFailed(failed)) => {
                let current = failed.current.map_or(0, |kv| kv.mod_revision);
                self.revisions.observe(key, current);
                Ok(Outcome::Conflict)
            }
            Err(error) => Err(Failure::from_kv(&error)),
        }
    }
}

/// A lock still held by another task after waiting `wait`.
pub fn not_granted(wait: Duration) -> Failure {
    Failure::bench(format!("lock not granted within {wait:?}"))
}

/// One watch of the data keys through keel-client (`fanout`).
pub struct KeelFeed {
    watch: Watch,
}

/// Opens `config.watchers` watches of the data keys over `config.connections` clients of
/// their own, from now on.
pub async fn feeds(config: &Config) -> anyhow::Result<Vec<KeelFeed>> {
    let clients = (0..config.connections)
        .map(|index| {
            let endpoints = preload::rotate(&config.endpoints, index);
            Client::new(endpoints, ClientOptions::default()).context("keel endpoints")
        })
        .collect::<anyhow::Result<Vec<Client>>>()?;
    let mut feeds = Vec::with_capacity(config.watchers);
    for index in 0..config.watchers {
        let client = &clients[index % clients.len()];
        let (start, end) = (fanout::WATCHED_PREFIX, fanout::WATCHED_END);
        let watch = client
            .watch(start, end, WatchOptions::default())
            .await
            .context("keel watch")?;
        feeds.push(KeelFeed { watch });
    }
    Ok(feeds)
}

impl Feed for KeelFeed {
    async fn next(&mut self) -> Option<Result<Vec<Vec<u8>>, Failure>> {
        let batch = match self.watch.next().await? {
            Ok(batch) => batch,
            Err(error) => return Some(Err(Failure::from_kv(&error))),
        };
        let puts = batch.events.into_iter().filter_map(|event| event.after);
        Some(Ok(puts.map(|kv| kv.value).collect()))
    }
}
