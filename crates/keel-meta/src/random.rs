//! The randomness seam: decisions that sample draw from a `RandomSource` they are handed, so
//! tests can script the draws and a node can seed its own.

/// Uniform random numbers.
pub trait RandomSource {
    /// A number in `0..bound`, each equally likely. `bound` is at least 1.
    fn below(&mut self, bound: u64) -> u64;
}

/// SplitMix64 (Steele, Lea and Flood, 2014): a small, fast generator with a 64-bit state.
/// Good enough for sampling; not for anything an adversary may exploit.
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64 { state: seed }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

impl RandomSource for SplitMix64 {
    /// Lemire's multiply-shift: the bias is at most `bound / 2^64`, nothing at these bounds.
    fn below(&mut self, bound: u64) -> u64 {
        assert!(bound > 0, "RandomSource::below needs a bound of at least 1");
        let wide = u128::from(self.next_u64()) * u128::from(bound);
        (wide >> 64) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix_matches_the_reference_sequence() {
        // First outputs of the reference implementation seeded with 0.
        let mut random = SplitMix64::new(0);
        let expected = [
            0xe220_a839_7b1d_cdaf,
            0x6e78_9e6a_a1b9_65f4,
            0x06c4_5d18_8009_454f,
        ];
        for value in expected {
            assert_eq!(random.next_u64(), value);
        }
    }

    #[test]
    fn draws_stay_below_the_bound_and_cover_it() {
        let mut random = SplitMix64::new(7);
        let mut seen = [0u32; 5];
        for _ in 0..1_000 {
            let draw = random.below(5);
            assert!(draw < 5, "{draw}");
            seen[draw as usize] += 1;
        }
        for (value, count) in seen.iter().enumerate() {
            assert!(
                (150..=250).contains(count),
                "{value} drawn {count} times of 1000"
            );
        }
        assert_eq!(random.below(1), 0);
    }
}
