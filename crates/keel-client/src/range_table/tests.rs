//! Table tests of the range table and its staleness rules.

use super::*;
use keel_types::NodeAddr;

/// Ranges `["", "g")` (1, led by node 1), `["g", "p")` (2, leader unknown),
/// `["p", +inf)` (3, led by node 3); every range on nodes 1, 2 and 3.
fn table() -> RangeTable {
    let range = |id: u64, start: &[u8], end: Option<&[u8]>, leader: Option<u64>| Entry {
        descriptor: descriptor(id, start, end),
        leader: leader.map(uri),
    };
    let ranges = vec![
        range(3, b"p", None, Some(3)),
        range(1, b"", Some(b"g"), Some(1)),
        range(2, b"g", Some(b"p"), None),
    ];
    RangeTable::new(ranges, nodes(&[1, 2, 3])).unwrap()
}

fn descriptor(id: u64, start: &[u8], end: Option<&[u8]>) -> RangeDescriptor {
    RangeDescriptor {
        id: RangeId(id),
        start: start.to_vec(),
        end: end.map(<[u8]>::to_vec),
        epoch: 1,
        conf_version: 1,
        replicas: vec![1, 2, 3],
    }
}

fn uri(node: u64) -> String {
    format!("127.0.0.1:700{node}")
}

fn nodes(ids: &[u64]) -> BTreeMap<NodeId, String> {
    ids.iter().map(|&id| (id, uri(id))).collect()
}

#[test]
fn keys_find_the_range_whose_half_open_span_holds_them() {
    let table = table();
    let cases: [(&[u8], Option<u64>); 7] = [
        (b"", Some(1)),
        (b"a", Some(1)),
        (b"f\xff", Some(1)),
        (b"g", Some(2)),
        (b"o", Some(2)),
        (b"p", Some(3)),
        (b"\xff\xff", Some(3)),
    ];
    for (key, expected) in cases {
        let got = table.lookup(key).map(|entry| entry.descriptor.id.0);
        assert_eq!(got, expected, "{key:?}");
    }
    // A gap: nothing holds "h".."k".
    let gapped = RangeTable::new(
        vec![
            Entry {
                descriptor: descriptor(1, b"", Some(b"h")),
                leader: None,
            },
            Entry {
                descriptor: descriptor(2, b"k", None),
                leader: None,
            },
        ],
        nodes(&[1]),
    )
    .unwrap();
    assert_eq!(gapped.lookup(b"i"), None);
    assert_eq!(gapped.lookup(b"k").unwrap().descriptor.id, RangeId(2));
}

#[test]
fn overlapping_tables_are_refused_and_the_meta_range_is_dropped() {
    let entry = |id, start: &[u8], end: Option<&[u8]>| Entry {
        descriptor: descriptor(id, start, end),
        leader: None,
    };
    let overlapping = vec![entry(1, b"", Some(b"m")), entry(2, b"k", None)];
    let error = RangeTable::new(overlapping, nodes(&[1])).unwrap_err();
    assert!(error.to_string().contains("overlaps"), "{error}");
    let unbounded_then_more = vec![entry(1, b"", None), entry(2, b"k", None)];
    assert!(RangeTable::new(unbounded_then_more, nodes(&[1])).is_err());
    let with_meta = vec![entry(0, b"", Some(b"")), entry(1, b"", None)];
    let table = RangeTable::new(with_meta, nodes(&[1])).unwrap();
    assert_eq!(table.ranges().len(), 1);
    assert_eq!(table.lookup(b"x").unwrap().descriptor.id, RangeId::FIRST);
}

