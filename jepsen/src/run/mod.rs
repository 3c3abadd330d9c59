//! `keel-jepsen run`: starts a cluster of real `keel serve` processes (in a network namespace
//! of its own when root, else behind the runner's proxies), runs a workload's clients and the
//! nemesis side by side, heals, waits, reads every key, and leaves history.jsonl,
//! faults.jsonl and run.json in the run directory for `check`. Talks to the cluster only
//! through keel-client, the raw calls of `--clients spread` (`spread`) and the processes'
//! command lines; knows nothing of how checkers work.

pub mod clock;
pub mod cluster;
pub mod damage;
#[cfg(feature = "etcd")]
pub mod etcd;
pub mod listeners;
pub mod nemesis;
pub mod net;
pub mod netns;
pub mod outcome;
pub mod plan;
pub mod proxy;
pub mod recorder;
pub mod rng;
pub mod spread;
pub mod topology;
pub mod workload;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use keel_client::{Client, ClientOptions};
use keel_types::Consistency;
use serde_json::json;

use crate::check::{FAULTS_FILE, HISTORY_FILE, RANGES_FILE, RUN_SPEC_FILE};
use crate::limits;
use crate::replicas::{self, REPLICAS_FILE};
use crate::run::clock::RunClock;
use crate::run::cluster::Cluster;
use crate::run::nemesis::{Nemesis, Parts};
use crate::run::net::Network;
use crate::run::netns::Namespace;
use crate::run::plan::{FaultKind, PlannedFault};
use crate::run::recorder::Recorder;
use crate::run::spread::ClientMode;
use crate::run::topology::RangeLog;
use crate::run::workload::{ClientPlan, Members, Workload, WorkloadKind};

/// How long a fresh cluster may take to serve its first linearizable read.
pub const READY_WAIT: Duration = Duration::from_secs(30);
/// Pause between two readiness probes.
pub const READY_POLL: Duration = Duration::from_millis(200);
/// Quiet time after healing, before the final reads.
pub const RECOVERY_WAIT: Duration = Duration::from_secs(5);
/// Ops per second the clients may be asked for, all together.
pub const RATE_HZ_MAX: u32 = 10_000;
/// Longest run.
pub const TIME_LIMIT_S_MAX: u64 = 24 * 3600;
/// Clients at most.
pub const CONCURRENCY_MAX: usize = 256;
/// Nodes at most, spares included (loopback aliases 127.0.0.11 to 127.0.0.(10+n)).
pub const NODES_MAX: usize = 9;
/// Ranges the workload's keys may be spread over.
pub const RANGES_MAX: usize = workload::SHARDS_MAX;
/// Nodes the `move` and `membership` faults need: more than a range has replicas (3).
pub const NODES_FOR_MOVES: usize = 4;

/// Where partitions come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isolation {
    /// A network namespace with iptables (root).
    Namespace,
    /// The runner's TCP proxies (no root needed).
    Proxy,
}

/// What `keel-jepsen run` was asked to do.
#[derive(Debug, Clone)]
pub struct RunConfig {
    pub workload: WorkloadKind,
    /// How the workload clients reach the cluster; `Spread` for register and follower-read
    /// only.
    pub clients: ClientMode,
    pub nemesis: Vec<FaultKind>,
    pub nodes: usize,
    /// Ranges the keyspace is split into before the workload starts.
    pub ranges: usize,
    pub time_limit_s: u64,
    pub rate_hz: u32,
    pub concurrency: usize,
    pub seed: u64,
    pub out: PathBuf,
    pub keel: PathBuf,
    pub planted_bug: Option<String>,
    /// `keel serve --fault-response-loss-percent`: answers of mutations dropped after
    /// applying them, so clients retry more (0 = flag not passed).
    pub response_loss_percent: u32,
    /// Never use a namespace, even as root.
    pub no_netns: bool,
    /// Aim every `kill` and `partition` at the leader (`plan::at_leader`).
    pub leader_faults: bool,
    /// Quiet time between two faults at least this long (`plan::spaced`); 0 = as planned.
    pub fault_gap_ms_min: u64,
}

