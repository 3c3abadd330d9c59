//! Writes a synthetic run directory (history.jsonl, faults.jsonl, run.json) that is correct
//! by construction, to time the checkers and look at the report:
//!
//! ```sh
//! cargo run -p keel-jepsen --release --example synth -- --workload register --ops 100000 \
//!     --keys 1000 --clients 16 --out /tmp/synth
//! cargo run -p keel-jepsen --release -- check /tmp/synth
//! ```

use std::path::PathBuf;

use clap::Parser;
use keel_jepsen::check::{FAULTS_FILE, HISTORY_FILE, RUN_SPEC_FILE};
use keel_jepsen::fault::FaultEvent;
use keel_jepsen::history::write_json_lines;
use keel_jepsen::spec::RunSpec;
use keel_jepsen::synth::{self, Shape, Workload};

#[derive(Debug, Parser)]
struct Args {
    /// register | append | counter
    #[arg(long, default_value = "register")]
    workload: String,
    #[arg(long, default_value_t = 5_000)]
    ops: usize,
    #[arg(long, default_value_t = 40)]
    keys: usize,
    #[arg(long, default_value_t = 10)]
    clients: usize,
    /// Indeterminate ops per thousand.
    #[arg(long, default_value_t = 20)]
    info_per_mille: u64,
    /// One op at a time across all clients.
    #[arg(long)]
    sequential: bool,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    #[arg(long)]
    out: PathBuf,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let workload = match args.workload.as_str() {
        "register" => Workload::Register,
        "append" => Workload::Append,
        "counter" => Workload::Counter,
        other => anyhow::bail!("unknown workload {other:?}; known: register, append, counter"),
    };
    let shape = Shape {
        ops: args.ops,
        keys: args.keys,
        clients: args.clients,
        sequential: args.sequential,
        info_per_mille: args.info_per_mille,
        seed: args.seed,
    };
    let history = synth::history(workload, &shape);
    let end_ns = history
        .iter()
        .filter_map(|op| op.return_ns)
        .max()
        .unwrap_or(0);
    // One healed partition over the middle third, so the report shows a band.
    let faults = vec![FaultEvent {
        fault: "partition".into(),
        target: "n1|n2,n3 (synthetic)".into(),
        start_ns: end_ns / 3,
        stop_ns: Some(end_ns / 3 * 2),
        extra: Default::default(),
    }];
    let spec = RunSpec {
        workload: args.workload.clone(),
        nemesis: vec!["partition".into()],
        nodes: 3,
        seed: args.seed,
        time_limit_s: end_ns.div_ceil(1_000_000_000),
        extra: Default::default(),
    };
    std::fs::create_dir_all(&args.out)?;
    write_json_lines(&args.out.join(HISTORY_FILE), &history)?;
    write_json_lines(&args.out.join(FAULTS_FILE), &faults)?;
    std::fs::write(
        args.out.join(RUN_SPEC_FILE),
        serde_json::to_string(&spec)? + "\n",
    )?;
    println!("{} ops written to {}", history.len(), args.out.display());
    Ok(())
}
