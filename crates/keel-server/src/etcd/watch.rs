//! etcd's `Watch` service on Keel: one bidirectional stream carries many watches. Each
//! create opens a `keel.v1.Kv.Watch` stream of the span on this node (in-process, with the
//! caller's metadata) and a task per watch turns its messages into etcd's: events, progress
//! notices, and a cancel with the reason when the Keel stream ends (a compacted start with
//! its compact revision, as etcd does). A cancel stops the watch's task; a progress request
//! asks every watch's Keel stream for a progress message. Knows nothing of how Keel's watch
//! reads history.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use futures::{Stream, StreamExt};
use keel_proto::etcd::etcdserverpb::watch_create_request::FilterType;
use keel_proto::etcd::etcdserverpb::watch_request::RequestUnion;
use keel_proto::etcd::etcdserverpb::watch_server::Watch;
use keel_proto::etcd::etcdserverpb::{
    ResponseHeader, WatchCreateRequest, WatchRequest, WatchResponse,
};
use keel_proto::etcd::mvccpb;
use keel_proto::v1;
use keel_proto::v1::kv_server::Kv;
use keel_types::{KvError, limits};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tonic::codegen::tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status, Streaming};

use super::convert;
use crate::api::kv::KvService;
use crate::status::kv_error;

type Sent = Result<WatchResponse, Status>;
type Responses = Pin<Box<dyn Stream<Item = Sent> + Send>>;

/// etcd's id of the watch a response answers no one watch with (a progress response).
const NO_WATCH: i64 = -1;

/// etcd's default interval of progress notices, for a watch that asks for them.
const PROGRESS_INTERVAL_MS: u64 = 10 * 60 * 1000;

pub(crate) struct EtcdWatch {
    kv: Arc<KvService>,
    node_id: u64,
}

impl EtcdWatch {
    pub fn new(kv: KvService, node_id: u64) -> EtcdWatch {
        EtcdWatch {
            kv: Arc::new(kv),
            node_id,
        }
    }
}

#[tonic::async_trait]
impl Watch for EtcdWatch {
    type WatchStream = Responses;

    async fn watch(
        &self,
        request: Request<Streaming<WatchRequest>>,
    ) -> Result<Response<Responses>, Status> {
        let (metadata, _, incoming) = request.into_parts();
        let (sender, receiver) = mpsc::channel(limits::ETCD_WATCH_RESPONSES_BUFFERED);
        let session = Session {
            kv: self.kv.clone(),
            node_id: self.node_id,
            metadata,
            sender,
            watches: BTreeMap::new(),
        };
        tokio::spawn(session.run(incoming));
        Ok(Response::new(Box::pin(ReceiverStream::new(receiver))))
    }
}

/// One etcd watch stream: its watches, by etcd id.
struct Session {
    kv: Arc<KvService>,
    node_id: u64,
    metadata: MetadataMap,
    sender: mpsc::Sender<Sent>,
    watches: BTreeMap<i64, Watching>,
}

struct Watching {
    task: JoinHandle<()>,
    /// The id of its Keel stream on this node (0 until the stream has started).
    keel_id: Arc<AtomicU64>,
}

impl Session {
    async fn run(mut self, mut incoming: Streaming<WatchRequest>) {
        loop {
            let message = tokio::select! {
                message = incoming.message() => message,
                () = self.sender.closed() => break,
            };
            let request = match message {
                Ok(Some(request)) => request,
                Ok(None) | Err(_) => break,
            };
            match request.request_union {
                Some(RequestUnion::CreateRequest(create)) => self.create(create).await,
                Some(RequestUnion::CancelRequest(cancel)) => self.cancel(cancel.watch_id).await,
                Some(RequestUnion::ProgressRequest(_)) => self.progress().await,
                None => {}
            }
        }
        for watch in self.watches.values() {
            watch.task.abort();
        }
    }

    fn header(&self, revision: u64) -> Option<ResponseHeader> {
        Some(convert::header(self.node_id, revision, 0))
    }

    async fn send(&self, response: WatchResponse) {
        let _ = self.sender.send(Ok(response)).await;
    }

    async fn create(&mut self, create: WatchCreateRequest) {
        self.watches.retain(|_, watch| !watch.task.is_finished());
        let id = match self.watch_id(create.watch_id) {
            Ok(id) => id,
            Err(reason) => {
                let refused = created_and_canceled(create.watch_id, reason);
                return self.send(refused).await;
            }
        };
        let request = match keel_watch(&create) {
            Ok(request) => request,
            Err(status) => {
                let refused = created_and_canceled(id, status.message().to_string());
                return self.send(refused).await;
            }
        };
        let mut keel = Request::new(request);
        *keel.metadata_mut() = self.metadata.clone();
        let stream = match self.kv.watch(keel).await {
            Ok(stream) => stream.into_inner(),
            Err(status) => {
                self.send(created(id, self.header(0))).await;
                return self.send(ended(id, &status)).await;
            }
        };
        self.send(created(id, self.header(0))).await;
        let keel_id = Arc::new(AtomicU64::new(0));
        let relay = Relay {
            id,
            node_id: self.node_id,
            fragment: create.fragment,
            keel_id: keel_id.clone(),
            sender: self.sender.clone(),
        };
        let task = tokio::spawn(relay.run(stream));
        self.watches.insert(id, Watching { task, keel_id });
    }

