//! The closed loop against a fake worker: it stops at the window's end, records only what
//! completes inside it, counts errors and conflicts, and maps ops to steps.

use std::time::Duration;

use clap::Parser;

use super::*;
use crate::config::{Args, Config};

/// Answers after `delay`; every `fail_every`-th call fails, every other call conflicts.
struct Fake {
    delay: Duration,
    calls: u64,
    fail_every: u64,
}

impl Worker for Fake {
    async fn run(&mut self, _step: Step) -> Result<Outcome, Failure> {
        tokio::time::sleep(self.delay).await;
        self.calls += 1;
        match (self.calls % self.fail_every, self.calls % 2) {
            (0, _) => Err(Failure::new("UNAVAILABLE", format!("call {}", self.calls))),
            (_, 0) => Ok(Outcome::Conflict),
            _ => Ok(Outcome::Done),
        }
    }

    async fn close(self) {}
}

fn config(line: &str) -> Config {
    let args =
        Args::try_parse_from(std::iter::once("keel-bench").chain(line.split_whitespace())).unwrap();
    Config::from_args(args).unwrap()
}

#[tokio::test(start_paused = true)]
async fn window_bounds_what_is_recorded() {
    let config = config("--clients 2 --duration 1s --warmup 500ms");
    let workers = (0..2)
        .map(|_| Fake {
            delay: Duration::from_millis(10),
            calls: 0,
            fail_every: 5,
        })
        .collect();
    let tally = drive(workers, &config, Window::from_now(&config), None)
        .await
        .total();
    // Each task completes one op per 10 ms of paused time: 100 per task in the 1 s window,
    // of which every 5th fails.
    let completed = tally.latencies_us.len() + tally.errors;
    assert!((198..=202).contains(&completed), "{completed}");
    assert!((38..=42).contains(&tally.errors), "{}", tally.errors);
    assert!(tally.conflicts > 0 && tally.conflicts < tally.latencies_us.len());
    let median = tally.latencies_us.value_at_quantile(0.5);
    assert!(tally.latencies_us.equivalent(median, 10_000), "{median}");
    assert!(tally.first_error.is_some());
    assert_eq!(tally.errors_by_code["UNAVAILABLE"], tally.errors);
}

#[tokio::test(start_paused = true)]
async fn operations_completing_soon_after_a_round_of_moves_are_counted_apart() {
    let config = config("--duration 3s --warmup 0s");
    let workers = vec![Fake {
        delay: Duration::from_millis(10),
        calls: 0,
        fail_every: 1_000,
    }];
    let moves = Moves::new();
    let mover = moves.clone();
    let round = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(1)).await;
        mover.start_round(Instant::now());
    });
    let phased = drive(workers, &config, Window::from_now(&config), Some(moves)).await;
    round.await.unwrap();
    // One op per 10 ms: those done in the second after the round (1 s to 2 s) are after it.
    let after = phased.after_move.latencies_us.len();
    let steady = phased.steady.latencies_us.len();
    assert!((98..=102).contains(&after), "{after}");
    assert!((196..=204).contains(&steady), "{steady}");
    assert_eq!(phased.total().latencies_us.len(), after + steady);
}

#[tokio::test(start_paused = true)]
async fn a_stuck_operation_times_out() {
    let config = config("--duration 30s --warmup 0s");
    let workers = vec![Fake {
        delay: Duration::from_secs(3_600),
        calls: 0,
        fail_every: 1_000,
    }];
    let tally = drive(workers, &config, Window::from_now(&config), None)
        .await
        .total();
    let expected = (30 / limits::OP_TIMEOUT.as_secs()) - 1;
    assert!(tally.errors >= expected, "{}", tally.errors);
    assert_eq!(tally.latencies_us.len(), 0);
    assert!(tally.first_error.unwrap().contains("no answer within"));
    assert_eq!(tally.errors_by_code["bench_timeout"], tally.errors);
}

#[test]
fn ops_map_to_steps() {
    let chooser = KeyChooser::new(crate::config::Distribution::Uniform, 1);
    let mut rng = Rng::new(1);
    let mut step = |op| next_step(op, &chooser, &mut rng, 0.5);
    assert_eq!(step(Op::Put), Step::Put(0));
    assert_eq!(
        step(Op::GetLinearizable),
        Step::Get(0, Consistency::Linearizable)
    );
    assert_eq!(step(Op::GetLease), Step::Get(0, Consistency::Lease));
    assert_eq!(step(Op::GetFollower), Step::Get(0, Consistency::Follower));
    assert_eq!(step(Op::Cas), Step::Cas(0));
    assert_eq!(step(Op::Increment), Step::Increment(0));
    assert_eq!(step(Op::Lock), Step::Lock);
    assert_eq!(step(Op::LockContended), Step::LockShared);
}

#[test]
fn mixed_follows_the_read_ratio() {
    let chooser = KeyChooser::new(crate::config::Distribution::Uniform, 10);
    let mut rng = Rng::new(9);
    let reads = (0..10_000)
        .filter(|_| matches!(next_step(Op::Mixed, &chooser, &mut rng, 0.9), Step::Get(..)))
        .count();
    assert!((8_800..=9_200).contains(&reads), "{reads}");
    let mut rng = Rng::new(9);
    assert!(
        (0..100).all(|_| next_step(Op::Mixed, &chooser, &mut rng, 0.0)
            != Step::Get(0, Consistency::Linearizable))
    );
}

#[test]
fn revisions_never_go_back() {
    let revisions = Revisions::new(2);
    revisions.observe(1, 7);
    revisions.observe(1, 3);
    assert_eq!((revisions.get(0), revisions.get(1)), (0, 7));
}
