//! Range table: lookups, updates after splits in any order, coverage, span queries.

use super::*;

fn range(id: u64, start: &str, end: Option<&str>, epoch: u64) -> RangeDescriptor {
    RangeDescriptor {
        id: RangeId(id),
        start: start.as_bytes().to_vec(),
        end: end.map(|end| end.as_bytes().to_vec()),
        epoch,
        conf_version: 0,
        replicas: vec![1, 2, 3],
    }
}

fn with_conf(mut descriptor: RangeDescriptor, conf_version: u64) -> RangeDescriptor {
    descriptor.conf_version = conf_version;
    descriptor
}

/// `[r1 ["", "g"), r2 ["g", "p"), r3 ["p", +inf)]`.
fn three() -> RangeTable {
    RangeTable::from_descriptors(vec![
        range(1, "", Some("g"), 2),
        range(2, "g", Some("p"), 3),
        range(3, "p", None, 3),
    ])
}

/// The table as `(id, start, end, epoch, conf_version)` rows in key order.
fn rows(table: &RangeTable) -> Vec<(u64, String, Option<String>, u64, u64)> {
    table
        .ranges()
        .map(|d| {
            let text = |key: &[u8]| String::from_utf8(key.to_vec()).unwrap();
            (
                d.id.0,
                text(&d.start),
                d.end().map(text),
                d.epoch,
                d.conf_version,
            )
        })
        .collect()
}

fn row(
    id: u64,
    start: &str,
    end: Option<&str>,
    epoch: u64,
    conf: u64,
) -> (u64, String, Option<String>, u64, u64) {
    (id, start.into(), end.map(Into::into), epoch, conf)
}

#[test]
fn keys_look_up_the_range_owning_them() {
    let table = three();
    let mut gapped = three();
    gapped.remove(RangeId(2));
    let empty = RangeTable::new();
    let cases: Vec<(&RangeTable, &[u8], Option<u64>)> = vec![
        (&table, b"", Some(1)),
        (&table, b"a", Some(1)),
        (&table, b"f\xff\xff", Some(1)),
        (&table, b"g", Some(2)),
        (&table, b"o", Some(2)),
        (&table, b"p", Some(3)),
        (&table, b"\xff\xff\xff", Some(3)),
        (&gapped, b"f", Some(1)),
        (&gapped, b"g", None),
        (&gapped, b"o\xff", None),
        (&gapped, b"p", Some(3)),
        (&empty, b"a", None),
    ];
    for (table, key, expected) in cases {
        let found = table.lookup(key).map(|d| d.id.0);
        assert_eq!(found, expected, "lookup {key:?} in {:?}", rows(table));
    }
    assert_eq!(
        table.get(RangeId(2)).map(|d| d.start.clone()),
        Some(b"g".to_vec())
    );
    assert_eq!(gapped.get(RangeId(2)), None);
}

#[test]
fn updates_keep_the_newest_descriptor() {
    let whole = || RangeTable::from_descriptors(vec![range(1, "", None, 1)]);
    let split =
        || RangeTable::from_descriptors(vec![range(1, "", Some("m"), 2), range(5, "m", None, 2)]);
    type Rows = Vec<(u64, String, Option<String>, u64, u64)>;
    let cases: Vec<(&str, RangeTable, RangeDescriptor, bool, Rows)> = vec![
        (
            "a later conf_version replaces",
            whole(),
            with_conf(range(1, "", None, 1), 4),
            true,
            vec![row(1, "", None, 1, 4)],
        ),
        (
            "the same descriptor again is not recorded",
            whole(),
            range(1, "", None, 1),
            false,
            vec![row(1, "", None, 1, 0)],
        ),
        (
            "an older epoch is not recorded, whatever its conf_version",
            split(),
            with_conf(range(1, "", None, 1), 9),
            false,
            vec![row(1, "", Some("m"), 2, 0), row(5, "m", None, 2, 0)],
        ),
        (
            "the parent's shorter descriptor replaces its old one and leaves a gap",
            whole(),
            range(1, "", Some("m"), 2),
            true,
            vec![row(1, "", Some("m"), 2, 0)],
        ),
        (
            "the child, learnt first, removes the parent it overlaps",
            whole(),
            range(5, "m", None, 2),
            true,
            vec![row(5, "m", None, 2, 0)],
        ),
        (
            "a stale range overlapping a newer one is not recorded",
            split(),
            range(9, "k", Some("z"), 1),
            false,
            vec![row(1, "", Some("m"), 2, 0), row(5, "m", None, 2, 0)],
        ),
        (
            "an equal epoch overlapping another range keeps what is there",
            split(),
            range(9, "k", Some("z"), 2),
            false,
            vec![row(1, "", Some("m"), 2, 0), row(5, "m", None, 2, 0)],
        ),
        (
            "a newer range removes every range it overlaps",
            split(),
            range(9, "", None, 3),
            true,
            vec![row(9, "", None, 3, 0)],
        ),
        (
            "the meta range owns no key and is not recorded",
            whole(),
            range(0, "", Some(""), 7),
            false,
            vec![row(1, "", None, 1, 0)],
        ),
        (
            "an empty span is not recorded",
            RangeTable::new(),
            range(4, "q", Some("c"), 7),
            false,
            vec![],
        ),
    ];
    for (name, mut table, update, recorded, expected) in cases {
        assert_eq!(table.update(update), recorded, "{name}");
        assert_eq!(rows(&table), expected, "{name}");
        for descriptor in table.ranges() {
            assert_eq!(table.get(descriptor.id), Some(descriptor), "{name}: index");
        }
    }
}

