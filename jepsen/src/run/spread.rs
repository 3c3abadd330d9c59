//! The clients of `--clients spread`: as a generic gRPC client or a load balancer reaches
//! Keel, each op goes to the next member node round robin as one raw call through
//! keel-proto's generated client, with `no_forward: false` (the node forwards to the range's
//! leader), no retry and no request id. A failed call is mapped to the `KvError` keel-client
//! would have returned for it, so `outcome::write_status` classifies both kinds of client
//! alike. Knows nothing of workloads or faults.

use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::Context;
use keel_client::attempt::{self, AttemptError};
use keel_proto::v1;
use keel_proto::v1::kv_client::KvClient;
use keel_types::{Condition, Consistency, KvError, ReadBound};
use tonic::transport::{Channel, Endpoint};

use crate::run::workload::{ATTEMPT_TIMEOUT, CONNECT_TIMEOUT, Members};

/// How the workload clients reach the cluster (`--clients`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientMode {
    /// keel-client: to each range's leader, with retries under one request id.
    Routed,
    /// Raw calls round robin over the members; the servers forward.
    Spread,
    /// etcd's API round robin over the members' etcd ports, through `etcd-client`
    /// (`run::etcd`; the `etcd` feature).
    Etcd,
}

/// A successful read, whichever client made it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Read {
    /// `None` when the key is absent.
    pub value: Option<Vec<u8>>,
    pub revision: u64,
    /// The node that served it.
    pub served_by: u64,
}

/// One raw client's turn in the round robin over the members.
pub struct Turns {
    members: Arc<Members>,
    turn: AtomicU64,
}

impl Turns {
    /// `first`: the client's first turn, so that clients start on different nodes.
    pub fn new(members: Arc<Members>, first: u64) -> Turns {
        Turns {
            members,
            turn: AtomicU64::new(first),
        }
    }

    /// The node (by index) the next op goes to.
    pub fn next_node(&self) -> usize {
        let turn = self.turn.fetch_add(1, Ordering::Relaxed);
        round_robin(&self.members.now(), turn)
    }
}

/// One workload client's raw connections: a lazy channel to every node (spares included),
/// and its turns.
pub struct Spread {
    nodes: Vec<KvClient<Channel>>,
    turns: Turns,
}

impl Spread {
    /// `first`: the client's first turn, so that clients start on different nodes.
    pub fn new(endpoints: &[String], members: Arc<Members>, first: u64) -> anyhow::Result<Spread> {
        let nodes = endpoints
            .iter()
            .map(|endpoint| {
                let channel = Endpoint::from_shared(format!("http://{endpoint}"))
                    .with_context(|| format!("endpoint {endpoint:?}"))?
                    .connect_timeout(CONNECT_TIMEOUT)
                    .connect_lazy();
                Ok(KvClient::new(channel))
            })
            .collect::<anyhow::Result<_>>()?;
        Ok(Spread {
            nodes,
            turns: Turns::new(members, first),
        })
    }

    /// The node (by index) the next op goes to.
    pub fn next_node(&self) -> usize {
        self.turns.next_node()
    }

    /// One put to node `index`; the revision it was written at.
    pub async fn put(
        &self,
        index: usize,
        key: &[u8],
        value: &[u8],
        condition: Option<Condition>,
    ) -> Result<u64, KvError> {
        let request = v1::PutRequest {
            key: key.to_vec(),
            value: value.to_vec(),
            condition: condition.map(v1::Condition::from),
            return_previous: false,
            no_forward: false,
            ttl_ms: None,
            request_id: None,
            fence: None,
        };
        let mut node = self.nodes[index].clone();
        let answer = tokio::time::timeout(ATTEMPT_TIMEOUT, node.put(request)).await;
        let answer = one_attempt(answer)?;
        Ok(answer.header.map_or(0, |header| header.revision))
    }

    /// One delete to node `index`; the revision it took.
    pub async fn delete(&self, index: usize, key: &[u8]) -> Result<u64, KvError> {
        let request = v1::DeleteRequest {
            key: key.to_vec(),
            ..v1::DeleteRequest::default()
        };
        let mut node = self.nodes[index].clone();
        let answer = tokio::time::timeout(ATTEMPT_TIMEOUT, node.delete(request)).await;
        let answer = one_attempt(answer)?;
        Ok(answer.header.map_or(0, |header| header.revision))
    }

    /// One get from node `index`.
    pub async fn get(
        &self,
        index: usize,
        key: &[u8],
        consistency: Consistency,
        bound: ReadBound,
    ) -> Result<Read, KvError> {
        let max_staleness_ms = bound
            .max_staleness_ms
            .map(|ms| ms.min(i64::MAX as u64) as i64);
        let request = v1::GetRequest {
            key: key.to_vec(),
            consistency: v1::Consistency::from(consistency).into(),
            no_forward: false,
            max_staleness_ms,
            min_revision: bound.min_revision,
            revision: None,
        };
        let mut node = self.nodes[index].clone();
        let answer = tokio::time::timeout(ATTEMPT_TIMEOUT, node.get(request)).await;
        let answer = one_attempt(answer)?;
        let header = answer.header.unwrap_or_default();
        Ok(Read {
            value: answer.kv.map(|kv| kv.value),
            revision: header.revision,
            served_by: header.served_by,
        })
    }
}

/// The member whose turn it is (the first node's when none is left).
pub fn round_robin(members: &[usize], turn: u64) -> usize {
    match members.len() {
        0 => 0,
        len => members[(turn % len as u64) as usize],
    }
}

/// The error keel-client would return for this one failed attempt, had it stopped there:
/// the server's own error; could not connect = not applied (`Unavailable`); the connection
/// lost after sending = `OutcomeUnknown`; no answer in time = `Timeout`.
pub fn attempt_error(error: AttemptError) -> KvError {
    match error {
        AttemptError::Server(error) => error,
        AttemptError::NotSent(message) => {
            KvError::unavailable(format!("could not connect: {message}; nothing was sent"))
        }
        AttemptError::Lost(message) => KvError::OutcomeUnknown {
            message: format!("connection lost after sending: {message}"),
        },
        AttemptError::TimedOut(message) | AttemptError::Superseded { message, .. } => {
            KvError::Timeout { message }
        }
    }
}

/// The answer of one call within `ATTEMPT_TIMEOUT`, or the error it stands for.
fn one_attempt<T>(
    answer: Result<Result<tonic::Response<T>, tonic::Status>, tokio::time::error::Elapsed>,
) -> Result<T, KvError> {
    match answer {
        Ok(Ok(response)) => Ok(response.into_inner()),
        Ok(Err(status)) => Err(attempt_error(attempt::from_status(&status))),
        Err(_) => Err(attempt_error(AttemptError::TimedOut(format!(
            "no answer within {} ms",
            ATTEMPT_TIMEOUT.as_millis()
        )))),
    }
}

impl ClientMode {
    pub fn as_str(self) -> &'static str {
        match self {
            ClientMode::Routed => "routed",
            ClientMode::Spread => "spread",
            ClientMode::Etcd => "etcd",
        }
    }
}

impl FromStr for ClientMode {
    type Err = String;

    fn from_str(name: &str) -> Result<ClientMode, String> {
        match name {
            "routed" => Ok(ClientMode::Routed),
            "spread" => Ok(ClientMode::Spread),
            "etcd" => Ok(ClientMode::Etcd),
            _ => Err(format!(
                "unknown client mode {name:?}; known: routed, spread, etcd"
            )),
        }
    }
}

#[cfg(test)]
mod tests;
