//! The key sampler: deterministic for a seed, uniform when asked, and zipfian with the right
//! head weight and a falling tail.

use super::*;

const SAMPLES: usize = 200_000;

fn histogram(chooser: &KeyChooser, keyspace: usize, seed: u64) -> Vec<usize> {
    let mut rng = Rng::new(seed);
    let mut counts = vec![0; keyspace];
    for _ in 0..SAMPLES {
        counts[chooser.choose(&mut rng)] += 1;
    }
    counts
}

#[test]
fn same_seed_same_keys() {
    let chooser = KeyChooser::new(Distribution::Zipf { exponent: 0.99 }, 1_000);
    let draw = |seed| {
        let mut rng = Rng::new(seed);
        (0..100)
            .map(|_| chooser.choose(&mut rng))
            .collect::<Vec<_>>()
    };
    assert_eq!(draw(7), draw(7));
    assert_ne!(draw(7), draw(8));
}

#[test]
fn uniform_covers_evenly() {
    let keyspace = 100;
    let counts = histogram(
        &KeyChooser::new(Distribution::Uniform, keyspace),
        keyspace,
        1,
    );
    let expected = SAMPLES / keyspace;
    for (key, &count) in counts.iter().enumerate() {
        // 2,000 expected per key; a deviation of 15 % is over 6 standard deviations.
        assert!(
            count.abs_diff(expected) < expected * 15 / 100,
            "key {key}: {count}"
        );
    }
}

#[test]
fn zipf_head_matches_the_law() {
    let (keyspace, exponent) = (1_000, 0.99);
    let counts = histogram(
        &KeyChooser::new(Distribution::Zipf { exponent }, keyspace),
        keyspace,
        42,
    );
    let total: f64 = (1..=keyspace)
        .map(|rank| 1.0 / (rank as f64).powf(exponent))
        .sum();
    for rank in [0usize, 1, 9] {
        let expected = SAMPLES as f64 / ((rank + 1) as f64).powf(exponent) / total;
        let observed = counts[rank] as f64;
        assert!(
            (observed - expected).abs() < expected * 0.1,
            "rank {rank}: {observed} vs {expected}"
        );
    }
    assert!(counts[0] > counts[1] && counts[1] > counts[10] && counts[10] > counts[500]);
    assert_eq!(counts.iter().sum::<usize>(), SAMPLES);
}

#[test]
fn steeper_zipf_is_hotter() {
    let keyspace = 1_000;
    let mild = histogram(
        &KeyChooser::new(Distribution::Zipf { exponent: 0.5 }, keyspace),
        keyspace,
        3,
    );
    let steep = histogram(
        &KeyChooser::new(Distribution::Zipf { exponent: 1.5 }, keyspace),
        keyspace,
        3,
    );
    assert!(steep[0] > 3 * mild[0], "{} vs {}", steep[0], mild[0]);
}

#[test]
fn one_key_keyspace() {
    let mut rng = Rng::new(5);
    for distribution in [Distribution::Uniform, Distribution::Zipf { exponent: 2.0 }] {
        let chooser = KeyChooser::new(distribution, 1);
        assert!((0..1_000).all(|_| chooser.choose(&mut rng) == 0));
    }
}

#[test]
fn unit_interval_and_bounds() {
    let mut rng = Rng::new(0);
    for _ in 0..10_000 {
        let x = rng.next_f64();
        assert!((0.0..1.0).contains(&x));
        assert!(rng.below(3) < 3);
    }
}

#[test]
fn key_names_sort_by_index() {
    assert_eq!(data_key(42), b"bench-0000042");
    assert_eq!(counter_key(7), b"bench-counter-0000007");
    assert!(data_key(9) < data_key(10));
}
