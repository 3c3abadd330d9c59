//! The watch workload: clients put unique values to a few keys, delete them now and then
//! (through keel-client or raw round robin, as register does) and now and then read a key at
//! the revision of its last acknowledged write (`read-at`: a follower read through
//! keel-client, which must give the value that write left), while `WATCHERS` keel-client
//! watches of the workload's whole keyspace, opened from its first revision when the run
//! begins, record every batch they receive as a `watch` op (`output`: the events as
//! `[key, revision, value or null]`). After the faults healed the watchers drain: each goes
//! on until its watch reported every key complete at or past the highest revision an
//! acknowledged write of the key returned, or `DRAIN_TIME_MAX` passed, and records how it
//! ended (`watch-end`). Knows nothing of faults.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use keel_client::{Client, WatchOptions};
use keel_types::{Consistency, KvError};
use serde_json::{Value, json};
use tokio::task::JoinHandle;

use crate::history::{Op, OpKind, Status};
use crate::run::clock::RunClock;
#[cfg(feature = "etcd")]
use crate::run::etcd::EtcdWatch;
use crate::run::outcome;
use crate::run::recorder::Recorder;
use crate::run::rng::Rng;
use crate::run::spread::ClientMode;
use crate::run::workload::register::decode;
use crate::run::workload::{Clients, Workload, called, client_options, put_unique, returned};

/// Keys in use; none retires (the watch checker has no per-key search to bound).
pub const KEYS: usize = 8;
/// Share of deletes among the ops, per mille; the rest are puts, and reads at a revision.
pub const DELETE_PER_MILLE: u64 = 100;
/// Share of reads at the revision of a key's last acknowledged write, per mille.
pub const READ_AT_PER_MILLE: u64 = 100;
/// Watches running side by side, each its own client.
pub const WATCHERS: u64 = 2;
/// Longest a watcher drains after the run before it gives up.
pub const DRAIN_TIME_MAX: Duration = Duration::from_secs(30);
/// How often a watcher's streams report progress while nothing changes.
const PROGRESS_INTERVAL: Duration = Duration::from_millis(200);
/// The span every watcher watches: the workload's keys (prefix "w"; "etcd/w" through etcd's
/// API).
const SPAN: (&[u8], &[u8]) = (b"w", b"x");
#[cfg(feature = "etcd")]
const ETCD_SPAN: (&[u8], &[u8]) = (b"etcd/w", b"etcd/x");

pub(super) async fn step(
    workload: &Workload,
    clients: &Clients,
    rng: &mut Rng,
    who: u64,
    clock: &RunClock,
) -> Op {
    let pick = workload.keys.pick(rng);
    let roll = rng.below(1000);
    if roll < READ_AT_PER_MILLE
        && let Some((revision, expected)) = workload.acknowledged_write(&pick.key)
    {
        return read_at(clients, (&pick.key, revision, expected), who, clock).await;
    }
    if roll < READ_AT_PER_MILLE + DELETE_PER_MILLE {
        let op = called(who, OpKind::Del, &pick.key, Value::Null, Value::Null, clock);
        let answer = clients.delete(pick.key.as_bytes()).await;
        return deleted(workload, op, answer, clock);
    }
    put_unique(workload, clients, &pick, who, clock).await
}

/// A follower read of `key` at the revision of its last acknowledged write, which must give
/// the value that write left (`expected`; null: a delete): a `read-at` op (`extra.revision`,
/// `output`: the value read, null when absent).
async fn read_at(
    clients: &Clients,
    (key, revision, expected): (&str, u64, Value),
    who: u64,
    clock: &RunClock,
) -> Op {
    let mut op = called(
        who,
        OpKind::Other("read-at".into()),
        key,
        Value::Null,
        expected,
        clock,
    );
    op.extra.insert("revision".into(), Value::from(revision));
    let answer = clients
        .main
        .get_at(key.as_bytes(), revision, Consistency::Follower)
        .await;
    match answer {
        Ok(read) => {
            let value = read.kv.map_or(Value::Null, |kv| decode(&kv.value));
            returned(op, Status::Ok, value, clock)
        }
        Err(_) => returned(op, Status::Fail, Value::Null, clock),
    }
}

