//! Watchers for the fan-out benchmark (`--watchers N`): N watches of the data keys, opened
//! before the load starts, each counting the put events it receives in the measured window
//! and how long after its put was sent each arrived. A put's value carries the instant it was
//! sent (`Payload`), so the watchers of this process read the latency off the event itself.
//! Knows nothing of which system it watches: a `Feed` receives the events.

use std::borrow::Cow;
use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::time::Instant;

use crate::driver::Window;
use crate::failure::Failure;
use crate::report::Tally;

/// Bytes at the front of a stamped value: microseconds since the process's epoch, little
/// endian.
pub const STAMP_BYTES: usize = 8;

/// The first key of the watched span and the key just past it: every data key.
pub const WATCHED_PREFIX: &[u8] = b"bench-";
pub const WATCHED_END: &[u8] = b"bench.";

/// Microseconds since the first call in this process.
fn now_us() -> u64 {
    static EPOCH: OnceLock<std::time::Instant> = OnceLock::new();
    let epoch = EPOCH.get_or_init(std::time::Instant::now);
    u64::try_from(epoch.elapsed().as_micros()).unwrap_or(u64::MAX)
}

/// How long ago the put that wrote `value` was sent; `None` for a value without a stamp
/// (too short, or written by another process: its stamp lies in this one's future).
pub fn age(value: &[u8]) -> Option<Duration> {
    let stamp = u64::from_le_bytes(value.get(..STAMP_BYTES)?.try_into().ok()?);
    let now = now_us();
    (stamp <= now).then(|| Duration::from_micros(now - stamp))
}

/// The value a worker puts: the run's constant bytes, with the instant of sending in the
/// first `STAMP_BYTES` when watchers measure (`stamped`).
#[derive(Debug, Clone)]
pub struct Payload {
    bytes: Arc<[u8]>,
    stamped: bool,
}

impl Payload {
    pub fn new(bytes: Vec<u8>, stamped: bool) -> Payload {
        Payload {
            stamped: stamped && bytes.len() >= STAMP_BYTES,
            bytes: bytes.into(),
        }
    }

    /// The bytes to send now.
    pub fn bytes(&self) -> Cow<'_, [u8]> {
        match self.stamped {
            false => Cow::Borrowed(&self.bytes),
            true => {
                let mut bytes = self.bytes.to_vec();
                bytes[..STAMP_BYTES].copy_from_slice(&now_us().to_le_bytes());
                Cow::Owned(bytes)
            }
        }
    }
}

/// One watcher's events.
pub trait Feed: Send + 'static {
    /// The values of the put events of the next message (deletes left out); `None` when
    /// the watch ended without an error.
    fn next(&mut self) -> impl Future<Output = Option<Result<Vec<Vec<u8>>, Failure>>> + Send;
}

/// Runs one task per feed until `window` ends and merges what they counted: the age of
/// every stamped put event received inside the window, and the errors that ended watches
/// (a watch that ends is not reopened).
pub async fn watch<F: Feed>(feeds: Vec<F>, window: Window) -> Tally {
    let tasks: Vec<_> = feeds
        .into_iter()
        .map(|feed| tokio::spawn(follow(feed, window)))
        .collect();
    let mut total = Tally::new();
    for task in tasks {
        match task.await {
            Ok(tally) => total.merge(tally),
            Err(error) => total.record_error(Failure::bench(format!("a watcher failed: {error}"))),
        }
    }
    total
}

async fn follow<F: Feed>(mut feed: F, window: Window) -> Tally {
    let mut tally = Tally::new();
    loop {
        let values = match tokio::time::timeout_at(window.end, feed.next()).await {
            Err(_window_over) => return tally,
            Ok(Some(Ok(values))) => values,
            Ok(Some(Err(failure))) => {
                tally.record_error(failure);
                return tally;
            }
            Ok(None) => {
                tally.record_error(Failure::bench("a watch ended"));
                return tally;
            }
        };
        let now = Instant::now();
        if now < window.start || now >= window.end {
            continue;
        }
        for age in values.iter().filter_map(|value| age(value)) {
            tally.record(age);
        }
    }
}

#[cfg(test)]
mod tests;
