//! A small seeded random generator (SplitMix64) for the runner's choices: which fault, which
//! node, which key, which op. Written out here rather than taken from a crate so that a seed
//! means the same fault sequence on every version. Knows nothing of what it is used for.

/// SplitMix64 (Steele, Lea, Flood): a 64-bit state, one add and two multiplies per draw.
#[derive(Debug, Clone, PartialEq, Eq)]
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

    /// A number in `0..n`; `n` must be positive. (The modulo bias is below 2^-40 for the
    /// small `n` the runner uses.)
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0, "Rng::below(0)");
        self.next_u64() % n
    }

    /// A number in `low..=high`.
    pub fn between(&mut self, low: u64, high: u64) -> u64 {
        assert!(low <= high, "Rng::between({low}, {high})");
        low + self.below(high - low + 1)
    }

    /// True with probability `per_mille` / 1000.
    pub fn chance(&mut self, per_mille: u64) -> bool {
        self.below(1000) < per_mille
    }

    /// An independent generator for one purpose (one client, the nemesis), so that what one
    /// draws does not shift what another draws.
    pub fn fork(&self, stream: u64) -> Rng {
        let mut mixer = Rng::new(self.state ^ stream.wrapping_mul(0xD6E8_FEB8_6659_FD93));
        Rng::new(mixer.next_u64())
    }

    /// Shuffles `items` in place (Fisher–Yates).
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            items.swap(i, j);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_numbers_and_forks_differ() {
        let draws = |seed| {
            let mut rng = Rng::new(seed);
            (0..4).map(|_| rng.next_u64()).collect::<Vec<_>>()
        };
        assert_eq!(draws(7), draws(7));
        assert_ne!(draws(7), draws(8));
        let root = Rng::new(7);
        assert_ne!(root.fork(1).next_u64(), root.fork(2).next_u64());
        let mut rng = Rng::new(1);
        assert!((0..1000).all(|_| (3..=5).contains(&rng.between(3, 5))));
    }
}