    /// The id for a new watch: the one the client chose, or the smallest free one.
    fn watch_id(&self, chosen: i64) -> Result<i64, String> {
        if self.watches.len() >= limits::ETCD_WATCHES_PER_STREAM_MAX {
            return Err(format!(
                "etcdserver: the stream has {} watches; limit is {}",
                self.watches.len(),
                limits::ETCD_WATCHES_PER_STREAM_MAX
            ));
        }
        if chosen != 0 {
            if chosen < 0 || self.watches.contains_key(&chosen) {
                return Err("etcdserver: mvcc: duplicate watch ID provided".to_string());
            }
            return Ok(chosen);
        }
        Ok((0..).find(|id| !self.watches.contains_key(id)).unwrap_or(0))
    }

    async fn cancel(&mut self, id: i64) {
        if let Some(watch) = self.watches.remove(&id) {
            watch.task.abort();
        }
        self.send(WatchResponse {
            header: self.header(0),
            watch_id: id,
            canceled: true,
            ..WatchResponse::default()
        })
        .await;
    }

    /// Asks each watch's Keel stream for a progress message (sent as that watch's); with no
    /// watch, answers at once for no watch.
    async fn progress(&mut self) {
        self.watches.retain(|_, watch| !watch.task.is_finished());
        if self.watches.is_empty() {
            let response = WatchResponse {
                header: self.header(0),
                watch_id: NO_WATCH,
                ..WatchResponse::default()
            };
            return self.send(response).await;
        }
        for watch in self.watches.values() {
            let watch_id = watch.keel_id.load(Ordering::Acquire);
            if watch_id == 0 {
                continue;
            }
            let mut asked = Request::new(v1::WatchProgressRequest { watch_id });
            *asked.metadata_mut() = self.metadata.clone();
            let _ = self.kv.watch_progress(asked).await;
        }
    }
}

/// Keel's watch of an etcd watch's span, filters and options.
fn keel_watch(create: &WatchCreateRequest) -> Result<v1::WatchRequest, Status> {
    let span = convert::span(&create.key, &create.range_end)?;
    let end = match span.end {
        Some(end) => end,
        None => {
            let mut next = span.key.clone();
            next.push(0);
            next
        }
    };
    let filters = |filter: FilterType| create.filters.contains(&(filter as i32));
    Ok(v1::WatchRequest {
        start: span.key,
        end,
        start_revision: convert::unsigned("start_revision", create.start_revision)?,
        resume_key: Vec::new(),
        prev_kv: create.prev_kv,
        no_put: filters(FilterType::Noput),
        no_delete: filters(FilterType::Nodelete),
        progress_interval_ms: if create.progress_notify {
            PROGRESS_INTERVAL_MS
        } else {
            0
        },
        reclaims: false,
    })
}

fn created(id: i64, header: Option<ResponseHeader>) -> WatchResponse {
    WatchResponse {
        header,
        watch_id: id,
        created: true,
        ..WatchResponse::default()
    }
}

fn created_and_canceled(id: i64, reason: String) -> WatchResponse {
    WatchResponse {
        watch_id: id,
        created: true,
        canceled: true,
        cancel_reason: reason,
        ..WatchResponse::default()
    }
}

/// The cancel that ends watch `id` because its Keel stream ended with `status`.
fn ended(id: i64, status: &Status) -> WatchResponse {
    let compact_revision = match kv_error(status) {
        Some(KvError::Compacted {
            compact_revision, ..
        }) => convert::revision(compact_revision),
        _ => 0,
    };
    WatchResponse {
        watch_id: id,
        canceled: true,
        compact_revision,
        cancel_reason: convert::status(status.clone()).message().to_string(),
        ..WatchResponse::default()
    }
}

/// Sends one watch's Keel messages on as etcd's.
struct Relay {
    id: i64,
    node_id: u64,
    /// The client takes a revision in fragments; else fragments are joined.
    fragment: bool,
    keel_id: Arc<AtomicU64>,
    sender: mpsc::Sender<Sent>,
}

impl Relay {
    async fn run<S>(self, mut stream: S)
    where
        S: Stream<Item = Result<v1::WatchResponse, Status>> + Unpin,
    {
        let mut pending: Vec<mvccpb::Event> = Vec::new();
        while let Some(message) = stream.next().await {
            let message = match message {
                Ok(message) => message,
                Err(status) => {
                    let _ = self.sender.send(Ok(ended(self.id, &status))).await;
                    return;
                }
            };
            if let Some(started) = &message.started {
                self.keel_id.store(started.watch_id, Ordering::Release);
            }
            let events = message.events.into_iter().map(event);
            pending.extend(events);
            if message.fragment && !self.fragment {
                continue;
            }
            if pending.is_empty() && message.started.is_some() {
                continue;
            }
            let last = pending.last().and_then(|event| event.kv.as_ref());
            let last = last.map_or(0, |kv| u64::try_from(kv.mod_revision).unwrap_or(0));
            let revision = last.max(message.complete_revision);
            let response = WatchResponse {
                header: Some(convert::header(self.node_id, revision, 0)),
                watch_id: self.id,
                fragment: message.fragment,
                events: std::mem::take(&mut pending),
                ..WatchResponse::default()
            };
            if self.sender.send(Ok(response)).await.is_err() {
                return;
            }
        }
    }
}

/// A Keel event as etcd's: a put with the key's state after it, or a delete whose key
/// carries the deletion's revision.
fn event(event: v1::Event) -> mvccpb::Event {
    use mvccpb::event::EventType;
    let (kind, kv) = match event.kv {
        Some(kv) => (EventType::Put, convert::key_value(kv)),
        None => (
            EventType::Delete,
            convert::key_value(v1::KeyValue {
                key: event.key,
                mod_revision: event.revision,
                ..v1::KeyValue::default()
            }),
        ),
    };
    mvccpb::Event {
        r#type: kind as i32,
        kv: Some(kv),
        prev_kv: event.prev_kv.map(convert::key_value),
    }
}
