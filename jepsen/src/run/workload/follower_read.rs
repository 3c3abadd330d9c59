//! The follower-read workload: linearizable puts of values unique per key, and gets with
//! `Consistency::Follower` through clients that know one node only, recorded as `get` with
//! `"consistency":"follower"` and the serving `"node"`. After the heal, the final reads: per
//! key a linearizable get, then a follower get on every node, in rounds until every node
//! returns what the linearizable get did (all marked `"final":true`). The puts and gets of the
//! steps go through keel-client or raw round robin (`Clients`); the final reads always through
//! keel-client. Knows nothing of faults.

use std::time::Duration;

use keel_client::Client;
use keel_types::{Consistency, KvError, ReadBound};
use serde_json::Value;

use crate::history::{Op, OpKind, Status};
use crate::run::clock::RunClock;
use crate::run::outcome;
use crate::run::recorder::Recorder;
use crate::run::rng::Rng;
use crate::run::spread::Read;
use crate::run::workload::register::decode;
use crate::run::workload::{Clients, Workload, called, put_unique, read, returned};

/// Keys in use at once.
pub const KEYS_ACTIVE: usize = 4;
/// Ops per key before it is retired (the checker is O(n log n); this bounds the final reads).
pub const KEY_OPS_MAX: u64 = 500;
/// Share of follower gets among ops, per mille; the rest are puts.
pub const GET_PER_MILLE: u64 = 500;
/// Share of follower gets with a bound, per mille: a third at the highest revision a put of
/// the key was acknowledged at so far (`min_revision`), a third within a staleness bound, a
/// third both.
pub const BOUNDED_PER_MILLE: u64 = 500;
/// The staleness bounds bounded gets pick from.
pub const STALENESS_MS: [u64; 3] = [0, 100, 1_000];
/// Rounds of final reads of one key at most, and the pause between two.
pub const FINAL_ROUNDS_MAX: usize = 10;
pub const FINAL_ROUND_PAUSE: Duration = Duration::from_millis(500);

pub(super) async fn step(
    workload: &Workload,
    clients: &Clients,
    rng: &mut Rng,
    who: u64,
    clock: &RunClock,
) -> Op {
    let pick = workload.keys.pick(rng);
    if rng.below(1000) < GET_PER_MILLE {
        let bound = pick_bound(workload, rng, &pick.key);
        let mut op = called(who, OpKind::Get, &pick.key, Value::Null, Value::Null, clock);
        if let Some(revision) = bound.min_revision {
            op.extra
                .insert("min_revision".into(), Value::from(revision));
        }
        if let Some(ms) = bound.max_staleness_ms {
            op.extra.insert("max_staleness_ms".into(), Value::from(ms));
        }
        let (index, answer) = clients.follower_get(rng, pick.key.as_bytes(), bound).await;
        return follower_got(op, index, answer, clock);
    }
    put_unique(workload, clients, &pick, who, clock).await
}

/// The bound of a follower get of `key`, if it gets one (`BOUNDED_PER_MILLE`).
fn pick_bound(workload: &Workload, rng: &mut Rng, key: &str) -> ReadBound {
    if rng.below(1000) >= BOUNDED_PER_MILLE {
        return ReadBound::default();
    }
    let kind = rng.below(3);
    let staleness = STALENESS_MS[rng.below(STALENESS_MS.len() as u64) as usize];
    let (revision, max_staleness_ms) = match kind {
        0 => (true, None),
        1 => (false, Some(staleness)),
        _ => (true, Some(staleness)),
    };
    ReadBound {
        max_staleness_ms,
        min_revision: revision
            .then(|| workload.acknowledged_revision(key))
            .flatten(),
    }
}

/// A follower get through `client`, which knows node `index` only. `node` is the node that
/// served it, or the node asked when it failed.
pub(super) async fn follower_get(
    client: &Client,
    index: usize,
    key: &str,
    who: u64,
    clock: &RunClock,
) -> Op {
    let op = called(who, OpKind::Get, key, Value::Null, Value::Null, clock);
    let answer = client.get(key.as_bytes(), Consistency::Follower).await;
    follower_got(op, index, answer.map(read), clock)
}

/// Completes a follower get of node `index` (asked) with its answer.
fn follower_got(mut op: Op, index: usize, answer: Result<Read, KvError>, clock: &RunClock) -> Op {
    op.extra.insert("consistency".into(), "follower".into());
    let mut node = index as u64 + 1;
    let op = match answer {
        Ok(read) => {
            node = read.served_by;
            let output = read.value.map_or(Value::Null, |value| decode(&value));
            op.extra
                .insert("revision".into(), Value::from(read.revision));
            returned(op, Status::Ok, output, clock)
        }
        Err(error) => returned(op, outcome::read_status(&error), Value::Null, clock),
    };
    with_field(op, "node", Value::from(node))
}

/// A linearizable get.
pub(super) async fn linearizable_get(client: &Client, key: &str, who: u64, clock: &RunClock) -> Op {
    let op = called(who, OpKind::Get, key, Value::Null, Value::Null, clock);
    match client.get(key.as_bytes(), Consistency::Linearizable).await {
        Ok(result) => {
            let output = result.kv.map_or(Value::Null, |kv| decode(&kv.value));
            returned(op, Status::Ok, output, clock)
        }
        Err(error) => returned(op, outcome::read_status(&error), Value::Null, clock),
    }
}

/// The final reads of every key (see the module's docs); every attempt is recorded.
pub(super) async fn final_reads(
    workload: &Workload,
    clients: &Clients,
    who: u64,
    clock: &RunClock,
    history: &Recorder,
) -> u64 {
    let mut done = 0;
    for key in workload.keys.all() {
        for round in 0..FINAL_ROUNDS_MAX {
            if round > 0 {
                tokio::time::sleep(FINAL_ROUND_PAUSE).await;
            }
            let truth = linearizable_get(&clients.main, &key, who, clock).await;
            let truth = with_field(truth, "final", Value::Bool(true));
            history.record(&truth);
            done += 1;
            let mut converged = truth.status() == Status::Ok;
            for index in clients.members.now() {
                let read = follower_get(&clients.nodes[index], index, &key, who, clock).await;
                let read = with_field(read, "final", Value::Bool(true));
                history.record(&read);
                done += 1;
                converged &= read.status() == Status::Ok && read.output == truth.output;
            }
            if converged {
                break;
            }
        }
    }
    done
}

fn with_field(mut op: Op, name: &str, value: Value) -> Op {
    op.extra.insert(name.into(), value);
    op
}
