//! Split decisions: whether a range should split (`plan_split`) and, when it is for load,
//! whether a split can pay (`load_split_has_room`) and where (`load_split_key`); where a range must split so that none spans two tenants'
//! namespaces (`boundary_split_key`). A split for size is cut where the range's bytes are halved, which
//! only the storage can tell (`StateMachine::split_key`).

use keel_types::pinned::{pinned_span, splits_pinned};
use keel_types::{NodeId, RangeDescriptor};

use crate::limits::{LOAD_SPLIT_SAMPLES_MIN, LOAD_SPLIT_SIDE_PERCENT_MIN};

/// When a range splits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SplitPolicy {
    /// A range holding more bytes (keys + values) splits in two halves of about equal size.
    pub range_bytes_max: u64,
    /// A range serving more requests than this in every one of the last `load_secs` seconds
    /// splits at the median of its sampled request keys. 0 turns load splits off.
    pub requests_per_sec_max: u64,
    /// Seconds the load must last; at most `limits::LOAD_WINDOW_SECS`.
    pub load_secs: u64,
}

impl Default for SplitPolicy {
    /// 64 MiB, as TiKV's region split size: a snapshot (a new replica's whole range) stays
    /// quick to send and install. 2,500 requests/s sustained for 10 s, as CockroachDB's load
    /// split threshold (`kv.range_split.load_qps_threshold`): a burst never splits, a split
    /// is metadata only, and a key that draws most of the load is never split away from
    /// itself (`load_split_key`), so the cost of a load split that does not help is one
    /// more Raft group. A load split is taken only when a half can move to a node that holds
    /// no replica of the range (`load_split_has_room`): on nodes that already hold it, the
    /// halves would do the same work as two Raft groups instead of one, which costs
    /// throughput (docs/BENCHMARKS.md, "Load splits during a run").
    fn default() -> Self {
        SplitPolicy {
            range_bytes_max: 64 * 1024 * 1024,
            requests_per_sec_max: 2_500,
            load_secs: 10,
        }
    }
}

/// What a range holds and serves, as a split decision needs it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RangeLoad {
    /// Bytes of keys and values (expired rows not yet cleaned up included).
    pub size_bytes: u64,
    pub keys: u64,
    /// Requests served in each of the last completed seconds, oldest first.
    pub requests_per_sec_history: Vec<u64>,
}

/// Why a range should split.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SplitReason {
    /// It holds more than `range_bytes_max`.
    Size,
    /// It served more than `requests_per_sec_max` in each of the last `load_secs` seconds.
    Load,
    /// A bound of a tenant's namespace lies inside it.
    Boundary,
}

impl std::fmt::Display for SplitReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SplitReason::Size => "size",
            SplitReason::Load => "load",
            SplitReason::Boundary => "namespace boundary",
        })
    }
}

/// The smallest of `bounds` strictly inside `range` (after its start, before its end): where
/// it must split so that each tenant's namespace is a whole number of ranges, whose sizes
/// then add up to the tenant's usage.
pub fn boundary_split_key<'a>(
    range: &RangeDescriptor,
    bounds: impl IntoIterator<Item = &'a [u8]>,
) -> Option<Vec<u8>> {
    bounds
        .into_iter()
        .filter(|bound| *bound > range.start.as_slice() && range.contains(bound))
        .min()
        .map(<[u8]>::to_vec)
}

/// Where a range of span `range` splits instead of `at`: `at` itself, or, when `at` lies
/// inside a span kept in one range (`keel_types::pinned`), that span's start or end,
/// whichever lies strictly inside the range (the start when both do). `None` when neither does: the range lies inside
/// the pinned span and never splits.
pub fn unpinned_split_key(at: Vec<u8>, range: &RangeDescriptor) -> Option<Vec<u8>> {
    if !splits_pinned(&at) {
        return Some(at);
    }
    let (start, end) = pinned_span(&at)?;
    let inside = |key: &Vec<u8>| key.as_slice() > range.start.as_slice() && range.contains(key);
    [start, end].into_iter().find(inside)
}

/// Whether a range of span `range` may split at all: not when it lies inside a span kept in
/// one range (`keel_types::pinned`), where `unpinned_split_key` would refuse every key. The
/// split driver asks this first, so such a range costs no search for a split key.
pub fn may_split(range: &RangeDescriptor) -> bool {
    let Some((_, pinned_end)) = pinned_span(&range.start) else {
        return true;
    };
    range.end().is_none_or(|end| end > pinned_end.as_slice())
}

