//! Split decisions, as tables.

use keel_types::RangeId;

use super::*;

fn load(size_bytes: u64, keys: u64, history: &[u64]) -> RangeLoad {
    RangeLoad {
        size_bytes,
        keys,
        requests_per_sec_history: history.to_vec(),
    }
}

fn policy(range_bytes_max: u64, requests_per_sec_max: u64, load_secs: u64) -> SplitPolicy {
    SplitPolicy {
        range_bytes_max,
        requests_per_sec_max,
        load_secs,
    }
}

#[test]
fn ranges_split_for_size_or_sustained_load() {
    use SplitReason::{Load, Size};
    let hot = [0, 0, 120, 150, 101];
    let cases: Vec<(&str, RangeLoad, SplitPolicy, Option<SplitReason>)> = vec![
        (
            "small and idle",
            load(1_000, 10, &[]),
            policy(4_096, 100, 3),
            None,
        ),
        (
            "at the size limit",
            load(4_096, 10, &[]),
            policy(4_096, 100, 3),
            None,
        ),
        (
            "past the size limit",
            load(4_097, 10, &[]),
            policy(4_096, 100, 3),
            Some(Size),
        ),
        (
            "one key never splits",
            load(1 << 40, 1, &hot),
            policy(4_096, 100, 3),
            None,
        ),
        (
            "no key never splits",
            load(0, 0, &hot),
            policy(4_096, 100, 3),
            None,
        ),
        (
            "busy for the last 3 s",
            load(10, 2, &hot),
            policy(4_096, 100, 3),
            Some(Load),
        ),
        (
            "busy, but not for 4 s",
            load(10, 2, &hot),
            policy(4_096, 100, 4),
            None,
        ),
        (
            "a second at the limit is not past it",
            load(10, 2, &[100, 200, 200]),
            policy(4_096, 100, 3),
            None,
        ),
        (
            "a quiet last second",
            load(10, 2, &[500, 500, 500, 0]),
            policy(4_096, 100, 3),
            None,
        ),
        (
            "a short history",
            load(10, 2, &[500, 500]),
            policy(4_096, 100, 3),
            None,
        ),
        (
            "load splits off",
            load(10, 2, &hot),
            policy(4_096, 0, 3),
            None,
        ),
        (
            "no seconds asked",
            load(10, 2, &hot),
            policy(4_096, 100, 0),
            None,
        ),
        (
            "size goes first",
            load(5_000, 2, &hot),
            policy(4_096, 100, 3),
            Some(Size),
        ),
    ];
    for (name, load, policy, expected) in cases {
        assert_eq!(plan_split(&load, &policy), expected, "{name}");
    }
}

#[test]
fn default_policy_is_64_mib_or_2500_requests_per_sec_for_10_s() {
    let policy = SplitPolicy::default();
    assert_eq!(policy.range_bytes_max, 64 * 1024 * 1024);
    assert_eq!(policy.requests_per_sec_max, 2_500);
    assert_eq!(policy.load_secs, 10);
    assert!(policy.load_secs as usize <= crate::limits::LOAD_WINDOW_SECS);
    assert_eq!(SplitReason::Size.to_string(), "size");
    assert_eq!(SplitReason::Load.to_string(), "load");
}

fn span(start: &str, end: Option<&str>) -> RangeDescriptor {
    RangeDescriptor {
        id: RangeId(3),
        start: start.as_bytes().to_vec(),
        end: end.map(|end| end.as_bytes().to_vec()),
        epoch: 1,
        conf_version: 0,
        replicas: vec![1],
    }
}

/// `count` copies of `key`.
fn many(key: &str, count: usize) -> Vec<String> {
    vec![key.to_string(); count]
}

/// One sample per letter of `letters`.
fn each(letters: &str) -> Vec<String> {
    letters.chars().map(String::from).collect()
}

#[test]
fn load_splits_divide_the_sampled_keys_evenly() {
    let cases: Vec<(&str, Vec<String>, RangeDescriptor, Option<&str>)> = vec![
        (
            "even spread: the median",
            each("abcdefghijklmnop"),
            span("", None),
            Some("i"),
        ),
        (
            "unsorted samples",
            each("pobnacmdlekfjghi"),
            span("", None),
            Some("i"),
        ),
        ("too few samples", each("abcdefg"), span("", None), None),
        ("one hot key", many("k", 40), span("", None), None),
        (
            "a hot key with a little around it",
            [many("a", 4), many("m", 32), many("z", 4)].concat(),
            span("", None),
            None,
        ),
        (
            "two hot keys: between them",
            [many("a", 24), many("m", 16)].concat(),
            span("", None),
            Some("m"),
        ),
        (
            "samples outside the span do not count",
            [many("a", 30), each("cdefghijkl"), many("z", 30)].concat(),
            span("c", Some("x")),
            Some("h"),
        ),
        (
            "too few inside the span",
            [many("a", 30), each("cdefg"), many("z", 30)].concat(),
            span("c", Some("x")),
            None,
        ),
        (
            "never at the start",
            [many("c", 10), each("defghijklm")].concat(),
            span("c", None),
            Some("d"),
        ),
        (
            "the start is most of the load",
            [many("c", 30), each("defghijk")].concat(),
            span("c", None),
            None,
        ),
    ];
    for (name, samples, span, expected) in cases {
        let found = load_split_key(samples.iter().map(|key| key.as_bytes()), &span);
        let expected = expected.map(|key| key.as_bytes().to_vec());
        assert_eq!(found, expected, "{name}");
        if let Some(at) = found {
            assert!(
                span.contains(&at) && at > span.start,
                "{name}: {at:?} inside the span"
            );
        }
    }
}

#[test]
fn a_range_splits_at_the_first_namespace_bound_inside_it() {
    let span = |start: &[u8], end: Option<&[u8]>| RangeDescriptor {
        id: RangeId(3),
        start: start.to_vec(),
        end: end.map(<[u8]>::to_vec),
        epoch: 1,
        conf_version: 1,
        replicas: vec![1, 2, 3],
    };
    let bounds: [&[u8]; 4] = [b"m", b"c", b"t", b"x"];
    let cases: [(RangeDescriptor, Option<&[u8]>); 6] = [
        (span(b"", None), Some(b"c")),
        (span(b"c", None), Some(b"m")),
        (span(b"c", Some(b"m")), None),
        (span(b"n", Some(b"x")), Some(b"t")),
        (span(b"x", None), None),
        (span(b"d", Some(b"e")), None),
    ];
    for (range, want) in cases {
        assert_eq!(
            boundary_split_key(&range, bounds),
            want.map(<[u8]>::to_vec),
            "{range}"
        );
    }
}

#[test]
fn a_load_split_needs_a_live_node_without_a_replica() {
    let cases: &[(&str, &[u64], &[u64], bool)] = &[
        (
            "three nodes, each holds the range",
            &[1, 2, 3],
            &[1, 2, 3],
            false,
        ),
        (
            "a fourth node holds none of it",
            &[1, 2, 3],
            &[1, 2, 3, 4],
            true,
        ),
        (
            "the only other node is not live",
            &[1, 2, 3],
            &[1, 2],
            false,
        ),
        ("one replica, three live nodes", &[1], &[1, 2, 3], true),
        ("no live node heard of", &[1, 2, 3], &[], false),
    ];
    for (name, replicas, live, room) in cases {
        let found = load_split_has_room(replicas, live.iter().copied());
        assert_eq!(found, *room, "{name}");
    }
}
