//! The clients of `--clients etcd`: each op goes to the next member node round robin, to its
//! etcd API port (`keel serve --etcd-listen`), as one call through the `etcd-client` crate
//! (etcd's own Rust client), with no retry. A put is etcd's `Put`; a cas is a `Txn` whose
//! compare is the condition and whose success branch is the put; a get is a linearizable
//! `Range` of the key. The workload's keys are Keel keys under `etcd/`, so etcd's key is the
//! rest, and the final reads (through keel-client) read the same keys. Failed calls map to
//! the `KvError` keel-client would have returned for them, as `spread` does, so
//! `outcome::write_status` classifies them alike. Built with the `etcd` feature only.

use std::sync::Arc;

use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, GetOptions, Txn, TxnOp, WatchOptions, WatchStream,
};
use keel_client::attempt::{self, AttemptError};
use keel_types::pinned::ETCD_PREFIX;
use keel_types::{Condition, ConditionFailed, KvError};

use crate::run::spread::{Read, Turns, attempt_error};
use crate::run::workload::{ATTEMPT_TIMEOUT, CONNECT_TIMEOUT, Members};

/// The port each node serves etcd's API on, on its own address (namespace runs only).
pub const ETCD_PORT: u16 = 2379;

/// One workload client's etcd connections: one client per node (spares included), each
/// knowing that node only, and its turn in the round robin.
pub struct EtcdSpread {
    nodes: Vec<Client>,
    turns: Turns,
}

impl EtcdSpread {
    /// `endpoints`: every node's etcd address; `first`: the client's first turn.
    pub async fn connect(
        endpoints: &[String],
        members: Arc<Members>,
        first: u64,
    ) -> anyhow::Result<EtcdSpread> {
        let options = ConnectOptions::new().with_connect_timeout(CONNECT_TIMEOUT);
        let mut nodes = Vec::with_capacity(endpoints.len());
        for endpoint in endpoints {
            let url = format!("http://{endpoint}");
            nodes.push(Client::connect([url], Some(options.clone())).await?);
        }
        Ok(EtcdSpread {
            nodes,
            turns: Turns::new(members, first),
        })
    }

    /// The node (by index) the next op goes to.
    pub fn next_node(&self) -> usize {
        self.turns.next_node()
    }

    /// One put of the Keel key `key` to node `index`, as a `Txn` when it has a condition;
    /// the revision it was written at.
    pub async fn put(
        &self,
        index: usize,
        key: &[u8],
        value: &[u8],
        condition: Option<Condition>,
    ) -> Result<u64, KvError> {
        let name = etcd_key(key)?;
        let mut kv = self.nodes[index].kv_client();
        let Some(condition) = condition else {
            let answer = within(kv.put(name, value.to_vec(), None)).await?;
            return Ok(revision(answer.header()));
        };
        let txn = Txn::new()
            .when([compare(name.clone(), &condition)])
            .and_then([TxnOp::put(name, value.to_vec(), None)]);
        let answer = within(kv.txn(txn)).await?;
        match answer.succeeded() {
            true => Ok(revision(answer.header())),
            false => Err(KvError::from(ConditionFailed {
                op_index: 0,
                key: key.to_vec(),
                current: None,
                revision: revision(answer.header()),
            })),
        }
    }

    /// One delete of the Keel key `key` through node `index`; the revision it took.
    pub async fn delete(&self, index: usize, key: &[u8]) -> Result<u64, KvError> {
        let name = etcd_key(key)?;
        let mut kv = self.nodes[index].kv_client();
        let answer = within(kv.delete(name, None)).await?;
        Ok(revision(answer.header()))
    }

    /// One linearizable get of the Keel key `key` from node `index`.
    pub async fn get(&self, index: usize, key: &[u8]) -> Result<Read, KvError> {
        let name = etcd_key(key)?;
        let mut kv = self.nodes[index].kv_client();
        let answer = within(kv.get(name, Some(GetOptions::new()))).await?;
        Ok(Read {
            value: answer.kvs().first().map(|kv| kv.value().to_vec()),
            revision: revision(answer.header()),
            served_by: answer.header().map_or(0, |header| header.member_id()),
        })
    }
}

/// A watch of Keel keys `[start, end)` through etcd's API (the watch workload's watchers
/// with `--clients etcd`), from revision 1, asking for progress every `progress` so that its
/// complete revision moves while nothing changes. As an etcd application must, it watches
/// again from the revision after the last one complete when the server cancels the watch
/// (Keel's etcd API does when the replica serving it stops hearing from the others) or the
/// stream breaks, through any member; a compacted start ends it.
pub struct EtcdWatch {
    client: Client,
    span: (Vec<u8>, Vec<u8>),
    stream: Option<WatchStream>,
    /// Every event below this revision has been received.
    next_revision: i64,
    ticks: tokio::time::Interval,
}

/// Pause before watching again after a canceled or broken watch.
const REWATCH_PAUSE: Duration = Duration::from_millis(200);

/// What one etcd watch response told: its events as `(Keel key, revision, value; None for
/// a delete)`, and the revision the watch is complete at (the header's: the last event's,
/// or the progress reported).
pub struct EtcdWatched {
    pub events: Vec<(Vec<u8>, u64, Option<Vec<u8>>)>,
    pub complete_revision: u64,
}

