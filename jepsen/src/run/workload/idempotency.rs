//! The idempotency workload (DESIGN §7 "idempotency records"): records of one scope, a few
//! ids active at a time (`idN`, each retired after `ID_ATTEMPTS_MAX` attempts and replaced by a
//! fresh one, so takeovers keep happening all run long). A client's step is one attempt:
//! `begin` a random id (an owner unique to the attempt, `c<client>-a<n>`; TTL 1–2 s). On
//! `Started` it "does the work", a sleep of 0–0.2 s, or for one attempt in four until 0.1–0.5
//! s past its TTL (counted from the begin's return, as a paused owner would: another attempt
//! may take the record over, and then this one's complete must be refused with
//! `RecordNotOwned`); then it `complete`s with the result `<owner>-t<token>` (unique per id),
//! kept for `RESULT_TTL_MS`, longer than any run, or for one attempt in eight `abort`s
//! instead. On `InProgress` or `Completed` the step ends with what it saw. An attempt ends at
//! its first indeterminate op, so one client id never has two ops open.
//!
//! Records `begin`, `complete` and `abort` (`key` = the id), with the fields `scope`, `id`,
//! `owner`, `ttl_ms` (begin), `token` (null on a begin not answered `Started`), `state` seen
//! (`started`, `in-progress`, `completed`; `absent` on a get), `holder` (the owner an
//! `in-progress` answer names), `result` (the result a `completed` answer carries; a
//! complete's `value` is the result it sends), `result_ttl_ms` and `replayed` (complete),
//! `late` (complete and abort), and `error` for ops that did not succeed. The final reads are
//! linearizable `get`s of each record (`output` = its result, null unless completed). Knows
//! nothing of faults.

use std::time::Duration;

use keel_client::{BeginResult, Client, RecordState};
use keel_types::Consistency;
use serde_json::Value;
use std::sync::atomic::Ordering;
use tokio::time::Instant;

use crate::history::{Op, OpKind, Status};
use crate::run::clock::RunClock;
use crate::run::outcome;
use crate::run::rng::Rng;
use crate::run::workload::{Clients, Workload, called, returned};

/// The scope of every record of a run.
pub const SCOPE: &str = "jepsen";

/// The key that routes record `id` of `SCOPE` to its range.
pub fn routing_key(id: &str) -> Vec<u8> {
    keel_types::coordination::idempotency_key(SCOPE.as_bytes(), id.as_bytes())
}
/// Ids active at a time, and attempts (begins) per id before it is replaced.
pub const IDS_ACTIVE: usize = 6;
pub const ID_ATTEMPTS_MAX: u64 = 50;
/// TTL of an attempt's record, drawn in this range.
pub const TTL_MS_MIN: u64 = 1_000;
pub const TTL_MS_MAX: u64 = 2_000;
/// How long results are kept: a day, longer than any run, so within a run an id's result
/// never expires (the checker relies on it and says unknown otherwise).
pub const RESULT_TTL_MS: u64 = 86_400_000;
/// The work of an attempt on time: a sleep of 0 to this.
pub const WORK_MS_MAX: u64 = 200;
/// Share of attempts whose work outlasts the TTL, per mille, and by how much.
pub const LATE_PER_MILLE: u64 = 250;
pub const LATE_MS_MIN: u64 = 100;
pub const LATE_MS_MAX: u64 = 500;
/// Share of started attempts that abort instead of completing, per mille.
pub const ABORT_PER_MILLE: u64 = 125;

/// The result an attempt stores: unique per id, since owners are unique.
pub fn result_of(owner: &str, token: u64) -> String {
    format!("{owner}-t{token}")
}

/// One attempt as planned: which id, for whom, how long, how it ends if started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    pub id: String,
    pub owner: String,
    pub ttl_ms: u64,
    /// The work's sleep, counted from the begin's return.
    pub work_ms: u64,
    pub late: bool,
    pub abort: bool,
}

