//! The watch streams of this node by id (`WatchIds`), so a client can ask one of them for a
//! progress message now (`Kv.WatchProgress`). A stream is registered while it lives (its
//! `WatchId` takes it out when dropped), with the namespace of the caller that opened it:
//! only a caller of the same namespace may ask it, and any other gets the answer an unknown
//! id gets. Knows nothing of gRPC.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use keel_types::tenant::Namespace;
use keel_types::{KvError, NodeId};
use tokio::sync::Notify;

/// The node's open watch streams by id.
#[derive(Default)]
pub(crate) struct WatchIds {
    streams: Arc<Mutex<HashMap<u64, Stream>>>,
}

struct Stream {
    /// The namespace of the caller that opened the stream (`None`: the raw keyspace).
    namespace: Option<Namespace>,
    asked: Arc<Notify>,
}

/// A stream's id while it lives, and the progress asked of it.
pub(crate) struct WatchId {
    pub id: u64,
    asked: Arc<Notify>,
    streams: Arc<Mutex<HashMap<u64, Stream>>>,
}

impl WatchId {
    /// Completes once progress is asked of the stream (at once if it was asked since the
    /// last time this completed).
    pub async fn asked(&self) {
        self.asked.notified().await
    }
}

impl Drop for WatchId {
    fn drop(&mut self) {
        lock(&self.streams).remove(&self.id);
    }
}

fn lock(streams: &Mutex<HashMap<u64, Stream>>) -> MutexGuard<'_, HashMap<u64, Stream>> {
    streams.lock().unwrap_or_else(PoisonError::into_inner)
}

impl WatchIds {
    /// Registers a stream opened by a caller of `namespace` under a new random id (never 0).
    pub fn register(&self, namespace: Option<Namespace>) -> WatchId {
        let asked = Arc::new(Notify::new());
        let mut streams = lock(&self.streams);
        let id = loop {
            let id = rand::random::<u64>();
            if id != 0 && !streams.contains_key(&id) {
                break id;
            }
        };
        let stream = Stream {
            namespace,
            asked: asked.clone(),
        };
        streams.insert(id, stream);
        WatchId {
            id,
            asked,
            streams: self.streams.clone(),
        }
    }

    /// Asks the stream `id` for a progress message on behalf of a caller of `namespace`.
    pub fn ask(&self, id: u64, namespace: Option<&Namespace>, node: NodeId) -> Result<(), KvError> {
        let streams = lock(&self.streams);
        match streams.get(&id) {
            Some(stream) if stream.namespace.as_ref() == namespace => {
                stream.asked.notify_one();
                Ok(())
            }
            _ => Err(KvError::invalid(format!(
                "node {node} serves no watch stream {id} of yours (it may have ended)"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use keel_types::tenant::TenantName;

    use super::*;

    #[tokio::test]
    async fn only_the_opening_namespace_may_ask_and_a_dropped_stream_is_gone() {
        let ids = WatchIds::default();
        let acme = Namespace::of(&TenantName::new("acme").unwrap());
        let globex = Namespace::of(&TenantName::new("globex").unwrap());
        let stream = ids.register(Some(acme.clone()));
        let raw = ids.register(None);
        assert_ne!(stream.id, raw.id);
        for (id, namespace) in [
            (stream.id, Some(&globex)),
            (stream.id, None),
            (raw.id, Some(&acme)),
        ] {
            assert!(matches!(
                ids.ask(id, namespace, 1),
                Err(KvError::InvalidArgument { .. })
            ));
        }
        ids.ask(stream.id, Some(&acme), 1).unwrap();
        // Asked before it waited: the wait completes at once.
        stream.asked().await;
        let id = stream.id;
        drop(stream);
        assert!(ids.ask(id, Some(&acme), 1).is_err());
    }
}