/// What the runner says about a finished run.
#[derive(Debug, Clone)]
pub struct RunSummary {
    pub isolation: Isolation,
    pub ops: u64,
    pub faults: usize,
    pub elapsed: Duration,
}

/// Runs the whole thing on this thread: picks the isolation, makes and enters the namespace
/// when it can (before any other thread starts, so all of them are inside), runs the cluster
/// and the clients on a fresh runtime, and removes the namespace whatever happened,
/// including on SIGINT/SIGTERM.
pub fn run_blocking(config: &RunConfig) -> anyhow::Result<RunSummary> {
    validate(config)?;
    let started = Instant::now();
    let isolation = match (config.no_netns, netns::unavailable()) {
        (true, _) => Isolation::Proxy,
        (false, Some(reason)) => {
            eprintln!(
                "keel-jepsen: no network namespace ({reason}); partitions through the TCP proxy"
            );
            Isolation::Proxy
        }
        (false, None) => Isolation::Namespace,
    };
    let namespace = match isolation {
        Isolation::Namespace => {
            let aliases: Vec<_> = (0..slots(config)).map(net::alias).collect();
            let namespace = Namespace::create(&aliases)?;
            namespace.enter()?;
            Some(namespace)
        }
        Isolation::Proxy => None,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    let outcome = runtime.block_on(async {
        tokio::select! {
            outcome = run(config, isolation) => outcome,
            signal = interrupted() => Err(anyhow::anyhow!("interrupted by {signal}; the cluster was stopped")),
        }
    });
    // Dropping the runtime kills the nodes (kill_on_drop) before the namespace goes.
    drop(runtime);
    drop(namespace);
    let (ops, faults) = outcome?;
    Ok(RunSummary {
        isolation,
        ops,
        faults,
        elapsed: started.elapsed(),
    })
}

/// What `--clients etcd` answers in a build without the `etcd` feature.
pub const ETCD_NOT_BUILT: &str = "--clients etcd needs keel-jepsen built with the etcd feature: \
     PROTOC=$(bench/protoc-path.sh) cargo build --release -p keel-jepsen --features etcd";

fn validate(config: &RunConfig) -> anyhow::Result<()> {
    if config.clients == ClientMode::Etcd {
        if !cfg!(feature = "etcd") {
            bail!(ETCD_NOT_BUILT);
        }
        if !matches!(
            config.workload,
            WorkloadKind::Register | WorkloadKind::Watch
        ) {
            bail!(
                "--clients etcd is for the register and watch workloads; {} runs its clients \
                 through keel-client only (--clients routed)",
                config.workload.as_str()
            );
        }
        if config.no_netns {
            bail!("--clients etcd needs a network namespace (run as root, without --no-netns)");
        }
        if config.nemesis.contains(&FaultKind::Split) {
            bail!(
                "--nemesis split has nothing to split with --clients etcd: the workload's keys \
                 are in etcd's namespace, which Keel keeps in one range that never splits"
            );
        }
    }
    if config.clients == ClientMode::Spread && !spreads(config.workload) {
        bail!(
            "--clients spread is for the register and follower-read workloads; {} runs its \
             clients through keel-client only (--clients routed)",
            config.workload.as_str()
        );
    }
    if !(1..=NODES_MAX).contains(&config.nodes) {
        bail!("--nodes is {}; it must be 1 to {NODES_MAX}", config.nodes);
    }
    if !(1..=RANGES_MAX).contains(&config.ranges) {
        bail!(
            "--ranges is {}; it must be 1 to {RANGES_MAX}",
            config.ranges
        );
    }
    for kind in [FaultKind::Move, FaultKind::Membership] {
        if config.nemesis.contains(&kind) && config.nodes < NODES_FOR_MOVES {
            bail!(
                "--nemesis {kind} needs at least {NODES_FOR_MOVES} nodes (a node without a \
                 replica to move one to); --nodes is {}",
                config.nodes
            );
        }
    }
    if !(1..=TIME_LIMIT_S_MAX).contains(&config.time_limit_s) {
        bail!(
            "--time-limit is {} s; it must be 1 to {TIME_LIMIT_S_MAX} s",
            config.time_limit_s
        );
    }
    if !(1..=RATE_HZ_MAX).contains(&config.rate_hz) {
        bail!(
            "--rate is {} ops/s; it must be 1 to {RATE_HZ_MAX}",
            config.rate_hz
        );
    }
    if !(1..=CONCURRENCY_MAX).contains(&config.concurrency) {
        bail!(
            "--concurrency is {}; it must be 1 to {CONCURRENCY_MAX}",
            config.concurrency
        );
    }
    if config.response_loss_percent > 100 {
        bail!(
            "--response-loss-percent is {}; it must be 0 to 100",
            config.response_loss_percent
        );
    }
    if std::fs::read_dir(&config.out).is_ok_and(|mut entries| entries.next().is_some()) {
        bail!(
            "--out {} is not empty: its nodes would start on an earlier run's data, and the \
             history would not be this run's alone; name a new directory or remove it",
            config.out.display()
        );
    }
    if !config.keel.is_file() {
        bail!(
            "no keel binary at {}; build it with\n  cargo build --release --bin keel --features keel-cli/fault-injection,keel-cli/planted-bugs\nor name one with --keel PATH",
            config.keel.display()
        );
    }
    Ok(())
}

async fn interrupted() -> &'static str {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut int), Ok(mut term)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = int.recv() => "SIGINT",
        _ = term.recv() => "SIGTERM",
    }
}