impl Attempt {
    /// Draws the attempt number `number` of client `who` on a random id.
    pub fn draw(workload: &Workload, rng: &mut Rng, who: u64, number: u64) -> Attempt {
        let id = workload.keys.pick(rng).key;
        let ttl_ms = rng.between(TTL_MS_MIN, TTL_MS_MAX);
        let late = rng.chance(LATE_PER_MILLE);
        let work_ms = if late {
            ttl_ms + rng.between(LATE_MS_MIN, LATE_MS_MAX)
        } else {
            rng.below(WORK_MS_MAX + 1)
        };
        Attempt {
            id,
            owner: format!("c{who}-a{number}"),
            ttl_ms,
            work_ms,
            late,
            abort: rng.chance(ABORT_PER_MILLE),
        }
    }
}

/// One attempt: begin, and if started, the work and a complete or an abort.
pub(super) async fn step(
    workload: &Workload,
    clients: &Clients,
    rng: &mut Rng,
    who: u64,
    clock: &RunClock,
) -> Vec<Op> {
    let number = workload.holds.fetch_add(1, Ordering::Relaxed);
    let attempt = Attempt::draw(workload, rng, who, number);
    let client = &clients.main;
    let (begin, token) = begin(client, &attempt, who, clock).await;
    let started_at = Instant::now();
    let Some(token) = token else {
        return vec![begin];
    };
    tokio::time::sleep_until(started_at + Duration::from_millis(attempt.work_ms)).await;
    let end = if attempt.abort {
        abort(client, &attempt, token, who, clock).await
    } else {
        complete(client, &attempt, token, who, clock).await
    };
    vec![begin, end]
}

/// Begins the attempt's record; the token when started.
async fn begin(
    client: &Client,
    attempt: &Attempt,
    who: u64,
    clock: &RunClock,
) -> (Op, Option<u64>) {
    let mut op = record_op(OpKind::Begin, attempt, Value::Null, who, clock);
    op.set("ttl_ms", attempt.ttl_ms);
    let ttl = Duration::from_millis(attempt.ttl_ms);
    let answer = client
        .begin(
            SCOPE.as_bytes(),
            attempt.id.as_bytes(),
            Some(attempt.owner.as_bytes()),
            ttl,
        )
        .await;
    let (status, token) = match answer {
        Ok(BeginResult::Started { token, .. }) => {
            op.set("state", "started");
            (Status::Ok, Some(token))
        }
        Ok(BeginResult::InProgress { owner, .. }) => {
            op.set("state", "in-progress");
            op.set("holder", text(&owner));
            (Status::Ok, None)
        }
        Ok(BeginResult::Completed { result, .. }) => {
            op.set("state", "completed");
            op.set("result", text(&result));
            (Status::Ok, None)
        }
        Err(error) => {
            op.set("error", outcome::error_name(&error));
            (outcome::write_status(&error), None)
        }
    };
    op.set("token", token);
    (returned(op, status, Value::Null, clock), token)
}

/// Stores the attempt's result under `token`.
async fn complete(
    client: &Client,
    attempt: &Attempt,
    token: u64,
    who: u64,
    clock: &RunClock,
) -> Op {
    let result = result_of(&attempt.owner, token);
    let value = Value::String(result.clone());
    let mut op = record_op(OpKind::Complete, attempt, value, who, clock);
    op.set("token", token);
    op.set("result_ttl_ms", RESULT_TTL_MS);
    op.set("late", attempt.late);
    let answer = client
        .complete(
            SCOPE.as_bytes(),
            attempt.id.as_bytes(),
            token,
            result.as_bytes(),
            Duration::from_millis(RESULT_TTL_MS),
        )
        .await;
    let status = match answer {
        Ok(answer) => {
            op.set("state", "completed");
            op.set("result", text(&answer.result));
            op.set("replayed", answer.replayed);
            Status::Ok
        }
        Err(error) => {
            op.set("error", outcome::error_name(&error));
            outcome::write_status(&error)
        }
    };
    returned(op, status, Value::Null, clock)
}

