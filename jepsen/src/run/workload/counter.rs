//! The counter workload: increments (`Client::increment`, applied once however often the
//! client retries it) and linearizable reads of a few counters. Knows nothing of faults.

use keel_client::Client;
use keel_types::Consistency;
use serde_json::Value;

use crate::history::{Op, OpKind, Status};
use crate::run::clock::RunClock;
use crate::run::outcome;
use crate::run::rng::Rng;
use crate::run::workload::register::decode;
use crate::run::workload::{Clients, Workload, called, returned};

/// Counters of a run (they are never retired: the counter checker is linear).
pub const KEYS: usize = 3;
/// Share of reads among ops, per mille; the rest are increments.
pub const READ_PER_MILLE: u64 = 400;
/// Increments add 1 to this much.
pub const DELTA_MAX: u64 = 5;

pub(super) async fn step(
    workload: &Workload,
    clients: &Clients,
    rng: &mut Rng,
    who: u64,
    clock: &RunClock,
) -> Op {
    let pick = workload.keys.pick(rng);
    if rng.below(1000) < READ_PER_MILLE {
        return read(clients.reader(rng), &pick.key, who, clock).await;
    }
    let delta = rng.between(1, DELTA_MAX) as i64;
    let op = called(
        who,
        OpKind::Incr,
        &pick.key,
        Value::from(delta),
        Value::Null,
        clock,
    );
    let status = match clients.main.increment(pick.key.as_bytes(), delta).await {
        Ok(_) => Status::Ok,
        Err(error) => outcome::write_status(&error),
    };
    returned(op, status, Value::Null, clock)
}

/// A linearizable read; an absent counter reads 0.
pub(super) async fn read(client: &Client, key: &str, who: u64, clock: &RunClock) -> Op {
    let op = called(who, OpKind::Read, key, Value::Null, Value::Null, clock);
    match client.get(key.as_bytes(), Consistency::Linearizable).await {
        Ok(result) => {
            let output = result.kv.map_or(Value::from(0), |kv| decode(&kv.value));
            returned(op, Status::Ok, output, clock)
        }
        Err(error) => returned(op, outcome::read_status(&error), Value::Null, clock),
    }
}