/// The run itself; returns (ops recorded, faults recorded).
async fn run(config: &RunConfig, isolation: Isolation) -> anyhow::Result<(u64, usize)> {
    std::fs::create_dir_all(&config.out)
        .with_context(|| format!("creating {}", config.out.display()))?;
    write_run_spec(config, isolation)?;
    let (network, mut addresses) = match isolation {
        Isolation::Namespace => net::in_namespace(slots(config)),
        Isolation::Proxy => net::proxied(slots(config))
            .await
            .context("starting the proxies")?,
    };
    if config.clients == ClientMode::Etcd {
        if isolation == Isolation::Proxy {
            bail!("--clients etcd needs a network namespace (run as root)");
        }
        for address in &mut addresses {
            address.etcd = Some(SocketAddr::new(address.listen.ip(), net::ETCD_PORT));
        }
    }
    let endpoints: Vec<String> = addresses
        .iter()
        .map(|address| address.cluster.to_string())
        .collect();
    let mut cluster = Cluster::new(
        &config.keel,
        &addresses,
        config.nodes,
        &config.out,
        &serve_flags(config),
    );
    cluster.start_all()?;
    let members = &endpoints[..config.nodes];
    wait_ready(&mut cluster, members).await?;
    eprintln!(
        "keel-jepsen: {} nodes up ({}); {} for {} s",
        config.nodes,
        network.describe(),
        config.workload.as_str(),
        config.time_limit_s
    );
    drive(config, cluster, network, endpoints).await
}

/// The nemesis plan of a run: a pure function of its settings.
fn schedule(config: &RunConfig) -> Vec<PlannedFault> {
    let faults = plan::plan(
        config.seed,
        &config.nemesis,
        config.nodes,
        config.time_limit_s * 1000,
    );
    let faults = match config.leader_faults {
        true => plan::at_leader(faults),
        false => faults,
    };
    match config.fault_gap_ms_min {
        0 => faults,
        gap_ms_min => plan::spaced(faults, gap_ms_min, config.time_limit_s * 1000),
    }
}

/// Nodes of the run, spares for the nodes the plan adds or replaces included.
fn slots(config: &RunConfig) -> usize {
    config.nodes + plan::spare_nodes(&schedule(config), config.nodes, NODES_MAX)
}

