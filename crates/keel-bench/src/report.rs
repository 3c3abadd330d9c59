//! The result of a run: latency histogram, counts, and their rendering as a human table and
//! as JSON. Pure; knows nothing of targets or the network.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::config::{Config, Distribution, Op, TargetKind};
use crate::failure::Failure;
use crate::limits;
use crate::mover::MoveCounts;

/// What the tasks of a run counted, merged.
#[derive(Debug, Clone)]
pub struct Tally {
    /// Latencies of the operations that completed in the measured window, in µs.
    pub latencies_us: Histogram<u64>,
    /// Operations that failed (or timed out) in the measured window.
    pub errors: u64,
    /// `errors` by class (`failure`'s module doc: the gRPC code, or keel-client's error).
    pub errors_by_code: BTreeMap<String, u64>,
    /// Compare-and-set operations whose condition did not hold (they completed, and count as
    /// operations too).
    pub conflicts: u64,
    /// One error message, to say what went wrong.
    pub first_error: Option<String>,
}

impl Tally {
    pub fn new() -> Tally {
        let latencies_us =
            Histogram::new_with_bounds(1, limits::LATENCY_US_MAX, limits::HISTOGRAM_DIGITS)
                .expect("histogram bounds are valid constants");
        Tally {
            latencies_us,
            errors: 0,
            errors_by_code: BTreeMap::new(),
            conflicts: 0,
            first_error: None,
        }
    }

    pub fn record(&mut self, latency: Duration) {
        let micros = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        self.latencies_us
            .saturating_record(micros.clamp(1, limits::LATENCY_US_MAX));
    }

    pub fn record_error(&mut self, failure: Failure) {
        self.errors += 1;
        *self.errors_by_code.entry(failure.code.clone()).or_default() += 1;
        self.first_error.get_or_insert_with(|| failure.to_string());
    }

    pub fn merge(&mut self, other: Tally) {
        self.latencies_us
            .add(&other.latencies_us)
            .expect("histograms of one run have the same bounds");
        self.errors += other.errors;
        for (code, count) in other.errors_by_code {
            *self.errors_by_code.entry(code).or_default() += count;
        }
        self.conflicts += other.conflicts;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
    }
}

/// One run's figures, as printed and as written to JSON.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
    pub target: TargetKind,
    /// Keel: `leader` or `spread`; etcd: `etcd-client` (its client balances by itself).
    pub route: &'static str,
    pub op: Op,
    pub clients: usize,
    pub connections: usize,
    pub value_bytes: usize,
    pub keyspace: usize,
    /// `uniform` or `zipf:S`.
    pub distribution: String,
    pub duration_s: f64,
    pub ops: u64,
    pub errors: u64,
    pub errors_by_code: BTreeMap<String, u64>,
    pub conflicts: u64,
    pub ops_per_sec: f64,
    pub mean_us: f64,
    pub p50_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
    pub max_us: u64,
    pub first_error: Option<String>,
    /// With `--move-leader-every`: the moves, and the operations split by whether they
    /// completed soon after a round of them.
    pub moves: Option<MoveReport>,
    /// With `--watchers`: what the watchers received.
    pub watch: Option<WatchReport>,
    /// With `--server-pids`: the CPU time (user + system) the servers spent in the measured
    /// window, in all and per operation.
    pub server_cpu_us: Option<u64>,
    pub server_cpu_us_per_op: Option<f64>,
}

/// The put events a run's watchers received in the measured window (`fanout`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WatchReport {
    pub watchers: usize,
    /// Put events received, over all watchers (each watcher receives every put).
    pub events: u64,
    pub events_per_sec: f64,
    /// From sending a put to a watcher receiving its event.
    pub p50_us: u64,
    pub p99_us: u64,
    pub max_us: u64,
    /// Watches that ended with an error (each counts once; it is not reopened).
    pub errors: u64,
    pub errors_by_code: BTreeMap<String, u64>,
    pub first_error: Option<String>,
}

