//! Command-line arguments and their validation into a `Config`. Pure: no I/O, no network.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use thiserror::Error;

use crate::{fanout, limits};

/// Default endpoints: those of `keel dev`, and etcd's default client port.
const KEEL_ENDPOINTS_DEFAULT: &str = "127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003";
const ETCD_ENDPOINTS_DEFAULT: &str = "127.0.0.1:2379";

/// Drive a closed-loop load against Keel or etcd and report throughput and latency.
#[derive(Debug, Clone, Parser)]
#[command(name = "keel-bench", version)]
pub struct Args {
    /// The system under load.
    #[arg(long, value_enum, default_value = "keel")]
    pub target: TargetKind,
    /// Comma-separated `host:port` list (default: keel dev's, or etcd's 127.0.0.1:2379).
    #[arg(long)]
    pub endpoints: Option<String>,
    /// The operation every client repeats.
    #[arg(long, value_enum, default_value = "put")]
    pub op: Op,
    /// Concurrent client tasks, each with one request in flight.
    #[arg(long, default_value_t = 1)]
    pub clients: usize,
    /// Client instances (each with its own connections) the tasks share round-robin. With
    /// `--route spread`: sets of one channel per endpoint.
    #[arg(long, default_value_t = 1)]
    pub connections: usize,
    /// Keel only. `leader`: through keel-client, which sends each request to its range's
    /// leader and retries. `spread`: raw gRPC calls round robin over the endpoints, which
    /// forward to the leader (`no_forward: false`), no retries, as generic clients do.
    #[arg(long, value_enum)]
    pub route: Option<Route>,
    /// Measured time: `10s`, `500ms`, `2m`, or plain seconds.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Load before measuring, not recorded.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub warmup: Duration,
    /// Bytes of every written value.
    #[arg(long, default_value_t = 256)]
    pub value_bytes: usize,
    /// Number of distinct keys; all are written before measuring (see `--no-preload`).
    #[arg(long, default_value_t = 10_000)]
    pub keyspace: usize,
    /// Zipfian key popularity with this exponent (e.g. 0.99); uniform when absent.
    #[arg(long)]
    pub zipf: Option<f64>,
    /// Share of reads (linearizable gets) in `mixed`, 0 to 1.
    #[arg(long, default_value_t = 0.5)]
    pub read_ratio: f64,
    /// Seed of the key and op choices (task i uses seed + i).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Keel only. During the measured time, hand every data range's leadership to its next
    /// voter this often (at least 2s), and report the operations that completed within 1 s
    /// of a round of moves apart from the rest.
    #[arg(long, value_parser = parse_duration)]
    pub move_leader_every: Option<Duration>,
    /// Keel only, with `--op get-follower`: read from a replica known current with its
    /// leader less than this long ago (`max_staleness_ms`; an older one catches up first).
    #[arg(long, value_parser = parse_duration)]
    pub max_staleness: Option<Duration>,
    /// With `--op put`: this many watches of every data key (prefix `bench-`), opened before
    /// the load over `--connections` clients of their own; the report adds the put events
    /// they received in the measured window and how long after its put was sent each
    /// arrived (each value carries its send time in its first 8 bytes). Keel's watches go
    /// through keel-client on both routes (any replica serves one).
    #[arg(long, default_value_t = 0)]
    pub watchers: usize,
    /// Skip writing the keyspace before the run.
    #[arg(long)]
    pub no_preload: bool,
    /// Comma-separated pids of the servers under load, on this machine (Linux): the report
    /// adds the CPU time (user + system) they spent in the measured window, and per
    /// operation.
    #[arg(long, value_delimiter = ',')]
    pub server_pids: Vec<u32>,
    /// Also write the summary as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum TargetKind {
    Keel,
    Etcd,
}

/// How Keel requests find their range's leader.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Route {
    /// keel-client's routing and retries (the default).
    Leader,
    /// Round robin over the endpoints; the servers forward.
    Spread,
}

impl Route {
    pub fn name(self) -> &'static str {
        match self {
            Route::Leader => "leader",
            Route::Spread => "spread",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Op {
    /// Put a value.
    Put,
    /// Linearizable get (Keel ReadIndex; etcd's default get).
    GetLinearizable,
    /// Keel's leader-lease get (etcd has none).
    GetLease,
    /// Keel follower get; etcd serializable get.
    GetFollower,
    /// Put conditioned on the key's last known revision (etcd: txn on mod_revision).
    Cas,
    /// Add 1 to a counter (etcd: get, then txn on mod_revision, repeated on conflict).
    Increment,
    /// Acquire and release a lock of the client's own (etcd: Lock + Unlock on a session lease).
    Lock,
    /// Acquire and release one lock all clients share (etcd: Lock + Unlock).
    LockContended,
    /// Linearizable gets and puts in the ratio `--read-ratio`.
    Mixed,
}

impl Op {
    pub fn name(self) -> &'static str {
        match self {
            Op::Put => "put",
            Op::GetLinearizable => "get-linearizable",
            Op::GetLease => "get-lease",
            Op::GetFollower => "get-follower",
            Op::Cas => "cas",
            Op::Increment => "increment",
            Op::Lock => "lock",
            Op::LockContended => "lock-contended",
            Op::Mixed => "mixed",
        }
    }
}

/// How keys are picked.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Distribution {
    Uniform,
    Zipf { exponent: f64 },
}

