//! Every limit of the harness in one place: input sizes, checker budgets and report sizes.
//! Plain constants; knows nothing about how they are enforced.

/// Records read from one history file; a longer file is refused, not truncated.
pub const HISTORY_OPS_MAX: usize = 10_000_000;
/// Records read from one faults file.
pub const FAULT_EVENTS_MAX: usize = 1_000_000;
/// Snapshots read from one ranges file (the range table as the runner saw it over time).
pub const RANGE_SNAPSHOTS_MAX: usize = 100_000;
/// Ranges in one snapshot of the range table.
pub const RANGES_PER_SNAPSHOT_MAX: usize = 10_000;
/// Size of run.json.
pub const RUN_SPEC_BYTES_MAX: u64 = 1 << 20;

/// Operations of one key that enter the linearizability search (failed writes and failed or
/// indeterminate reads do not count); a key with more is `unknown`.
pub const REGISTER_KEY_OPS_MAX: usize = 200;
/// Wall-clock time the search may spend on one key before the key is `unknown`.
pub const REGISTER_KEY_TIME_BUDGET_MS: u64 = 10_000;
/// Wall-clock time the register checker may spend on all keys; keys not searched by then are
/// `unknown`.
pub const REGISTER_TOTAL_TIME_BUDGET_MS: u64 = 600_000;
/// Memo entries (linearized set, state) one key's search may keep: with 200 ops an entry
/// costs about 130 bytes (measured), so the default is about 260 MB.
pub const REGISTER_KEY_MEMO_ENTRIES_MAX: usize = 2_000_000;
/// Search steps between two looks at the clock.
pub const SEARCH_CLOCK_STEPS: u64 = 1024;

/// Operations quoted in one piece of evidence.
pub const EVIDENCE_OPS_MAX: usize = 12;
/// Possible states quoted when a read or cas cannot be placed.
pub const EVIDENCE_STATES_MAX: usize = 8;
/// Keys (or reads) listed by name in a checker's details; the rest are counted.
pub const DETAILS_ITEMS_MAX: usize = 20;

/// Operations the timeline draws one by one; above this it draws buckets.
pub const REPORT_TIMELINE_OPS_MAX: usize = 3_000;
/// Time buckets across the timeline and the latency plot.
pub const REPORT_BUCKETS: usize = 600;
/// Client lanes of the timeline; more clients share lanes.
pub const REPORT_LANES_MAX: usize = 64;
/// Range-table changes marked on the timeline and listed; the page says when more were left
/// out.
pub const REPORT_RANGE_CHANGES_MAX: usize = 500;
/// Lines of one range-table change (or of the first table) in its marker's hover text and in
/// the list of changes; the rest are counted.
pub const REPORT_RANGE_CHANGE_LINES_MAX: usize = 20;
/// Rows of the ops-per-range table (ranges in id order); the page says when more were left
/// out.
pub const REPORT_RANGE_ROWS_MAX: usize = 500;
/// Ops quoted as evidence listed with their ranges under one checker's details.
pub const REPORT_QUOTED_OPS_MAX: usize = 100;
/// Keys named in one row of the ops-per-range table; the rest are counted.
pub const REPORT_RANGE_KEYS_SHOWN_MAX: usize = 8;
/// Points of the latency plot; above this it samples (keeping the slowest op per bucket).
pub const REPORT_SCATTER_POINTS_MAX: usize = 4_000;
