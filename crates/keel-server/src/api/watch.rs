//! `Kv.Watch`: one stream of the changes of a span that one range holds, served from this
//! node's replica of the range (any replica: no leader load) by a task that reads the
//! range's history from a cursor (its part of a read the range's streams at that cursor
//! share: `shared::watch_pages`), sends what it read, and waits for the replica to apply
//! more. A stream never holds events in memory beyond its few messages ready to send
//! (`WATCH_STREAM_MESSAGES_BUFFERED`): a slow reader leaves its task waiting on the send, the
//! history it has not read stays in storage, and writes never wait for it. A reader that
//! falls so far behind that its events are compacted gets `Compacted` and the stream ends.
//! The stream ends too when a split leaves the range without the whole covered span
//! (`KeyOutOfRange`, naming the range as it is now), when the replica stops, when the range
//! is held (its replicas disagree with no majority: `Unavailable`), or when it
//! hears from no other replica of its group (cut off by a partition, it would fall behind
//! without a word: `Unavailable`, so the client watches on another). A stream sends a
//! progress message at the interval its request asks, and when a caller of its namespace
//! asks by its id (`Kv.WatchProgress`, `shared::watch_progress`).

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use keel_proto::convert;
use keel_proto::v1::{WatchRequest, WatchResponse, WatchStarted};
use keel_raft::RaftGroup;
use keel_types::limits::{
    WATCH_MESSAGE_BYTES_MAX, WATCH_MESSAGE_EVENTS_MAX, WATCH_STREAM_MESSAGES_BUFFERED,
    WATCHES_PER_NODE_MAX,
};
use keel_types::planted::{self, PlantedBug};
use keel_types::tenant::Namespace;
use keel_types::validate::{WatchChecked, check_watch};
use keel_types::{Event, EventCursor, KvError, NodeId, RangeDescriptor, Revision};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tonic::Status;
use tracing::debug;

use crate::metrics::{WatchEnd, WatchSlot};
use crate::ranges::lookup;
use crate::shared::Shared;
use crate::shared::watch_pages::{PageRead, RangePages};
use crate::shared::watch_progress::WatchId;

/// How often a waiting stream checks that its replica still hears from the rest of its
/// group (`Watch::cut_off`), and how long past a missed ping the others must be silent.
const CUT_OFF_CHECK: Duration = Duration::from_secs(1);
const CUT_OFF_GRACE: Duration = Duration::from_secs(2);

/// The messages of a watch stream, as tonic sends them.
pub(crate) type WatchStream = Pin<Box<dyn Stream<Item = Result<WatchResponse, Status>> + Send>>;

/// What a stream sends: a message, or the error it ends with.
pub(crate) type Sent = Result<WatchResponse, KvError>;

/// A watch of one range's part of a span, as the request and the range define it.
struct Watch {
    shared: Arc<Shared>,
    group: Arc<RaftGroup>,
    /// The covered span: the requested span cut to the range's (empty end: unbounded).
    start: Vec<u8>,
    end: Vec<u8>,
    request: WatchRequest,
    checked: WatchChecked,
    /// The range's last page of events, shared with its other streams on this node.
    pages: Arc<RangePages>,
    /// The stream's id, and the progress asked of it (`Kv.WatchProgress`).
    id: WatchId,
    _slot: WatchSlot,
}