/// Splits the keyspace when asked for more than one range, then clients and nemesis side by
/// side until the time limit (the range table polled meanwhile), then heal, wait, final
/// reads.
async fn drive(
    config: &RunConfig,
    cluster: Cluster,
    network: Network,
    all_endpoints: Vec<String>,
) -> anyhow::Result<(u64, usize)> {
    let endpoints = all_endpoints[..config.nodes].to_vec();
    let history = Arc::new(Recorder::create(
        &config.out.join(HISTORY_FILE),
        limits::HISTORY_OPS_MAX,
    )?);
    let faults = Recorder::create(&config.out.join(FAULTS_FILE), limits::FAULT_EVENTS_MAX)?;
    let clock = RunClock::start();
    let ranges = Arc::new(RangeLog::create(&config.out.join(RANGES_FILE), clock)?);
    let workload = Arc::new(Workload::new(
        config.workload,
        config.ranges,
        config.clients,
    ));
    let admin = Client::new(endpoints.clone(), ClientOptions::default())?;
    if config.ranges > 1 {
        let points = workload::split_points(&workload.families(), config.ranges);
        let table = topology::prepare(&admin, &points).await?;
        eprintln!("keel-jepsen: {} ranges", table.len());
    }
    ranges.read(&admin, "start").await;
    let members = Arc::new(Members::first(config.nodes));
    let parts = Parts {
        endpoints: all_endpoints.clone(),
        members: members.clone(),
        clock,
        faults,
        workload: workload.clone(),
        ranges: ranges.clone(),
    };
    let mut nemesis = Nemesis::new(cluster, network, parts)?;
    let end = Duration::from_secs(config.time_limit_s);
    let schedule = schedule(config);
    let client_plan = ClientPlan {
        mode: config.clients,
        concurrency: config.concurrency,
        rate_hz: config.rate_hz,
        end,
        ops_max: ops_max(config),
        seed: config.seed,
    };
    // The watch workload's watchers run from before the first write to the final reads.
    let watchers = match config.workload {
        WorkloadKind::Watch => Some(workload::watch::start(
            &endpoints,
            config.clients,
            config.concurrency as u64 * 2_000_000,
            clock,
            history.clone(),
        )?),
        _ => None,
    };
    let clients = workload::run_clients(
        workload.clone(),
        &all_endpoints,
        &members,
        &client_plan,
        clock,
        history.clone(),
    );
    let (ops, faulted, ()) = tokio::join!(
        clients,
        nemesis.run(&schedule, end),
        ranges.poll(&admin, end)
    );
    faulted?;
    let mut ops = ops?;
    nemesis.heal_all().await?;
    tokio::time::sleep(RECOVERY_WAIT).await;
    if let Some(watchers) = watchers {
        ops += watchers.finish(&workload, clock, &history).await;
    }
    ops += workload::final_reads(
        &workload,
        &all_endpoints,
        &members,
        config.concurrency as u64 * 1_000_000,
        clock,
        &history,
    )
    .await?;
    let replicas = nemesis.replica_report().await;
    replicas::write(&config.out.join(REPLICAS_FILE), &replicas)?;
    for (index, status) in nemesis.cluster.exited() {
        eprintln!(
            "keel-jepsen: warning: node {} exited on its own ({status}); {}",
            cluster::node_name(index),
            nemesis.cluster.log_tail(index)
        );
    }
    let faults = nemesis.finish().await?;
    history.finish().map_err(anyhow::Error::msg)?;
    Ok((ops, faults))
}

/// Ops of all clients together: twice what the rate asks for over the time limit, within the
/// history limit.
fn ops_max(config: &RunConfig) -> u64 {
    let asked = u64::from(config.rate_hz) * config.time_limit_s * 2;
    asked.min(limits::HISTORY_OPS_MAX as u64 / 2)
}

/// Flags every `keel serve` of the run gets beyond its address and data.
fn serve_flags(config: &RunConfig) -> Vec<String> {
    let mut flags = Vec::new();
    if let Some(bug) = &config.planted_bug {
        flags.extend(["--planted-bug".to_string(), bug.clone()]);
    }
    if config.response_loss_percent > 0 {
        flags.extend([
            "--fault-response-loss-percent".to_string(),
            config.response_loss_percent.to_string(),
        ]);
    }
    if lose_unsynced_writes(config) {
        flags.push("--fault-lose-unsynced-writes".to_string());
    }
    if replaces_dead_nodes(config) {
        flags.extend([
            "--node-dead-after-ms".to_string(),
            plan::DEAD_AFTER_MS.to_string(),
        ]);
    }
    if checks_often(config) {
        flags.extend([
            "--consistency-check-interval-ms".to_string(),
            plan::CHECK_INTERVAL_MS.to_string(),
        ]);
    }
    flags
}

