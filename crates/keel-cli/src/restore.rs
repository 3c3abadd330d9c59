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
        .and_then(|cluster| cluster.get(&args.node_id).map(|addr| listen_on(addr)))
        .unwrap_or_else(|| "IP:PORT".to_string());
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

/// What `--listen` takes for a node the cluster knows at `addr`: the address itself when it
/// names an IP, else every interface on its port (`serve` listens on an IP, not a name).
fn listen_on(addr: &str) -> String {
    if addr.parse::<std::net::SocketAddr>().is_ok() {
        return addr.to_string();
    }
    match addr.rsplit_once(':') {
        Some((_, port)) => format!("0.0.0.0:{port}"),
        None => "IP:PORT".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::listen_on;

    #[test]
    fn the_printed_listen_address_is_one_serve_takes() {
        assert_eq!(listen_on("127.0.0.1:7101"), "127.0.0.1:7101");
        assert_eq!(listen_on("[::1]:7101"), "[::1]:7101");
        assert_eq!(listen_on("localhost:7101"), "0.0.0.0:7101");
        assert_eq!(listen_on("keel-0.keel:7001"), "0.0.0.0:7001");
    }
}
