//! `Client::idempotent`: run a piece of work at most once to completion under an
//! idempotency record, and hand its result to every later caller. Begin, run, complete (or
//! abort); wait with backoff while another owner is in progress.

use std::future::Future;
use std::time::Duration;

use keel_types::validate;
use tokio::time::Instant;

use super::Client;
use super::idempotency::checked_ttl_ms;
use crate::errors::IdempotentError;
use crate::options::IdempotentOptions;
use crate::random;
use crate::results::BeginResult;

/// Shortest pause before asking again about a record another owner has in progress.
const IN_PROGRESS_PAUSE_MIN: Duration = Duration::from_millis(50);
/// First pause (before jitter) while another owner is in progress; it doubles per begin.
const IN_PROGRESS_PAUSE_FIRST_MS: u64 = 100;
/// Longest pause (before jitter) while another owner is in progress.
const IN_PROGRESS_PAUSE_MAX_MS: u64 = 2_000;

/// How a begin loop ended well.
enum Begun {
    /// This caller owns the record under the token.
    Started(u64),
    /// The work was done; its result.
    Completed(Vec<u8>),
}

impl Client {
    /// Runs `work` at most once to completion for the record `(scope, id)` and returns its
    /// result, or the result stored by whoever completed it first. `ttl` is how long the
    /// work may take before another caller may take over; the result is kept 24 hours, and
    /// another owner in progress is waited for up to 1 minute (`idempotent_with` to choose).
    ///
    /// - Begin answers `Started`: `work` runs; its `Ok` result (at most 64 KiB) is stored
    ///   with complete and returned; its `Err` aborts the record (so the next caller runs
    ///   the work afresh) and is returned as `IdempotentError::Work`.
    /// - `Completed`: the stored result is returned and `work` does not run.
    /// - `InProgress`: begin is asked again after a pause (jittered, doubling from about
    ///   100 ms to about 2 s, never shorter than 50 ms, at most until the owner's TTL runs
    ///   out) until the wait runs out (`IdempotentError::InProgress`). Once the owner's TTL
    ///   has run out, begin takes the record over and `work` runs here.
    ///
    /// `work` runs at most once to completion per record lifetime *if it finishes within
    /// `ttl`*. If it outlives its TTL, another caller may take the record over and run the
    /// work again; this caller's complete is then refused with `RecordNotOwned` (returned
    /// as `IdempotentError::Keel`), its result is not stored, and the other owner's result
    /// wins. Give the work a TTL well above its worst case, and pass the id on to outside
    /// systems that can deduplicate.
    pub async fn idempotent<F, Fut, E>(
        &self,
        scope: &[u8],
        id: &[u8],
        ttl: Duration,
        work: F,
    ) -> Result<Vec<u8>, IdempotentError<E>>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Vec<u8>, E>>,
    {
        let options = IdempotentOptions::new(ttl);
        self.idempotent_with(scope, id, options, work).await
    }

    /// `idempotent` with every option: TTL, result TTL, wait, owner.
    pub async fn idempotent_with<F, Fut, E>(
        &self,
        scope: &[u8],
        id: &[u8],
        options: IdempotentOptions,
        work: F,
    ) -> Result<Vec<u8>, IdempotentError<E>>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Vec<u8>, E>>,
    {
        // Checked before the work runs, so a bad result TTL cannot strand a finished result.
        validate::check_idempotency_key(scope, id)?;
        checked_ttl_ms("result TTL", scope, id, options.result_ttl)?;
        let token = match self.begin_or_wait(scope, id, &options).await? {
            Begun::Completed(result) => return Ok(result),
            Begun::Started(token) => token,
        };
        match work().await {
            Ok(result) => {
                let stored = self
                    .complete(scope, id, token, &result, options.result_ttl)
                    .await?;
                Ok(stored.result)
            }
            Err(error) => {
                if let Err(abort) = self.abort(scope, id, token).await {
                    tracing::warn!(%abort, token, "aborting a failed idempotent run failed; the record expires with its TTL");
                }
                Err(IdempotentError::Work(error))
            }
        }
    }

