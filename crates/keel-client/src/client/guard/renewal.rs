//! When a lock guard renews and when it must consider its lock lost, as pure arithmetic on
//! instants. Knows nothing of the network or of tasks.
//!
//! The expiry a holder can rely on is counted from when it *sent* the last acquire or renew
//! that succeeded: the server started the TTL when it applied the request, which was later,
//! so the holder's expiry is never later than the server's. Clocks of the two never meet.

use std::time::Duration;

use tokio::time::Instant;

/// Shortest pause before sending a renew again after one failed.
const RETRY_PAUSE_MIN: Duration = Duration::from_millis(50);
/// Longest pause before sending a renew again after one failed.
const RETRY_PAUSE_MAX: Duration = Duration::from_secs(1);

/// The renewal schedule of one held lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Renewal {
    ttl: Duration,
    /// When the last successful acquire or renew was sent.
    sent: Instant,
    /// When to try again after a renew failed (the TTL may still hold).
    retry_at: Option<Instant>,
}

/// What the renewer does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// Send a renew now.
    Renew,
    /// Nothing to do before this instant.
    Wait(Instant),
    /// The TTL ran out before a renew succeeded.
    Lost,
}

impl Renewal {
    /// The schedule of a lock whose acquire (or renew) with `ttl` was sent at `sent` and
    /// succeeded.
    pub fn new(ttl: Duration, sent: Instant) -> Renewal {
        Renewal {
            ttl,
            sent,
            retry_at: None,
        }
    }

    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// When the lock's TTL runs out as far as this holder can tell.
    pub fn expires_at(&self) -> Instant {
        self.sent + self.ttl
    }

    /// When the next renew is due: a third of the TTL after the last successful one was
    /// sent (two renews can fail before the TTL runs out), or the retry time after a failure.
    pub fn due_at(&self) -> Instant {
        self.retry_at.unwrap_or(self.sent + self.ttl / 3)
    }

    /// The next step at `now`. A `paused` renewer sends nothing and only waits for the
    /// expiry.
    pub fn next(&self, now: Instant, paused: bool) -> Step {
        let expires_at = self.expires_at();
        if now >= expires_at {
            Step::Lost
        } else if paused {
            Step::Wait(expires_at)
        } else if now >= self.due_at() {
            Step::Renew
        } else {
            Step::Wait(self.due_at().min(expires_at))
        }
    }

    /// A renew sent at `sent` succeeded. An answer to an older renew never moves the expiry
    /// back.
    pub fn renewed(&mut self, sent: Instant) {
        self.sent = self.sent.max(sent);
        self.retry_at = None;
    }

    /// A renew failed at `now` without saying the lock is lost: try again after a tenth of
    /// the TTL, within 50 ms..1 s.
    pub fn failed(&mut self, now: Instant) {
        let pause = (self.ttl / 10).clamp(RETRY_PAUSE_MIN, RETRY_PAUSE_MAX);
        self.retry_at = Some(now + pause);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    /// Steps of a 9 s lock acquired at t0, renewed at the given offsets (ms), failed at the
    /// given offsets, then asked at `at` (ms, paused or not).
    fn check(renewed: &[u64], failed: &[u64], at: u64, paused: bool, expected: Step, t0: Instant) {
        let mut renewal = Renewal::new(ms(9_000), t0);
        for offset in renewed {
            renewal.renewed(t0 + ms(*offset));
        }
        for offset in failed {
            renewal.failed(t0 + ms(*offset));
        }
        let got = renewal.next(t0 + ms(at), paused);
        assert_eq!(
            got, expected,
            "renewed {renewed:?} failed {failed:?} at {at}"
        );
    }

    #[test]
    fn renews_every_third_of_the_ttl_and_is_lost_at_the_expiry_from_the_last_send() {
        let t0 = Instant::now();
        let at = |offset: u64| t0 + ms(offset);
        use Step::*;
        // (renewed at, failed at, asked at, paused, step)
        type Case = (&'static [u64], &'static [u64], u64, bool, Step);
        let cases: Vec<Case> = vec![
            (&[], &[], 0, false, Wait(at(3_000))),
            (&[], &[], 2_999, false, Wait(at(3_000))),
            (&[], &[], 3_000, false, Renew),
            (&[], &[], 8_999, false, Renew),
            (&[], &[], 9_000, false, Lost),
            // Renewed: counted from the renew's send, not from its answer.
            (&[3_000], &[], 5_000, false, Wait(at(6_000))),
            (&[3_000], &[], 11_999, false, Renew),
            (&[3_000], &[], 12_000, false, Lost),
            // A late answer to an older renew does not move the expiry back.
            (&[3_000, 1_000], &[], 11_999, false, Renew),
            // A failed renew is tried again after a tenth of the TTL (900 ms)...
            (&[], &[3_000], 3_500, false, Wait(at(3_900))),
            (&[], &[3_000], 3_900, false, Renew),
            // ...but never past the expiry.
            (&[], &[8_500], 8_800, false, Wait(at(9_000))),
            (&[], &[8_500], 9_000, false, Lost),
            // Success clears the retry.
            (&[3_000], &[], 3_900, false, Wait(at(6_000))),
            // Paused: nothing is sent and the lock is lost at the expiry.
            (&[], &[], 3_000, true, Wait(at(9_000))),
            (&[], &[], 9_000, true, Lost),
        ];
        for (renewed, failed, offset, paused, expected) in cases {
            check(renewed, failed, offset, paused, expected, t0);
        }
    }

    #[test]
    fn retry_pauses_stay_within_bounds() {
        let t0 = Instant::now();
        for (ttl_ms, pause_ms) in [(100, 50), (1_000, 100), (9_000, 900), (60_000, 1_000)] {
            let mut renewal = Renewal::new(ms(ttl_ms), t0);
            renewal.failed(t0);
            assert_eq!(renewal.due_at(), t0 + ms(pause_ms), "ttl {ttl_ms} ms");
        }
    }
}
