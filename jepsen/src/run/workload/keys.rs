//! The keys of a workload: a few active at a time, each retired after a number of ops (so a
//! key's history stays within the checker's budget) and replaced by a fresh one; values unique
//! per key; the last state a client saw of each key. Knows nothing of the network.

use std::sync::Mutex;

use serde_json::Value;

use crate::run::rng::Rng;

/// Keys a run may create in all; past it the pool keeps using the last ones.
pub const KEYS_MAX: u64 = 100_000;

#[derive(Debug)]
pub struct KeyPool {
    prefix: &'static str,
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
    /// `active` keys at a time, each used by at most `key_ops_max` ops.
    pub fn new(prefix: &'static str, active: usize, key_ops_max: u64) -> KeyPool {
        let mut state = PoolState {
            slots: Vec::new(),
            next_key: 0,
            all: Vec::new(),
        };
        for _ in 0..active.max(1) {
            let slot = state.fresh(prefix);
            state.slots.push(slot);
        }
        KeyPool {
            prefix,
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
            let fresh = state.fresh(self.prefix);
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
    fn fresh(&mut self, prefix: &str) -> Slot {
        let key = format!("{prefix}{}", self.next_key);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_retire_after_their_ops_and_values_stay_unique() {
        let pool = KeyPool::new("r", 2, 3);
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
}