/// Opens a watch on this node's replica of the range holding `request.start` for a caller of
/// `namespace`: a task sends its messages until the stream ends (with the error it ends
/// with, if any), and the returned stream yields them as they come.
pub(crate) async fn open(
    shared: Arc<Shared>,
    request: WatchRequest,
    namespace: Option<Namespace>,
) -> Result<impl Stream<Item = Sent> + Send + 'static, KvError> {
    let checked = check_watch(
        &request.start,
        &request.end,
        &request.resume_key,
        request.progress_interval_ms,
    )?;
    let group = lookup::route(&shared, &request.start).await?;
    let slot = shared
        .metrics
        .watches
        .open()
        .ok_or_else(|| KvError::Overloaded {
            message: format!(
                "node {} serves {WATCHES_PER_NODE_MAX} watch streams already",
                shared.node_id
            ),
        })?;
    let range = group.descriptor().await?;
    // A split since the lookup may have left the range without the start.
    if !range.contains(&request.start) {
        return Err(KvError::KeyOutOfRange {
            key: request.start.clone(),
            range: Box::new(range),
        });
    }
    if let Some(hold) = group.state_machine().hold() {
        return Err(KvError::range_held(range.id, &hold));
    }
    let (start, end) = covered(&range, &request.start, &request.end);
    let from = match request.start_revision {
        0 => {
            let (revision, _) = group
                .state_machine()
                .applied()
                .await
                .map_err(|e| KvError::fatal(format!("range {}: {e}", range.id)))?;
            EventCursor::at(revision + 1)
        }
        revision => EventCursor {
            revision,
            key: request.resume_key.clone(),
        },
    };
    let id = shared.watch_ids.register(namespace);
    let started = WatchResponse {
        started: Some(WatchStarted {
            range_id: range.id.0,
            served_by: shared.node_id,
            start: start.clone(),
            end: end.clone(),
            start_revision: from.revision,
            watch_id: id.id,
        }),
        complete_revision: from.revision - 1,
        ..WatchResponse::default()
    };
    let (sender, receiver) = mpsc::channel(WATCH_STREAM_MESSAGES_BUFFERED);
    let watch = Watch {
        pages: shared.watch_pages.of(range.id),
        shared,
        group,
        start,
        end,
        request,
        checked,
        id,
        _slot: slot,
    };
    tokio::spawn(async move {
        let end = match sender.send(Ok(started)).await {
            Ok(()) => watch.run(from, &sender).await,
            Err(_) => WatchEnd::Closed,
        };
        debug!(?end, "watch stream ended");
        watch.shared.metrics.watches.ended(end);
    });
    Ok(futures::stream::unfold(
        receiver,
        |mut receiver| async move {
            let sent = receiver.recv().await?;
            Some((sent, receiver))
        },
    ))
}

/// The part of `[start, end)` (empty `end`: unbounded) inside `range`, which holds `start`.
fn covered(range: &RangeDescriptor, start: &[u8], end: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let end = match (range.end(), end.is_empty()) {
        (None, _) => end,
        (Some(own), true) => own,
        (Some(own), false) => own.min(end),
    };
    (start.to_vec(), end.to_vec())
}

/// Whether `range` holds every key of `[start, end)` (empty `end`: unbounded).
fn covers(range: &RangeDescriptor, start: &[u8], end: &[u8]) -> bool {
    range.contains(start)
        && match (range.end(), end.is_empty()) {
            (None, _) => true,
            (Some(_), true) => false,
            (Some(own), false) => end <= own,
        }
}

/// Where a read leaves a stream.
struct Step {
    /// Where the next read starts.
    next: EventCursor,
    /// More history is there to read now (the read stopped at its bounds).
    more: bool,
}

impl Watch {
    /// Sends the range's events from `from` on until the stream ends; why it ended.
    async fn run(&self, mut from: EventCursor, sender: &mpsc::Sender<Sent>) -> WatchEnd {
        let progress = self.checked.progress_interval_ms.map(Duration::from_millis);
        let mut last_sent = Instant::now();
        let mut next_check = last_sent + CUT_OFF_CHECK;
        loop {
            // The applied index before the read: any apply after it wakes the wait below.
            let seen = self.group.applied_index();
            let step = match self.read(&from, seen).await {
                Ok((events, step)) => {
                    let complete = step.next.revision - 1;
                    if let Some(message) = self.message(events, &step.next, complete) {
                        let events = message.events.len();
                        if sender.send(Ok(message)).await.is_err() {
                            return WatchEnd::Closed;
                        }
                        self.shared.metrics.watches.sent(events);
                        last_sent = Instant::now();
                    }
                    step
                }
                Err(error) => {
                    let end = match &error {
                        KvError::Compacted { .. } => WatchEnd::Compacted,
                        KvError::KeyOutOfRange { .. } => WatchEnd::Split,
                        _ => WatchEnd::Unavailable,
                    };
                    // The reader may be gone already; the stream ends either way.
                    let _ = sender.send(Err(error)).await;
                    return end;
                }
            };
            from = step.next;
            if step.more {
                continue;
            }
            let progress_due = progress.map(|every| last_sent + every);
            tokio::select! {
                changed = self.group.applied_change(seen) => {
                    if let Err(error) = changed {
                        let _ = sender.send(Err(error)).await;
                        return WatchEnd::Unavailable;
                    }
                }
                requested = progress_asked(progress_due, &self.id) => {
                    let message = WatchResponse {
                        complete_revision: from.revision - 1,
                        requested,
                        ..WatchResponse::default()
                    };
                    if sender.send(Ok(message)).await.is_err() {
                        return WatchEnd::Closed;
                    }
                    last_sent = Instant::now();
                }
                () = tokio::time::sleep_until(next_check) => {
                    next_check = Instant::now() + CUT_OFF_CHECK;
                    if self.cut_off() {
                        let error = KvError::unavailable(format!(
                            "the replica of range {} on node {} hears from no other replica; \
                             watch on another",
                            self.group.range(),
                            self.shared.node_id
                        ));
                        let _ = sender.send(Err(error)).await;
                        return WatchEnd::Unavailable;
                    }
                }
                () = sender.closed() => return WatchEnd::Closed,
                () = self.shared.health.closing() => {
                    let error = KvError::unavailable(format!(
                        "node {} is shutting down",
                        self.shared.node_id
                    ));
                    let _ = sender.send(Err(error)).await;
                    return WatchEnd::Unavailable;
                }
            }
        }
    }

