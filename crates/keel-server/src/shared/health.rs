//! Whether this node still serves: it stops for good when its store is poisoned by an I/O
//! failure or a Raft group stops, and it says so while shutting down. Knows nothing of gRPC.

use keel_storage::Store;
use keel_types::KvError;
use tokio::sync::watch;
use tracing::error;

pub(crate) struct Health {
    store: Store,
    /// `Some(reason)` once the node has stopped serving.
    stopped: watch::Sender<Option<String>>,
    /// Whether the node is shutting down.
    closing: watch::Sender<bool>,
}

impl Health {
    pub fn new(store: Store) -> Health {
        Health {
            store,
            stopped: watch::Sender::new(None),
            closing: watch::Sender::new(false),
        }
    }

    /// `Fatal` once the node has stopped serving; checks the store first.
    pub fn check(&self) -> Result<(), KvError> {
        if let Err(error) = self.store.health() {
            self.fail(format!("storage failed: {error}"));
        }
        match &*self.stopped.borrow() {
            Some(reason) => Err(KvError::fatal(reason.clone())),
            None => Ok(()),
        }
    }

    /// Stops serving for good; the first reason is kept and logged.
    pub fn fail(&self, reason: String) {
        self.stopped.send_if_modified(|stopped| {
            if stopped.is_some() {
                return false;
            }
            error!(%reason, "node stopped serving");
            *stopped = Some(reason);
            true
        });
    }

    pub fn set_closing(&self) {
        self.closing.send_replace(true);
    }

    /// Whether the node is shutting down.
    pub fn is_closing(&self) -> bool {
        *self.closing.borrow()
    }

    /// Resolves once the node is shutting down.
    pub async fn closing(&self) {
        let mut watch = self.closing.subscribe();
        // The sender lives in `self`, so the watch cannot close while this waits.
        let _ = watch.wait_for(|closing| *closing).await;
    }

    /// (healthy, message) for Cluster.Status.
    pub fn summary(&self) -> (bool, String) {
        if let Err(KvError::Fatal { message }) = self.check() {
            return (false, message);
        }
        if self.is_closing() {
            return (false, "shutting down".to_string());
        }
        (true, String::new())
    }

    /// Resolves with the reason once the node has stopped serving.
    pub async fn stopped(&self) -> String {
        let mut watch = self.stopped.subscribe();
        match watch.wait_for(Option::is_some).await {
            Ok(reason) => reason.clone().unwrap_or_default(),
            Err(_) => "health watch closed".to_string(),
        }
    }
}
