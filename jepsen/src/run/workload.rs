//! The workloads' clients: each runs steps of its workload at its share of the rate until the
//! time limit, through keel-client (`--clients routed`) or, for register and follower-read,
//! as raw calls round robin over the nodes (`--clients spread`, `run::spread`), and records a step's ops in the history as soon as
//! the step completes (a step is one op, or for fencing one hold: acquire, fenced puts,
//! release, and for idempotency one attempt: begin, then complete or abort); then the final
//! reads of every key (idempotency: of every record id). Knows nothing of faults or of node
//! processes: the cluster is a list of endpoints.

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use keel_client::{Client, ClientOptions, GetResult, PutOptions};
use keel_types::{Condition, Consistency, KvError, ReadBound};
use serde_json::{Map, Value};

use crate::history::{Op, OpKind, Status};
use crate::run::clock::RunClock;
#[cfg(feature = "etcd")]
use crate::run::etcd::EtcdSpread;
#[cfg(feature = "etcd")]
use crate::run::net;
use crate::run::outcome;
use crate::run::recorder::Recorder;
use crate::run::rng::Rng;
use crate::run::spread::{ClientMode, Read, Spread};

mod append;
mod counter;
mod fencing;
mod follower_read;
mod idempotency;
mod keys;
mod register;
pub mod watch;

pub use keys::{KeyPool, SHARDS_MAX, split_points};

/// Reads get this long, all attempts included.
pub const READ_TIMEOUT: Duration = Duration::from_secs(5);
/// Writes get this long, all attempts with one request id included.
pub const WRITE_DEADLINE: Duration = Duration::from_secs(10);
/// One attempt of a read or a write.
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(2);
/// Opening a connection.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// Final reads of one key until one succeeds (each attempt is recorded).
pub const FINAL_READ_ATTEMPTS: usize = 5;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkloadKind {
    Register,
    Append,
    Counter,
    FollowerRead,
    Fencing,
    Idempotency,
    Watch,
}

/// A workload's shared state: its keys and what the clients know of them.
#[derive(Debug)]
pub struct Workload {
    pub kind: WorkloadKind,
    pub keys: KeyPool,
    /// Holds (fencing) or attempts (idempotency) begun so far, which numbers each one's
    /// owner.
    pub holds: AtomicU64,
    /// The acknowledged write of each key with the highest revision, and the value it left
    /// (null: a delete): follower-read's bounded reads ask for its revision, watch's reads at
    /// a revision check its value.
    acked: Mutex<HashMap<String, (u64, Value)>>,
}

/// The nodes (by index) that are members of the cluster now. The nemesis changes it when it
/// adds, drains or replaces a node; clients read through members only (a replaced node is
/// gone for good, as a client's configuration would be updated in production).
#[derive(Debug)]
pub struct Members(RwLock<Vec<usize>>);

impl Members {
    /// The first `nodes` nodes.
    pub fn first(nodes: usize) -> Members {
        Members(RwLock::new((0..nodes).collect()))
    }

    pub fn now(&self) -> Vec<usize> {
        self.0.read().expect("members lock poisoned").clone()
    }

    pub fn set(&self, members: &[usize]) {
        *self.0.write().expect("members lock poisoned") = members.to_vec();
    }
}

/// One workload client's connections: `main` knows the first nodes and follows the leader;
/// `nodes[i]` knows node i only (spares included), so reads through it start there, as a
/// client connected to one node would (a node that answers a linearizable read itself stays
/// that client's choice). With `--clients spread` or `--clients etcd`, `raw` sends the ops of
/// the step (not the final reads) instead.
pub struct Clients {
    pub main: Client,
    pub nodes: Vec<Client>,
    pub members: Arc<Members>,
    pub raw: Option<Raw>,
}

/// The raw route of a step's ops: each to the next member node, with no retry.
pub enum Raw {
    /// `--clients spread`: Keel's own API, through keel-proto's generated client.
    Keel(Spread),
    /// `--clients etcd`: etcd's API, through the `etcd-client` crate.
    #[cfg(feature = "etcd")]
    Etcd(EtcdSpread),
}