impl WatchReport {
    pub fn new(watchers: usize, duration: Duration, tally: &Tally) -> WatchReport {
        let events = tally.latencies_us.len();
        WatchReport {
            watchers,
            events,
            events_per_sec: events as f64 / duration.as_secs_f64(),
            p50_us: quantile(&tally.latencies_us, 0.50),
            p99_us: quantile(&tally.latencies_us, 0.99),
            max_us: quantile(&tally.latencies_us, 1.0),
            errors: tally.errors,
            errors_by_code: tally.errors_by_code.clone(),
            first_error: tally.first_error.clone(),
        }
    }
}

/// Leader moves during a run and what the operations around them saw.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MoveReport {
    pub every_s: f64,
    /// An operation completing this long after a round started counts as after a move.
    pub after_move_s: f64,
    /// Hand-overs the leaders accepted, and those refused.
    pub done: u64,
    pub refused: u64,
    pub first_refusal: Option<String>,
    pub after_move: Phase,
    pub steady: Phase,
}

/// The operations of one phase of a run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Phase {
    pub ops: u64,
    pub errors: u64,
    pub errors_by_code: BTreeMap<String, u64>,
    pub p50_us: u64,
    pub p99_us: u64,
    pub max_us: u64,
}

impl Phase {
    pub fn new(tally: &Tally) -> Phase {
        Phase {
            ops: tally.latencies_us.len(),
            errors: tally.errors,
            errors_by_code: tally.errors_by_code.clone(),
            p50_us: quantile(&tally.latencies_us, 0.50),
            p99_us: quantile(&tally.latencies_us, 0.99),
            max_us: quantile(&tally.latencies_us, 1.0),
        }
    }
}

/// The latency at `q` (the maximum at 1.0); 0 without operations.
fn quantile(latencies: &Histogram<u64>, q: f64) -> u64 {
    match latencies.is_empty() {
        true => 0,
        false if q >= 1.0 => latencies.max(),
        false => latencies.value_at_quantile(q),
    }
}

impl MoveReport {
    pub fn new(
        every: Duration,
        counts: MoveCounts,
        after_move: &Tally,
        steady: &Tally,
    ) -> MoveReport {
        MoveReport {
            every_s: every.as_secs_f64(),
            after_move_s: limits::AFTER_MOVE.as_secs_f64(),
            done: counts.done,
            refused: counts.refused,
            first_refusal: counts.first_refusal,
            after_move: Phase::new(after_move),
            steady: Phase::new(steady),
        }
    }
}

impl Summary {
    pub fn new(config: &Config, tally: &Tally) -> Summary {
        let latencies = &tally.latencies_us;
        let ops = latencies.len();
        let duration_s = config.duration.as_secs_f64();
        Summary {
            target: config.target,
            route: config.route.map_or("etcd-client", |route| route.name()),
            op: config.op,
            clients: config.clients,
            connections: config.connections,
            value_bytes: config.value_bytes,
            keyspace: config.keyspace,
            distribution: match config.distribution {
                Distribution::Uniform => "uniform".to_string(),
                Distribution::Zipf { exponent } => format!("zipf:{exponent}"),
            },
            duration_s,
            ops,
            errors: tally.errors,
            errors_by_code: tally.errors_by_code.clone(),
            conflicts: tally.conflicts,
            ops_per_sec: ops as f64 / duration_s,
            mean_us: if ops == 0 { 0.0 } else { latencies.mean() },
            p50_us: quantile(latencies, 0.50),
            p99_us: quantile(latencies, 0.99),
            p999_us: quantile(latencies, 0.999),
            max_us: quantile(latencies, 1.0),
            first_error: tally.first_error.clone(),
            moves: None,
            watch: None,
            server_cpu_us: None,
            server_cpu_us_per_op: None,
        }
    }

