//! The node's hot keys: a sample of the keys its local ranges serve (each request with
//! probability 1 / `HOT_KEYS_SAMPLE_EVERY`, drawn without a lock from a seeded SplitMix64,
//! so a regular request pattern cannot alias with the sampling), counted per window of `HOT_KEYS_WINDOW_SECS` with the
//! space-saving algorithm (at most `HOT_KEYS_COUNTED_MAX` counters; a new key takes the
//! place of the smallest count, plus one, so a key's count may be over but never under its
//! sampled requests while it is kept), and reported as the top `HOT_KEYS_REPORTED_MAX` of the
//! last two windows. Keys are kept cut to `HOT_KEY_BYTES_MAX` bytes. Time is an argument or
//! the node's clock seam. A key of a tenant's namespace is kept as the tenant's name and the key
//! within it, never with the internal prefix. Knows nothing of gRPC or the text format.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use keel_meta::{RandomSource, SplitMix64};
use keel_types::SharedClock;
use keel_types::limits::{
    HOT_KEY_BYTES_MAX, HOT_KEYS_COUNTED_MAX, HOT_KEYS_REPORTED_MAX, HOT_KEYS_SAMPLE_EVERY,
    HOT_KEYS_WINDOW_SECS,
};
use keel_types::tenant::{TENANT_MARK, namespace_prefix_len};

/// A key as counted: the tenant whose namespace holds it (`None` outside every namespace),
/// the first `HOT_KEY_BYTES_MAX` bytes of the key within it, and whether it was longer.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct HotKey {
    pub tenant: Option<String>,
    pub prefix: Vec<u8>,
    pub cut: bool,
}

impl HotKey {
    pub fn of(stored: &[u8]) -> HotKey {
        let prefix_len = namespace_prefix_len(stored);
        let tenant = (prefix_len > 0).then(|| {
            // The prefix is the mark, the name (lowercase ASCII) and one end byte.
            let name = &stored[TENANT_MARK.len()..prefix_len - 1];
            String::from_utf8_lossy(name).into_owned()
        });
        let key = &stored[prefix_len..];
        let cut = key.len() > HOT_KEY_BYTES_MAX;
        HotKey {
            tenant,
            prefix: key[..key.len().min(HOT_KEY_BYTES_MAX)].to_vec(),
            cut,
        }
    }

    /// The key as a label value, one to one: printable ASCII other than `\` as it is, every
    /// other byte as `\xNN`, and `…` after a key that was cut.
    pub fn label(&self) -> String {
        let mut label = String::with_capacity(self.prefix.len());
        for byte in &self.prefix {
            match byte {
                b' '..=b'~' if *byte != b'\\' => label.push(char::from(*byte)),
                byte => label.push_str(&format!("\\x{byte:02x}")),
            }
        }
        if self.cut {
            label.push('…');
        }
        label
    }
}

/// Space-saving counters of one window.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Counts {
    counts: HashMap<HotKey, u64>,
}

impl Counts {
    /// Counts one sample of `key`; when all counters are taken, the key replaces the one
    /// with the smallest count (the first in key order among equals) and takes its count + 1.
    pub fn record(&mut self, key: HotKey) {
        if let Some(count) = self.counts.get_mut(&key) {
            *count += 1;
            return;
        }
        if self.counts.len() < HOT_KEYS_COUNTED_MAX {
            self.counts.insert(key, 1);
            return;
        }
        let (smallest, count) = self
            .counts
            .iter()
            .min_by(|a, b| a.1.cmp(b.1).then_with(|| a.0.cmp(b.0)))
            .map(|(key, count)| (key.clone(), *count))
            .expect("the counters are full");
        self.counts.remove(&smallest);
        self.counts.insert(key, count + 1);
    }
}

/// The `HOT_KEYS_REPORTED_MAX` largest of the sums of `windows`' counts, largest first (key
/// order among equals).
pub(crate) fn top(windows: &[&Counts]) -> Vec<(HotKey, u64)> {
    let mut sums: HashMap<&HotKey, u64> = HashMap::new();
    for window in windows {
        for (key, count) in &window.counts {
            *sums.entry(key).or_default() += count;
        }
    }
    let mut top: Vec<(HotKey, u64)> = sums
        .into_iter()
        .map(|(key, count)| (key.clone(), count))
        .collect();
    top.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    top.truncate(HOT_KEYS_REPORTED_MAX);
    top
}

