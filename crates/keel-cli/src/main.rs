//! The `keel` binary: `serve` one node, run a local `dev` cluster, or talk to a cluster
//! (`put`, `get`, `del`, `cas`, `incr`, `scan`, `lock ...`, `idem ...`, `cluster status`,
//! `cluster ranges`, `cluster split`, `backup`), or make a restored node's data dir
//! (`restore`, offline).
//! Its only server-side dependencies are `keel_server::{ServeArgs, run, data_damaged}` and
//! `keel_server::{RestoreArgs, restore}`; the client commands use keel-client alone (and
//! `backup` keel-backup for its file).

mod args;
mod commands;
mod dev;
mod duration;
mod input;
mod output;
mod progress;
mod restore;

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;
use tracing_subscriber::EnvFilter;

use crate::args::{Cli, Command};
use crate::output::code;

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Err(error) = args::check(&cli, std::io::stdin().is_terminal()) {
        error.exit();
    }
    // `keel serve` sets up its logs from its configuration (`--log-format`, `--log-level`).
    if !matches!(cli.command, Command::Serve(_)) {
        init_tracing(&cli.command);
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: starting the async runtime: {error}");
            return ExitCode::from(code::UNAVAILABLE);
        }
    };
    ExitCode::from(runtime.block_on(run(cli)))
}

async fn run(cli: Cli) -> u8 {
    match cli.command {
        Command::Serve(args) => match keel_server::run(*args).await {
            Ok(()) => code::OK,
            Err(error) => {
                eprintln!("error: keel serve: {error:#}");
                if keel_server::data_damaged(&error) {
                    code::DATA_DAMAGED
                } else {
                    code::UNAVAILABLE
                }
            }
        },
        Command::Dev(args) => match dev::run(args).await {
            Ok(()) => code::OK,
            Err(error) => {
                eprintln!("error: keel dev: {error:#}");
                code::UNAVAILABLE
            }
        },
        Command::Restore(args) => restore::run(args, cli.global.output).await,
        command => commands::run(&cli.global, command).await,
    }
}

/// Logs go to stderr, filtered by `RUST_LOG`; `keel dev` logs `info` by default, the client
/// commands only warnings.
fn init_tracing(command: &Command) {
    let default = match command {
        Command::Dev(_) => "info",
        _ => "warn",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}