impl EtcdWatch {
    pub async fn open(
        endpoints: &[String],
        (start, end): (&[u8], &[u8]),
        progress: Duration,
    ) -> Result<EtcdWatch, KvError> {
        let urls: Vec<String> = endpoints.iter().map(|e| format!("http://{e}")).collect();
        let options = ConnectOptions::new().with_connect_timeout(CONNECT_TIMEOUT);
        let client = Client::connect(urls, Some(options)).await;
        let client = client.map_err(|e| KvError::unavailable(e.to_string()))?;
        Ok(EtcdWatch {
            client,
            span: (etcd_key(start)?, etcd_key(end)?),
            stream: None,
            next_revision: 1,
            ticks: tokio::time::interval(progress),
        })
    }

    /// Watches from `next_revision` when there is no stream.
    async fn open_stream(&mut self) {
        while self.stream.is_none() {
            let options = WatchOptions::new()
                .with_range(self.span.1.clone())
                .with_start_revision(self.next_revision)
                .with_progress_notify();
            match self.client.watch(self.span.0.clone(), Some(options)).await {
                Ok(stream) => self.stream = Some(stream),
                Err(_) => tokio::time::sleep(REWATCH_PAUSE).await,
            }
        }
    }

    /// The next response with events or progress. A compacted start ends the watch with an
    /// error; any other cancel or break is followed by a new watch.
    pub async fn next(&mut self) -> Option<Result<EtcdWatched, KvError>> {
        loop {
            self.open_stream().await;
            let stream = self.stream.as_mut().expect("a stream was just opened");
            let message = tokio::select! {
                message = stream.message() => message,
                _ = self.ticks.tick() => {
                    let _ = stream.request_progress().await;
                    continue;
                }
            };
            let response = match message {
                Ok(Some(response)) => response,
                Ok(None) | Err(_) => {
                    self.stream = None;
                    tokio::time::sleep(REWATCH_PAUSE).await;
                    continue;
                }
            };
            if response.compact_revision() > 0 {
                let reason = format!("compacted: {}", response.cancel_reason());
                return Some(Err(KvError::fatal(reason)));
            }
            if response.canceled() {
                self.stream = None;
                tokio::time::sleep(REWATCH_PAUSE).await;
                continue;
            }
            let events = response.events().iter().filter_map(|event| {
                let kv = event.kv()?;
                let key = [ETCD_PREFIX, kv.key()].concat();
                let value = match event.event_type() {
                    etcd_client::EventType::Put => Some(kv.value().to_vec()),
                    etcd_client::EventType::Delete => None,
                };
                Some((key, kv.mod_revision().max(0) as u64, value))
            });
            // A new watch's first answer reports no revision yet.
            if response.created() && response.events().is_empty() {
                continue;
            }
            let complete_revision = revision(response.header());
            self.next_revision = self.next_revision.max(complete_revision as i64 + 1);
            return Some(Ok(EtcdWatched {
                events: events.collect(),
                complete_revision,
            }));
        }
    }
}

/// etcd's name of the Keel key `key`, which the workload keeps under `etcd/`.
fn etcd_key(key: &[u8]) -> Result<Vec<u8>, KvError> {
    key.strip_prefix(ETCD_PREFIX)
        .map(<[u8]>::to_vec)
        .ok_or_else(|| KvError::invalid("an etcd workload key lies under etcd/"))
}

/// etcd's compare for a Keel condition: absent is a create revision of 0 (etcd's absent
/// key), a revision is the mod revision, a value the value.
fn compare(name: Vec<u8>, condition: &Condition) -> Compare {
    match condition {
        Condition::Absent => Compare::create_revision(name, CompareOp::Equal, 0),
        Condition::Revision(revision) => {
            Compare::mod_revision(name, CompareOp::Equal, *revision as i64)
        }
        Condition::Value(value) => Compare::value(name, CompareOp::Equal, value.clone()),
    }
}

fn revision(header: Option<&etcd_client::ResponseHeader>) -> u64 {
    header.map_or(0, |header| header.revision().max(0) as u64)
}

/// The answer of one call within `ATTEMPT_TIMEOUT`, or the error keel-client would return
/// for it: a status as keel-client reads one (the server's error, or what its code or a
/// lost connection says), a timeout, a connection never made (nothing sent); anything else
/// the client library ran into leaves the outcome unknown.
async fn within<T>(
    call: impl Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, KvError> {
    let error = match tokio::time::timeout(ATTEMPT_TIMEOUT, call).await {
        Ok(Ok(answer)) => return Ok(answer),
        Ok(Err(error)) => error,
        Err(_) => {
            let waited = format!("no answer within {} ms", ATTEMPT_TIMEOUT.as_millis());
            return Err(attempt_error(AttemptError::TimedOut(waited)));
        }
    };
    Err(match error {
        etcd_client::Error::GRpcStatus(status) => attempt_error(attempt::from_status(&status)),
        etcd_client::Error::TransportError(error) => {
            attempt_error(AttemptError::NotSent(error.to_string()))
        }
        other => KvError::OutcomeUnknown {
            message: other.to_string(),
        },
    })
}
