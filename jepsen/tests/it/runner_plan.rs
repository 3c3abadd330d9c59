//! The nemesis plan is a pure function of the seed: the same seed gives the same faults, every
//! requested kind comes up, and every fault fits between the warm-up and the time limit.

use keel_jepsen::run::plan::{
    self, Damage, FaultAction, FaultKind, HOLD_MS_SHORTEST, LONG_HOLD_MS, MemberChange,
    PartitionShape, PlannedFault, WARMUP_MS, Who,
};

const ALL: &[FaultKind] = &FaultKind::ALL;

/// (seed, kinds, nodes, time limit ms, faults expected at least, at most)
type Case = (u64, &'static [FaultKind], usize, u64, usize, usize);

/// Properties every plan must have.
fn well_formed(faults: &[PlannedFault], kinds: &[FaultKind], nodes: usize, time_limit_ms: u64) {
    let mut previous_end = WARMUP_MS;
    for fault in faults {
        assert!(
            fault.start_ms >= previous_end,
            "{fault:?} overlaps the one before"
        );
        assert!(fault.hold_ms >= HOLD_MS_SHORTEST, "{fault:?}");
        assert!(
            fault.start_ms + fault.hold_ms <= time_limit_ms,
            "{fault:?} ends late"
        );
        assert!(
            kinds.contains(&fault.action.kind()),
            "{fault:?} was not asked for"
        );
        let node_ok =
            |who: &Who| matches!(who, Who::Leader) || matches!(who, Who::Node(n) if *n < nodes);
        match &fault.action {
            FaultAction::Kill(who) | FaultAction::Pause(who) => assert!(node_ok(who), "{fault:?}"),
            FaultAction::Clock { node, offset_ms } => {
                assert!(
                    node_ok(node) && offset_ms.abs() == plan::CLOCK_OFFSET_MS,
                    "{fault:?}"
                )
            }
            FaultAction::Partition(PartitionShape::Halves(side)) => {
                assert_eq!(side.len(), nodes / 2, "{fault:?}")
            }
            FaultAction::Partition(PartitionShape::OneNode(node)) => assert!(*node < nodes),
            FaultAction::Membership(MemberChange::Outage { .. }) | FaultAction::Disk { .. } => {
                assert!(fault.hold_ms >= LONG_HOLD_MS, "{fault:?}")
            }
            _ => {}
        }
        previous_end = fault.start_ms + fault.hold_ms;
    }
    // Kinds take turns, so each requested kind is among the first ones (time allowing).
    let mut first: Vec<FaultKind> = faults
        .iter()
        .take(kinds.len())
        .map(|f| f.action.kind())
        .collect();
    first.sort();
    if faults.len() >= kinds.len() {
        let mut asked = kinds.to_vec();
        asked.sort();
        assert_eq!(first, asked);
    }
}

#[test]
fn plans_are_well_formed_and_fixed_by_the_seed() {
    let cases: &[Case] = &[
        (1, ALL, 3, 60_000, 6, 20),
        (2, ALL, 5, 60_000, 6, 20),
        (
            3,
            &[FaultKind::Partition, FaultKind::Kill],
            3,
            60_000,
            6,
            20,
        ),
        (4, &[FaultKind::Pause], 3, 30_000, 3, 10),
        (5, &[FaultKind::Partition], 3, 600_000, 60, 200),
        (6, &[], 3, 60_000, 0, 0),
        (7, ALL, 3, WARMUP_MS + HOLD_MS_SHORTEST - 1, 0, 0),
        (8, &[FaultKind::Kill, FaultKind::Kill], 1, 10_000, 1, 3),
        (
            9,
            &[
                FaultKind::Split,
                FaultKind::Move,
                FaultKind::Membership,
                FaultKind::Disk,
            ],
            5,
            60_000,
            5,
            14,
        ),
        (10, &[FaultKind::Disk], 5, 20_000, 1, 2),
    ];
    for &(seed, kinds, nodes, time_limit_ms, least, most) in cases {
        let faults = plan::plan(seed, kinds, nodes, time_limit_ms);
        assert_eq!(
            faults,
            plan::plan(seed, kinds, nodes, time_limit_ms),
            "seed {seed}"
        );
        assert!(
            (least..=most).contains(&faults.len()),
            "seed {seed}: {} faults",
            faults.len()
        );
        well_formed(&faults, kinds, nodes, time_limit_ms);
    }
}

#[test]
fn plans_without_the_range_faults_did_not_change() {
    // The first faults of seed 1 over the six kinds that came before the range faults, as
    // planned before those existed: adding kinds must not move anyone's matrix rows.
    let old = [
        FaultKind::Partition,
        FaultKind::Kill,
        FaultKind::KillAll,
        FaultKind::Pause,
        FaultKind::LeaderTransfer,
        FaultKind::Clock,
    ];
    let faults = plan::plan(1, &old, 3, 60_000);
    let fault = |start_ms, hold_ms, action| PlannedFault {
        start_ms,
        hold_ms,
        action,
    };
    let expected = [
        fault(3000, 2500, FaultAction::Pause(Who::Leader)),
        fault(7941, 4353, FaultAction::Kill(Who::Node(0))),
        fault(
            13595,
            4418,
            FaultAction::Clock {
                node: Who::Leader,
                offset_ms: 2000,
            },
        ),
        fault(20611, 4020, FaultAction::LeaderTransfer { nth: 2 }),
    ];
    assert_eq!(faults[..4], expected);
}

#[test]
fn membership_and_damage_take_turns_and_count_spare_nodes() {
    let faults = plan::plan(3, &[FaultKind::Membership], 5, 600_000);
    let changes: Vec<MemberChange> = faults
        .iter()
        .map(|fault| match fault.action {
            FaultAction::Membership(change) => change,
            ref other => panic!("{other:?}"),
        })
        .collect();
    for window in changes.windows(3) {
        let adds = window
            .iter()
            .filter(|c| matches!(c, MemberChange::Add))
            .count();
        let drains = window
            .iter()
            .filter(|c| matches!(c, MemberChange::Drain { .. }))
            .count();
        assert_eq!((adds, drains), (1, 1), "{window:?}");
    }
    let adds = changes
        .iter()
        .filter(|c| matches!(c, MemberChange::Add))
        .count();
    assert_eq!(plan::spare_nodes(&faults, 5, 100), adds);
    // Spares stop at the most nodes a run may have.
    assert_eq!(plan::spare_nodes(&faults, 5, 7), 2.min(adds));

    let faults = plan::plan(4, &[FaultKind::Disk], 5, 120_000);
    let truncations = faults
        .iter()
        .filter(|f| {
            matches!(
                f.action,
                FaultAction::Disk {
                    damage: Damage::TruncateStore { .. },
                    ..
                }
            )
        })
        .count();
    assert!(truncations >= 1, "{faults:?}");
    // Every damaged node is replaced by a spare.
    assert_eq!(plan::spare_nodes(&faults, 5, 100), faults.len());
}

#[test]
fn different_seeds_give_different_plans() {
    let plans: Vec<Vec<PlannedFault>> = (0..8)
        .map(|seed| plan::plan(seed, ALL, 3, 60_000))
        .collect();
    for (i, a) in plans.iter().enumerate() {
        for b in &plans[i + 1..] {
            assert_ne!(a, b);
        }
    }
}

#[test]
fn partitions_rotate_through_every_shape() {
    let faults = plan::plan(9, &[FaultKind::Partition], 5, 60_000);
    let shapes: Vec<&PartitionShape> = faults
        .iter()
        .map(|fault| match &fault.action {
            FaultAction::Partition(shape) => shape,
            other => panic!("{other:?}"),
        })
        .collect();
    for window in shapes.windows(3) {
        let leader = window
            .iter()
            .filter(|s| matches!(s, PartitionShape::IsolateLeader))
            .count();
        let halves = window
            .iter()
            .filter(|s| matches!(s, PartitionShape::Halves(_)))
            .count();
        assert_eq!((leader, halves), (1, 1), "{window:?}");
    }
}

#[test]
fn partition_sides_and_cut_pairs() {
    let check =
        |shape: PartitionShape, leader, nodes, sides: &[&[usize]], pairs: &[(usize, usize)]| {
            let actual = plan::partition_sides(&shape, leader, nodes);
            let expected: Vec<Vec<usize>> = sides.iter().map(|side| side.to_vec()).collect();
            assert_eq!(actual, expected, "{shape:?}");
            assert_eq!(plan::cut_pairs(&actual), pairs, "{shape:?}");
        };
    check(
        PartitionShape::IsolateLeader,
        1,
        3,
        &[&[1], &[0, 2]],
        &[(0, 1), (1, 2)],
    );
    check(
        PartitionShape::OneNode(2),
        0,
        3,
        &[&[2], &[0, 1]],
        &[(0, 2), (1, 2)],
    );
    check(
        PartitionShape::Halves(vec![0, 3]),
        0,
        5,
        &[&[0, 3], &[1, 2, 4]],
        &[(0, 1), (0, 2), (0, 4), (1, 3), (2, 3), (3, 4)],
    );
}

#[test]
fn fault_names_round_trip() {
    for kind in FaultKind::ALL {
        assert_eq!(kind.as_str().parse::<FaultKind>(), Ok(kind));
    }
    let error = "partitions".parse::<FaultKind>().unwrap_err();
    assert!(
        error.contains("known: partition, kill, kill-all"),
        "{error}"
    );
}

#[test]
fn leader_faults_aim_kills_and_partitions_at_the_leader() {
    use FaultKind::{Clock, Kill, KillAll, Partition, Pause};
    let faults = plan::plan(1, &[Kill, Partition, Pause, KillAll, Clock], 3, 300_000);
    let aimed = plan::at_leader(faults.clone());
    let elsewhere = |action: &FaultAction| {
        matches!(
            action,
            FaultAction::Kill(Who::Node(_))
                | FaultAction::Partition(PartitionShape::Halves(_) | PartitionShape::OneNode(_))
        )
    };
    // Without the option some kills and partitions miss the leader, so this can fail.
    assert!(faults.iter().any(|fault| elsewhere(&fault.action)));
    assert!(!aimed.iter().any(|fault| elsewhere(&fault.action)));
    assert_eq!(aimed.len(), faults.len());
    for (before, after) in faults.iter().zip(&aimed) {
        assert_eq!(
            (before.start_ms, before.hold_ms),
            (after.start_ms, after.hold_ms)
        );
        assert_eq!(before.action.kind(), after.action.kind());
        if !matches!(before.action.kind(), Kill | Partition) {
            assert_eq!(before.action, after.action);
        }
    }
}

#[test]
fn spaced_plans_keep_the_gap_and_the_time_limit() {
    use FaultKind::{Kill, KillAll, Partition, Pause};
    let faults = plan::plan(1, &[Kill, Partition, Pause, KillAll], 3, 120_000);
    let gap_ms = |pair: &[PlannedFault]| pair[1].start_ms - pair[0].start_ms - pair[0].hold_ms;
    // The plan's own gaps are 1-3 s, so this can fail.
    assert!(faults.windows(2).any(|pair| gap_ms(pair) < 6_000));
    let spaced = plan::spaced(faults.clone(), 6_000, 120_000);
    assert!(spaced.windows(2).all(|pair| gap_ms(pair) >= 6_000));
    assert!(
        spaced
            .iter()
            .all(|fault| fault.start_ms + fault.hold_ms <= 120_000)
    );
    assert!(
        spaced.len() < faults.len() && spaced.len() >= 8,
        "{}",
        spaced.len()
    );
    for (before, after) in faults.iter().zip(&spaced) {
        assert_eq!(
            (&before.action, before.hold_ms),
            (&after.action, after.hold_ms)
        );
    }
    assert_eq!(plan::spaced(faults.clone(), 0, 120_000), faults);
}
