//! The `keel-jepsen` binary: command-line parsing and exit codes. `check DIR` checks a run
//! directory; the runner (`run`) comes later. Knows nothing about how checkers work.
//!
//! Exit codes: 0 valid, 1 invalid, 2 unknown, 3 usage or I/O error.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use keel_jepsen::check::{self, REPORT_FILE, RESULTS_FILE};
use keel_jepsen::checker::{Budget, CheckerName};
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
    /// Check DIR/history.jsonl (+ faults.jsonl, run.json); write results.json and report.html.
    Check(CheckArgs),
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
    let Command::Check(args) = cli.command;
    match check_dir(&args) {
        Ok(code) => ExitCode::from(code),
        Err(error) => {
            eprintln!("keel-jepsen: {error:#}");
            ExitCode::from(EXIT_USAGE)
        }
    }
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
    println!(
        "{}: {} (see {})",
        args.dir.display(),
        results.valid.as_str(),
        args.dir.join(REPORT_FILE).display()
    );
    Ok(results.valid.exit_code())
}
