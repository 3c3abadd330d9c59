//! `keel restore`: runs `keel_server::restore` (its one other use of keel-server, beside
//! `serve`) with a progress line on a terminal, and prints what it made. Offline: talks to no
//! cluster.

use keel_server::{RestoreArgs, RestoreError, RestoreProgress};

use crate::output::backup::{progress, restored};
use crate::output::{Output, Report, code};
use crate::progress::Progress;

/// Restores, prints, and returns the exit code.
pub async fn run(args: RestoreArgs, output: Output) -> u8 {
    let listen = keel_server::parse_initial_cluster(&args.initial_cluster)
        .ok()
        .and_then(|cluster| cluster.get(&args.node_id).cloned())
        .unwrap_or_else(|| "HOST:PORT".to_string());
    let serve = format!(
        "keel serve --node-id {} --listen {listen} --data-dir {} --initial-cluster {}",
        args.node_id,
        args.data_dir.display(),
        args.initial_cluster
    );
    let dir = args.data_dir.display().to_string();
    let mut line = Progress::on_stderr();
    let shown = |state: RestoreProgress| {
        let text = progress(
            state.ranges_done,
            state.ranges_total,
            state.bytes_done,
            Some(state.bytes_total),
        );
        line.show(&format!("restore: {text}"), true);
    };
    let outcome = keel_server::restore(args, shown).await;
    line.clear();
    let report = match outcome {
        Ok(summary) => {
            let ranges: Vec<_> = summary.ranges.into_iter().zip(summary.revisions).collect();
            restored(&dir, &ranges, summary.snapshot_bytes, &serve, output)
        }
        Err(error) => {
            let exit = match &error {
                RestoreError::Refused(_) => code::USAGE,
                RestoreError::Failed(_) => code::UNAVAILABLE,
            };
            Report {
                stdout: Vec::new(),
                stderr: format!("error: keel restore: {error}"),
                code: exit,
            }
        }
    };
    crate::commands::print(&report)
}