/// The route of `--clients etcd`: the etcd ports of the nodes of `endpoints`.
#[cfg(feature = "etcd")]
async fn etcd_route(
    endpoints: &[String],
    members: &Arc<Members>,
    first: u64,
) -> anyhow::Result<Raw> {
    let etcd: Vec<String> = endpoints
        .iter()
        .map(|endpoint| net::etcd_endpoint(endpoint))
        .collect::<anyhow::Result<_>>()?;
    Ok(Raw::Etcd(
        EtcdSpread::connect(&etcd, members.clone(), first).await?,
    ))
}

#[cfg(not(feature = "etcd"))]
async fn etcd_route(_: &[String], _: &Arc<Members>, _: u64) -> anyhow::Result<Raw> {
    anyhow::bail!(crate::run::ETCD_NOT_BUILT)
}

impl Raw {
    fn next_node(&self) -> usize {
        match self {
            Raw::Keel(spread) => spread.next_node(),
            #[cfg(feature = "etcd")]
            Raw::Etcd(etcd) => etcd.next_node(),
        }
    }

    async fn put(
        &self,
        key: &[u8],
        value: &[u8],
        condition: Option<Condition>,
    ) -> Result<u64, KvError> {
        let index = self.next_node();
        match self {
            Raw::Keel(spread) => spread.put(index, key, value, condition).await,
            #[cfg(feature = "etcd")]
            Raw::Etcd(etcd) => etcd.put(index, key, value, condition).await,
        }
    }

    async fn delete(&self, key: &[u8]) -> Result<u64, KvError> {
        let index = self.next_node();
        match self {
            Raw::Keel(spread) => spread.delete(index, key).await,
            #[cfg(feature = "etcd")]
            Raw::Etcd(etcd) => etcd.delete(index, key).await,
        }
    }

    /// A get from the next node; the node asked, and the answer. etcd's route reads
    /// linearizably only (`run::validate` keeps it to the register workload).
    async fn get(
        &self,
        key: &[u8],
        consistency: Consistency,
        bound: ReadBound,
    ) -> (usize, Result<Read, KvError>) {
        let index = self.next_node();
        let answer = match self {
            Raw::Keel(spread) => spread.get(index, key, consistency, bound).await,
            #[cfg(feature = "etcd")]
            Raw::Etcd(etcd) => match consistency {
                Consistency::Linearizable => etcd.get(index, key).await,
                _ => Err(KvError::invalid("--clients etcd reads linearizably only")),
            },
        };
        (index, answer)
    }
}

impl Clients {
    /// `endpoints`: every node's, spares included; `main` knows the members' of now.
    pub fn new(endpoints: &[String], members: Arc<Members>) -> anyhow::Result<Clients> {
        Clients::with_raw(endpoints, members, None)
    }

    /// As `new`, with raw round-robin connections too when `mode` is spread or etcd, whose
    /// first turn is `first` (the client's index, so clients start on different nodes).
    pub async fn with_mode(
        endpoints: &[String],
        members: Arc<Members>,
        mode: ClientMode,
        first: u64,
    ) -> anyhow::Result<Clients> {
        let raw = match mode {
            ClientMode::Routed => None,
            ClientMode::Spread => Some(Raw::Keel(Spread::new(endpoints, members.clone(), first)?)),
            ClientMode::Etcd => Some(etcd_route(endpoints, &members, first).await?),
        };
        Clients::with_raw(endpoints, members, raw)
    }

    fn with_raw(
        endpoints: &[String],
        members: Arc<Members>,
        raw: Option<Raw>,
    ) -> anyhow::Result<Clients> {
        let nodes = endpoints
            .iter()
            .map(|endpoint| Client::new(vec![endpoint.clone()], client_options()))
            .collect::<Result<_, _>>()?;
        let first: Vec<String> = members
            .now()
            .iter()
            .map(|index| endpoints[*index].clone())
            .collect();
        Ok(Clients {
            main: Client::new(first, client_options())?,
            nodes,
            members,
            raw,
        })
    }

