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
mod fanout;
mod keel;
mod keys;
mod limits;
mod mover;
mod preload;
mod report;
mod server_cpu;
mod spread;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use keel_client::{Client, ClientOptions};

use crate::config::{Args, Config, Route, TargetKind};
use crate::driver::{Phased, Revisions, Window, Worker};
use crate::failure::Failure;
use crate::fanout::Feed;
use crate::mover::Moves;
use crate::report::{MoveReport, Summary, Tally, WatchReport};

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
    server_cpu::check(&config.server_pids).map_err(anyhow::Error::msg)?;
    let moves = config.move_leader_every.map(|_| Moves::new());
    let Driven {
        phased,
        watched,
        server_cpu,
    } = drive(config, moves.clone()).await?;
    let mut summary = Summary::new(config, &phased.total());
    summary.watch = watched.map(|tally| WatchReport::new(config.watchers, config.duration, &tally));
    match server_cpu {
        Some(Ok(cpu)) => summary.add_server_cpu(cpu),
        Some(Err(error)) => eprintln!("keel-bench: the servers' CPU time is unknown: {error}"),
        None => {}
    }
    if let (Some(every), Some(moves)) = (config.move_leader_every, moves) {
        summary.moves = Some(MoveReport::new(
            every,
            moves.counts(),
            &phased.after_move,
            &phased.steady,
        ));
    }
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

/// What the workers counted, the watchers when there are any, and the servers' CPU time in
/// the measured window with `--server-pids`.
struct Driven {
    phased: Phased,
    watched: Option<Tally>,
    server_cpu: Option<Result<Duration, String>>,
}

async fn drive(config: &Config, moves: Option<Arc<Moves>>) -> anyhow::Result<Driven> {
    let revisions = Revisions::new(config.keyspace);
    match (config.target, config.route) {
        (TargetKind::Keel, Some(Route::Spread)) => {
            let workers = spread::prepare(config, &revisions).await?;
            drive_keel(workers, config, moves).await
        }
        (TargetKind::Keel, _) => {
            let workers = keel::prepare(config, &revisions).await?;
            drive_keel(workers, config, moves).await
        }
        #[cfg(feature = "etcd")]
        (TargetKind::Etcd, _) => {
            let workers = etcd::prepare(config, &revisions).await?;
            let feeds = match config.watchers {
                0 => None,
                _ => Some(etcd::feeds(config).await?),
            };
            Ok(drive_watched(workers, feeds, config, None).await)
        }
        #[cfg(not(feature = "etcd"))]
        (TargetKind::Etcd, _) => anyhow::bail!("{}", config::ConfigError::EtcdNotBuilt),
    }
}

/// Drives Keel's workers, with a mover handing leaderships round during the measured time
/// when `moves` is given.
async fn drive_keel<W: Worker>(
    workers: Vec<W>,
    config: &Config,
    moves: Option<Arc<Moves>>,
) -> anyhow::Result<Driven> {
    let feeds = match config.watchers {
        0 => None,
        _ => Some(keel::feeds(config).await?),
    };
    let mover = match (config.move_leader_every, &moves) {
        (Some(every), Some(moves)) => {
            let client = Client::new(config.endpoints.clone(), ClientOptions::default())
                .context("keel endpoints")?;
            let start = tokio::time::Instant::now() + config.warmup;
            let end = start + config.duration;
            Some(tokio::spawn(mover::run(
                client,
                every,
                start,
                end,
                moves.clone(),
            )))
        }
        _ => None,
    };
    let driven = drive_watched(workers, feeds, config, moves).await;
    if let Some(mover) = mover {
        mover.abort();
    }
    Ok(driven)
}

/// Drives `workers` and, alongside, the watchers of `feeds`, over one measured window.
async fn drive_watched<W: Worker, F: Feed>(
    workers: Vec<W>,
    feeds: Option<Vec<F>>,
    config: &Config,
    moves: Option<Arc<Moves>>,
) -> Driven {
    let window = Window::from_now(config);
    let watchers = feeds.map(|feeds| tokio::spawn(fanout::watch(feeds, window)));
    let cpu = (!config.server_pids.is_empty())
        .then(|| tokio::spawn(server_cpu::during(config.server_pids.clone(), window)));
    let phased = driver::drive(workers, config, window, moves).await;
    let watched = match watchers {
        None => None,
        Some(task) => Some(task.await.unwrap_or_else(|error| {
            let mut tally = Tally::new();
            tally.record_error(Failure::bench(format!("the watchers failed: {error}")));
            tally
        })),
    };
    let server_cpu = match cpu {
        None => None,
        Some(task) => Some(task.await.unwrap_or_else(|error| Err(error.to_string()))),
    };
    Driven {
        phased,
        watched,
        server_cpu,
    }
}
