//! `keel serve`: start a node from flags and file (logging as they say), run until
//! SIGTERM/SIGINT or a fatal failure, then shut down in order. Knows nothing of request
//! handling.

use anyhow::Context;
use keel_storage::StorageError;
use tracing::{error, info};

use crate::config::{NodeConfig, ServeArgs};
use crate::node::Node;

/// Runs a node until a signal (then exits cleanly) or until it stops serving (then returns an
/// error, so the process exits non-zero).
pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    let config = NodeConfig::from_args(&args)?;
    crate::config::logging::init(&config.log)?;
    #[cfg(feature = "planted-bugs")]
    if let Some(name) = &args.planted_bug {
        plant(name)?;
    }
    let node = Node::start(config).await?;
    let outcome = tokio::select! {
        signal = shutdown_signal() => signal.map(|name| info!(signal = name, "shutting down")),
        reason = node.failed() => {
            error!(%reason, "node stopped serving; exiting");
            Err(anyhow::anyhow!("node stopped serving: {reason}"))
        }
    };
    let stopped = node.shutdown().await;
    match (outcome, stopped) {
        (Err(error), Err(shutdown)) => {
            error!(%shutdown, "shutdown after failure");
            Err(error)
        }
        (Err(error), Ok(())) | (Ok(()), Err(error)) => Err(error),
        (Ok(()), Ok(())) => Ok(()),
    }
}

/// Whether `error` (from `run`) is a store that failed its checks when the node opened it
/// (`StorageError::Damaged`): the node must not serve from its data dir, and restarting it
/// will not help. `keel serve` exits with its own code for it.
pub fn data_damaged(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        matches!(
            cause.downcast_ref::<StorageError>(),
            Some(StorageError::Damaged { .. })
        )
    })
}

/// Plants the bug `name` in this process (test-only; see `keel_types::planted`).
#[cfg(feature = "planted-bugs")]
fn plant(name: &str) -> anyhow::Result<()> {
    use keel_types::planted::{self, PlantedBug};
    let names: Vec<&str> = PlantedBug::ALL.iter().map(|bug| bug.name()).collect();
    let bug = PlantedBug::from_name(name).ok_or_else(|| {
        anyhow::anyhow!("unknown planted bug {name:?}; known: {}", names.join(", "))
    })?;
    planted::plant(bug).map_err(anyhow::Error::msg)?;
    tracing::warn!(
        bug = name,
        "planted bug active: this node breaks a guarantee on purpose"
    );
    Ok(())
}

/// Waits for SIGTERM or SIGINT and names it.
async fn shutdown_signal() -> anyhow::Result<&'static str> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut terminate = signal(SignalKind::terminate()).context("listening for SIGTERM")?;
    let mut interrupt = signal(SignalKind::interrupt()).context("listening for SIGINT")?;
    tokio::select! {
        _ = terminate.recv() => Ok("SIGTERM"),
        _ = interrupt.recv() => Ok("SIGINT"),
    }
}
