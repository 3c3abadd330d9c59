//! The `keel-jepsen` binary: command-line parsing and exit codes. `run` makes a run directory
//! against real `keel serve` processes and then checks it; `check DIR` checks one. Knows
//! nothing about how checkers work or how faults are made.
//!
//! Exit codes: 0 valid, 1 invalid, 2 unknown, 3 usage or I/O error (for `run` also: the
//! cluster could not be started or the run could not be completed).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use keel_jepsen::check::{self, REPORT_FILE, RESULTS_FILE};
use keel_jepsen::checker::{Budget, CheckerName};
use keel_jepsen::run::plan::FaultKind;
use keel_jepsen::run::spread::ClientMode;
use keel_jepsen::run::workload::WorkloadKind;
use keel_jepsen::run::{self, RunConfig};
use keel_jepsen::{limits, report};

/// Exit code for a usage or I/O error (clap's own would be 2, which means `unknown` here).
const EXIT_USAGE: u8 = 3;

#[derive(Debug, Parser)]
#[command(name = "keel-jepsen", version, about = "Keel's Jepsen-style harness")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a workload against real `keel serve` processes under faults, then check it.
    Run(RunArgs),
    /// Check DIR/history.jsonl (+ faults.jsonl, run.json); write results.json and report.html.
    Check(CheckArgs),
}

#[derive(Debug, clap::Args)]
struct RunArgs {
    /// register, append, counter, follower-read, fencing, idempotency or watch.
    #[arg(long)]
    workload: WorkloadKind,
    /// routed: keel-client, to each range's leader, with retries. spread: each op to the next
    /// node round robin as one raw gRPC call that the node forwards (no_forward false), no
    /// retry, as generic clients send them (register and follower-read only). etcd: each op
    /// to the next node's etcd API port through the etcd-client crate (register and watch;
    /// needs a build with the etcd feature and a network namespace).
    #[arg(long, default_value = "routed")]
    clients: ClientMode,
    /// Faults, comma-separated: partition, kill, kill-all, pause, leader-transfer, clock,
    /// split, move, membership, disk (move and membership need --nodes 4 or more).
    #[arg(long, value_delimiter = ',')]
    nemesis: Vec<FaultKind>,
    /// Nodes of the cluster at the start (faults that add or replace nodes start more).
    #[arg(long, default_value_t = 3)]
    nodes: usize,
    /// Ranges the keyspace is split into before the workload starts, so its keys spread over
    /// them (leaders on different nodes).
    #[arg(long, default_value_t = 1)]
    ranges: usize,
    /// Seconds of workload (faults stop then; heal, recovery and final reads follow).
    #[arg(long, default_value_t = 60)]
    time_limit: u64,
    /// Ops per second, all clients together.
    #[arg(long, default_value_t = 100)]
    rate: u32,
    /// Clients running ops at once.
    #[arg(long, default_value_t = 5)]
    concurrency: usize,
    /// Seed of every random choice (faults, keys, ops): the same seed, the same fault plan.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// The run directory (made if missing; its files are replaced).
    #[arg(long)]
    out: PathBuf,
    /// The keel binary (a release build with the fault-injection and planted-bugs features).
    #[arg(long, default_value = "target/release/keel")]
    keel: PathBuf,
    /// Start every node with `--planted-bug NAME` (stale-read, ack-before-fsync, double-apply,
    /// lock-no-expiry, idem-stale-complete).
    #[arg(long, value_name = "NAME")]
    planted_bug: Option<String>,
    /// Drop this percentage of mutation answers after applying them (more client retries).
    #[arg(long, default_value_t = 0)]
    response_loss_percent: u32,
    /// Use the TCP proxy even when a network namespace is possible.
    #[arg(long)]
    no_netns: bool,
    /// Aim every kill and partition at the leader (kill it; isolate it from the rest), as
    /// pause always is: for measuring fail-over (bench/failover.sh).
    #[arg(long)]
    leader_faults: bool,
    /// At least this much quiet between two faults (later faults move later; those that no
    /// longer fit in the time limit are dropped); 0 = the plan's 1-3 s.
    #[arg(long, default_value_t = 0)]
    fault_gap_ms_min: u64,
}