    /// A put: through `main`, or raw to the next node. The revision written.
    pub async fn put(
        &self,
        key: &[u8],
        value: &[u8],
        condition: Option<Condition>,
    ) -> Result<u64, KvError> {
        match &self.raw {
            Some(raw) => raw.put(key, value, condition).await,
            None => {
                let options = PutOptions {
                    condition,
                    ..PutOptions::default()
                };
                let put = self.main.put(key, value, options).await;
                put.map(|result| result.revision)
            }
        }
    }

    /// A delete: through `main`, or raw to the next node. The revision it took.
    pub async fn delete(&self, key: &[u8]) -> Result<u64, KvError> {
        match &self.raw {
            Some(raw) => raw.delete(key).await,
            None => {
                let deleted = self.main.delete(key, Default::default()).await;
                deleted.map(|deleted| deleted.revision)
            }
        }
    }

    /// A linearizable get: through `reader`, or raw from the next node.
    pub async fn linearizable_get(&self, rng: &mut Rng, key: &[u8]) -> Result<Read, KvError> {
        let consistency = Consistency::Linearizable;
        match &self.raw {
            Some(raw) => raw.get(key, consistency, ReadBound::default()).await.1,
            None => self.reader(rng).get(key, consistency).await.map(read),
        }
    }

    /// A follower get within `bound` from one member: through the client that knows it only
    /// (at random), or raw (the next node). The node asked, and the answer.
    pub async fn follower_get(
        &self,
        rng: &mut Rng,
        key: &[u8],
        bound: ReadBound,
    ) -> (usize, Result<Read, KvError>) {
        let consistency = Consistency::Follower;
        match &self.raw {
            Some(raw) => raw.get(key, consistency, bound).await,
            None => {
                let index = self.member(rng);
                let answer = self.nodes[index].get_within(key, consistency, bound).await;
                (index, answer.map(read))
            }
        }
    }

    /// A member's index, at random (the first node's when none is left).
    pub fn member(&self, rng: &mut Rng) -> usize {
        let members = self.members.now();
        match members.len() {
            0 => 0,
            len => members[rng.below(len as u64) as usize],
        }
    }

    /// The client for one read: `main` or one member's, at random.
    pub fn reader(&self, rng: &mut Rng) -> &Client {
        let members = self.members.now();
        match rng.below(members.len() as u64 + 1) as usize {
            0 => &self.main,
            index => &self.nodes[members[index - 1]],
        }
    }
}

/// How the clients run.
#[derive(Debug, Clone)]
pub struct ClientPlan {
    pub mode: ClientMode,
    pub concurrency: usize,
    pub rate_hz: u32,
    /// Clients start no op after this (time since the run began).
    pub end: Duration,
    /// Ops of all clients together (a step's ops all count).
    pub ops_max: u64,
    pub seed: u64,
}

impl Workload {
    /// The workload's state, its keys named to spread over `ranges` ranges; through etcd's
    /// API (`mode` etcd) they lie under `etcd/` instead, in the one range that holds etcd's
    /// namespace (the keyspace is still split at `families`, so the other ranges exist).
    pub fn new(kind: WorkloadKind, ranges: usize, mode: ClientMode) -> Workload {
        let (prefix, ranges) = match mode {
            ClientMode::Etcd => (kind.etcd_key_prefix(), 1),
            ClientMode::Routed | ClientMode::Spread => (kind.key_prefix(), ranges),
        };
        let keys = match kind {
            WorkloadKind::Register => {
                KeyPool::new(prefix, register::KEYS_ACTIVE, register::KEY_OPS_MAX, ranges)
            }
            WorkloadKind::Append => {
                KeyPool::new(prefix, append::KEYS_ACTIVE, append::KEY_OPS_MAX, ranges)
            }
            WorkloadKind::Counter => KeyPool::new(prefix, counter::KEYS, u64::MAX, ranges),
            WorkloadKind::FollowerRead => KeyPool::new(
                prefix,
                follower_read::KEYS_ACTIVE,
                follower_read::KEY_OPS_MAX,
                ranges,
            ),
            WorkloadKind::Fencing => KeyPool::new(prefix, fencing::LOCKS, u64::MAX, ranges),
            WorkloadKind::Idempotency => KeyPool::new(
                prefix,
                idempotency::IDS_ACTIVE,
                idempotency::ID_ATTEMPTS_MAX,
                ranges,
            ),
            WorkloadKind::Watch => KeyPool::new(prefix, watch::KEYS, u64::MAX, ranges),
        };
        Workload {
            kind,
            keys,
            holds: AtomicU64::new(0),
            acked: Mutex::default(),
        }
    }