/// The current and the previous window.
#[derive(Debug, Default)]
pub(crate) struct Windows {
    /// Second the current window started at.
    start_sec: u64,
    current: Counts,
    previous: Counts,
}

impl Windows {
    pub fn record(&mut self, now_sec: u64, key: HotKey) {
        self.rotate(now_sec);
        self.current.record(key);
    }

    /// The top keys of the last two windows, with their sampled counts.
    pub fn top(&mut self, now_sec: u64) -> Vec<(HotKey, u64)> {
        self.rotate(now_sec);
        top(&[&self.previous, &self.current])
    }

    /// Starts a new window once the current one is `HOT_KEYS_WINDOW_SECS` old; the previous
    /// window is dropped too when the current one is twice that old.
    fn rotate(&mut self, now_sec: u64) {
        let age = now_sec.saturating_sub(self.start_sec);
        if age < HOT_KEYS_WINDOW_SECS {
            return;
        }
        self.previous = match age < 2 * HOT_KEYS_WINDOW_SECS {
            true => std::mem::take(&mut self.current),
            false => Counts::default(),
        };
        self.current = Counts::default();
        self.start_sec = now_sec;
    }
}

/// The node's hot-key sampler; thread-safe.
pub(crate) struct HotKeys {
    clock: SharedClock,
    /// Requests seen; the n-th request's draw is the first output of SplitMix64 seeded
    /// with `seed ^ n`.
    requests: AtomicU64,
    seed: u64,
    /// One request in this many is sampled, on average.
    sample_every: u64,
    windows: Mutex<Windows>,
}

impl HotKeys {
    /// A sampler keeping one request in `HOT_KEYS_SAMPLE_EVERY`, randomly seeded.
    pub fn new(clock: SharedClock) -> HotKeys {
        HotKeys::with_sampling(clock, rand::random(), HOT_KEYS_SAMPLE_EVERY)
    }

    /// A sampler keeping one request in `sample_every` (at least 1), seeded with `seed`.
    pub fn with_sampling(clock: SharedClock, seed: u64, sample_every: u64) -> HotKeys {
        assert!(sample_every >= 1, "sample one request in at least 1");
        let start_sec = clock.now_ms() / 1_000;
        HotKeys {
            clock,
            requests: AtomicU64::new(0),
            seed,
            sample_every,
            windows: Mutex::new(Windows {
                start_sec,
                ..Windows::default()
            }),
        }
    }

    /// Counts a request for `key` when it is sampled.
    pub fn record(&self, key: &[u8]) {
        let request = self.requests.fetch_add(1, Ordering::Relaxed);
        let mut draw = SplitMix64::new(self.seed ^ request);
        if draw.below(self.sample_every) != 0 {
            return;
        }
        let now_sec = self.clock.now_ms() / 1_000;
        let key = HotKey::of(key);
        self.lock().record(now_sec, key);
    }

