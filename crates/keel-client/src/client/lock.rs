//! Locks with fencing tokens: acquire (waiting in the leader's queue when asked), renew,
//! release and inspect, and `lock`, which keeps an acquired lock renewed in a `LockGuard`.
//! The writes go through the write loop, so each carries a request id and a retry is
//! answered from the first attempt's record.

use std::time::Duration;

use keel_proto::v1;
use keel_proto::v1::lock_client::LockClient;
use keel_types::{Consistency, KvError, validate};
use tokio::time::Instant;

use super::guard::{self, LockGuard, Renewal};
use super::route::RouteBy;
use super::{Client, Kind, WRITE, read};
use crate::errors::LockError;
use crate::options::{AcquireOptions, millis};
use crate::results::{self, AcquireResult, InspectResult, ReleaseResult, RenewResult};
use crate::stub::Transport;

impl Client {
    /// Takes the lock `name` if it is free; if someone else holds it, waits up to
    /// `options.wait` for it (first come, first served, on the leader; the call returns as
    /// soon as the lock is handed over) and otherwise answers with the holder
    /// (`acquired: false`). A lock the same owner holds is granted again with the same token
    /// and a new TTL, which is why a retried acquire is safe.
    ///
    /// The token (`holder.token`) is strictly greater than every token issued before for
    /// this lock. A lock alone cannot keep two holders from acting at once (a holder can be
    /// paused past its TTL without knowing): guard the writes it protects with a fence
    /// (`PutOptions::fence`), which the store enforces.
    pub async fn acquire(
        &self,
        name: &[u8],
        options: AcquireOptions,
    ) -> Result<AcquireResult, KvError> {
        let request = self.acquire_request(name, options)?;
        let wait = Duration::from_millis(u64::try_from(request.wait_ms).unwrap_or(0));
        let started = Instant::now();
        // The server holds the call while it waits: each attempt's budget covers the wait,
        // and a retry waits only for what is left of it, but at least 1 ms: a retry of a
        // waiting acquire whose first answer was `Busy` is then asked again rather than
        // answered from that record, so a hand-over whose answer was lost is found.
        let wait_min = wait.min(Duration::from_millis(1));
        let kind = Kind {
            held: wait,
            ..WRITE
        };
        let response = self
            .write(
                kind,
                RouteBy::Key(name),
                |mut lock: LockClient<Transport>, id| {
                    let left = wait.saturating_sub(started.elapsed()).max(wait_min);
                    let request = v1::AcquireRequest {
                        request_id: Some(id.into()),
                        wait_ms: millis(left),
                        ..request.clone()
                    };
                    async move { lock.acquire(request).await }
                },
            )
            .await?;
        results::lock::acquire(response)
    }

    /// Extends the lock held with `token` to `ttl` from now. Fails with `LockNotHeld` once
    /// its TTL has run out (even if nobody took it yet) or another token holds it.
    pub async fn renew(
        &self,
        name: &[u8],
        token: u64,
        ttl: Duration,
    ) -> Result<RenewResult, KvError> {
        validate::check_lock_name(name)?;
        let ttl_ms = millis(ttl);
        validate::check_lock_ttl_ms(name, ttl_ms)?;
        let request = v1::RenewRequest {
            name: name.to_vec(),
            token,
            ttl_ms,
            request_id: None,
            no_forward: true,
        };
        let response = self
            .write(
                WRITE,
                RouteBy::Key(name),
                |mut lock: LockClient<Transport>, id| {
                    let request = v1::RenewRequest {
                        request_id: Some(id.into()),
                        ..request.clone()
                    };
                    async move { lock.renew(request).await }
                },
            )
            .await?;
        results::lock::renew(response)
    }

    /// Frees the lock held with `token` (also after its TTL ran out, as long as nobody took
    /// it), handing it to the first waiter if there is one. Fails with `LockNotHeld` if the
    /// token does not hold it.
    pub async fn release(&self, name: &[u8], token: u64) -> Result<ReleaseResult, KvError> {
        validate::check_lock_name(name)?;
        let request = v1::ReleaseRequest {
            name: name.to_vec(),
            token,
            request_id: None,
            no_forward: true,
        };
        let response = self
            .write(
                WRITE,
                RouteBy::Key(name),
                |mut lock: LockClient<Transport>, id| {
                    let request = v1::ReleaseRequest {
                        request_id: Some(id.into()),
                        ..request.clone()
                    };
                    async move { lock.release(request).await }
                },
            )
            .await?;
        results::lock::release(response)
    }

    /// Who holds the lock `name`, read with `consistency`.
    pub async fn inspect(
        &self,
        name: &[u8],
        consistency: Consistency,
    ) -> Result<InspectResult, KvError> {
        validate::check_lock_name(name)?;
        let request = v1::InspectRequest {
            name: name.to_vec(),
            consistency: v1::Consistency::from(consistency).into(),
            no_forward: true,
        };
        let timeout = self.inner.options.request_timeout;
        let response = self
            .call(
                read(consistency),
                RouteBy::Key(name),
                timeout,
                |mut lock: LockClient<Transport>| {
                    let request = request.clone();
                    async move { lock.inspect(request).await }
                },
            )
            .await?;
        results::lock::inspect(response)
    }

    /// Acquires the lock `name` (waiting up to `options.wait`) and keeps it renewed in the
    /// background, every third of its TTL, until the guard is released or dropped, or the
    /// lock is lost (`LockGuard::lost`). Someone else holding it past the wait is
    /// `LockError::Busy`.
    ///
    /// When the acquire took a third of the TTL or more (it waited), the lock is renewed
    /// once before the guard is returned, so that the guard's expiry, counted from when a
    /// renew was sent, starts with most of the TTL; if that renew fails, the lock is
    /// released in the background and the error returned.
    pub async fn lock(&self, name: &[u8], options: AcquireOptions) -> Result<LockGuard, LockError> {
        let ttl = Duration::from_millis(u64::try_from(options.ttl.as_millis()).unwrap_or(0));
        let mut sent = Instant::now();
        let answer = self.acquire(name, options).await?;
        let holder = match (answer.acquired, answer.holder) {
            (true, Some(holder)) => holder,
            (_, holder) => {
                return Err(LockError::Busy {
                    name: name.to_vec(),
                    holder,
                    available_in: answer.available_in,
                });
            }
        };
        if Renewal::new(ttl, sent).due_at() <= Instant::now() {
            sent = Instant::now();
            if let Err(error) = self.renew(name, holder.token, ttl).await {
                guard::release_in_background(self, name, holder.token);
                return Err(error.into());
            }
        }
        Ok(LockGuard::start(
            self.clone(),
            name,
            holder.token,
            ttl,
            sent,
        ))
    }

    /// The checked wire request of an acquire, without its request id.
    fn acquire_request(
        &self,
        name: &[u8],
        options: AcquireOptions,
    ) -> Result<v1::AcquireRequest, KvError> {
        validate::check_lock_name(name)?;
        let owner = options.owner.unwrap_or_else(|| self.owner().to_vec());
        validate::check_owner(&owner)?;
        let (ttl_ms, wait_ms) = (millis(options.ttl), millis(options.wait));
        let lock_delay_ms = millis(options.lock_delay);
        validate::check_lock_ttl_ms(name, ttl_ms)?;
        validate::check_lock_wait_ms(name, wait_ms)?;
        validate::check_lock_delay_ms(name, lock_delay_ms)?;
        Ok(v1::AcquireRequest {
            name: name.to_vec(),
            owner,
            ttl_ms,
            wait_ms,
            lock_delay_ms,
            request_id: None,
            no_forward: true,
        })
    }
}
