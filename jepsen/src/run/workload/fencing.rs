//! The fencing workload (DESIGN §7 "lock + fenced writes"): a few locks, each guarding one
//! key (lock `lock-fkN` guards key `fkN`). A client's step is one hold: acquire a random lock
//! through `Client::acquire` (an owner unique to the hold, `c<client>-h<n>`; TTL 1–3 s;
//! waiting up to 2 s), then 1–3 puts of its key fenced by the token (values
//! `<owner>-t<token>-n<i>`, unique per key), then a release. No renewals: a hold lasts its
//! TTL. One hold in five sleeps past its TTL (counted from the acquire's return) before its
//! last put, as a paused holder would: if another holder has written since, that put must be
//! refused with `FencedOut`. A hold ends at its first indeterminate op (its lock then
//! expires), so one client id never has two ops open.
//!
//! Records `acquire` and `release` (`key` = the lock) and `fput`, with the fields `lock`,
//! `token` (null when not granted), `owner`, and `ttl_ms` and `wait_ms` (acquire), `late`
//! (fput), `revision` (ok fput), `successor_token` (release), and `error` for ops that did not
//! succeed (`busy` for a lock not granted within the wait). The final reads are linearizable
//! `get`s. Knows nothing of faults.

use std::sync::atomic::Ordering;
use std::time::Duration;

use keel_client::{AcquireOptions, Client, PutOptions};
use keel_types::Fence;
use serde_json::Value;
use tokio::time::Instant;

use crate::history::{Op, OpKind, Status};
use crate::run::clock::RunClock;
use crate::run::outcome;
use crate::run::rng::Rng;
use crate::run::workload::register::encode;
use crate::run::workload::{Clients, Workload, called, returned};

/// Locks of a run, each guarding one key (never retired: the checker is O(n log n)).
pub const LOCKS: usize = 3;
/// TTL of a hold, drawn in this range.
pub const TTL_MS_MIN: u64 = 1_000;
pub const TTL_MS_MAX: u64 = 3_000;
/// How long an acquire waits for a held lock.
pub const WAIT: Duration = Duration::from_secs(2);
/// Fenced puts per hold, 1 to this.
pub const PUTS_MAX: u64 = 3;
/// Pause between two puts of a hold, 0 to this.
pub const PUT_GAP_MS_MAX: u64 = 50;
/// Share of holds whose last put comes after the TTL, per mille, and how long after.
pub const LATE_PER_MILLE: u64 = 200;
pub const LATE_MS_MIN: u64 = 100;
pub const LATE_MS_MAX: u64 = 500;

/// The lock guarding `key`.
pub fn lock_of(key: &str) -> String {
    format!("lock-{key}")
}

/// The value of the `n`-th put of a hold: unique per key, since owners are unique.
pub fn value_of(owner: &str, token: u64, n: u64) -> String {
    format!("{owner}-t{token}-n{n}")
}

/// One hold as planned: which lock and key, for whom, how long, what it writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hold {
    pub key: String,
    pub lock: String,
    pub owner: String,
    pub ttl_ms: u64,
    pub puts: u64,
    /// Set: the last put comes this long after the TTL ran out.
    pub late_ms: Option<u64>,
}

impl Hold {
    /// Draws the hold number `number` of client `who` on a random lock.
    pub fn draw(workload: &Workload, rng: &mut Rng, who: u64, number: u64) -> Hold {
        let key = workload.keys.pick(rng).key;
        Hold {
            lock: lock_of(&key),
            key,
            owner: format!("c{who}-h{number}"),
            ttl_ms: rng.between(TTL_MS_MIN, TTL_MS_MAX),
            puts: rng.between(1, PUTS_MAX),
            late_ms: rng
                .chance(LATE_PER_MILLE)
                .then(|| rng.between(LATE_MS_MIN, LATE_MS_MAX)),
        }
    }
}

/// One hold, from acquire to release; returns its ops in the order they completed.
pub(super) async fn step(
    workload: &Workload,
    clients: &Clients,
    rng: &mut Rng,
    who: u64,
    clock: &RunClock,
) -> Vec<Op> {
    let number = workload.holds.fetch_add(1, Ordering::Relaxed);
    let hold = Hold::draw(workload, rng, who, number);
    let client = &clients.main;
    let (acquire, token) = acquire(client, &hold, who, clock).await;
    let granted_at = Instant::now();
    let mut ops = vec![acquire];
    let Some(token) = token else {
        return ops;
    };
    for n in 1..=hold.puts {
        let late_ms = hold.late_ms.filter(|_| n == hold.puts);
        match late_ms {
            Some(ms) => {
                let past = Duration::from_millis(hold.ttl_ms + ms);
                tokio::time::sleep_until(granted_at + past).await;
            }
            None if n > 1 => {
                let gap = Duration::from_millis(rng.below(PUT_GAP_MS_MAX + 1));
                tokio::time::sleep(gap).await;
            }
            None => {}
        }
        let put = fput(client, &hold, token, n, late_ms.is_some(), who, clock).await;
        let indeterminate = put.status() == Status::Info;
        ops.push(put);
        if indeterminate {
            return ops;
        }
    }
    ops.push(release(client, &hold, token, who, clock).await);
    ops
}

