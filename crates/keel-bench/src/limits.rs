//! Every bound of the load generator, in one place. Plain constants; no logic.

use std::time::Duration;

/// Most concurrent client tasks.
pub const CLIENTS_MAX: usize = 4_096;
/// Most client instances (connections) the tasks share.
pub const CONNECTIONS_MAX: usize = 256;
/// Most watches of a fan-out run (`--watchers`).
pub const WATCHERS_MAX: usize = 10_000;
/// Longest measured phase.
pub const DURATION_MAX: Duration = Duration::from_secs(60 * 60);
/// Longest warm-up.
pub const WARMUP_MAX: Duration = Duration::from_secs(10 * 60);
/// Largest `--max-staleness`: Keel's own limit.
pub const MAX_STALENESS_MAX: Duration =
    Duration::from_millis(keel_types::limits::MAX_STALENESS_MS_MAX);
/// Most keys in the keyspace; the zipfian sampler keeps one `f64` per key.
pub const KEYSPACE_MAX: usize = 1_000_000;
/// Largest value: Keel's own limit (etcd's default request limit is 1.5 MiB).
pub const VALUE_BYTES_MAX: usize = keel_types::limits::VALUE_BYTES_MAX;
/// Largest zipfian exponent accepted (`--zipf S`, S > 0).
pub const ZIPF_EXPONENT_MAX: f64 = 10.0;
/// Most operations one task starts, whatever the duration.
pub const OPS_PER_CLIENT_MAX: u64 = 10_000_000;
/// Budget of one operation (a lock wait, an increment loop included); past it the operation
/// counts as an error.
pub const OP_TIMEOUT: Duration = Duration::from_secs(10);
/// Budget of connecting, preloading and cleaning up.
pub const SETUP_TIMEOUT: Duration = Duration::from_secs(120);
/// Preload requests in flight at once.
pub const PRELOAD_TASKS: usize = 8;
/// Most ops in one preload request: Keel's batch limit and etcd's default `--max-txn-ops`.
pub const PRELOAD_OPS_MAX: usize = keel_types::limits::BATCH_OPS_MAX;
/// Most bytes of keys and values in one preload request, below Keel's batch limit (4 MiB)
/// and etcd's default request limit (1.5 MiB).
pub const PRELOAD_BYTES_MAX: usize = 1024 * 1024;
#[cfg(feature = "etcd")]
/// Most read-compare-write rounds of one etcd increment before it counts as an error.
pub const INCREMENT_ATTEMPTS_MAX: u32 = 64;
/// Largest latency the histograms record, in microseconds; longer ones are clamped to it.
pub const LATENCY_US_MAX: u64 = 60_000_000;
/// Significant decimal digits the histograms keep.
pub const HISTOGRAM_DIGITS: u8 = 3;
/// Extra life of a lock (Keel's TTL, etcd's session lease) beyond warm-up and duration, in
/// seconds.
pub const LOCK_LEASE_SLACK_S: u64 = 60;
/// Shortest `--move-leader-every`: a round of moves and the `AFTER_MOVE` that follows it must
/// leave steady time between rounds.
pub const MOVE_LEADER_EVERY_MIN: Duration = Duration::from_secs(2);
/// An operation completing this soon after a round of leader moves started counts as "after a
/// move" in the report.
pub const AFTER_MOVE: Duration = Duration::from_secs(1);
/// Most rounds of leader moves in one run, whatever the duration.
pub const MOVE_ROUNDS_MAX: u64 = 10_000;
/// Most ranges whose leadership one round moves.
pub const MOVE_RANGES_MAX: usize = 256;
/// Server processes whose CPU time a run adds up (`--server-pids`).
pub const SERVER_PIDS_MAX: usize = 64;