#[derive(Debug, clap::Args)]
struct CheckArgs {
    /// The run directory.
    dir: PathBuf,
    /// Run this checker instead of those of run.json's workload (repeatable).
    #[arg(long = "checker", value_name = "NAME")]
    checkers: Vec<CheckerName>,
    /// Ops of one key the linearizability search takes on; more = unknown.
    #[arg(long, default_value_t = limits::REGISTER_KEY_OPS_MAX)]
    key_ops_max: usize,
    /// Time the linearizability search may spend on one key.
    #[arg(long, default_value_t = limits::REGISTER_KEY_TIME_BUDGET_MS)]
    key_time_budget_ms: u64,
    /// Time the linearizability search may spend on all keys.
    #[arg(long, default_value_t = limits::REGISTER_TOTAL_TIME_BUDGET_MS)]
    total_time_budget_ms: u64,
    /// Memo entries the linearizability search may keep for one key.
    #[arg(long, default_value_t = limits::REGISTER_KEY_MEMO_ENTRIES_MAX)]
    memo_entries_max: usize,
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => {
            let code = if error.use_stderr() { EXIT_USAGE } else { 0 };
            let _ = error.print();
            return ExitCode::from(code);
        }
    };
    let outcome = match cli.command {
        Command::Check(args) => check_dir(&args),
        Command::Run(args) => run_and_check(args),
    };
    match outcome {
        Ok(code) => ExitCode::from(code),
        Err(error) => {
            eprintln!("keel-jepsen: {error:#}");
            ExitCode::from(EXIT_USAGE)
        }
    }
}

/// Runs `run`, then the checkers of its workload on its directory.
fn run_and_check(args: RunArgs) -> anyhow::Result<u8> {
    let config = RunConfig {
        workload: args.workload,
        clients: args.clients,
        nemesis: args.nemesis,
        nodes: args.nodes,
        ranges: args.ranges,
        time_limit_s: args.time_limit,
        rate_hz: args.rate,
        concurrency: args.concurrency,
        seed: args.seed,
        out: args.out.clone(),
        keel: args.keel,
        planted_bug: args.planted_bug,
        response_loss_percent: args.response_loss_percent,
        no_netns: args.no_netns,
        leader_faults: args.leader_faults,
        fault_gap_ms_min: args.fault_gap_ms_min,
    };
    let summary = run::run_blocking(&config)?;
    println!(
        "run: {} ops, {} faults in {:.1} s ({:?})",
        summary.ops,
        summary.faults,
        summary.elapsed.as_secs_f64(),
        summary.isolation
    );
    check_dir(&CheckArgs {
        dir: args.out,
        checkers: Vec::new(),
        key_ops_max: limits::REGISTER_KEY_OPS_MAX,
        key_time_budget_ms: limits::REGISTER_KEY_TIME_BUDGET_MS,
        total_time_budget_ms: limits::REGISTER_TOTAL_TIME_BUDGET_MS,
        memo_entries_max: limits::REGISTER_KEY_MEMO_ENTRIES_MAX,
    })
}

/// Runs `check DIR`, prints one line per checker and returns the verdict's exit code.
fn check_dir(args: &CheckArgs) -> anyhow::Result<u8> {
    let budget = Budget {
        key_ops_max: args.key_ops_max,
        key_time: Duration::from_millis(args.key_time_budget_ms),
        total_time: Duration::from_millis(args.total_time_budget_ms),
        memo_entries_max: args.memo_entries_max,
    };
    let run = check::load(&args.dir).context("cannot read the run directory")?;
    let checkers = check::select(&args.dir, &run, &args.checkers)?;
    let results = check::run(&run, &checkers, &budget);
    check::write_results(&args.dir.join(RESULTS_FILE), &results)?;
    check::write_file(&args.dir.join(REPORT_FILE), &report::render(&run, &results))?;
    for (name, result) in &results.checkers {
        let summary = result.details["summary"].as_str().unwrap_or("");
        println!(
            "{name:<9} {:<8} {:>10.3} ms  {summary}",
            result.result.as_str(),
            result.elapsed_ms
        );
    }
    if let Some(availability) = &results.availability {
        println!("{}", availability.summary());
    }
    println!(
        "{}: {} (see {})",
        args.dir.display(),
        results.valid.as_str(),
        args.dir.join(REPORT_FILE).display()
    );
    Ok(results.valid.exit_code())
}