/// Drops the attempt's record started with `token`.
async fn abort(client: &Client, attempt: &Attempt, token: u64, who: u64, clock: &RunClock) -> Op {
    let mut op = record_op(OpKind::Abort, attempt, Value::Null, who, clock);
    op.set("token", token);
    op.set("late", attempt.late);
    let answer = client
        .abort(SCOPE.as_bytes(), attempt.id.as_bytes(), token)
        .await;
    let status = match answer {
        Ok(_) => Status::Ok,
        Err(error) => {
            op.set("error", outcome::error_name(&error));
            outcome::write_status(&error)
        }
    };
    returned(op, status, Value::Null, clock)
}

/// A linearizable read of record `id` (a final read).
pub(super) async fn get(client: &Client, id: &str, who: u64, clock: &RunClock) -> Op {
    let mut op = called(who, OpKind::Get, id, Value::Null, Value::Null, clock);
    op.set("scope", SCOPE);
    op.set("id", id);
    let answer = client
        .idempotency_get(SCOPE.as_bytes(), id.as_bytes(), Consistency::Linearizable)
        .await;
    let (status, output) = match answer.map(|answer| answer.state) {
        Ok(None) => {
            op.set("state", "absent");
            (Status::Ok, Value::Null)
        }
        Ok(Some(RecordState::InProgress { owner, .. })) => {
            op.set("state", "in-progress");
            op.set("holder", text(&owner));
            (Status::Ok, Value::Null)
        }
        Ok(Some(RecordState::Completed { result, .. })) => {
            op.set("state", "completed");
            op.set("result", text(&result));
            (Status::Ok, Value::String(text(&result)))
        }
        Err(error) => {
            op.set("error", outcome::error_name(&error));
            (outcome::read_status(&error), Value::Null)
        }
    };
    returned(op, status, output, clock)
}

/// A new op of the attempt's record, with the fields every one carries.
fn record_op(kind: OpKind, attempt: &Attempt, value: Value, who: u64, clock: &RunClock) -> Op {
    let mut op = called(who, kind, &attempt.id, value, Value::Null, clock);
    op.set("scope", SCOPE);
    op.set("id", attempt.id.as_str());
    op.set("owner", attempt.owner.as_str());
    op
}

/// Owners and results are the workload's own ASCII; anything else is shown lossily.
fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;
    use crate::run::spread::ClientMode;
    use crate::run::workload::WorkloadKind;

    #[test]
    fn attempts_stay_in_their_ranges_and_results_are_unique() {
        let workload = Workload::new(WorkloadKind::Idempotency, 1, ClientMode::Routed);
        let mut rng = Rng::new(7);
        let attempts: Vec<Attempt> = (0..1200)
            .map(|number| Attempt::draw(&workload, &mut rng, number % 5, number))
            .collect();
        for attempt in &attempts {
            assert!(attempt.id.starts_with("id"), "{attempt:?}");
            assert!(
                (TTL_MS_MIN..=TTL_MS_MAX).contains(&attempt.ttl_ms),
                "{attempt:?}"
            );
            let late_ms = attempt.work_ms.checked_sub(attempt.ttl_ms);
            match attempt.late {
                true => assert!(
                    late_ms.is_some_and(|ms| (LATE_MS_MIN..=LATE_MS_MAX).contains(&ms)),
                    "{attempt:?}"
                ),
                false => assert!(attempt.work_ms <= WORK_MS_MAX, "{attempt:?}"),
            }
        }
        let late = attempts.iter().filter(|a| a.late).count();
        assert!((220..=380).contains(&late), "{late} of 1200 attempts late");
        let aborts = attempts.iter().filter(|a| a.abort).count();
        assert!(
            (100..=200).contains(&aborts),
            "{aborts} of 1200 attempts abort"
        );
        // Ids are retired after 50 attempts each and replaced: more than 6 in all.
        let ids = workload.keys.all();
        assert!(ids.len() > IDS_ACTIVE, "{ids:?}");
        for id in &ids {
            let count = attempts.iter().filter(|a| &a.id == id).count() as u64;
            assert!(count <= ID_ATTEMPTS_MAX, "{id}: {count} attempts");
        }
        // Even if two attempts got one token, their results differ: owners are unique.
        let results: HashSet<String> = attempts.iter().map(|a| result_of(&a.owner, 1)).collect();
        assert_eq!(results.len(), attempts.len());
    }
}