#[test]
fn requests_go_to_a_preferred_replica_else_the_leader_else_a_reachable_replica() {
    let table = table();
    let none: &[String] = &[];
    /// (key, preferred, unreachable, rotation) -> (range, URI)
    type Case = (
        &'static [u8],
        Vec<String>,
        Vec<String>,
        usize,
        Option<(u64, Option<String>)>,
    );
    let cases: Vec<Case> = vec![
        // Known leaders win.
        (b"a", vec![], vec![], 0, Some((1, Some(uri(1))))),
        (b"q", vec![], vec![], 5, Some((3, Some(uri(3))))),
        // Leader unknown: replicas in turn.
        (b"h", vec![], vec![], 0, Some((2, Some(uri(1))))),
        (b"h", vec![], vec![], 1, Some((2, Some(uri(2))))),
        (b"h", vec![], vec![], 5, Some((2, Some(uri(3))))),
        // Unreachable leaders and replicas are passed over.
        (b"a", vec![], vec![uri(1)], 0, Some((1, Some(uri(2))))),
        (
            b"h",
            vec![],
            vec![uri(1), uri(2)],
            0,
            Some((2, Some(uri(3)))),
        ),
        (
            b"h",
            vec![],
            vec![uri(1), uri(2), uri(3)],
            0,
            Some((2, None)),
        ),
        // Follower reads: the first preferred node that is a reachable replica, over the
        // leader; a preferred node that is no replica, or unreachable, is passed over.
        (b"a", vec![uri(2)], vec![], 0, Some((1, Some(uri(2))))),
        (
            b"a",
            vec![uri(9), uri(3)],
            vec![],
            0,
            Some((1, Some(uri(3)))),
        ),
        (b"a", vec![uri(2)], vec![uri(2)], 0, Some((1, Some(uri(1))))),
        (b"a", vec![uri(9)], vec![], 0, Some((1, Some(uri(1))))),
    ];
    for (key, preferred, unreachable, rotation, expected) in cases {
        let got = table
            .pick(key, &preferred, &unreachable, rotation)
            .map(|(range, uri)| (range.0, uri));
        assert_eq!(
            got, expected,
            "{key:?} {preferred:?} {unreachable:?} {rotation}"
        );
    }
    // Replicas whose address is unknown are not candidates.
    let sparse = RangeTable::new(table.ranges().to_vec(), nodes(&[2])).unwrap();
    assert_eq!(
        sparse.pick(b"h", none, none, 0),
        Some((RangeId(2), Some(uri(2))))
    );
}

#[test]
fn leaders_are_learned_and_forgotten_per_range() {
    let mut table = table();
    table.set_leader(RangeId(2), uri(2));
    assert_eq!(table.pick(b"h", &[], &[], 0).unwrap().1, Some(uri(2)));
    // Forgetting another node changes nothing; forgetting the leader does.
    table.forget_leader(RangeId(2), &uri(1));
    assert_eq!(table.lookup(b"h").unwrap().leader, Some(uri(2)));
    table.forget_leader(RangeId(2), &uri(2));
    assert_eq!(table.lookup(b"h").unwrap().leader, None);
    // Range 1 is untouched; an unknown range is ignored.
    assert_eq!(table.lookup(b"a").unwrap().leader, Some(uri(1)));
    table.set_leader(RangeId(9), uri(9));
}

#[test]
fn keys_spanning_ranges_name_the_first_two_ranges_and_group_by_range() {
    let table = table();
    let check = |keys: &[&[u8]], expected: Option<(&[u8], u64, &[u8], u64)>| {
        let got = table.spans(keys);
        let got = got.as_ref().map(|spans| {
            let (first_key, first) = &spans.first;
            let (second_key, second) = &spans.second;
            (
                first_key.as_slice(),
                first.id.0,
                second_key.as_slice(),
                second.id.0,
            )
        });
        assert_eq!(got, expected, "{keys:?}");
    };
    check(&[b"a", b"b", b"f"], None);
    check(&[b"q"], None);
    check(&[], None);
    check(&[b"a", b"g"], Some((b"a", 1, b"g", 2)));
    check(&[b"q", b"b", b"h"], Some((b"q", 3, b"b", 1)));
    let spans = table.spans(&[b"q", b"b", b"h", b"c"]).unwrap();
    assert_eq!(spans.groups, vec![vec![1, 3], vec![2], vec![0]]);
}