    /// Whether every other member of the range's group, once heard from, has been silent (no
    /// ping, no heartbeat) for `CUT_OFF_GRACE` past a missed ping: this replica may be on the wrong
    /// side of a partition, where it applies nothing more while the rest of its group goes on.
    fn cut_off(&self) -> bool {
        let heard = self.shared.heartbeats.last_heard();
        let now = std::time::Instant::now();
        let me = self.shared.node_id;
        let others: Vec<_> = self
            .group
            .members()
            .into_iter()
            .map(|member| member.id)
            .filter(|id| *id != me)
            .collect();
        // A peer never heard from (this node just started) says nothing either way.
        let lost = |id: &NodeId| heard.heard_from(*id) && heard.silent(*id, now, CUT_OFF_GRACE);
        !others.is_empty() && others.iter().all(lost)
    }

    /// One bounded read of the covered span's events from `from` on, by a replica that
    /// applied log index `seen`: this stream's part of a read of the range's whole span,
    /// which the range's other streams at the same cursor share.
    async fn read(&self, from: &EventCursor, seen: u64) -> Result<(Vec<Event>, Step), KvError> {
        let bounds = (WATCH_MESSAGE_EVENTS_MAX, WATCH_MESSAGE_BYTES_MAX as u64);
        // The range's streams on this node (each holds the pages once).
        let streams = Arc::strong_count(&self.pages);
        let read = self
            .pages
            .read(&self.group, (from, seen), bounds, streams)
            .await;
        let page = match read {
            Ok(PageRead::Page { page, read }) => {
                if read {
                    self.shared.metrics.watches.history_read();
                }
                page
            }
            Ok(PageRead::Compacted { compact_revision }) => {
                return Err(KvError::Compacted {
                    requested: from.revision,
                    compact_revision,
                });
            }
            Err(error) => {
                return Err(KvError::unavailable(format!(
                    "range {}: reading its history: {error}",
                    self.group.range()
                )));
            }
        };
        if !covers(&page.descriptor, &self.start, &self.end) {
            return Err(KvError::KeyOutOfRange {
                key: self.start.clone(),
                range: Box::new(page.descriptor.clone()),
            });
        }
        if let Some(hold) = self.group.state_machine().hold() {
            return Err(KvError::range_held(self.group.range(), &hold));
        }
        let in_span = |event: &&Event| {
            event.key >= self.start && (self.end.is_empty() || event.key < self.end)
        };
        let events = page.page.events.iter().filter(in_span).cloned().collect();
        let step = match &page.page.next {
            Some(next) => Step {
                next: next.clone(),
                more: true,
            },
            // Read up to the range's revision; a cursor past it (a start revision not made
            // yet) stays where it is.
            None => Step {
                next: from.clone().max(EventCursor::at(page.page.revision + 1)),
                more: false,
            },
        };
        Ok((events, step))
    }

    /// The message of the events read before `next` (those the filters keep), complete up to
    /// `complete`: a fragment when `next` stands inside its last event's revision. None when
    /// the filters kept nothing.
    fn message(
        &self,
        events: Vec<Event>,
        next: &EventCursor,
        complete: Revision,
    ) -> Option<WatchResponse> {
        let request = &self.request;
        // The planted bug leaves out every revision divisible by 7.
        let skip = planted::active(PlantedBug::WatchSkipsEvent);
        let events: Vec<_> = events
            .into_iter()
            .filter(|event| !(skip && event.revision.is_multiple_of(7)))
            .filter(|event| request.reclaims || event.is_key())
            .filter(|event| match event.is_removal() {
                true => !request.no_delete,
                false => !request.no_put,
            })
            .map(|mut event| {
                if !request.prev_kv {
                    event.before = None;
                }
                convert::event(event)
            })
            .collect();
        let last = events.last()?.revision;
        Some(WatchResponse {
            fragment: last == next.revision,
            complete_revision: complete,
            events,
            ..WatchResponse::default()
        })
    }
}

/// Completes when a progress message is due: at `due` (false), or when progress is asked
/// of the stream (true).
async fn progress_asked(due: Option<Instant>, id: &WatchId) -> bool {
    let due = async {
        match due {
            Some(at) => tokio::time::sleep_until(at).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        () = due => false,
        () = id.asked() => true,
    }
}
