//! The register workload: get (linearizable), put and cas on a few keys at a time, values
//! unique per key (decimal integers, recorded as JSON numbers), through keel-client or raw
//! round robin (`Clients`). Knows nothing of faults.

use keel_client::Client;
use keel_types::{Condition, Consistency, KvError};
use serde_json::Value;

use crate::history::{Op, OpKind, Status};
use crate::limits;
use crate::run::clock::RunClock;
use crate::run::outcome;
use crate::run::rng::Rng;
use crate::run::spread::Read;
use crate::run::workload::{Clients, Workload, called, read, returned};

/// Keys in use at once.
pub const KEYS_ACTIVE: usize = 4;
/// Ops per key before it is retired, leaving room for the final reads within the
/// linearizability checker's budget per key (`limits::REGISTER_KEY_OPS_MAX`).
pub const KEY_OPS_MAX: u64 =
    limits::REGISTER_KEY_OPS_MAX as u64 - crate::run::workload::FINAL_READ_ATTEMPTS as u64;
/// Share of gets and of puts among ops, per mille; the rest are cas.
pub const GET_PER_MILLE: u64 = 500;
pub const PUT_PER_MILLE: u64 = 250;

pub(super) async fn step(
    workload: &Workload,
    clients: &Clients,
    rng: &mut Rng,
    who: u64,
    clock: &RunClock,
) -> Op {
    let pick = workload.keys.pick(rng);
    let roll = rng.below(1000);
    if roll < GET_PER_MILLE {
        let op = called(who, OpKind::Get, &pick.key, Value::Null, Value::Null, clock);
        let answer = clients.linearizable_get(rng, pick.key.as_bytes()).await;
        return got(workload, op, answer, clock);
    }
    let value = Value::from(pick.value);
    let (kind, expect, condition) = match roll < GET_PER_MILLE + PUT_PER_MILLE {
        true => (OpKind::Put, Value::Null, None),
        false => {
            let condition = match &pick.known {
                Value::Null => Condition::Absent,
                known => Condition::Value(encode(known)),
            };
            (OpKind::Cas, pick.known.clone(), Some(condition))
        }
    };
    let op = called(who, kind, &pick.key, value.clone(), expect, clock);
    let answer = clients
        .put(pick.key.as_bytes(), &encode(&value), condition)
        .await;
    let status = match &answer {
        Ok(_) => {
            workload.keys.learn(&pick.key, value);
            Status::Ok
        }
        Err(error) => outcome::write_status(error),
    };
    returned(op, status, Value::Null, clock)
}

/// A linearizable get; the output is the value, or null when the key is absent.
pub(super) async fn get(
    workload: &Workload,
    client: &Client,
    key: &str,
    who: u64,
    clock: &RunClock,
) -> Op {
    let op = called(who, OpKind::Get, key, Value::Null, Value::Null, clock);
    let answer = client.get(key.as_bytes(), Consistency::Linearizable).await;
    got(workload, op, answer.map(read), clock)
}

/// Completes a get with its answer; the value read is what the client knows of the key now.
fn got(workload: &Workload, op: Op, answer: Result<Read, KvError>, clock: &RunClock) -> Op {
    match answer {
        Ok(read) => {
            let output = read.value.map_or(Value::Null, |value| decode(&value));
            workload.keys.learn(&op.key, output.clone());
            returned(op, Status::Ok, output, clock)
        }
        Err(error) => returned(op, outcome::read_status(&error), Value::Null, clock),
    }
}

/// A value as stored: its JSON text (an integer is its decimal digits).
pub fn encode(value: &Value) -> Vec<u8> {
    value.to_string().into_bytes()
}

/// A stored value as recorded: its JSON, or the raw text as a string when it is not JSON.
pub fn decode(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(bytes).into_owned()))
}