/// Whether a range with `load` should split under `policy`, and why. Size goes before load.
/// A range with fewer than 2 keys never splits: one side would be empty.
pub fn plan_split(load: &RangeLoad, policy: &SplitPolicy) -> Option<SplitReason> {
    if load.keys < 2 {
        return None;
    }
    if load.size_bytes > policy.range_bytes_max {
        return Some(SplitReason::Size);
    }
    if load_is_sustained(&load.requests_per_sec_history, policy) {
        return Some(SplitReason::Load);
    }
    None
}

/// Whether a split of a range for load can pay: a live node holds no replica of it
/// (`replicas`), so the rebalancer can move one half's replicas and leadership there. On a
/// cluster where every live node already holds the range, the halves would stay on the
/// same nodes, cutting the same work into two Raft groups with their own appends,
/// replication messages and applies: measured on one machine, that cost up to half the
/// throughput and gave nothing back.
pub fn load_split_has_room(replicas: &[NodeId], live: impl IntoIterator<Item = NodeId>) -> bool {
    live.into_iter().any(|node| !replicas.contains(&node))
}

/// Where to split a range of span `span` for load, from keys sampled from its requests: the
/// sampled key that divides the samples inside the span most evenly (the median, or the
/// distinct key nearest to it when keys repeat), strictly after the span's start. `None`
/// with fewer than `LOAD_SPLIT_SAMPLES_MIN` samples inside the span, or when the best split
/// leaves either side less than `LOAD_SPLIT_SIDE_PERCENT_MIN` of them: the load sits on one
/// key, and splitting would not divide it.
pub fn load_split_key<'a>(
    samples: impl IntoIterator<Item = &'a [u8]>,
    span: &RangeDescriptor,
) -> Option<Vec<u8>> {
    let mut keys: Vec<&[u8]> = samples
        .into_iter()
        .filter(|key| span.contains(key))
        .collect();
    if keys.len() < LOAD_SPLIT_SAMPLES_MIN {
        return None;
    }
    keys.sort_unstable();
    let count = keys.len();
    // Splitting at the first occurrence of a key puts `index` samples on the left. Every key
    // is at least the start, so one greater than its predecessor lies strictly after it.
    let (index, _) = (1..count)
        .filter(|&index| keys[index] != keys[index - 1])
        .map(|index| (index, (2 * index).abs_diff(count)))
        .min_by_key(|&(_, imbalance)| imbalance)?;
    let smaller_side = index.min(count - index);
    if smaller_side * 100 < count * LOAD_SPLIT_SIDE_PERCENT_MIN {
        return None;
    }
    Some(keys[index].to_vec())
}

/// Whether each of the last `load_secs` completed seconds saw more than the policy allows.
fn load_is_sustained(history: &[u64], policy: &SplitPolicy) -> bool {
    let secs = usize::try_from(policy.load_secs).unwrap_or(usize::MAX);
    if policy.requests_per_sec_max == 0 || secs == 0 || history.len() < secs {
        return false;
    }
    history[history.len() - secs..]
        .iter()
        .all(|&requests| requests > policy.requests_per_sec_max)
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod pinned_tests {
    use super::*;

    fn range(start: &str, end: Option<&str>) -> RangeDescriptor {
        RangeDescriptor {
            id: keel_types::RangeId(2),
            start: start.as_bytes().to_vec(),
            end: end.map(|end| end.as_bytes().to_vec()),
            epoch: 1,
            conf_version: 0,
            replicas: vec![1],
        }
    }

    #[test]
    fn a_split_inside_the_etcd_namespace_moves_to_its_bounds() {
        let key = |key: &str| Some(key.as_bytes().to_vec());
        let cases = [
            (range("a", None), "b", key("b")),
            (range("a", None), "etcd/k", key("etcd/")),
            (range("etcd/", None), "etcd/k", key("etcd0")),
            (range("a", Some("etcd/z")), "etcd/k", key("etcd/")),
            (range("etcd/", Some("etcd0")), "etcd/k", None),
            (range("etcd/a", Some("etcd/z")), "etcd/k", None),
        ];
        for (range, at, expected) in cases {
            let got = unpinned_split_key(at.as_bytes().to_vec(), &range);
            assert_eq!(got, expected, "{range} at {at}");
            // A range that may split has a key to split at for some `at`, and the other way.
            assert!(may_split(&range) || got.is_none(), "{range}");
        }
        assert!(!may_split(&range("etcd/", Some("etcd0"))));
        assert!(!may_split(&range("etcd/a", Some("etcd/z"))));
        assert!(may_split(&range("etcd/", None)));
        assert!(may_split(&range("a", Some("etcd/z"))));
    }
}
