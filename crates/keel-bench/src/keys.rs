//! Key naming and key choice: a small seeded generator and the uniform or zipfian sampler.
//! Pure; the same seed gives the same keys on every target.

use crate::config::Distribution;

/// The name of key `index`; the same on every target.
pub fn data_key(index: usize) -> Vec<u8> {
    format!("bench-{index:07}").into_bytes()
}

/// The counter `increment` adds to; apart from the data keys, which hold non-numeric values.
pub fn counter_key(index: usize) -> Vec<u8> {
    format!("bench-counter-{index:07}").into_bytes()
}

/// A lock name: the task's own (`task = Some`) or the one all tasks share.
pub fn lock_name(task: Option<usize>) -> Vec<u8> {
    match task {
        Some(task) => format!("bench-lock-{task:04}").into_bytes(),
        None => b"bench-lock-shared".to_vec(),
    }
}

/// SplitMix64: tiny, fast and good enough to pick keys; not for anything secret.
#[derive(Debug, Clone)]
pub struct Rng {
    state: u64,
}

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng { state: seed }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in [0, n); `n` > 0.
    pub fn below(&mut self, n: usize) -> usize {
        assert!(n > 0, "Rng::below(0)");
        ((u128::from(self.next_u64()) * n as u128) >> 64) as usize
    }
}

/// Picks key indexes in [0, keyspace).
#[derive(Debug, Clone)]
pub enum KeyChooser {
    Uniform {
        keyspace: usize,
    },
    /// Key i has weight 1 / (i + 1)^s; `cumulative[i]` is the sum of weights 0..=i.
    Zipf {
        cumulative: Vec<f64>,
    },
}

impl KeyChooser {
    pub fn new(distribution: Distribution, keyspace: usize) -> KeyChooser {
        assert!(keyspace > 0, "an empty keyspace");
        match distribution {
            Distribution::Uniform => KeyChooser::Uniform { keyspace },
            Distribution::Zipf { exponent } => {
                let mut total = 0.0;
                let cumulative = (0..keyspace)
                    .map(|rank| {
                        total += 1.0 / ((rank + 1) as f64).powf(exponent);
                        total
                    })
                    .collect();
                KeyChooser::Zipf { cumulative }
            }
        }
    }

    pub fn choose(&self, rng: &mut Rng) -> usize {
        match self {
            KeyChooser::Uniform { keyspace } => rng.below(*keyspace),
            KeyChooser::Zipf { cumulative } => {
                let total = cumulative[cumulative.len() - 1];
                let point = rng.next_f64() * total;
                cumulative
                    .partition_point(|&sum| sum <= point)
                    .min(cumulative.len() - 1)
            }
        }
    }
}

#[cfg(test)]
mod tests;
