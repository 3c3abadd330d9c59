//! The keys of a workload: a few active at a time, each retired after a number of ops (so a
//! key's history stays within the checker's budget) and replaced by a fresh one; values unique
//! per key; the last state a client saw of each key; and, for runs over several ranges, key
//! names that spread over the ranges and the split points that make those ranges. Knows
//! nothing of the network.
//!
//! Key names: `{prefix}{n}` for the n-th key of a one-range run; over `shards` ranges the n-th
//! key goes to shard `s = n % shards` and is named `{prefix}{s:02}.{n}`, so that splitting at
//! `{prefix}{s:02}` puts each shard's keys in a range of their own (`split_points`).

use std::sync::Mutex;

use serde_json::Value;

use crate::run::rng::Rng;

/// Keys a run may create in all; past it the pool keeps using the last ones.
pub const KEYS_MAX: u64 = 100_000;
/// Shards (ranges) key names can spread over: shard numbers have two digits.
pub const SHARDS_MAX: usize = 100;

#[derive(Debug)]
pub struct KeyPool {
    prefix: &'static str,
    shards: usize,
    key_ops_max: u64,
    state: Mutex<PoolState>,
}

#[derive(Debug)]
struct PoolState {
    slots: Vec<Slot>,
    next_key: u64,
    all: Vec<String>,
}

#[derive(Debug)]
struct Slot {
    key: String,
    ops: u64,
    next_value: u64,
    known: Value,
}

/// What `pick` hands a client for one op.
#[derive(Debug, Clone, PartialEq)]
pub struct Pick {
    pub key: String,
    /// A value no other op of this key uses.
    pub value: u64,
    /// The last state of the key a client confirmed (null = absent or unknown).
    pub known: Value,
}

impl KeyPool {
    /// `active` keys at a time, each used by at most `key_ops_max` ops, named to spread over
    /// `shards` ranges (1 to `SHARDS_MAX`).
    pub fn new(prefix: &'static str, active: usize, key_ops_max: u64, shards: usize) -> KeyPool {
        let shards = shards.clamp(1, SHARDS_MAX);
        let mut state = PoolState {
            slots: Vec::new(),
            next_key: 0,
            all: Vec::new(),
        };
        for _ in 0..active.max(1) {
            let slot = state.fresh(prefix, shards);
            state.slots.push(slot);
        }
        KeyPool {
            prefix,
            shards,
            key_ops_max,
            state: Mutex::new(state),
        }
    }

    /// A random active key for one op, with a value unique to it. A key that reaches its op
    /// limit is replaced for the ops after this one.
    pub fn pick(&self, rng: &mut Rng) -> Pick {
        let mut state = self.state.lock().expect("key pool lock poisoned");
        let index = rng.below(state.slots.len() as u64) as usize;
        let slot = &mut state.slots[index];
        slot.ops += 1;
        slot.next_value += 1;
        let pick = Pick {
            key: slot.key.clone(),
            value: slot.next_value,
            known: slot.known.clone(),
        };
        if slot.ops >= self.key_ops_max && state.next_key < KEYS_MAX {
            let fresh = state.fresh(self.prefix, self.shards);
            state.slots[index] = fresh;
        }
        pick
    }

    /// Notes a state of `key` a client confirmed (a read, or an acknowledged write).
    pub fn learn(&self, key: &str, value: Value) {
        let mut state = self.state.lock().expect("key pool lock poisoned");
        if let Some(slot) = state.slots.iter_mut().find(|slot| slot.key == key) {
            slot.known = value;
        }
    }

    /// The keys in use now.
    pub fn active(&self) -> Vec<String> {
        let state = self.state.lock().expect("key pool lock poisoned");
        state.slots.iter().map(|slot| slot.key.clone()).collect()
    }

    /// Every key handed out so far, in order.
    pub fn all(&self) -> Vec<String> {
        self.state
            .lock()
            .expect("key pool lock poisoned")
            .all
            .clone()
    }
}

impl PoolState {
    fn fresh(&mut self, prefix: &str, shards: usize) -> Slot {
        let key = key_name(prefix, self.next_key, shards);
        self.next_key += 1;
        self.all.push(key.clone());
        Slot {
            key,
            ops: 0,
            next_value: 0,
            known: Value::Null,
        }
    }
}