    /// Adds the servers' CPU time in the measured window.
    pub fn add_server_cpu(&mut self, cpu: std::time::Duration) {
        let us = u64::try_from(cpu.as_micros()).unwrap_or(u64::MAX);
        self.server_cpu_us = Some(us);
        self.server_cpu_us_per_op = (self.ops > 0).then(|| us as f64 / self.ops as f64);
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a summary serializes")
    }

    /// A header line and one row, columns aligned; the errors by code last (`-` for none).
    pub fn to_table(&self) -> String {
        let target = match self.target {
            TargetKind::Keel => "keel",
            TargetKind::Etcd => "etcd",
        };
        let mut table = String::new();
        let _ = writeln!(
            table,
            "{:<6} {:<11} {:<18} {:>7} {:>5} {:>9} {:>7} {:>10} {:>8} {:>8} {:>9} {:>9}  errors by code",
            "target",
            "route",
            "op",
            "clients",
            "conns",
            "ops",
            "errors",
            "ops/s",
            "p50 µs",
            "p99 µs",
            "p99.9 µs",
            "max µs",
        );
        let _ = writeln!(
            table,
            "{:<6} {:<11} {:<18} {:>7} {:>5} {:>9} {:>7} {:>10.1} {:>8} {:>8} {:>9} {:>9}  {}",
            target,
            self.route,
            self.op.name(),
            self.clients,
            self.connections,
            self.ops,
            self.errors,
            self.ops_per_sec,
            self.p50_us,
            self.p99_us,
            self.p999_us,
            self.max_us,
            self.errors_by_code_text()
        );
        if let Some(moves) = &self.moves {
            let _ = writeln!(
                table,
                "leader moves every {}s: {} done, {} refused; operations completing within {}s \
                 of a round of moves, and the rest:",
                moves.every_s, moves.done, moves.refused, moves.after_move_s
            );
            let _ = writeln!(
                table,
                "  {:<12} {:>9} {:>7} {:>8} {:>8} {:>9}  errors by code",
                "phase", "ops", "errors", "p50 µs", "p99 µs", "max µs"
            );
            for (name, phase) in [("after move", &moves.after_move), ("steady", &moves.steady)] {
                let _ = writeln!(
                    table,
                    "  {:<12} {:>9} {:>7} {:>8} {:>8} {:>9}  {}",
                    name,
                    phase.ops,
                    phase.errors,
                    phase.p50_us,
                    phase.p99_us,
                    phase.max_us,
                    codes_text(&phase.errors_by_code)
                );
            }
        }
        if let Some(watch) = &self.watch {
            let _ = writeln!(
                table,
                "{} watchers: {} put events ({:.1}/s); put to event p50 {} µs, p99 {} µs, \
                 max {} µs; {} watches ended by errors: {}",
                watch.watchers,
                watch.events,
                watch.events_per_sec,
                watch.p50_us,
                watch.p99_us,
                watch.max_us,
                watch.errors,
                codes_text(&watch.errors_by_code)
            );
        }
        if let Some(us) = self.server_cpu_us {
            let per_op = self
                .server_cpu_us_per_op
                .map_or("-".to_string(), |per_op| format!("{per_op:.0}"));
            let _ = writeln!(
                table,
                "server CPU in the measured window: {} ms, {per_op} µs per operation",
                us / 1_000
            );
        }
        table
    }

    /// The run's errors as `codes_text` writes them.
    pub fn errors_by_code_text(&self) -> String {
        codes_text(&self.errors_by_code)
    }
}

/// `CODE=count` pairs, most frequent first, comma-separated; `-` when there is none.
fn codes_text(errors_by_code: &BTreeMap<String, u64>) -> String {
    let mut counts: Vec<(&String, &u64)> = errors_by_code.iter().collect();
    counts.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    let pairs: Vec<String> = counts
        .iter()
        .map(|(code, count)| format!("{code}={count}"))
        .collect();
    match pairs.is_empty() {
        true => "-".to_string(),
        false => pairs.join(","),
    }
}

#[cfg(test)]
mod tests;
