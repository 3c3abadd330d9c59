//! Load windows: per-second counts, their history, and the key sample.

use std::collections::VecDeque;

use super::*;
use crate::SplitMix64;

/// Draws from a script, checking the bound of each draw.
struct Scripted {
    draws: VecDeque<(u64, u64)>,
}

impl Scripted {
    /// `(expected bound, draw)` pairs.
    fn new(draws: &[(u64, u64)]) -> Scripted {
        Scripted {
            draws: draws.iter().copied().collect(),
        }
    }
}

impl RandomSource for Scripted {
    fn below(&mut self, bound: u64) -> u64 {
        let (expected, draw) = self.draws.pop_front().expect("an unscripted draw");
        assert_eq!(bound, expected, "draw bound");
        draw
    }
}

/// A source that must not be drawn from.
fn no_draws() -> Scripted {
    Scripted::new(&[])
}

/// The last `n` seconds of the history at `now_sec`.
fn last(window: &LoadWindow, now_sec: u64, n: usize) -> Vec<u64> {
    let history = window.history(now_sec);
    assert_eq!(history.len(), LOAD_WINDOW_SECS);
    history[history.len() - n..].to_vec()
}

#[test]
fn requests_are_counted_per_completed_second() {
    let mut window = LoadWindow::new(100);
    let mut random = SplitMix64::new(1);
    for second in [100, 100, 100, 101, 103, 103] {
        window.record(second, b"k", &mut random);
    }
    let cases: Vec<(u64, Vec<u64>)> = vec![
        (103, vec![0, 0, 3, 1, 0]),
        (104, vec![0, 3, 1, 0, 2]),
        (106, vec![1, 0, 2, 0, 0]),
        // A reader behind the window sees it at its newest second.
        (50, vec![0, 0, 3, 1, 0]),
    ];
    for (now_sec, expected) in cases {
        assert_eq!(last(&window, now_sec, 5), expected, "at {now_sec}");
    }
    let gone = 103 + LOAD_WINDOW_SECS as u64 + 1;
    assert_eq!(window.history(gone), vec![0; LOAD_WINDOW_SECS]);
    assert_eq!(LoadWindow::new(0).history(0), vec![0; LOAD_WINDOW_SECS]);
}

#[test]
fn seconds_leaving_the_ring_are_cleared() {
    let mut window = LoadWindow::new(10);
    let mut random = SplitMix64::new(1);
    window.record(10, b"k", &mut random);
    window.record(11, b"k", &mut random);
    // The slot of second 10 comes round again; second 11 is still in the window.
    let again = 10 + SLOTS as u64;
    window.record(again, b"k", &mut random);
    assert_eq!(window.history(again + 1)[0], 0, "second {}", again + 1 - 60);
    assert_eq!(window.history(again)[0], 1, "second 11 is kept");
    assert_eq!(last(&window, again + 1, 1), vec![1]);
    // A jump past the whole ring clears everything.
    window.record(again + 1_000, b"k", &mut random);
    assert_eq!(window.history(again + 1_000).iter().sum::<u64>(), 0);
}

#[test]
fn a_clock_going_back_counts_into_the_newest_second() {
    let mut window = LoadWindow::new(200);
    let mut random = SplitMix64::new(1);
    window.record(200, b"k", &mut random);
    window.record(190, b"k", &mut random);
    assert_eq!(last(&window, 201, 2), vec![0, 2]);
}

#[test]
fn the_rate_is_the_mean_of_the_last_completed_seconds() {
    let mut window = LoadWindow::new(0);
    let mut random = SplitMix64::new(1);
    for second in 1..=LOAD_RATE_SECS as u64 {
        for _ in 0..50 {
            window.record(second, b"k", &mut random);
        }
    }
    let end = LOAD_RATE_SECS as u64;
    assert_eq!(window.requests_per_sec(end + 1), 50.0);
    assert_eq!(
        window.requests_per_sec(end),
        45.0,
        "the current second is left out"
    );
    assert_eq!(window.requests_per_sec(end + 6), 25.0);
    assert_eq!(window.requests_per_sec(end + 11), 0.0);
}

