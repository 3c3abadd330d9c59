//! The clock seam: every component that needs wall-clock time (TTL stamps, session starts,
//! TTL visibility) asks a `Clock`, so tests and fault injection can set time per node.
//! Raft timing (elections, heartbeats) does not use it.

use std::fmt::Debug;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Wall-clock time in Unix milliseconds.
pub trait Clock: Debug + Send + Sync {
    fn now_ms(&self) -> u64;

    /// Test hook (fault injection): from now on read `offset_ms` away from the clock's base
    /// (negative = behind). Replaces any earlier offset.
    fn set_offset_ms(&self, offset_ms: i64);
}

/// A shared clock.
pub type SharedClock = Arc<dyn Clock>;

/// The host's clock, with an offset that tests and fault injection may shift (never the
/// host clock itself).
#[derive(Debug, Default)]
pub struct SystemClock {
    offset_ms: AtomicI64,
}

impl SystemClock {
    pub fn shared() -> Arc<SystemClock> {
        Arc::new(SystemClock::default())
    }
}

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        let host = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| {
                u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
            });
        host.saturating_add_signed(self.offset_ms.load(Ordering::SeqCst))
    }

    fn set_offset_ms(&self, offset_ms: i64) {
        self.offset_ms.store(offset_ms, Ordering::SeqCst);
    }
}

/// A clock that moves only when told to. For tests.
#[derive(Debug)]
pub struct ManualClock {
    now_ms: AtomicU64,
    offset_ms: AtomicI64,
}

impl ManualClock {
    pub fn new(now_ms: u64) -> Arc<ManualClock> {
        Arc::new(ManualClock {
            now_ms: AtomicU64::new(now_ms),
            offset_ms: AtomicI64::new(0),
        })
    }

    pub fn advance_ms(&self, ms: u64) {
        self.now_ms.fetch_add(ms, Ordering::SeqCst);
    }

    pub fn set_ms(&self, now_ms: u64) {
        self.now_ms.store(now_ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        let now_ms = self.now_ms.load(Ordering::SeqCst);
        now_ms.saturating_add_signed(self.offset_ms.load(Ordering::SeqCst))
    }

    fn set_offset_ms(&self, offset_ms: i64) {
        self.offset_ms.store(offset_ms, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_shift_clocks_and_manual_clocks_move_when_told() {
        let clock = SystemClock::default();
        let before = clock.now_ms();
        clock.set_offset_ms(-60_000);
        assert!(
            clock.now_ms() < before,
            "a negative offset puts the clock behind"
        );
        let manual = ManualClock::new(1_000);
        manual.advance_ms(500);
        assert_eq!(manual.now_ms(), 1_500);
        manual.set_ms(10);
        assert_eq!(manual.now_ms(), 10);
        manual.set_offset_ms(-4);
        assert_eq!(manual.now_ms(), 6);
    }
}