    /// Begins until this caller owns the record or finds it completed, pausing while
    /// another owner has it in progress, within `options.wait`.
    async fn begin_or_wait<E>(
        &self,
        scope: &[u8],
        id: &[u8],
        options: &IdempotentOptions,
    ) -> Result<Begun, IdempotentError<E>> {
        let deadline = Instant::now() + options.wait;
        // Every pause is at least `IN_PROGRESS_PAUSE_MIN`, so the deadline comes first.
        let begins_max = options.wait.as_millis() / IN_PROGRESS_PAUSE_MIN.as_millis() + 1;
        let owner = options.owner.as_deref();
        let mut begins = 0;
        loop {
            begins += 1;
            let (owner_seen, ttl_remaining) =
                match self.begin(scope, id, owner, options.ttl).await? {
                    BeginResult::Started { token, .. } => return Ok(Begun::Started(token)),
                    BeginResult::Completed { result, .. } => return Ok(Begun::Completed(result)),
                    BeginResult::InProgress {
                        owner,
                        ttl_remaining,
                    } => (owner, ttl_remaining),
                };
            let pause = in_progress_pause(begins, ttl_remaining, random::unit());
            if begins >= begins_max || Instant::now() + pause > deadline {
                return Err(IdempotentError::InProgress {
                    owner: owner_seen,
                    ttl_remaining,
                });
            }
            tokio::time::sleep(pause).await;
        }
    }
}

/// Pause after begin number `begins` (1 for the first) found another owner in progress
/// with `ttl_remaining`: doubling from `IN_PROGRESS_PAUSE_FIRST_MS` to
/// `IN_PROGRESS_PAUSE_MAX_MS`, of which a random part (`jitter`, 0..=1) is kept in the
/// second half so that waiters spread out; no longer than the owner's TTL (then the record
/// can be taken over) and never shorter than `IN_PROGRESS_PAUSE_MIN`.
fn in_progress_pause(begins: u128, ttl_remaining: Duration, jitter: f64) -> Duration {
    let exponent = u32::try_from(begins.saturating_sub(1))
        .unwrap_or(u32::MAX)
        .min(16);
    let base_ms = (IN_PROGRESS_PAUSE_FIRST_MS << exponent).min(IN_PROGRESS_PAUSE_MAX_MS);
    let half_us = base_ms * 500;
    // `as` saturates; the product is within 0..=half_us.
    let jitter_us = (half_us as f64 * jitter.clamp(0.0, 1.0)) as u64;
    Duration::from_micros(half_us + jitter_us)
        .min(ttl_remaining)
        .max(IN_PROGRESS_PAUSE_MIN)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_progress_pauses_double_within_bounds_and_stop_at_the_owners_ttl() {
        let ms = Duration::from_millis;
        let long = Duration::from_secs(60);
        let cases = [
            (1, long, 0.0, ms(50)),
            (1, long, 1.0, ms(100)),
            (2, long, 0.0, ms(100)),
            (2, long, 0.5, ms(150)),
            (4, long, 1.0, ms(800)),
            (5, long, 1.0, ms(1_600)),
            (6, long, 1.0, ms(2_000)),
            (6, long, 0.0, ms(1_000)),
            (1_000, long, 1.0, ms(2_000)),
            // Out-of-range jitter is clamped.
            (1, long, 7.0, ms(100)),
            (1, long, -1.0, ms(50)),
            // The owner's TTL runs out first: ask again then, but not sooner than 50 ms.
            (5, ms(300), 1.0, ms(300)),
            (5, ms(10), 1.0, ms(50)),
            (5, Duration::ZERO, 0.0, ms(50)),
        ];
        for (begins, ttl_remaining, jitter, expected) in cases {
            assert_eq!(
                in_progress_pause(begins, ttl_remaining, jitter),
                expected,
                "{begins} {ttl_remaining:?} {jitter}"
            );
        }
    }
}