#[test]
fn grouping_keeps_the_callers_order_within_a_range_and_ranges_in_key_order() {
    let table = table();
    type Case = (Vec<&'static [u8]>, Vec<Vec<usize>>);
    let cases: Vec<Case> = vec![
        (vec![], vec![]),
        (vec![b"a"], vec![vec![0]]),
        (vec![b"z", b"a", b"y", b"a"], vec![vec![1, 3], vec![0, 2]]),
        (
            vec![b"h", b"q", b"g", b"f"],
            vec![vec![3], vec![0, 2], vec![1]],
        ),
    ];
    for (keys, expected) in cases {
        assert_eq!(table.group(&keys), expected, "{keys:?}");
    }
    // Keys in a gap form their own group, placed by their smallest key.
    let gapped = RangeTable::new(
        vec![
            Entry {
                descriptor: descriptor(1, b"", Some(b"h")),
                leader: None,
            },
            Entry {
                descriptor: descriptor(2, b"k", None),
                leader: None,
            },
        ],
        nodes(&[1]),
    )
    .unwrap();
    let keys: Vec<&[u8]> = vec![b"z", b"j", b"a", b"i"];
    assert_eq!(gapped.group(&keys), vec![vec![2], vec![1, 3], vec![0]]);
}

#[test]
fn wire_tables_resolve_leaders_through_node_addresses() {
    let info = |id: u64, start: &[u8], end: Option<&[u8]>, leader| v1::RangeInfo {
        descriptor: Some(descriptor(id, start, end).into()),
        leader_id: leader,
        ..Default::default()
    };
    let member = |id: u64, addr: &str| v1::Member {
        node_id: id,
        addr: addr.to_string(),
        voter: true,
        ..v1::Member::default()
    };
    let response = v1::RangesResponse {
        ranges: vec![
            info(2, b"m", None, Some(2)),
            info(1, b"", Some(b"m"), Some(7)),
        ],
        nodes: vec![
            member(1, "127.0.0.1:7001"),
            member(2, "127.0.0.1:7002"),
            member(3, "bad"),
        ],
        meta_leader_id: 1,
    };
    let table = RangeTable::from_wire(response).unwrap();
    assert_eq!(table.lookup(b"z").unwrap().leader, Some(uri(2)));
    // Node 7 has no address: its leadership is of no use.
    assert_eq!(table.lookup(b"a").unwrap().leader, None);
    assert_eq!(table.nodes.len(), 2, "the unparsable address is left out");
    let missing = v1::RangesResponse {
        ranges: vec![v1::RangeInfo::default()],
        ..Default::default()
    };
    assert!(RangeTable::from_wire(missing).is_err());
}

#[test]
fn answers_show_a_stale_table_by_their_range() {
    let out_of_range = AttemptError::Server(KvError::KeyOutOfRange {
        key: b"k".to_vec(),
        range: Box::new(descriptor(2, b"a", Some(b"c"))),
    });
    let mismatch = AttemptError::Server(KvError::EpochMismatch {
        expected_epoch: 1,
        range: Box::new(descriptor(2, b"a", None)),
    });
    let not_leader = |range: u64| {
        AttemptError::Server(KvError::NotLeader {
            range_id: RangeId(range),
            leader: Some((2, NodeAddr::new("127.0.0.1:7002"))),
        })
    };
    let unavailable = AttemptError::Server(KvError::unavailable("no quorum"));
    let two = Picked::Range(RangeId(2));
    use Stale::*;
    let cases = [
        (two, &out_of_range, Shown),
        (Picked::Whole, &out_of_range, Shown),
        (Picked::Unrouted, &mismatch, Shown),
        (two, &not_leader(2), No),
        (two, &not_leader(5), Shown),
        (Picked::Whole, &not_leader(1), No),
        // A cluster without a table that names other ranges is being upgraded, perhaps.
        (Picked::Whole, &not_leader(5), Suspected),
        (Picked::Unrouted, &not_leader(5), No),
        (two, &unavailable, No),
    ];
    for (picked, error, expected) in cases {
        assert_eq!(
            refused_as_stale(picked, error),
            expected,
            "{picked:?} {error}"
        );
    }
    let served = [
        (two, 2, false),
        (two, 3, true),
        (two, 0, false),
        (Picked::Whole, 1, false),
        (Picked::Whole, 4, true),
        (Picked::Unrouted, 4, false),
    ];
    for (picked, range, expected) in served {
        assert_eq!(
            served_as_stale(picked, range),
            expected,
            "{picked:?} {range}"
        );
    }
}