#[test]
fn any_order_of_a_split_history_builds_the_current_table() {
    let mut random = crate::SplitMix64::new(42);
    let (history, current) = split_history(&mut random, 40);
    assert_eq!(current.check_coverage(), Ok(()));
    for round in 0..20 {
        let shuffled = shuffled(&history, &mut random);
        let built = RangeTable::from_descriptors(shuffled.clone());
        assert_eq!(
            rows(&built),
            rows(&current),
            "from_descriptors, round {round}"
        );
        let mut updated = RangeTable::new();
        for descriptor in shuffled {
            updated.update(descriptor);
        }
        assert_eq!(rows(&updated), rows(&current), "updates, round {round}");
    }
}

/// Every descriptor a keyspace passes through in `splits` random splits (and some membership
/// changes), with the table of the descriptors that are current at the end.
fn split_history(
    random: &mut crate::SplitMix64,
    splits: u64,
) -> (Vec<RangeDescriptor>, RangeTable) {
    use crate::RandomSource;
    let mut current = vec![range(1, "", None, 1)];
    let mut history = current.clone();
    for child in 2..2 + splits {
        let index = random.below(current.len() as u64) as usize;
        let parent = current[index].clone();
        if random.below(4) == 0 {
            let moved = with_conf(parent.clone(), parent.conf_version + 1);
            history.push(moved.clone());
            current[index] = moved;
            continue;
        }
        // A split key strictly inside the parent's span: its start plus one byte.
        let mut at = parent.start.clone();
        at.push(b'a' + random.below(26) as u8);
        if parent.end().is_some_and(|end| at.as_slice() >= end) {
            continue;
        }
        let epoch = parent.epoch + 1;
        let left = RangeDescriptor {
            end: Some(at.clone()),
            epoch,
            ..parent.clone()
        };
        let right = RangeDescriptor {
            id: RangeId(child),
            start: at,
            epoch,
            ..parent
        };
        history.extend([left.clone(), right.clone()]);
        current[index] = left;
        current.push(right);
    }
    let mut table = RangeTable::new();
    for descriptor in current {
        assert!(
            table.update(descriptor),
            "current descriptors never overlap"
        );
    }
    (history, table)
}

fn shuffled(items: &[RangeDescriptor], random: &mut crate::SplitMix64) -> Vec<RangeDescriptor> {
    use crate::RandomSource;
    let mut items = items.to_vec();
    for i in (1..items.len()).rev() {
        let j = random.below(i as u64 + 1) as usize;
        items.swap(i, j);
    }
    items
}