/// A validated run.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub target: TargetKind,
    pub endpoints: Vec<String>,
    pub op: Op,
    pub clients: usize,
    pub connections: usize,
    /// Keel's route; `None` for etcd, whose client balances over the endpoints itself.
    pub route: Option<Route>,
    pub duration: Duration,
    pub warmup: Duration,
    pub value_bytes: usize,
    pub keyspace: usize,
    pub distribution: Distribution,
    pub read_ratio: f64,
    pub seed: u64,
    pub preload: bool,
    pub move_leader_every: Option<Duration>,
    /// The staleness bound of Keel's follower gets.
    pub max_staleness: Option<Duration>,
    /// Watches of the data keys during a put run.
    pub watchers: usize,
    /// Servers whose CPU time the measured window adds up.
    pub server_pids: Vec<u32>,
    pub json: Option<PathBuf>,
}

#[derive(Debug, Clone, PartialEq, Error)]
pub enum ConfigError {
    #[error("--{name} is {value}; it must be {min} to {max}")]
    OutOfRange {
        name: &'static str,
        value: String,
        min: String,
        max: String,
    },
    #[error("--connections is {connections}; it must not exceed --clients ({clients})")]
    ConnectionsAboveClients { connections: usize, clients: usize },
    #[error("--endpoints names no endpoint")]
    NoEndpoints,
    #[error("--op {op} is not available on {target}: {reason}")]
    Unsupported {
        op: &'static str,
        target: &'static str,
        reason: &'static str,
    },
    #[error("--target etcd needs keel-bench built with `--features etcd`")]
    EtcdNotBuilt,
    #[error("--route is for keel; etcd's client balances over the endpoints itself")]
    RouteOnEtcd,
    #[error("--move-leader-every is for keel: it moves leaderships through Keel's Cluster service")]
    MovesOnEtcd,
    #[error("--max-staleness is for keel's follower gets (--target keel --op get-follower)")]
    StalenessNotFollower,
    #[error("--watchers is for put runs (--op put): the watchers time the puts' events")]
    WatchersNotPut,
}

impl Config {
    pub fn from_args(args: Args) -> Result<Config, ConfigError> {
        check_supported(args.target, args.op)?;
        check_range("clients", args.clients, 1, limits::CLIENTS_MAX)?;
        check_range("connections", args.connections, 1, limits::CONNECTIONS_MAX)?;
        if args.connections > args.clients {
            return Err(ConfigError::ConnectionsAboveClients {
                connections: args.connections,
                clients: args.clients,
            });
        }
        check_duration("duration", args.duration, limits::DURATION_MAX)?;
        if args.warmup > limits::WARMUP_MAX {
            return Err(out_of_range(
                "warmup",
                args.warmup,
                "0s",
                limits::WARMUP_MAX,
            ));
        }
        check_range("value-bytes", args.value_bytes, 1, limits::VALUE_BYTES_MAX)?;
        check_range("keyspace", args.keyspace, 1, limits::KEYSPACE_MAX)?;
        let distribution = distribution(args.zipf)?;
        if !(0.0..=1.0).contains(&args.read_ratio) {
            return Err(out_of_range("read-ratio", args.read_ratio, 0, 1));
        }
        let endpoints = endpoints(args.target, args.endpoints.as_deref())?;
        let route = match (args.target, args.route) {
            (TargetKind::Keel, route) => Some(route.unwrap_or(Route::Leader)),
            (TargetKind::Etcd, None) => None,
            (TargetKind::Etcd, Some(_)) => return Err(ConfigError::RouteOnEtcd),
        };
        if let Some(every) = args.move_leader_every {
            if args.target == TargetKind::Etcd {
                return Err(ConfigError::MovesOnEtcd);
            }
            if every < limits::MOVE_LEADER_EVERY_MIN || every > limits::DURATION_MAX {
                return Err(out_of_range(
                    "move-leader-every",
                    every,
                    limits::MOVE_LEADER_EVERY_MIN,
                    limits::DURATION_MAX,
                ));
            }
        }
        if let Some(bound) = args.max_staleness {
            if args.target != TargetKind::Keel || args.op != Op::GetFollower {
                return Err(ConfigError::StalenessNotFollower);
            }
            if bound > limits::MAX_STALENESS_MAX {
                let max = limits::MAX_STALENESS_MAX;
                return Err(out_of_range("max-staleness", bound, "0s", max));
            }
        }
        check_range("watchers", args.watchers, 0, limits::WATCHERS_MAX)?;
        let servers = args.server_pids.len();
        check_range("server-pids count", servers, 0, limits::SERVER_PIDS_MAX)?;
        if args.watchers > 0 {
            if args.op != Op::Put {
                return Err(ConfigError::WatchersNotPut);
            }
            let (min, max) = (fanout::STAMP_BYTES, limits::VALUE_BYTES_MAX);
            check_range("value-bytes", args.value_bytes, min, max)?;
        }
        Ok(Config {
            target: args.target,
            endpoints,
            op: args.op,
            clients: args.clients,
            connections: args.connections,
            route,
            duration: args.duration,
            warmup: args.warmup,
            value_bytes: args.value_bytes,
            keyspace: args.keyspace,
            distribution,
            read_ratio: args.read_ratio,
            seed: args.seed,
            preload: !args.no_preload,
            move_leader_every: args.move_leader_every,
            max_staleness: args.max_staleness,
            watchers: args.watchers,
            server_pids: args.server_pids,
            json: args.json,
        })
    }
}