    /// A write of `key` that left `value` (null: a delete) was acknowledged at `revision`.
    pub fn acknowledged(&self, key: &str, revision: u64, value: Value) {
        let mut acked = self.acked.lock().expect("acked lock poisoned");
        let highest = acked.entry(key.to_owned()).or_insert((0, Value::Null));
        if revision > highest.0 {
            *highest = (revision, value);
        }
    }

    /// The highest revision an acknowledged write of `key` returned so far.
    pub fn acknowledged_revision(&self, key: &str) -> Option<u64> {
        self.acknowledged_write(key).map(|(revision, _)| revision)
    }

    /// The acknowledged write of `key` with the highest revision so far: that revision and
    /// the value the write left (null: a delete).
    pub fn acknowledged_write(&self, key: &str) -> Option<(u64, Value)> {
        let acked = self.acked.lock().expect("acked lock poisoned");
        acked.get(key).cloned()
    }

    /// The prefixes, in key order, of the keys the workload's requests are routed by: its
    /// keys' prefix, the lock names of fencing, the record keys of idempotency.
    pub fn families(&self) -> Vec<String> {
        let prefix = self.kind.key_prefix();
        match self.kind {
            WorkloadKind::Fencing => vec![prefix.to_string(), fencing::lock_of(prefix)],
            WorkloadKind::Idempotency => {
                vec![String::from_utf8_lossy(&idempotency::routing_key(prefix)).into_owned()]
            }
            _ => vec![prefix.to_string()],
        }
    }

    /// The keys requests are routed by now: of every active key, its own key or record key,
    /// and for fencing its lock's name too.
    pub fn routing_keys(&self) -> Vec<Vec<u8>> {
        let mut keys = Vec::new();
        for key in self.keys.active() {
            match self.kind {
                WorkloadKind::Fencing => {
                    keys.push(fencing::lock_of(&key).into_bytes());
                    keys.push(key.into_bytes());
                }
                WorkloadKind::Idempotency => keys.push(idempotency::routing_key(&key)),
                _ => keys.push(key.into_bytes()),
            }
        }
        keys
    }

    /// One step of client `who`: its ops, done and ready to record, in the order they
    /// completed.
    async fn step(&self, clients: &Clients, rng: &mut Rng, who: u64, clock: &RunClock) -> Vec<Op> {
        let op = match self.kind {
            WorkloadKind::Register => register::step(self, clients, rng, who, clock).await,
            WorkloadKind::Append => append::step(self, clients, rng, who, clock).await,
            WorkloadKind::Counter => counter::step(self, clients, rng, who, clock).await,
            WorkloadKind::FollowerRead => follower_read::step(self, clients, rng, who, clock).await,
            WorkloadKind::Fencing => return fencing::step(self, clients, rng, who, clock).await,
            WorkloadKind::Idempotency => {
                return idempotency::step(self, clients, rng, who, clock).await;
            }
            WorkloadKind::Watch => watch::step(self, clients, rng, who, clock).await,
        };
        vec![op]
    }

    /// A final read of `key`.
    async fn read(&self, client: &Client, key: &str, who: u64, clock: &RunClock) -> Op {
        match self.kind {
            WorkloadKind::Register | WorkloadKind::Watch => {
                register::get(self, client, key, who, clock).await
            }
            WorkloadKind::Append => append::read(client, key, who, clock).await,
            WorkloadKind::Counter => counter::read(client, key, who, clock).await,
            WorkloadKind::FollowerRead | WorkloadKind::Fencing => {
                follower_read::linearizable_get(client, key, who, clock).await
            }
            WorkloadKind::Idempotency => idempotency::get(client, key, who, clock).await,
        }
    }
}

/// A keel-client read as a `Read`.
pub fn read(result: GetResult) -> Read {
    Read {
        value: result.kv.map(|kv| kv.value),
        revision: result.revision,
        served_by: result.served_by,
    }
}

