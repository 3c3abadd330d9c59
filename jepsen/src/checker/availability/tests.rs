//! The availability measure on small histories written inline, times in ms.

use super::*;
use crate::checker::lease::test_support::op;

/// A fault of `kind` from `start_ms` to `stop_ms` (None = never healed).
fn fault(kind: &str, start_ms: u64, stop_ms: Option<u64>) -> FaultEvent {
    FaultEvent {
        fault: kind.into(),
        target: "n1 (leader)".into(),
        start_ns: start_ms * 1_000_000,
        stop_ns: stop_ms.map(|ms| ms * 1_000_000),
        extra: Default::default(),
    }
}

/// A register op of `client`: `kind` (get or put) called at `call_ms`, returned at
/// `return_ms` with `ok` (null = indeterminate).
fn line(client: u64, kind: &str, ok: Option<bool>, call_ms: u64, return_ms: Option<u64>) -> Op {
    let text = serde_json::json!({
        "client": client, "op": kind, "key": "r1", "value": 1, "ok": ok,
        "call": call_ms, "return": return_ms,
    });
    op(&text.to_string())
}

fn measure_ms(history: &[Op], faults: &[FaultEvent], run_end_ms: u64) -> Availability {
    measure(history, faults, Some(run_end_ms * 1_000_000))
}

/// Ops of one client every 100 ms from `from_ms` to `to_ms`, alternating get and put, all
/// ok, each taking 10 ms: a cluster that serves throughout.
fn steady(from_ms: u64, to_ms: u64) -> Vec<Op> {
    (from_ms..to_ms)
        .step_by(100)
        .enumerate()
        .map(|(i, at)| {
            let kind = if i % 2 == 0 { "get" } else { "put" };
            line(9, kind, Some(true), at, Some(at + 10))
        })
        .collect()
}

#[test]
fn first_success_counts_from_the_fault_start() {
    // Nothing succeeds from 1000 ms (the kill) until a read returns at 2200 ms.
    let mut history = steady(0, 1000);
    history.push(line(1, "get", Some(true), 2100, Some(2200)));
    history.push(line(2, "put", Some(true), 2300, Some(2500)));
    history.extend(steady(2600, 10_000));
    let faults = [fault("kill", 1000, Some(3000))];
    let events = measure_ms(&history, &faults, 10_000).events;
    let event = &events[0];
    assert_eq!(event.first_read_ms, Some(1200.0));
    assert_eq!(event.first_write_ms, Some(1500.0));
    assert_eq!(event.gap_ms, 1200.0);
    assert_eq!(
        (event.gap_start_ns, event.gap_end_ns),
        (1_000_000_000, 2_200_000_000)
    );
    // The window: stop + 5 s.
    assert_eq!(event.end_ns, 8_000_000_000);
}

#[test]
fn failed_and_indeterminate_ops_are_not_successes() {
    let mut history = steady(0, 1000);
    history.push(line(1, "get", Some(false), 1100, Some(1150)));
    history.push(line(2, "put", None, 1100, None));
    history.push(line(3, "put", Some(true), 1200, None));
    history.push(line(4, "put", Some(false), 1300, Some(1400)));
    history.push(line(5, "get", Some(true), 1900, Some(2000)));
    history.push(line(6, "put", Some(true), 2400, Some(2500)));
    let faults = [fault("pause", 1000, Some(2000))];
    let event = &measure_ms(&history, &faults, 3000).events[0];
    assert_eq!(event.first_read_ms, Some(1000.0));
    assert_eq!(event.first_write_ms, Some(1500.0));
    assert_eq!(event.gap_ms, 1000.0);
}

#[test]
fn ops_called_before_the_fault_do_not_count() {
    // A put sent 1 ms before the kill and answered just after it may have been committed
    // before the kill: it says nothing about writes to the faulted cluster.
    let mut history = steady(0, 1000);
    history.push(line(1, "put", Some(true), 999, Some(1001)));
    history.push(line(2, "get", Some(true), 950, Some(1002)));
    history.push(line(3, "put", Some(true), 2900, Some(3000)));
    history.push(line(4, "get", Some(true), 2950, Some(3050)));
    let faults = [fault("kill", 1000, Some(2000))];
    let event = &measure_ms(&history, &faults, 3100).events[0];
    assert_eq!(event.first_write_ms, Some(2000.0));
    assert_eq!(event.first_read_ms, Some(2050.0));
    assert_eq!(event.gap_ms, 2000.0);
}

#[test]
fn no_success_until_after_the_heal() {
    let mut history = steady(0, 1000);
    history.push(line(1, "get", Some(true), 4000, Some(4300)));
    history.push(line(2, "put", Some(true), 4100, Some(4400)));
    let faults = [fault("partition", 1000, Some(4000))];
    let event = &measure_ms(&history, &faults, 4500).events[0];
    assert_eq!(event.first_read_ms, Some(3300.0));
    assert_eq!(event.first_write_ms, Some(3400.0));
    assert_eq!(event.healed_read_ms, Some(300.0));
    assert_eq!(event.healed_write_ms, Some(400.0));
    assert_eq!(event.gap_ms, 3300.0);
}