#[test]
fn coverage_finds_gaps_overlaps_and_empty_spans() {
    let cases: Vec<(Vec<RangeDescriptor>, Option<&str>)> = vec![
        (vec![range(1, "", None, 1)], None),
        (
            vec![
                range(3, "p", None, 3),
                range(1, "", Some("g"), 2),
                range(2, "g", Some("p"), 3),
            ],
            None,
        ),
        (vec![range(0, "", Some(""), 1), range(1, "", None, 1)], None),
        (vec![], Some(r#"keys ["", +inf) belong to no range"#)),
        (
            vec![range(1, "a", None, 1)],
            Some(r#"keys ["", "a") belong to no range"#),
        ),
        (
            vec![range(1, "", Some("m"), 2)],
            Some(r#"keys ["m", +inf) belong to no range"#),
        ),
        (
            vec![range(1, "", Some("g"), 2), range(3, "h", None, 2)],
            Some(r#"keys ["g", "h") belong to no range"#),
        ),
        (
            vec![range(1, "", Some("m"), 2), range(5, "k", None, 2)],
            Some(r#"ranges r1 ["", "m") epoch 2 and r5 ["k", +inf) epoch 2 overlap"#),
        ),
        (
            vec![range(1, "", None, 1), range(5, "m", None, 2)],
            Some(r#"ranges r1 ["", +inf) epoch 1 and r5 ["m", +inf) epoch 2 overlap"#),
        ),
        (
            vec![range(1, "", Some("m"), 2), range(1, "", None, 1)],
            Some("overlap"),
        ),
        (
            vec![
                range(1, "", Some("m"), 2),
                range(5, "m", Some("m"), 2),
                range(6, "m", None, 2),
            ],
            Some(r#"range r5 ["m", "m") epoch 2 has an empty span"#),
        ),
    ];
    for (ranges, expected) in cases {
        let result = check_coverage(&ranges);
        match expected {
            None => assert_eq!(result, Ok(()), "{ranges:?}"),
            Some(message) => {
                let error = result.expect_err(message).to_string();
                assert!(error.contains(message), "{error:?} lacks {message:?}");
            }
        }
    }
    let mut table = three();
    assert_eq!(table.check_coverage(), Ok(()));
    table.remove(RangeId(2));
    let gap = CoverageError::Gap {
        start: b"g".to_vec(),
        end: Some(b"p".to_vec()),
    };
    assert_eq!(table.check_coverage(), Err(gap));
}

#[test]
fn spans_list_the_ranges_they_touch_in_key_order() {
    let table = three();
    let mut gapped = three();
    gapped.remove(RangeId(2));
    let cases: Vec<(&RangeTable, &str, Option<&str>, Vec<u64>)> = vec![
        (&table, "", None, vec![1, 2, 3]),
        (&table, "a", Some("b"), vec![1]),
        (&table, "f", Some("g"), vec![1]),
        (&table, "f", Some("g\0"), vec![1, 2]),
        (&table, "g", Some("h"), vec![2]),
        (&table, "h", None, vec![2, 3]),
        (&table, "p", None, vec![3]),
        (&table, "b", Some("b"), vec![]),
        (&table, "q", Some("a"), vec![]),
        (&gapped, "h", Some("q"), vec![3]),
        (&gapped, "h", Some("o"), vec![]),
        (&gapped, "", None, vec![1, 3]),
    ];
    for (table, start, end, expected) in cases {
        let found: Vec<u64> = table
            .ranges_in(start.as_bytes(), end.map(str::as_bytes))
            .map(|d| d.id.0)
            .collect();
        assert_eq!(found, expected, "[{start:?}, {end:?}) in {:?}", rows(table));
    }
}

#[test]
fn removing_a_range_forgets_it() {
    let mut table = three();
    assert_eq!(table.len(), 3);
    let removed = table.remove(RangeId(2)).map(|d| d.id);
    assert_eq!(removed, Some(RangeId(2)));
    assert_eq!(table.remove(RangeId(2)), None);
    assert_eq!(table.len(), 2);
    assert!(!table.is_empty());
    assert!(
        table.update(range(2, "g", Some("p"), 3)),
        "a removed range can come back"
    );
}

#[test]
fn from_descriptors_takes_the_newest_first_whatever_the_order() {
    // Not a history of splits alone (r8 grew over r9's keys), where the order of updates
    // matters: newest first, r8 is refused where r7 holds "b", and r9 stays.
    let r7 = range(7, "a", Some("c"), 5);
    let r8 = range(8, "b", None, 4);
    let r9 = range(9, "d", None, 3);
    let expected = vec![row(7, "a", Some("c"), 5, 0), row(9, "d", None, 3, 0)];
    for order in [
        vec![r9.clone(), r8.clone(), r7.clone()],
        vec![r7.clone(), r9.clone(), r8.clone()],
        vec![r8.clone(), r7.clone(), r9.clone()],
    ] {
        let table = RangeTable::from_descriptors(order.clone());
        assert_eq!(rows(&table), expected, "{order:?}");
    }
}