/// The name of key `n` of a pool spreading over `shards` ranges (module doc).
pub fn key_name(prefix: &str, n: u64, shards: usize) -> String {
    match shards {
        0 | 1 => format!("{prefix}{n}"),
        _ => format!("{prefix}{:02}.{n}", n % shards as u64),
    }
}

/// Where to split the keyspace so that keys named by `key_name` under each of `families`
/// (the prefixes a workload's requests are routed by, in key order) spread over `ranges`
/// ranges: `ranges - 1` split keys in key order. Each family after the first starts a range of
/// its own (so a lock never shares a range with the key it guards); the other split keys are
/// shard boundaries `{family}{s:02}`, spread evenly over all families' shards.
pub fn split_points(families: &[String], ranges: usize) -> Vec<Vec<u8>> {
    let ranges = ranges.clamp(1, SHARDS_MAX);
    let wanted = ranges - 1;
    let mut points: Vec<String> = families.iter().skip(1).take(wanted).cloned().collect();
    let boundaries: Vec<String> = families
        .iter()
        .flat_map(|family| (1..ranges).map(move |shard| format!("{family}{shard:02}")))
        .collect();
    let more = wanted - points.len();
    for i in 0..more {
        // The middle of the i-th of `more` equal slices of the boundaries.
        points.push(boundaries[(2 * i + 1) * boundaries.len() / (2 * more)].clone());
    }
    points.sort();
    points.dedup();
    points.into_iter().map(String::into_bytes).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_retire_after_their_ops_and_values_stay_unique() {
        let pool = KeyPool::new("r", 2, 3, 1);
        let mut rng = Rng::new(1);
        let picks: Vec<Pick> = (0..12).map(|_| pool.pick(&mut rng)).collect();
        for key in pool.all() {
            let values: Vec<u64> = picks
                .iter()
                .filter(|p| p.key == key)
                .map(|p| p.value)
                .collect();
            assert!(values.len() <= 3, "{key}: {values:?}");
            let mut unique = values.clone();
            unique.dedup();
            assert_eq!(unique, values, "{key}");
        }
        let counts: Vec<usize> = pool
            .all()
            .iter()
            .map(|key| picks.iter().filter(|p| &p.key == key).count())
            .collect();
        assert_eq!(counts.iter().sum::<usize>(), 12);
        // Only the two keys still active may have fewer than 3 ops.
        assert!(
            counts.iter().filter(|count| **count < 3).count() <= 2,
            "{counts:?}"
        );
    }

    #[test]
    fn one_range_keeps_plain_names_and_shards_spread_keys() {
        assert_eq!(key_name("r", 7, 1), "r7");
        assert_eq!(key_name("r", 7, 4), "r03.7");
        assert_eq!(key_name("r", 12, 8), "r04.12");
        let pool = KeyPool::new("c", 3, u64::MAX, 4);
        assert_eq!(pool.active(), ["c00.0", "c01.1", "c02.2"]);
    }

    #[test]
    fn split_points_give_the_asked_ranges_and_separate_families() {
        let one = vec!["r".to_string()];
        assert!(split_points(&one, 1).is_empty());
        let points = split_points(&one, 8);
        let expected: Vec<Vec<u8>> = (1..8).map(|s| format!("r{s:02}").into_bytes()).collect();
        assert_eq!(points, expected);

        let two = vec!["fk".to_string(), "lock-fk".to_string()];
        for ranges in 2..=12 {
            let points = split_points(&two, ranges);
            assert_eq!(points.len(), ranges - 1, "{ranges}: {points:?}");
            assert!(
                points.contains(&b"lock-fk".to_vec()),
                "{ranges}: {points:?}"
            );
            assert!(points.windows(2).all(|w| w[0] < w[1]), "{points:?}");
        }
        // Every key and its lock land in different ranges.
        let points = split_points(&two, 8);
        let range_of = |key: &str| {
            points
                .iter()
                .filter(|p| p.as_slice() <= key.as_bytes())
                .count()
        };
        for n in 0..20 {
            let key = key_name("fk", n, 8);
            assert_ne!(range_of(&key), range_of(&format!("lock-{key}")), "{key}");
        }
    }
}
