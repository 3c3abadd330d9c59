//! The register workload: get (linearizable), put and cas on a few keys at a time, values
//! unique per key (decimal integers, recorded as JSON numbers). Knows nothing of faults.

use keel_client::{Client, PutOptions};
use keel_types::{Condition, Consistency};
use serde_json::Value;

use crate::history::{Op, OpKind, Status};
use crate::limits;
use crate::run::clock::RunClock;
use crate::run::outcome;
use crate::run::rng::Rng;
use crate::run::workload::{Clients, Workload, called, returned};

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
        return get(workload, clients.reader(rng), &pick.key, who, clock).await;
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
    let options = PutOptions {
        condition,
        ..PutOptions::default()
    };
    let answer = clients
        .main
        .put(pick.key.as_bytes(), &encode(&value), options)
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
    match client.get(key.as_bytes(), Consistency::Linearizable).await {
        Ok(result) => {
            let output = result.kv.map_or(Value::Null, |kv| decode(&kv.value));
            workload.keys.learn(key, output.clone());
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