fn key(i: usize) -> Vec<u8> {
    format!("k{i:05}").into_bytes()
}

fn sorted(window: &LoadWindow, now_sec: u64) -> Vec<Vec<u8>> {
    let mut samples: Vec<Vec<u8>> = window.samples(now_sec).map(<[u8]>::to_vec).collect();
    samples.sort();
    samples
}

#[test]
fn the_reservoir_keeps_the_first_keys_then_replaces_at_random() {
    let mut window = LoadWindow::new(0);
    for i in 0..LOAD_SAMPLES_MAX {
        window.record(0, &key(i), &mut no_draws());
    }
    let n = LOAD_SAMPLES_MAX as u64;
    // Key 32 (the 33rd) replaces slot 3; key 33 draws 33 of 34 and is not kept; key 34
    // replaces slot 0.
    let mut random = Scripted::new(&[(n + 1, 3), (n + 2, n + 1), (n + 3, 0)]);
    for i in LOAD_SAMPLES_MAX..LOAD_SAMPLES_MAX + 3 {
        window.record(0, &key(i), &mut random);
    }
    assert!(random.draws.is_empty());
    let mut expected: Vec<Vec<u8>> = (0..LOAD_SAMPLES_MAX).map(key).collect();
    expected[3] = key(LOAD_SAMPLES_MAX);
    expected[0] = key(LOAD_SAMPLES_MAX + 2);
    expected.sort();
    assert_eq!(sorted(&window, 0), expected);
}

#[test]
fn the_sample_spreads_over_all_the_keys_offered() {
    let mut window = LoadWindow::new(0);
    let mut random = SplitMix64::new(9);
    let offered = 10_000;
    for i in 0..offered {
        window.record(0, &key(i), &mut random);
    }
    let samples = sorted(&window, 0);
    assert_eq!(samples.len(), LOAD_SAMPLES_MAX);
    let late = samples
        .iter()
        .filter(|k| k.as_slice() >= key(offered / 2).as_slice())
        .count();
    // Each kept key is from the second half with probability 1/2; keeping only the first
    // keys offered (a broken reservoir) gives 0.
    assert!(
        (8..=24).contains(&late),
        "{late} of {} from the second half",
        samples.len()
    );
}

#[test]
fn samples_describe_the_current_and_the_last_period() {
    let period = LOAD_SAMPLE_PERIOD_SECS;
    let mut window = LoadWindow::new(0);
    let mut random = SplitMix64::new(1);
    window.record(0, b"first", &mut random);
    window.record(period, b"second", &mut random);
    let keys = |window: &LoadWindow, now_sec: u64| -> Vec<String> {
        let mut keys: Vec<String> = window
            .samples(now_sec)
            .map(|key| String::from_utf8(key.to_vec()).unwrap())
            .collect();
        keys.sort();
        keys
    };
    assert_eq!(keys(&window, period), ["first", "second"]);
    assert_eq!(keys(&window, 2 * period), ["second"], "read a period later");
    assert_eq!(keys(&window, 3 * period), Vec::<String>::new());
    window.record(2 * period, b"third", &mut random);
    assert_eq!(keys(&window, 2 * period), ["second", "third"]);
    window.record(5 * period, b"fourth", &mut random);
    assert_eq!(
        keys(&window, 5 * period),
        ["fourth"],
        "after a quiet period"
    );
}

#[test]
fn long_keys_are_cut_in_the_sample() {
    let mut window = LoadWindow::new(0);
    let long = vec![b'x'; LOAD_SAMPLE_KEY_BYTES_MAX + 100];
    window.record(0, &long, &mut no_draws());
    let samples: Vec<&[u8]> = window.samples(0).collect();
    assert_eq!(samples, vec![&long[..LOAD_SAMPLE_KEY_BYTES_MAX]]);
}