    /// The top keys with their estimated requests (sampled count × the sampling rate).
    pub fn report(&self) -> Vec<(HotKey, u64)> {
        let now_sec = self.clock.now_ms() / 1_000;
        let mut top = self.lock().top(now_sec);
        for (_, count) in &mut top {
            *count *= self.sample_every;
        }
        top
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Windows> {
        self.windows.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use keel_types::ManualClock;
    use keel_types::tenant::{Namespace, TenantName};

    use super::*;

    fn key(name: &str) -> HotKey {
        HotKey::of(name.as_bytes())
    }

    fn counted(samples: &[&str]) -> Counts {
        let mut counts = Counts::default();
        for sample in samples {
            counts.record(key(sample));
        }
        counts
    }

    fn names(top: &[(HotKey, u64)]) -> Vec<(String, u64)> {
        top.iter()
            .map(|(key, count)| (key.label(), *count))
            .collect()
    }

    #[test]
    fn keys_show_as_one_to_one_labels() {
        let long = vec![b'a'; HOT_KEY_BYTES_MAX + 1];
        let cut = format!("{}…", "a".repeat(HOT_KEY_BYTES_MAX));
        let exact = "b".repeat(HOT_KEY_BYTES_MAX);
        let cases: Vec<(&[u8], &str)> = vec![
            (b"user:17", "user:17"),
            (b"a b~", "a b~"),
            (b"back\\slash", "back\\x5cslash"),
            (b"\x00\xff\n", "\\x00\\xff\\x0a"),
            ("é".as_bytes(), "\\xc3\\xa9"),
            (&long, &cut),
            (exact.as_bytes(), &exact),
        ];
        for (bytes, label) in cases {
            assert_eq!(HotKey::of(bytes).label(), label, "{bytes:?}");
        }
    }

    #[test]
    fn a_tenants_key_shows_its_tenant_and_the_key_within_not_the_prefix() {
        let acme = Namespace::of(&TenantName::new("acme").unwrap());
        let hot = HotKey::of(&acme.confine(b"cart:7"));
        assert_eq!(hot.tenant.as_deref(), Some("acme"));
        assert_eq!(hot.label(), "cart:7");
        let long = HotKey::of(&acme.confine(&[b'a'; HOT_KEY_BYTES_MAX]));
        assert!(!long.cut, "the prefix does not count toward the cut");
        let plain = HotKey::of(b"\xffTnot-a-prefix");
        assert_eq!(plain.tenant, None);
        assert_eq!(plain.label(), "\\xffTnot-a-prefix");
    }

    #[test]
    fn the_top_keys_are_the_most_counted() {
        type Case<'a> = (Vec<&'a str>, Vec<(&'a str, u64)>);
        let cases: Vec<Case> = vec![
            (vec![], vec![]),
            (vec!["a", "b", "a"], vec![("a", 2), ("b", 1)]),
            (vec!["c", "b", "a"], vec![("a", 1), ("b", 1), ("c", 1)]),
        ];
        for (samples, expected) in cases {
            let got = names(&top(&[&counted(&samples)]));
            let expected: Vec<(String, u64)> = expected
                .into_iter()
                .map(|(name, count)| (name.to_string(), count))
                .collect();
            assert_eq!(got, expected, "{samples:?}");
        }
    }

    #[test]
    fn at_most_k_keys_are_reported() {
        let samples: Vec<String> = (0..HOT_KEYS_REPORTED_MAX + 5)
            .map(|i| format!("k{i:02}"))
            .collect();
        let refs: Vec<&str> = samples.iter().map(String::as_str).collect();
        let got = top(&[&counted(&refs)]);
        assert_eq!(got.len(), HOT_KEYS_REPORTED_MAX);
    }

    #[test]
    fn a_hot_key_survives_many_cold_ones() {
        let mut counts = Counts::default();
        for i in 0..10_000 {
            counts.record(key("hot"));
            counts.record(key(&format!("cold{i}")));
        }
        assert_eq!(counts.counts.len(), HOT_KEYS_COUNTED_MAX);
        let got = top(&[&counts]);
        assert_eq!(got[0].0, key("hot"));
        assert!(got[0].1 >= 10_000, "never under its samples: {}", got[0].1);
    }

    #[test]
    fn windows_rotate_and_age_out() {
        let mut windows = Windows::default();
        windows.record(0, key("old"));
        windows.record(HOT_KEYS_WINDOW_SECS, key("new"));
        let at = HOT_KEYS_WINDOW_SECS + 1;
        assert_eq!(
            names(&windows.top(at)),
            vec![("new".to_string(), 1), ("old".to_string(), 1)],
            "the previous window still counts"
        );
        assert_eq!(
            names(&windows.top(2 * HOT_KEYS_WINDOW_SECS)),
            vec![("new".to_string(), 1)],
            "two windows on, the oldest is gone"
        );
        assert!(windows.top(5 * HOT_KEYS_WINDOW_SECS).is_empty());
    }

    #[test]
    fn unsampled_every_request_is_counted() {
        let hot_keys = HotKeys::with_sampling(ManualClock::new(1_000_000), 3, 1);
        for _ in 0..40 {
            hot_keys.record(b"k");
        }
        assert_eq!(names(&hot_keys.report()), vec![("k".to_string(), 40)]);
    }

    /// Keys taking turns with the sampling period are still both seen: draws are random.
    #[test]
    fn sampling_does_not_alias_with_a_regular_pattern() {
        let every = HOT_KEYS_SAMPLE_EVERY;
        let hot_keys = HotKeys::with_sampling(ManualClock::new(1_000_000), 11, every);
        for i in 0..4_000 {
            let key: &[u8] = match i % every {
                0 => b"a",
                _ => b"b",
            };
            hot_keys.record(key);
        }
        let report: std::collections::BTreeMap<String, u64> =
            names(&hot_keys.report()).into_iter().collect();
        let a = report["a"];
        let b = report["b"];
        let expected_a = 4_000 / every;
        assert!(
            (expected_a / 2..expected_a * 2).contains(&a),
            "a estimated at {a}, sent {expected_a}"
        );
        assert!(b > a, "b {b} was sent more often than a {a}");
    }
}
