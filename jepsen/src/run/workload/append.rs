//! The append workload: each key holds a JSON list; an append reads the list and writes it
//! back longer with a cas on the key's revision, retrying on conflict. Reads return the whole
//! list. Knows nothing of faults.

use std::time::Duration;

use keel_client::{Client, PutOptions};
use keel_types::{Condition, Consistency, KvError};
use serde_json::Value;

use crate::history::{Op, OpKind, Status};
use crate::limits;
use crate::run::clock::RunClock;
use crate::run::outcome;
use crate::run::rng::Rng;
use crate::run::workload::register::{decode, encode};
use crate::run::workload::{Clients, Workload, called, returned};

/// Keys in use at once.
pub const KEYS_ACTIVE: usize = 4;
/// Ops per key before it is retired, leaving room for the final reads within the
/// linearizability checker's budget per key (`limits::REGISTER_KEY_OPS_MAX`).
pub const KEY_OPS_MAX: u64 =
    limits::REGISTER_KEY_OPS_MAX as u64 - crate::run::workload::FINAL_READ_ATTEMPTS as u64;
/// Share of reads among ops, per mille; the rest are appends.
pub const READ_PER_MILLE: u64 = 400;
/// Read + cas rounds of one append before it gives up (as a failure: nothing was written).
pub const CAS_ATTEMPTS_MAX: usize = 10;
/// Time one append may spend on its rounds.
pub const APPEND_TIME_MAX: Duration = Duration::from_secs(15);

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
    let op = called(
        who,
        OpKind::Append,
        &pick.key,
        Value::from(pick.value),
        Value::Null,
        clock,
    );
    let status = append(&clients.main, &pick.key, pick.value).await;
    returned(op, status, Value::Null, clock)
}

/// A linearizable read of the whole list (`[]` when the key is absent).
pub(super) async fn read(client: &Client, key: &str, who: u64, clock: &RunClock) -> Op {
    let op = called(who, OpKind::Read, key, Value::Null, Value::Null, clock);
    match client.get(key.as_bytes(), Consistency::Linearizable).await {
        Ok(result) => {
            let output = result
                .kv
                .map_or(Value::Array(Vec::new()), |kv| decode(&kv.value));
            returned(op, Status::Ok, output, clock)
        }
        Err(error) => returned(op, outcome::read_status(&error), Value::Null, clock),
    }
}

/// Appends `value` to `key`'s list: read, then cas on the revision read. Ok when a cas
/// succeeds; fail when every round failed before writing or on its condition; info once a
/// cas may have been applied.
async fn append(client: &Client, key: &str, value: u64) -> Status {
    let deadline = tokio::time::Instant::now() + APPEND_TIME_MAX;
    for _ in 0..CAS_ATTEMPTS_MAX {
        if tokio::time::Instant::now() >= deadline {
            break;
        }
        let (mut list, condition) =
            match client.get(key.as_bytes(), Consistency::Linearizable).await {
                Ok(result) => match result.kv {
                    Some(kv) => match decode(&kv.value) {
                        Value::Array(list) => (list, Condition::Revision(kv.mod_revision)),
                        // Not a list: some other writer; nothing can be appended safely.
                        _ => return Status::Fail,
                    },
                    None => (Vec::new(), Condition::Absent),
                },
                Err(_) => return Status::Fail,
            };
        list.push(Value::from(value));
        let options = PutOptions {
            condition: Some(condition),
            ..PutOptions::default()
        };
        match client
            .put(key.as_bytes(), &encode(&Value::Array(list)), options)
            .await
        {
            Ok(_) => return Status::Ok,
            Err(KvError::ConditionFailed(_)) => continue,
            Err(error) => return outcome::write_status(&error),
        }
    }
    Status::Fail
}