/// The options of every workload client.
pub fn client_options() -> ClientOptions {
    ClientOptions {
        request_timeout: READ_TIMEOUT,
        read_attempt_timeout: ATTEMPT_TIMEOUT,
        write_deadline: WRITE_DEADLINE,
        write_attempt_timeout: ATTEMPT_TIMEOUT,
        connect_timeout: CONNECT_TIMEOUT,
        ..ClientOptions::default()
    }
}

/// Runs `plan.concurrency` clients until the time limit or the op budget; returns the ops
/// recorded. Each client is its own keel-client (own connections and session), like a
/// separate process. A client whose step ends with an indeterminate op takes a new id
/// (+ concurrency), so one id never has two ops open (a step stops at its first
/// indeterminate op).
pub async fn run_clients(
    workload: Arc<Workload>,
    endpoints: &[String],
    members: &Arc<Members>,
    plan: &ClientPlan,
    clock: RunClock,
    history: Arc<Recorder>,
) -> anyhow::Result<u64> {
    let budget = Arc::new(AtomicU64::new(plan.ops_max));
    let root = Rng::new(plan.seed);
    let interval =
        Duration::from_secs_f64(plan.concurrency as f64 / f64::from(plan.rate_hz.max(1)));
    let mut tasks = tokio::task::JoinSet::new();
    for index in 0..plan.concurrency {
        let clients =
            Clients::with_mode(endpoints, members.clone(), plan.mode, index as u64).await?;
        let first = interval.mul_f64(index as f64 / plan.concurrency as f64);
        let loop_ = ClientLoop {
            index: index as u64,
            concurrency: plan.concurrency as u64,
            interval,
            first,
            end: plan.end,
        };
        let state = (workload.clone(), history.clone(), budget.clone());
        tasks.spawn(loop_.run(clients, root.fork(index as u64), clock, state));
    }
    let mut done = 0;
    while let Some(ops) = tasks.join_next().await {
        done += ops?;
    }
    Ok(done)
}

struct ClientLoop {
    index: u64,
    concurrency: u64,
    interval: Duration,
    first: Duration,
    end: Duration,
}

impl ClientLoop {
    async fn run(
        self,
        clients: Clients,
        mut rng: Rng,
        clock: RunClock,
        (workload, history, budget): (Arc<Workload>, Arc<Recorder>, Arc<AtomicU64>),
    ) -> u64 {
        let mut who = self.index;
        let mut next = clock.at(self.first);
        let mut done = 0;
        loop {
            tokio::time::sleep_until(next).await;
            next = (next + self.interval).max(tokio::time::Instant::now());
            if clock.at(self.end) <= tokio::time::Instant::now() {
                return done;
            }
            let taken = budget.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| {
                left.checked_sub(1)
            });
            if taken.is_err() {
                return done;
            }
            let ops = workload.step(&clients, &mut rng, who, &clock).await;
            for op in &ops {
                history.record(op);
            }
            done += ops.len() as u64;
            // The budget was taken for the step's first op; its other ops count too.
            let more = ops.len().saturating_sub(1) as u64;
            let _ = budget.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| {
                Some(left.saturating_sub(more))
            });
            if ops.iter().any(|op| op.status() == Status::Info) {
                who += self.concurrency;
            }
        }
    }
}

/// Reads every key the run touched, retrying a key until a read succeeds (at most
/// `FINAL_READ_ATTEMPTS`); every attempt is recorded. Client ids follow the workload's.
/// follower-read reads on every node too (`follower_read::final_reads`).
pub async fn final_reads(
    workload: &Workload,
    endpoints: &[String],
    members: &Arc<Members>,
    first_client: u64,
    clock: RunClock,
    history: &Recorder,
) -> anyhow::Result<u64> {
    if workload.kind == WorkloadKind::FollowerRead {
        let clients = Clients::new(endpoints, members.clone())?;
        let done =
            follower_read::final_reads(workload, &clients, first_client, &clock, history).await;
        return Ok(done);
    }
    let clients = Clients::new(endpoints, members.clone())?;
    let client = &clients.main;
    let mut done = 0;
    for key in workload.keys.all() {
        for _ in 0..FINAL_READ_ATTEMPTS {
            let op = workload.read(client, &key, first_client, &clock).await;
            history.record(&op);
            done += 1;
            if op.status() == Status::Ok {
                break;
            }
        }
    }
    Ok(done)
}