#[test]
fn no_success_in_the_window_leaves_first_null_and_gap_whole() {
    // Only reads succeed, and only after the window ended (the next fault began).
    let mut history = steady(0, 1000);
    history.push(line(1, "get", Some(true), 1500, Some(2500)));
    history.push(line(1, "get", Some(true), 7000, Some(7100)));
    let faults = [
        fault("kill-all", 1000, Some(3000)),
        fault("pause", 6000, Some(8000)),
    ];
    let availability = measure_ms(&history, &faults, 9000);
    let event = &availability.events[0];
    assert_eq!(event.end_ns, 6_000_000_000);
    assert_eq!(event.first_read_ms, Some(1500.0));
    assert_eq!(event.first_write_ms, None);
    assert_eq!(event.healed_read_ms, None);
    assert_eq!(
        event.gap_ms, 3500.0,
        "from the read at 2500 ms to the next fault"
    );
    let worst = &availability.worst["kill-all"];
    assert_eq!((worst.without_read, worst.without_write), (0, 1));
}

#[test]
fn window_ends_at_settle_next_fault_or_workload_end() {
    let history = steady(0, 30_000);
    let faults = [
        // Settles at 7000 ms; the next fault starts at 5000.
        fault("kill", 1000, Some(2000)),
        // Settles at 11000 ms; the next fault starts at 9000.
        fault("pause", 5000, Some(6000)),
        // Never healed: until the next fault.
        fault("partition", 9000, None),
        // Settles at 18000 ms; the workload ends at 15000.
        fault("clock", 12_000, Some(13_000)),
        // Starts after the workload ended: an empty window.
        fault("kill", 20_000, Some(21_000)),
    ];
    let events = measure_ms(&history, &faults, 15_000).events;
    let ends: Vec<u64> = events.iter().map(|e| e.end_ns / 1_000_000).collect();
    assert_eq!(ends, [5000, 9000, 12_000, 15_000, 20_000]);
    let last = &events[4];
    assert_eq!((last.first_read_ms, last.gap_ms), (None, 0.0));
}

#[test]
fn a_served_window_has_short_gaps() {
    let history = steady(0, 10_000);
    let faults = [fault("kill", 1000, Some(3000))];
    let event = &measure_ms(&history, &faults, 10_000).events[0];
    // Ops are called every 100 ms and take 10: the first returns 10 ms after 1000 ms.
    assert_eq!(event.first_read_ms, Some(10.0));
    assert_eq!(event.first_write_ms, Some(110.0));
    assert_eq!(event.gap_ms, 100.0);
    assert_eq!(event.healed_read_ms, Some(10.0));
}

#[test]
fn worst_per_kind_takes_the_largest() {
    let mut history = steady(0, 1000);
    history.push(line(1, "get", Some(true), 1000, Some(1800)));
    history.push(line(1, "put", Some(true), 1000, Some(1200)));
    history.extend(steady(2000, 5000));
    history.push(line(2, "get", Some(true), 5000, Some(5100)));
    history.push(line(2, "put", Some(true), 5000, Some(5900)));
    history.extend(steady(6000, 9000));
    let faults = [
        fault("kill", 1000, Some(1500)),
        fault("kill", 5000, Some(5500)),
    ];
    let availability = measure_ms(&history, &faults, 9000);
    let worst = &availability.worst["kill"];
    assert_eq!(worst.events, 2);
    assert_eq!(worst.first_read_ms, Some(800.0));
    assert_eq!(worst.first_write_ms, Some(900.0));
    assert_eq!(worst.gap_ms, 800.0);
    let event = availability.worst_event().unwrap();
    assert_eq!(
        event.start_ns, 5_000_000_000,
        "its gap (800 ms) beats the first's (600 ms)"
    );
}

#[test]
fn reads_and_writes_by_op_kind() {
    let cases = [
        ("get", Some(Access::Read)),
        ("read", Some(Access::Read)),
        ("put", Some(Access::Write)),
        ("cas", Some(Access::Write)),
        ("del", Some(Access::Write)),
        ("append", Some(Access::Write)),
        ("incr", Some(Access::Write)),
        ("acquire", Some(Access::Write)),
        ("fput", Some(Access::Write)),
        ("release", Some(Access::Write)),
        ("begin", Some(Access::Write)),
        ("complete", Some(Access::Write)),
        ("abort", Some(Access::Write)),
        ("watch", None),
    ];
    for (name, expected) in cases {
        assert_eq!(access(&OpKind::from(name.to_string())), expected, "{name}");
    }
}

#[test]
fn summary_names_the_longest_gap() {
    let mut history = steady(0, 1000);
    history.push(line(1, "get", Some(true), 1000, Some(1800)));
    history.extend(steady(2000, 9000));
    let faults = [fault("pause", 1000, Some(1500)), fault("kill", 5000, None)];
    let summary = measure_ms(&history, &faults, 9000).summary();
    assert_eq!(
        summary,
        "availability: longest gap 0.800 s (pause n1 (leader) at 1.000 s); slowest first \
         read 0.800 s, first write 1.110 s (2 events)"
    );
    let quiet = measure_ms(&history, &[], 9000).summary();
    assert_eq!(quiet, "availability: no fault events");
}
