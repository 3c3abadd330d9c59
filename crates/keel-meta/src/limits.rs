//! Bounds on the load a node tracks per range. None is checked at an edge (nothing here comes
//! from a client), so they live with the code they bound rather than in `keel_types::limits`.
//! Change one here and in `docs/ARCHITECTURE.md`.

/// Completed seconds of request counts a `LoadWindow` keeps: the longest span of sustained
/// load a split policy may ask for (`SplitPolicy::load_secs`).
pub const LOAD_WINDOW_SECS: usize = 60;
/// Completed seconds `LoadWindow::requests_per_sec` averages over (what `Cluster.Ranges`
/// reports).
pub const LOAD_RATE_SECS: usize = 10;
/// Request keys one reservoir samples. A window keeps two reservoirs (the current sampling
/// period and the one before), so at most twice this many keys.
pub const LOAD_SAMPLES_MAX: usize = 32;
/// Seconds one reservoir samples before a fresh one starts, so the sampled keys describe the
/// recent load, not the range's whole life.
pub const LOAD_SAMPLE_PERIOD_SECS: u64 = 10;
/// Bytes of a sampled key that are kept: longer keys are cut. Cutting keeps key order (a
/// prefix never sorts after its key), so a cut key is still a valid split point when it lies
/// after the range's start. Bounds a window's samples to 2 × 32 × 256 B = 16 KiB.
pub const LOAD_SAMPLE_KEY_BYTES_MAX: usize = 256;
/// Fewest sampled keys inside the span that a load split key is chosen from.
pub const LOAD_SPLIT_SAMPLES_MIN: usize = 8;
/// Smallest share of the sampled requests, in percent, that each side of a load split must
/// get. Below it the load sits on one key (or a few adjacent ones) that a split cannot
/// divide, and the range is not split for load.
pub const LOAD_SPLIT_SIDE_PERCENT_MIN: usize = 25;
/// Ranges one node tracks load for; requests to further ranges are not counted. A node drops
/// the windows of ranges it no longer hosts. Bounds the tracker to about 4,096 × 17 KiB.
pub const LOAD_RANGES_MAX: usize = 4_096;
