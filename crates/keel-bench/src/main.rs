//! `keel-bench`: a closed-loop load generator for Keel (through `keel-client`, or with
//! `--route spread` as raw gRPC calls round robin over the nodes) and, with the `etcd`
//! feature, for etcd (through `etcd-client`), so both can be measured the same way on the
//! same machine. Never depends on Keel's server-side crates.
//!
//! Every task sends one request at a time, picks keys uniformly or by a zipfian law, and
//! records the latency of what completes inside the measured window (after the warm-up) in an
//! HdrHistogram. The result is printed as a table and, with `--json FILE`, written as JSON;
//! both name the route and count the errors by code (`failure`).
//!
//! Exit codes: 0 the run completed with at least one successful operation; 1 setup failed
//! (connect, preload) or no operation succeeded; 2 usage error.

mod config;
mod driver;
#[cfg(feature = "etcd")]
mod etcd;
mod failure;
mod keel;
mod keys;
mod limits;
mod preload;
mod report;
mod spread;

use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;

use crate::config::{Args, Config, Route, TargetKind};
use crate::driver::Revisions;
use crate::report::{Summary, Tally};

fn main() -> ExitCode {
    let config = match Config::from_args(Args::parse()) {
        Ok(config) => config,
        Err(error) => {
            eprintln!("keel-bench: {error}");
            return ExitCode::from(2);
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    match runtime.block_on(run(&config)) {
        Ok(summary) if summary.ops > 0 => ExitCode::SUCCESS,
        Ok(_) => {
            eprintln!("keel-bench: no operation succeeded");
            ExitCode::from(1)
        }
        Err(error) => {
            eprintln!("keel-bench: {error:#}");
            ExitCode::from(1)
        }
    }
}

async fn run(config: &Config) -> anyhow::Result<Summary> {
    let tally = drive(config).await?;
    let summary = Summary::new(config, &tally);
    print!("{}", summary.to_table());
    if let Some(error) = &summary.first_error {
        eprintln!(
            "keel-bench: {} errors ({}); the first: {error}",
            summary.errors,
            summary.errors_by_code_text()
        );
    }
    if let Some(path) = &config.json {
        std::fs::write(path, summary.to_json() + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(summary)
}

async fn drive(config: &Config) -> anyhow::Result<Tally> {
    let revisions = Revisions::new(config.keyspace);
    match (config.target, config.route) {
        (TargetKind::Keel, Some(Route::Spread)) => {
            let workers = spread::prepare(config, &revisions).await?;
            Ok(driver::drive(workers, config).await)
        }
        (TargetKind::Keel, _) => {
            let workers = keel::prepare(config, &revisions).await?;
            Ok(driver::drive(workers, config).await)
        }
        #[cfg(feature = "etcd")]
        (TargetKind::Etcd, _) => {
            let workers = etcd::prepare(config, &revisions).await?;
            Ok(driver::drive(workers, config).await)
        }
        #[cfg(not(feature = "etcd"))]
        (TargetKind::Etcd, _) => anyhow::bail!("{}", config::ConfigError::EtcdNotBuilt),
    }
}