/// Puts `pick`'s value, unique to its key (through `clients.put`): the `put` op, completed.
/// An acknowledged one carries its revision (`extra.revision`) and is noted as the key's
/// acknowledged write (`Workload::acknowledged`).
pub(super) async fn put_unique(
    workload: &Workload,
    clients: &Clients,
    pick: &keys::Pick,
    who: u64,
    clock: &RunClock,
) -> Op {
    let value = Value::from(pick.value);
    let mut op = called(
        who,
        OpKind::Put,
        &pick.key,
        value.clone(),
        Value::Null,
        clock,
    );
    let answer = clients
        .put(pick.key.as_bytes(), &register::encode(&value), None)
        .await;
    let status = match &answer {
        Ok(revision) => {
            op.extra.insert("revision".into(), Value::from(*revision));
            workload.acknowledged(&pick.key, *revision, value);
            Status::Ok
        }
        Err(error) => outcome::write_status(error),
    };
    returned(op, status, Value::Null, clock)
}

/// A new op record: called now, not yet returned.
pub fn called(
    who: u64,
    kind: OpKind,
    key: &str,
    value: Value,
    expect: Value,
    clock: &RunClock,
) -> Op {
    Op {
        client: who,
        op: kind,
        key: key.to_string(),
        value,
        expect,
        ok: None,
        output: Value::Null,
        call_ns: clock.now_ns(),
        return_ns: None,
        extra: Map::new(),
    }
}

/// Completes `op` with `status` (and `output` for reads) now. An indeterminate op keeps
/// `return: null`.
pub fn returned(mut op: Op, status: Status, output: Value, clock: &RunClock) -> Op {
    op.ok = outcome::ok_field(status);
    op.output = output;
    op.return_ns = match status {
        Status::Info => None,
        Status::Ok | Status::Fail => Some(clock.now_ns().max(op.call_ns)),
    };
    op
}

impl FromStr for WorkloadKind {
    type Err = String;

    fn from_str(name: &str) -> Result<WorkloadKind, String> {
        match name {
            "register" => Ok(WorkloadKind::Register),
            "append" => Ok(WorkloadKind::Append),
            "counter" => Ok(WorkloadKind::Counter),
            "follower-read" => Ok(WorkloadKind::FollowerRead),
            "fencing" => Ok(WorkloadKind::Fencing),
            "idempotency" => Ok(WorkloadKind::Idempotency),
            "watch" => Ok(WorkloadKind::Watch),
            _ => Err(format!(
                "unknown workload {name:?}; known: register, append, counter, follower-read, \
                 fencing, idempotency, watch"
            )),
        }
    }
}

impl WorkloadKind {
    /// The prefix of the workload's key names.
    /// The workload's key prefix under etcd's namespace (`--clients etcd`).
    fn etcd_key_prefix(self) -> &'static str {
        match self {
            WorkloadKind::Register => "etcd/r",
            WorkloadKind::Append => "etcd/a",
            WorkloadKind::Counter => "etcd/c",
            WorkloadKind::FollowerRead => "etcd/f",
            WorkloadKind::Fencing => "etcd/fk",
            WorkloadKind::Idempotency => "etcd/id",
            WorkloadKind::Watch => "etcd/w",
        }
    }

    fn key_prefix(self) -> &'static str {
        match self {
            WorkloadKind::Register => "r",
            WorkloadKind::Append => "a",
            WorkloadKind::Counter => "c",
            WorkloadKind::FollowerRead => "f",
            WorkloadKind::Fencing => "fk",
            WorkloadKind::Idempotency => "id",
            WorkloadKind::Watch => "w",
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            WorkloadKind::Register => "register",
            WorkloadKind::Append => "append",
            WorkloadKind::Counter => "counter",
            WorkloadKind::FollowerRead => "follower-read",
            WorkloadKind::Fencing => "fencing",
            WorkloadKind::Idempotency => "idempotency",
            WorkloadKind::Watch => "watch",
        }
    }
}