/// Completes a delete with its answer; an acknowledged one is what the watchers must see.
fn deleted(workload: &Workload, op: Op, answer: Result<u64, KvError>, clock: &RunClock) -> Op {
    match answer {
        Ok(revision) => {
            workload.acknowledged(&op.key, revision, op.value.clone());
            returned(op, Status::Ok, Value::Null, clock)
        }
        Err(error) => returned(op, outcome::write_status(&error), Value::Null, clock),
    }
}

/// The running watchers of a run.
pub struct Watchers {
    tasks: Vec<JoinHandle<Watcher>>,
    stop: tokio::sync::watch::Sender<bool>,
}

/// Where a watcher's batches come from: keel-client's watch, or etcd's through `etcd-client`
/// (`--clients etcd`).
enum Source {
    Keel(keel_client::Watch),
    /// Boxed: etcd-client's client is large.
    #[cfg(feature = "etcd")]
    Etcd(Box<EtcdWatch>),
}

/// One batch received, whichever watch it came from: the part of the span it reports on, the
/// revision that part is complete at, its events as `[key, revision, value or null]`, and
/// the range that sent it (0 through etcd's API, whose namespace is one range).
struct Received {
    start: Vec<u8>,
    end: Vec<u8>,
    complete_revision: u64,
    events: Vec<Value>,
    range: u64,
}

impl Source {
    /// Opens a watch of the workload's keys from revision 1, through keel-client (`client`)
    /// or, with `--clients etcd`, through the members' etcd ports.
    async fn open(
        client: &Client,
        mode: ClientMode,
        endpoints: &[String],
    ) -> Result<Source, KvError> {
        if mode != ClientMode::Etcd {
            let options = WatchOptions {
                start_revision: 1,
                progress_interval: Some(PROGRESS_INTERVAL),
                ..WatchOptions::default()
            };
            return client
                .watch(SPAN.0, SPAN.1, options)
                .await
                .map(Source::Keel);
        }
        Source::open_etcd(endpoints).await
    }

    #[cfg(feature = "etcd")]
    async fn open_etcd(endpoints: &[String]) -> Result<Source, KvError> {
        let etcd = endpoints
            .iter()
            .map(|endpoint| crate::run::net::etcd_endpoint(endpoint))
            .collect::<anyhow::Result<Vec<_>>>()
            .map_err(|e| KvError::invalid(e.to_string()))?;
        let watch = EtcdWatch::open(&etcd, ETCD_SPAN, PROGRESS_INTERVAL).await?;
        Ok(Source::Etcd(Box::new(watch)))
    }

    #[cfg(not(feature = "etcd"))]
    async fn open_etcd(_: &[String]) -> Result<Source, KvError> {
        Err(KvError::invalid(crate::run::ETCD_NOT_BUILT))
    }

    async fn next(&mut self) -> Option<Result<Received, KvError>> {
        match self {
            Source::Keel(watch) => {
                let batch = watch.next().await?;
                Some(batch.map(|batch| {
                    Received {
                        events: batch
                            .events
                            .iter()
                            .map(|event| {
                                let value = event.after.as_ref().map(|kv| kv.value.as_slice());
                                event_json(&event.key, event.revision, value)
                            })
                            .collect(),
                        start: batch.start,
                        end: batch.end,
                        complete_revision: batch.complete_revision,
                        range: batch.range_id.0,
                    }
                }))
            }
            #[cfg(feature = "etcd")]
            Source::Etcd(watch) => {
                let watched = watch.next().await?;
                Some(watched.map(|watched| {
                    Received {
                        events: watched
                            .events
                            .iter()
                            .map(|(key, revision, value)| {
                                event_json(key, *revision, value.as_deref())
                            })
                            .collect(),
                        start: ETCD_SPAN.0.to_vec(),
                        end: ETCD_SPAN.1.to_vec(),
                        complete_revision: watched.complete_revision,
                        range: 0,
                    }
                }))
            }
        }
    }
}

/// An event as a watch op records it: `[key, revision, value or null]`.
fn event_json(key: &[u8], revision: u64, value: Option<&[u8]>) -> Value {
    let key = String::from_utf8_lossy(key).into_owned();
    json!([key, revision, value.map_or(Value::Null, decode)])
}

/// One watcher's client, watch and what it saw.
struct Watcher {
    who: u64,
    watch: Result<Source, KvError>,
    /// How far each part of the span its watch reported complete: start → (end, complete
    /// revision). A part's report stays true after a split cut it (its revisions carry on in
    /// both halves).
    complete: BTreeMap<Vec<u8>, (Vec<u8>, u64)>,
}