/// Parses `10s`, `250ms`, `2m`, `1h` or plain seconds (`humantime` would refuse a plain
/// number, which the bench's flags and scripts accept).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration (e.g. 10s, 500ms, 2m)"))?;
    let millis_per_unit = match unit {
        "ms" => 1,
        "" | "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => {
            return Err(format!(
                "{text:?}: unknown unit {unit:?}; use ms, s, m or h"
            ));
        }
    };
    number
        .checked_mul(millis_per_unit)
        .map(Duration::from_millis)
        .ok_or_else(|| format!("{text:?} is too long"))
}

/// Which operations each target can run, and why not.
fn check_supported(target: TargetKind, op: Op) -> Result<(), ConfigError> {
    let reason = match (target, op) {
        (TargetKind::Etcd, Op::GetLease) => "etcd has no leader-lease reads",
        (TargetKind::Etcd, _) if !cfg!(feature = "etcd") => return Err(ConfigError::EtcdNotBuilt),
        _ => return Ok(()),
    };
    Err(ConfigError::Unsupported {
        op: op.name(),
        target: match target {
            TargetKind::Keel => "keel",
            TargetKind::Etcd => "etcd",
        },
        reason,
    })
}

fn distribution(zipf: Option<f64>) -> Result<Distribution, ConfigError> {
    match zipf {
        None => Ok(Distribution::Uniform),
        Some(exponent) if exponent > 0.0 && exponent <= limits::ZIPF_EXPONENT_MAX => {
            Ok(Distribution::Zipf { exponent })
        }
        Some(exponent) => Err(out_of_range(
            "zipf",
            exponent,
            "above 0",
            limits::ZIPF_EXPONENT_MAX,
        )),
    }
}

fn endpoints(target: TargetKind, given: Option<&str>) -> Result<Vec<String>, ConfigError> {
    let text = given.unwrap_or(match target {
        TargetKind::Keel => KEEL_ENDPOINTS_DEFAULT,
        TargetKind::Etcd => ETCD_ENDPOINTS_DEFAULT,
    });
    let endpoints: Vec<String> = text
        .split(',')
        .map(str::trim)
        .filter(|endpoint| !endpoint.is_empty())
        .map(str::to_string)
        .collect();
    match endpoints.is_empty() {
        true => Err(ConfigError::NoEndpoints),
        false => Ok(endpoints),
    }
}

fn check_range(
    name: &'static str,
    value: usize,
    min: usize,
    max: usize,
) -> Result<(), ConfigError> {
    match (min..=max).contains(&value) {
        true => Ok(()),
        false => Err(out_of_range(name, value, min, max)),
    }
}

fn check_duration(name: &'static str, value: Duration, max: Duration) -> Result<(), ConfigError> {
    match !value.is_zero() && value <= max {
        true => Ok(()),
        false => Err(out_of_range(name, value, "1ms", max)),
    }
}

fn out_of_range(
    name: &'static str,
    value: impl std::fmt::Debug,
    min: impl std::fmt::Debug,
    max: impl std::fmt::Debug,
) -> ConfigError {
    let text = |v: String| v.trim_matches('"').to_string();
    ConfigError::OutOfRange {
        name,
        value: text(format!("{value:?}")),
        min: text(format!("{min:?}")),
        max: text(format!("{max:?}")),
    }
}

#[cfg(test)]
mod tests;
