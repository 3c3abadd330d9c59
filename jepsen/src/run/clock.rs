//! The runner's one monotonic clock: every `call`, `return`, `start` and `stop` of a run is in
//! nanoseconds since the run began, read from here. Knows nothing of what it times.

use std::time::Duration;

use tokio::time::Instant;

#[derive(Debug, Clone, Copy)]
pub struct RunClock {
    origin: Instant,
}

impl RunClock {
    /// A clock whose zero is now.
    pub fn start() -> RunClock {
        RunClock {
            origin: Instant::now(),
        }
    }

    /// Nanoseconds since the run began.
    pub fn now_ns(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// The instant `offset` after the run began, for `sleep_until`.
    pub fn at(&self, offset: Duration) -> Instant {
        self.origin + offset
    }
}