/// Opens the watchers (client ids from `first_client`), each receiving and recording until
/// `finish` tells it to drain.
pub fn start(
    endpoints: &[String],
    mode: ClientMode,
    first_client: u64,
    clock: RunClock,
    history: Arc<Recorder>,
) -> anyhow::Result<Watchers> {
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut tasks = Vec::new();
    for index in 0..WATCHERS {
        let client = Client::new(endpoints.to_vec(), client_options())?;
        let who = first_client + index;
        let mut stopped = stopped.clone();
        let history = history.clone();
        let endpoints = endpoints.to_vec();
        tasks.push(tokio::spawn(async move {
            let mut watcher = Watcher {
                who,
                watch: Source::open(&client, mode, &endpoints).await,
                complete: BTreeMap::new(),
            };
            loop {
                tokio::select! {
                    received = watcher.receive(&clock, &history) => {
                        if !received {
                            return watcher;
                        }
                    }
                    _ = stopped.wait_for(|stop| *stop) => return watcher,
                }
            }
        }));
    }
    Ok(Watchers { tasks, stop })
}

impl Watcher {
    /// Receives and records one batch; false once the watch ended (recorded).
    async fn receive(&mut self, clock: &RunClock, history: &Recorder) -> bool {
        let watch = match &mut self.watch {
            Ok(watch) => watch,
            Err(_) => return false,
        };
        let batch = watch.next().await;
        match batch {
            Some(Ok(batch)) => {
                let end = (batch.end.clone(), batch.complete_revision);
                self.complete.insert(batch.start.clone(), end);
                if !batch.events.is_empty() {
                    history.record(&self.op(batch, clock));
                }
                true
            }
            Some(Err(error)) => {
                self.watch = Err(error);
                false
            }
            None => {
                self.watch = Err(KvError::fatal("the watch ended without an error"));
                false
            }
        }
    }

    /// A batch as a `watch` op.
    fn op(&self, batch: Received, clock: &RunClock) -> Op {
        let op = called(
            self.who,
            OpKind::Other("watch".into()),
            "",
            Value::Null,
            Value::Null,
            clock,
        );
        let mut op = returned(op, Status::Ok, Value::Array(batch.events), clock);
        op.extra.insert("range".into(), Value::from(batch.range));
        op
    }

    /// Whether its watch reported every key complete at or past the revision of the key's
    /// last acknowledged write.
    fn caught_up(&self, workload: &Workload) -> bool {
        workload.keys.all().iter().all(|key| {
            workload.acknowledged_revision(key).is_none_or(|acked| {
                let key = key.as_bytes();
                let covers = |end: &[u8]| end.is_empty() || key < end;
                self.complete
                    .range(..=key.to_vec())
                    .any(|(_, (end, complete))| covers(end) && *complete >= acked)
            })
        })
    }
}

impl Watchers {
    /// Drains every watcher (until caught up with the acknowledged writes, its watch ends or
    /// `DRAIN_TIME_MAX`), and records how each ended as a `watch-end` op (`output`:
    /// `caught-up`, `timeout`, or the error). The ops recorded.
    pub async fn finish(self, workload: &Workload, clock: RunClock, history: &Recorder) -> u64 {
        let _ = self.stop.send(true);
        let mut done = 0;
        for task in self.tasks {
            let Ok(mut watcher) = task.await else {
                continue;
            };
            let deadline = tokio::time::Instant::now() + DRAIN_TIME_MAX;
            let end = loop {
                if watcher.caught_up(workload) {
                    break Value::from("caught-up");
                }
                let received = tokio::time::timeout_at(deadline, watcher.receive(&clock, history));
                match received.await {
                    Err(_) => break Value::from("timeout"),
                    Ok(true) => continue,
                    Ok(false) => match &watcher.watch {
                        Err(error) => break Value::from(error.to_string()),
                        Ok(_) => break Value::from("ended"),
                    },
                }
            };
            let op = called(
                watcher.who,
                OpKind::Other("watch-end".into()),
                "",
                Value::Null,
                Value::Null,
                &clock,
            );
            history.record(&returned(op, Status::Ok, end, &clock));
            done += 1;
        }
        done
    }
}
