//! One range's recent load: how many requests it served in each of the last seconds, and a
//! bounded sample of the keys they named (reservoir sampling), from which a load split picks
//! its key. Time comes in as whole seconds from the caller's clock; randomness from a
//! `RandomSource`. Knows nothing of threads or clocks.

use crate::limits::{
    LOAD_RATE_SECS, LOAD_SAMPLE_KEY_BYTES_MAX, LOAD_SAMPLE_PERIOD_SECS, LOAD_SAMPLES_MAX,
    LOAD_WINDOW_SECS,
};
use crate::random::RandomSource;

/// Slots of the per-second ring: the completed seconds kept and the current one.
const SLOTS: usize = LOAD_WINDOW_SECS + 1;

/// Requests per second over the last `LOAD_WINDOW_SECS` seconds and up to
/// 2 × `LOAD_SAMPLES_MAX` sampled keys, in fixed memory. Time never goes back for a window: a
/// second earlier than the newest one it has seen counts as that newest second.
#[derive(Debug, Clone)]
pub struct LoadWindow {
    /// Requests of second `s` are in slot `s % SLOTS`, for the `SLOTS` seconds up to `second`.
    counts: [u32; SLOTS],
    /// The newest second seen.
    second: u64,
    /// Keys sampled in the newest sampling period, and in the one before it.
    current: Reservoir,
    previous: Reservoir,
}

impl LoadWindow {
    /// An empty window: no request in any second up to `now_sec`.
    pub fn new(now_sec: u64) -> LoadWindow {
        LoadWindow {
            counts: [0; SLOTS],
            second: now_sec,
            current: Reservoir::new(now_sec / LOAD_SAMPLE_PERIOD_SECS),
            previous: Reservoir::new(0),
        }
    }

    /// Counts one request for `key` in second `now_sec`, and offers the key to the sample.
    pub fn record(&mut self, now_sec: u64, key: &[u8], random: &mut dyn RandomSource) {
        let now_sec = self.advance(now_sec);
        let slot = &mut self.counts[slot_of(now_sec)];
        *slot = slot.saturating_add(1);
        let period = now_sec / LOAD_SAMPLE_PERIOD_SECS;
        if period > self.current.period {
            let current = std::mem::replace(&mut self.current, Reservoir::new(period));
            self.previous = if current.period + 1 == period {
                current
            } else {
                Reservoir::new(0)
            };
        }
        self.current.offer(key, random);
    }

    /// Requests in each of the `LOAD_WINDOW_SECS` completed seconds before `now_sec`, oldest
    /// first (0 for seconds before the window existed).
    pub fn history(&self, now_sec: u64) -> Vec<u64> {
        let now_sec = now_sec.max(self.second);
        (1..=LOAD_WINDOW_SECS as u64)
            .rev()
            .map(|back| {
                now_sec
                    .checked_sub(back)
                    .map_or(0, |second| self.count(second))
            })
            .collect()
    }

    /// Mean requests per second over the `LOAD_RATE_SECS` completed seconds before `now_sec`.
    pub fn requests_per_sec(&self, now_sec: u64) -> f64 {
        let history = self.history(now_sec);
        let recent: u64 = history[history.len() - LOAD_RATE_SECS..].iter().sum();
        recent as f64 / LOAD_RATE_SECS as f64
    }

    /// Keys sampled in the sampling period of `now_sec` and the one before (each cut to
    /// `LOAD_SAMPLE_KEY_BYTES_MAX`), in no particular order.
    pub fn samples(&self, now_sec: u64) -> impl Iterator<Item = &[u8]> {
        let period = now_sec.max(self.second) / LOAD_SAMPLE_PERIOD_SECS;
        [&self.previous, &self.current]
            .into_iter()
            .filter(move |reservoir| reservoir.period + 1 >= period)
            .flat_map(|reservoir| reservoir.keys.iter().map(Vec::as_slice))
    }

    /// Moves the window to `now_sec` (clearing the seconds it skips) unless it is already
    /// there or later; returns the window's second.
    fn advance(&mut self, now_sec: u64) -> u64 {
        if now_sec <= self.second {
            return self.second;
        }
        if now_sec - self.second >= SLOTS as u64 {
            self.counts = [0; SLOTS];
        } else {
            for second in self.second + 1..=now_sec {
                self.counts[slot_of(second)] = 0;
            }
        }
        self.second = now_sec;
        now_sec
    }

    /// Requests of `second`: 0 once it left the ring or before it was reached.
    fn count(&self, second: u64) -> u64 {
        if second > self.second || self.second - second >= SLOTS as u64 {
            return 0;
        }
        u64::from(self.counts[slot_of(second)])
    }
}

fn slot_of(second: u64) -> usize {
    (second % SLOTS as u64) as usize
}

/// A uniform sample of up to `LOAD_SAMPLES_MAX` keys of one sampling period (Vitter's
/// algorithm R): the n-th key offered replaces a random kept one with probability
/// `LOAD_SAMPLES_MAX / n`.
#[derive(Debug, Clone)]
struct Reservoir {
    period: u64,
    /// Keys offered in this period.
    seen: u64,
    keys: Vec<Vec<u8>>,
}

impl Reservoir {
    fn new(period: u64) -> Reservoir {
        Reservoir {
            period,
            seen: 0,
            keys: Vec::new(),
        }
    }

    fn offer(&mut self, key: &[u8], random: &mut dyn RandomSource) {
        self.seen += 1;
        let key = &key[..key.len().min(LOAD_SAMPLE_KEY_BYTES_MAX)];
        if self.keys.len() < LOAD_SAMPLES_MAX {
            self.keys.push(key.to_vec());
            return;
        }
        let slot = random.below(self.seen);
        if let Some(kept) = usize::try_from(slot)
            .ok()
            .and_then(|s| self.keys.get_mut(s))
        {
            kept.clear();
            kept.extend_from_slice(key);
        }
    }
}

#[cfg(test)]
mod tests;