/// Whether the nodes check their ranges' replicas every `plan::CHECK_INTERVAL_MS` rather than
/// daily: runs with faults that damage a replica's data (`corrupt`, `disk`), whose checks
/// must find and repair it while the workload runs.
fn checks_often(config: &RunConfig) -> bool {
    config.nemesis.contains(&FaultKind::Corrupt) || config.nemesis.contains(&FaultKind::Disk)
}

/// Whether `--clients spread` is implemented for `workload`: the workloads of single-key gets
/// and puts, which a generic client sends as they are.
pub fn spreads(workload: WorkloadKind) -> bool {
    matches!(
        workload,
        WorkloadKind::Register | WorkloadKind::FollowerRead
    )
}

/// Whether nodes are declared dead after `plan::DEAD_AFTER_MS` rather than the default 5
/// minutes, so their replicas are re-created elsewhere within a fault's hold: runs with
/// `membership` (outages) or `disk` (a damaged node refuses to start) faults.
pub fn replaces_dead_nodes(config: &RunConfig) -> bool {
    config.nemesis.contains(&FaultKind::Membership) || config.nemesis.contains(&FaultKind::Disk)
}

/// Whether nodes keep storage writes in memory until synced (`--fault-lose-unsynced-writes`),
/// so that `kill-all` loses what was not synced, as a power loss would. Only `kill-all` asks
/// for it: a single kill leaves a majority whose data a lost write is repaired from anyway.
pub fn lose_unsynced_writes(config: &RunConfig) -> bool {
    config.nemesis.contains(&FaultKind::KillAll)
}

/// Waits until a linearizable read succeeds; fails early if a node exits.
async fn wait_ready(cluster: &mut Cluster, endpoints: &[String]) -> anyhow::Result<()> {
    let options = ClientOptions {
        request_timeout: READY_POLL * 5,
        read_attempt_timeout: READY_POLL * 5,
        ..ClientOptions::default()
    };
    let client = Client::new(endpoints.to_vec(), options)?;
    let deadline = tokio::time::Instant::now() + READY_WAIT;
    loop {
        if let Some((index, status)) = cluster.exited().into_iter().next() {
            bail!(
                "node {} exited at start ({status}); {}",
                cluster::node_name(index),
                cluster.log_tail(index)
            );
        }
        let probe = client
            .get(b"keel-jepsen-ready", Consistency::Linearizable)
            .await;
        if probe.is_ok() {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            bail!(
                "the cluster did not serve a linearizable read within {} s (last error: {}); {}",
                READY_WAIT.as_secs(),
                probe.err().map(|e| e.to_string()).unwrap_or_default(),
                cluster.log_tail(0)
            );
        }
        tokio::time::sleep(READY_POLL).await;
    }
}

fn write_run_spec(config: &RunConfig, isolation: Isolation) -> anyhow::Result<()> {
    let spec = json!({
        "workload": config.workload.as_str(),
        "clients": config.clients.as_str(),
        "nemesis": config.nemesis.iter().map(|kind| kind.as_str()).collect::<Vec<_>>(),
        "nodes": config.nodes,
        "spare_nodes": slots(config) - config.nodes,
        "ranges": config.ranges,
        "seed": config.seed,
        "time_limit_s": config.time_limit_s,
        "rate_hz": config.rate_hz,
        "concurrency": config.concurrency,
        "planted_bug": config.planted_bug,
        "response_loss_percent": config.response_loss_percent,
        "leader_faults": config.leader_faults,
        "fault_gap_ms_min": config.fault_gap_ms_min,
        "lose_unsynced_writes": lose_unsynced_writes(config),
        "node_dead_after_ms": replaces_dead_nodes(config).then_some(plan::DEAD_AFTER_MS),
        "keel": config.keel.display().to_string(),
        "keel_version": keel_version(&config.keel),
        "runner_version": env!("CARGO_PKG_VERSION"),
        "isolation": match isolation {
            Isolation::Namespace => "netns",
            Isolation::Proxy => "proxy",
        },
    });
    let path = config.out.join(RUN_SPEC_FILE);
    let text = serde_json::to_string_pretty(&spec).expect("run.json always serializes");
    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))
}

