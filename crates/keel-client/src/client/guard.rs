//! `LockGuard`: a held lock, renewed in the background until it is released, dropped or
//! lost. The renewal schedule is the pure `Renewal`; this file runs it in a task.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use keel_types::{Fence, KvError};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::Client;
use crate::errors::LockLost;
use crate::results::ReleaseResult;

mod renewal;

pub(crate) use renewal::{Renewal, Step};

/// A lock held by this process, made by `Client::lock`. A background task renews it every
/// third of its TTL; `lost` says when it no longer holds it. Guard the writes the lock
/// protects with `fence()`: the lock alone cannot keep a paused holder from writing after
/// its TTL ran out, the fence can.
///
/// `release` frees the lock. Dropping the guard stops the renewals and, inside a tokio
/// runtime, releases the lock in the background (best effort; otherwise it expires).
pub struct LockGuard {
    client: Client,
    name: Vec<u8>,
    token: u64,
    /// `Some` once the renewer found the lock lost; closed when the renewer stops.
    state: watch::Receiver<Option<LockLost>>,
    /// Test seam: set, the renewer sends no more renews.
    paused: Arc<AtomicBool>,
    renewer: JoinHandle<()>,
    released: bool,
}

impl LockGuard {
    /// A guard of the lock `name` held with `token`, whose last successful acquire or
    /// renew with `ttl` was sent at `sent`. Starts the renewer in the current runtime.
    pub(crate) fn start(
        client: Client,
        name: &[u8],
        token: u64,
        ttl: Duration,
        sent: Instant,
    ) -> LockGuard {
        let (sender, state) = watch::channel(None);
        let paused = Arc::new(AtomicBool::new(false));
        let renewer = Renewer {
            client: client.clone(),
            name: name.to_vec(),
            token,
            renewal: Renewal::new(ttl, sent),
            paused: paused.clone(),
        };
        LockGuard {
            client,
            name: name.to_vec(),
            token,
            state,
            paused,
            renewer: tokio::spawn(renewer.run(sender)),
            released: false,
        }
    }

    pub fn name(&self) -> &[u8] {
        &self.name
    }

    /// The fencing token of this hold.
    pub fn token(&self) -> u64 {
        self.token
    }

    /// The fence of writes made under this lock (`PutOptions::fence` and the like).
    pub fn fence(&self) -> Fence {
        Fence {
            lock: self.name.clone(),
            token: self.token,
        }
    }

    /// Resolves as soon as the lock is lost: a renew was refused (`LockLost::Refused`), or
    /// its TTL, counted from when the last successful acquire or renew was sent, ran out
    /// before another renew succeeded (`LockLost::Expired`); or the guard was released or
    /// dropped (`LockLost::Released`). Owns what it needs, so it can be spawned or kept in
    /// a `select!` while the guard is used.
    pub fn lost(&self) -> impl Future<Output = LockLost> + Send + 'static {
        let mut state = self.state.clone();
        async move {
            match state.wait_for(Option::is_some).await {
                Ok(lost) => lost.clone().unwrap_or(LockLost::Released),
                Err(_) => LockLost::Released,
            }
        }
    }

    /// Why the lock is lost, if it is by now.
    pub fn lost_now(&self) -> Option<LockLost> {
        self.state.borrow().clone()
    }

    /// Stops the renewals and frees the lock (handing it to the first waiter, if any).
    /// Fails with `LockNotHeld` if the lock was lost in the meantime.
    pub async fn release(mut self) -> Result<ReleaseResult, KvError> {
        self.renewer.abort();
        let result = self.client.release(&self.name, self.token).await;
        self.released = true;
        result
    }

    /// Test seam: stops sending renews, as a holder that is paused (a GC pause, SIGSTOP)
    /// would, so that its lock expires and can be taken over while the guard still exists.
    /// `lost` then resolves with `Expired` at the guard's local expiry.
    #[doc(hidden)]
    pub fn pause_renewals(&self) {
        self.paused.store(true, Ordering::SeqCst);
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        self.renewer.abort();
        let refused = matches!(*self.state.borrow(), Some(LockLost::Refused(_)));
        if !self.released && !refused {
            release_in_background(&self.client, &self.name, self.token);
        }
    }
}

impl std::fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockGuard")
            .field("name", &keel_types::validate::show_key(&self.name))
            .field("token", &self.token)
            .field("lost", &*self.state.borrow())
            .finish()
    }
}

/// Releases the lock `name` held with `token` in a task of the current runtime, if there
/// is one; a failure is only logged (the lock then expires).
pub(crate) fn release_in_background(client: &Client, name: &[u8], token: u64) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let (client, name) = (client.clone(), name.to_vec());
    runtime.spawn(async move {
        if let Err(error) = client.release(&name, token).await {
            tracing::debug!(%error, token, "releasing a dropped lock guard failed");
        }
    });
}

/// The background task of a guard.
struct Renewer {
    client: Client,
    name: Vec<u8>,
    token: u64,
    renewal: Renewal,
    paused: Arc<AtomicBool>,
}

impl Renewer {
    /// Renews on schedule until the lock is lost, then says why on `state`. The guard
    /// aborts it on release and drop. The loop ends with the lock: each pass either waits
    /// for a later instant or sends one renew, which is cut off at the expiry, and the
    /// expiry moves only when a renew succeeds.
    async fn run(mut self, state: watch::Sender<Option<LockLost>>) {
        let lost = loop {
            let paused = self.paused.load(Ordering::SeqCst);
            match self.renewal.next(Instant::now(), paused) {
                Step::Lost => break LockLost::Expired,
                Step::Wait(until) => tokio::time::sleep_until(until).await,
                Step::Renew => {
                    if let Some(lost) = self.renew().await {
                        break lost;
                    }
                }
            }
        };
        tracing::warn!(lock = %keel_types::validate::show_key(&self.name), token = self.token, %lost, "lock guard lost its lock");
        state.send_replace(Some(lost));
    }

    /// Sends one renew; `Some` if it shows the lock lost.
    async fn renew(&mut self) -> Option<LockLost> {
        let sent = Instant::now();
        let renew = self
            .client
            .renew(&self.name, self.token, self.renewal.ttl());
        match tokio::time::timeout_at(self.renewal.expires_at(), renew).await {
            Err(_) => Some(LockLost::Expired),
            Ok(Ok(_)) => {
                self.renewal.renewed(sent);
                None
            }
            Ok(Err(error @ KvError::LockNotHeld { .. })) => Some(LockLost::Refused(error)),
            Ok(Err(error)) => {
                tracing::debug!(%error, token = self.token, "lock renew failed; retrying");
                self.renewal.failed(Instant::now());
                None
            }
        }
    }
}