/// Asks for the hold's lock, waiting up to `WAIT`; the token when granted.
async fn acquire(client: &Client, hold: &Hold, who: u64, clock: &RunClock) -> (Op, Option<u64>) {
    let mut op = called(
        who,
        OpKind::Acquire,
        &hold.lock,
        Value::Null,
        Value::Null,
        clock,
    );
    op.set("lock", hold.lock.as_str());
    op.set("owner", hold.owner.as_str());
    op.set("ttl_ms", hold.ttl_ms);
    op.set("wait_ms", WAIT.as_millis() as u64);
    let options = AcquireOptions {
        owner: Some(hold.owner.clone().into_bytes()),
        ttl: Duration::from_millis(hold.ttl_ms),
        wait: WAIT,
        lock_delay: Duration::ZERO,
    };
    let (status, token) = match client.acquire(hold.lock.as_bytes(), options).await {
        Ok(answer) => match (answer.acquired, answer.holder) {
            (true, Some(holder)) => (Status::Ok, Some(holder.token)),
            (true, None) => (Status::Info, None),
            (false, _) => {
                op.set("error", "busy");
                (Status::Fail, None)
            }
        },
        Err(error) => {
            op.set("error", outcome::error_name(&error));
            (outcome::write_status(&error), None)
        }
    };
    op.set("token", token);
    (returned(op, status, Value::Null, clock), token)
}

/// The `n`-th put of the hold, fenced by its token.
async fn fput(
    client: &Client,
    hold: &Hold,
    token: u64,
    n: u64,
    late: bool,
    who: u64,
    clock: &RunClock,
) -> Op {
    let value = Value::String(value_of(&hold.owner, token, n));
    let mut op = called(
        who,
        OpKind::Fput,
        &hold.key,
        value.clone(),
        Value::Null,
        clock,
    );
    op.set("lock", hold.lock.as_str());
    op.set("token", token);
    op.set("owner", hold.owner.as_str());
    op.set("late", late);
    let fence = Fence {
        lock: hold.lock.as_bytes().to_vec(),
        token,
    };
    let options = PutOptions {
        fence: Some(fence),
        ..PutOptions::default()
    };
    let status = match client
        .put(hold.key.as_bytes(), &encode(&value), options)
        .await
    {
        Ok(answer) => {
            op.set("revision", answer.revision);
            Status::Ok
        }
        Err(error) => {
            op.set("error", outcome::error_name(&error));
            outcome::write_status(&error)
        }
    };
    returned(op, status, Value::Null, clock)
}

/// Frees the hold's lock.
async fn release(client: &Client, hold: &Hold, token: u64, who: u64, clock: &RunClock) -> Op {
    let mut op = called(
        who,
        OpKind::Release,
        &hold.lock,
        Value::Null,
        Value::Null,
        clock,
    );
    op.set("lock", hold.lock.as_str());
    op.set("token", token);
    op.set("owner", hold.owner.as_str());
    let status = match client.release(hold.lock.as_bytes(), token).await {
        Ok(answer) => {
            let successor = answer.successor.map(|holder| holder.token);
            op.set("successor_token", successor);
            Status::Ok
        }
        Err(error) => {
            op.set("error", outcome::error_name(&error));
            outcome::write_status(&error)
        }
    };
    returned(op, status, Value::Null, clock)
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;
    use crate::run::spread::ClientMode;
    use crate::run::workload::WorkloadKind;

    #[test]
    fn holds_stay_in_their_ranges_and_values_are_unique() {
        let workload = Workload::new(WorkloadKind::Fencing, 1, ClientMode::Routed);
        let mut rng = Rng::new(7);
        let holds: Vec<Hold> = (0..300)
            .map(|number| Hold::draw(&workload, &mut rng, number % 5, number))
            .collect();
        let keys: HashSet<&str> = holds.iter().map(|hold| hold.key.as_str()).collect();
        assert_eq!(keys, HashSet::from(["fk0", "fk1", "fk2"]));
        for hold in &holds {
            assert_eq!(hold.lock, lock_of(&hold.key));
            assert!((TTL_MS_MIN..=TTL_MS_MAX).contains(&hold.ttl_ms), "{hold:?}");
            assert!((1..=PUTS_MAX).contains(&hold.puts), "{hold:?}");
            assert!(
                hold.late_ms
                    .is_none_or(|ms| (LATE_MS_MIN..=LATE_MS_MAX).contains(&ms)),
                "{hold:?}"
            );
        }
        let late = holds.iter().filter(|hold| hold.late_ms.is_some()).count();
        assert!((30..=90).contains(&late), "{late} of 300 holds late");
        // Even if two holds got one token, their values differ: owners are unique.
        let values: HashSet<String> = holds
            .iter()
            .flat_map(|hold| (1..=hold.puts).map(|n| value_of(&hold.owner, 1, n)))
            .collect();
        let puts: u64 = holds.iter().map(|hold| hold.puts).sum();
        assert_eq!(values.len() as u64, puts);
    }
}