/// `keel --version`, or null when it cannot be asked.
fn keel_version(binary: &Path) -> Option<String> {
    let output = std::process::Command::new(binary)
        .arg("--version")
        .output()
        .ok()?;
    Some(String::from_utf8_lossy(&output.stdout).trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(nemesis: Vec<FaultKind>) -> RunConfig {
        RunConfig {
            workload: WorkloadKind::Register,
            clients: ClientMode::Routed,
            nemesis,
            nodes: 3,
            ranges: 1,
            time_limit_s: 10,
            rate_hz: 10,
            concurrency: 1,
            seed: 1,
            out: PathBuf::from("/nonexistent"),
            keel: PathBuf::from("/nonexistent"),
            planted_bug: None,
            response_loss_percent: 0,
            no_netns: true,
            leader_faults: false,
            fault_gap_ms_min: 0,
        }
    }

    #[test]
    fn only_kill_all_runs_lose_unsynced_writes() {
        let flag = "--fault-lose-unsynced-writes".to_string();
        let cases = [
            (vec![], false),
            (vec![FaultKind::Kill, FaultKind::Partition], false),
            (vec![FaultKind::KillAll], true),
            (vec![FaultKind::Partition, FaultKind::KillAll], true),
        ];
        for (nemesis, expected) in cases {
            let config = config(nemesis);
            assert_eq!(
                lose_unsynced_writes(&config),
                expected,
                "{:?}",
                config.nemesis
            );
            assert_eq!(serve_flags(&config).contains(&flag), expected);
        }
    }

    #[test]
    fn etcd_clients_run_the_register_workload_in_a_namespace() {
        let refusal = |workload, no_netns| {
            let config = RunConfig {
                workload,
                clients: ClientMode::Etcd,
                no_netns,
                ..config(vec![])
            };
            validate(&config).unwrap_err().to_string()
        };
        if !cfg!(feature = "etcd") {
            let error = refusal(WorkloadKind::Register, false);
            assert!(error.contains("the etcd feature"), "{error}");
            return;
        }
        let error = refusal(WorkloadKind::Append, false);
        assert!(
            error.contains("for the register and watch workloads"),
            "{error}"
        );
        let error = refusal(WorkloadKind::Register, true);
        assert!(error.contains("network namespace"), "{error}");
        let split = RunConfig {
            clients: ClientMode::Etcd,
            no_netns: false,
            ..config(vec![FaultKind::Kill, FaultKind::Split])
        };
        let error = validate(&split).unwrap_err().to_string();
        assert!(error.contains("never splits"), "{error}");
        // The keel binary is checked last: the register workload gets past the mode.
        let error = refusal(WorkloadKind::Register, false);
        assert!(!error.contains("--clients etcd"), "{error}");
    }

    #[test]
    fn only_register_and_follower_read_spread() {
        let all = [
            WorkloadKind::Register,
            WorkloadKind::Append,
            WorkloadKind::Counter,
            WorkloadKind::FollowerRead,
            WorkloadKind::Fencing,
            WorkloadKind::Idempotency,
        ];
        for workload in all {
            let config = RunConfig {
                workload,
                clients: ClientMode::Spread,
                ..config(vec![])
            };
            // The keel binary is checked last: a workload that spreads gets past the mode.
            let error = validate(&config).unwrap_err().to_string();
            let refused = error.contains("--clients spread is for the register");
            assert_eq!(refused, !spreads(workload), "{workload:?}: {error}");
        }
    }
}
