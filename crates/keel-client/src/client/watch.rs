//! A watch of a span over any number of ranges (`Client::watch`): one `Kv.Watch` stream per
//! part of the span a range holds, each part with its own cursor (revision, key), merged into
//! one stream of batches. A part whose stream ends for a split, a replica move, a node that
//! stopped or a lost connection opens again where its cursor stands, on whatever replica
//! holds its start now; when the range there covers less than the part, the rest becomes a
//! part of its own from the same cursor (a split child keeps its parent's revisions and
//! history, so the cursor carries over). Every event is delivered once, and a key's events in
//! order: a key belongs to one part at a time, and a part never goes back behind its cursor.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use keel_proto::v1;
use keel_proto::v1::kv_client::KvClient;
use keel_types::{Consistency, Event, EventCursor, KvError, NodeId, RangeId, Revision, validate};
use tokio::sync::mpsc;
use tonic::Streaming;

use super::replicas::REPLICAS_ASKED_MAX;
use super::route::RouteBy;
use super::{Client, read};
use crate::attempt::{self, AttemptError};
use crate::results::Served;
use crate::retry;
use crate::stub::Transport;

/// Batches a watch holds ready for a slow caller; its streams wait for the caller beyond that.
const BATCHES_BUFFERED: usize = 16;
/// The pauses before a part opens again after its stream failed: doubling, reset once open.
const REOPEN_PAUSE_MIN: Duration = Duration::from_millis(20);
const REOPEN_PAUSE_MAX: Duration = Duration::from_secs(1);
/// How often a part's stream reports progress at least (the caller's interval if shorter):
/// a stream silent for `SILENCE_MAX` has lost its node (stopped, paused, cut off), even
/// when its connection did not break, and the part opens again elsewhere.
const LIVENESS_PROGRESS_MS: u64 = 1_000;
const SILENCE_MAX: Duration = Duration::from_secs(5);

/// What a watch sends and from where.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WatchOptions {
    /// The first revision to deliver in every range of the span; 0 = from now (each
    /// range's revision when its stream opened). Revisions are per range: a revision other
    /// than 0 suits a span one range holds, or one whose ranges came from one by splits.
    pub start_revision: Revision,
    /// Deliver each event's state before the change.
    pub prev_kv: bool,
    /// Leave out puts (and increments).
    pub no_put: bool,
    /// Leave out removals (deletes, expiries and reclaims).
    pub no_delete: bool,
    /// Also deliver the reclaims of locks and idempotency records whose names lie in the
    /// span (`Event::kind`).
    pub reclaims: bool,
    /// Deliver a progress batch (no events) from a range after this long without one; None
    /// = never; 100 ms to 1 hour.
    pub progress_interval: Option<Duration>,
}

/// Events of one part of the watched span, from one range's stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchBatch {
    /// The range and the node that served them.
    pub range_id: RangeId,
    pub served_by: NodeId,
    /// The part of the watched span the batch is complete for (empty end = unbounded).
    pub start: Vec<u8>,
    pub end: Vec<u8>,
    /// In revision order, key order within a revision; empty in a progress batch.
    pub events: Vec<Event>,
    /// Every event of the part at or below this revision of its range has been delivered.
    pub complete_revision: Revision,
}

/// A running watch; dropping it stops its streams.
pub struct Watch {
    batches: mpsc::Receiver<Result<WatchBatch, KvError>>,
    streams: OpenStreams,
}

/// The streams of a watch open now, by serving node and stream id, each with the client of
/// its node (for `Kv.WatchProgress`).
type OpenStreams = Arc<Mutex<HashMap<(NodeId, u64), KvClient<Transport>>>>;

/// A part's stream in `OpenStreams` while the part follows it.
struct Listed {
    streams: OpenStreams,
    key: (NodeId, u64),
}

impl Drop for Listed {
    fn drop(&mut self) {
        lock(&self.streams).remove(&self.key);
    }
}

fn lock(streams: &OpenStreams) -> MutexGuard<'_, HashMap<(NodeId, u64), KvClient<Transport>>> {
    streams.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Watch {
    /// Asks every stream open now for a progress message: each sends a batch (no events,
    /// its part's `complete_revision`) after what it has sent, whatever
    /// `WatchOptions::progress_interval` says. A part whose stream is reopening at the call
    /// (after a split, a move or a lost connection) is not asked; its next batch says how
    /// far it is complete. Returns how many streams were asked.
    pub async fn request_progress(&self) -> usize {
        let streams: Vec<_> = lock(&self.streams)
            .iter()
            .map(|(&(_, watch_id), kv)| (watch_id, kv.clone()))
            .collect();
        let mut asked = 0;
        for (watch_id, mut kv) in streams {
            // A stream that ended meanwhile is reopening: nothing to ask.
            let request = v1::WatchProgressRequest { watch_id };
            if kv.watch_progress(request).await.is_ok() {
                asked += 1;
            }
        }
        asked
    }

    /// The next batch; an error ends the watch: `Compacted` (events from where a part stood
    /// are gone from every replica of its range: read the current state and watch again
    /// from its revision), or what made the span unwatchable (such as `PermissionDenied`).
    /// `None` after the error.
    pub async fn next(&mut self) -> Option<Result<WatchBatch, KvError>> {
        self.batches.recv().await
    }
}

/// One part of the watched span and where its stream stands.
#[derive(Debug, Clone)]
struct Part {
    start: Vec<u8>,
    end: Vec<u8>,
    /// `None` until its first stream opened "from now".
    cursor: Option<EventCursor>,
}

/// A stream opened and its first message read, with the client of the node serving it.
struct Opened {
    started: v1::WatchStarted,
    stream: Streaming<v1::WatchResponse>,
    kv: KvClient<Transport>,
}

impl Served for Opened {
    fn range_id(&self) -> u64 {
        self.started.range_id
    }
}

/// A part's round of the range's replicas after one answered `Compacted`.
struct Elsewhere {
    /// The last `Compacted` answer: what the watch ends with if no replica can resume it.
    error: KvError,
    /// The replica (in the range table's order) to ask next.
    next: usize,
    /// Whether every replica asked so far answered `Compacted`.
    all_compacted: bool,
}

/// How a part's stream ended.
enum Ended {
    /// The caller is gone.
    Dropped,
    /// Open it again where it stands.
    Reopen,
    /// The serving replica no longer keeps the part's history from its cursor; another
    /// replica may.
    Compacted(KvError),
    /// The serving replica ended the stream with `Unavailable`: another replica should
    /// serve it.
    Unserved(KvError),
    /// The watch ends with this error.
    Failed(KvError),
}

impl Client {
    /// Watches the keys of `[start, end)` (empty `end` = to the end of the keyspace; one key:
    /// `end` = the key followed by a 0 byte) across every range that holds them, following
    /// splits, replica moves, leader changes, node restarts and lost connections. Each
    /// event is delivered once; a key's events in revision order. Events of different
    /// ranges have no order between them: a batch's `complete_revision` says how far its
    /// part of the span is complete.
    pub async fn watch(
        &self,
        start: &[u8],
        end: &[u8],
        options: WatchOptions,
    ) -> Result<Watch, KvError> {
        let asked_ms = options.progress_interval.map_or(0, |every| {
            u64::try_from(every.as_millis()).unwrap_or(u64::MAX)
        });
        validate::check_watch(start, end, &[], asked_ms)?;
        // The streams report progress at least this often, so a silent one is known dead.
        let progress_ms = match asked_ms {
            0 => LIVENESS_PROGRESS_MS,
            asked => asked.min(LIVENESS_PROGRESS_MS),
        };
        let (sender, batches) = mpsc::channel(BATCHES_BUFFERED);
        let part = Part {
            start: start.to_vec(),
            end: end.to_vec(),
            cursor: (options.start_revision != 0).then(|| EventCursor::at(options.start_revision)),
        };
        let streams = OpenStreams::default();
        let watcher = Watcher {
            client: self.clone(),
            options,
            progress_ms,
            sender,
            streams: streams.clone(),
        };
        tokio::spawn(watcher.run(part));
        Ok(Watch { batches, streams })
    }

    /// Opens `request`'s stream on a replica of the range holding its start, as a follower
    /// read is routed (with its retries within the request timeout).
    async fn open_watch(&self, request: &v1::WatchRequest) -> Result<Opened, KvError> {
        let timeout = self.inner.options.request_timeout;
        self.call(
            read(Consistency::Follower),
            RouteBy::AnyReplica(&request.start),
            timeout,
            |kv: KvClient<Transport>| open(kv, request.clone()),
        )
        .await
    }

    /// Opens `request`'s stream on the `index`th replica the range table names for the
    /// range holding its start (after another answered `Compacted`). `None` past the last.
    async fn open_watch_on_replica(
        &self,
        request: &v1::WatchRequest,
        index: usize,
    ) -> Option<Result<Opened, KvError>> {
        let open = |kv: KvClient<Transport>| open(kv, request.clone());
        self.call_replica(&request.start, index, open).await
    }
}

/// Opens `request`'s stream with `kv` and reads its first message.
async fn open(
    mut kv: KvClient<Transport>,
    request: v1::WatchRequest,
) -> Result<tonic::Response<Opened>, tonic::Status> {
    let mut stream = kv.watch(request).await?.into_inner();
    let first = stream.message().await?;
    match first.and_then(|first| first.started) {
        Some(started) => Ok(tonic::Response::new(Opened {
            started,
            stream,
            kv,
        })),
        None => Err(tonic::Status::internal(
            "a watch stream whose first message does not say what it covers",
        )),
    }
}

/// What every part of one watch shares.
#[derive(Clone)]
struct Watcher {
    client: Client,
    options: WatchOptions,
    progress_ms: u64,
    sender: mpsc::Sender<Result<WatchBatch, KvError>>,
    streams: OpenStreams,
}

impl Watcher {
    /// Keeps `part` watched until the caller drops the watch or it fails. (Boxed: a part
    /// spawns the parts a split cuts off it.)
    fn run(self, part: Part) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        Box::pin(self.keep(part))
    }

    async fn keep(self, mut part: Part) {
        let mut pause = REOPEN_PAUSE_MIN;
        // Set by a `Compacted` answer, cleared by a message: the part goes round the range's
        // replicas for one that keeps its history.
        let mut elsewhere: Option<Elsewhere> = None;
        loop {
            let request = self.request(&part);
            let opened = match &elsewhere {
                None => tokio::select! {
                    opened = self.client.open_watch(&request) => opened,
                    () = self.sender.closed() => return,
                },
                Some(round) => match self
                    .client
                    .open_watch_on_replica(&request, round.next)
                    .await
                {
                    Some(opened) => opened,
                    // Every replica the table names was asked: none keeps the part's history,
                    // or some could not say (the table may be stale: it is read again).
                    None if round.all_compacted => Err(round.error.clone()),
                    None => {
                        self.client.inner.ranges.mark_stale();
                        elsewhere = None;
                        Err(KvError::unavailable(
                            "no replica could resume the watch yet",
                        ))
                    }
                },
            };
            let ended = match opened {
                Ok(opened) => {
                    pause = REOPEN_PAUSE_MIN;
                    self.follow(&mut part, opened, &mut elsewhere).await
                }
                Err(error) => ended_by(error),
            };
            match (ended, &mut elsewhere) {
                (Ended::Dropped, _) => return,
                (Ended::Failed(error), _) => {
                    let _ = self.sender.send(Err(error)).await;
                    return;
                }
                (Ended::Compacted(error), Some(round))
                    if round.all_compacted && round.next >= REPLICAS_ASKED_MAX =>
                {
                    let _ = self.sender.send(Err(error)).await;
                    return;
                }
                (Ended::Compacted(error), Some(round)) => {
                    round.error = error;
                    round.next += 1;
                    continue;
                }
                (Ended::Compacted(error), None) => {
                    elsewhere = Some(Elsewhere {
                        error,
                        next: 0,
                        all_compacted: true,
                    });
                    continue;
                }
                // A replica that could not be reached or holds no replica now: the next.
                (Ended::Reopen, Some(round)) => {
                    round.next += 1;
                    round.all_compacted = false;
                    continue;
                }
                (Ended::Reopen, None) => {}
                // Another replica than the one that gave up on the stream, if one answers.
                (Ended::Unserved(error), None) => {
                    elsewhere = Some(Elsewhere {
                        error,
                        next: 0,
                        all_compacted: false,
                    });
                }
                (Ended::Unserved(_), Some(round)) => {
                    round.next += 1;
                    round.all_compacted = false;
                }
            }
            tokio::select! {
                () = tokio::time::sleep(pause) => {}
                () = self.sender.closed() => return,
            }
            pause = (pause * 2).min(REOPEN_PAUSE_MAX);
        }
    }

    fn request(&self, part: &Part) -> v1::WatchRequest {
        let cursor = part.cursor.clone().unwrap_or_default();
        v1::WatchRequest {
            start: part.start.clone(),
            end: part.end.clone(),
            start_revision: cursor.revision,
            resume_key: cursor.key,
            prev_kv: self.options.prev_kv,
            no_put: self.options.no_put,
            no_delete: self.options.no_delete,
            reclaims: self.options.reclaims,
            progress_interval_ms: self.progress_ms,
        }
    }

    /// Delivers an open stream's events until it ends, moving `part`'s cursor past each. A
    /// message that moves the cursor on clears `elsewhere`: this replica serves the part.
    async fn follow(
        &self,
        part: &mut Part,
        opened: Opened,
        elsewhere: &mut Option<Elsewhere>,
    ) -> Ended {
        let Opened {
            started,
            mut stream,
            kv,
        } = opened;
        let key = (started.served_by, started.watch_id);
        lock(&self.streams).insert(key, kv);
        let _listed = Listed {
            streams: self.streams.clone(),
            key,
        };
        let cursor = part
            .cursor
            .get_or_insert_with(|| EventCursor::at(started.start_revision));
        if covers_less(&started.end, &part.end) {
            // The range ends inside the part: the rest is watched on its own, from here.
            let rest = Part {
                start: started.end.clone(),
                end: std::mem::replace(&mut part.end, started.end.clone()),
                cursor: Some(cursor.clone()),
            };
            tokio::spawn(self.clone().run(rest));
        }
        loop {
            let message = tokio::select! {
                message = tokio::time::timeout(SILENCE_MAX, stream.message()) => message,
                () = self.sender.closed() => return Ended::Dropped,
            };
            let message = match message {
                Err(_silent) => return Ended::Reopen,
                Ok(message) => message,
            };
            let message = match message {
                Ok(Some(message)) => message,
                Ok(None) => return Ended::Reopen,
                Err(status) => {
                    return match attempt::from_status(&status) {
                        // The replica ended the stream: it stopped, or hears from no other
                        // replica of its range (a partition may have cut it off).
                        AttemptError::Server(error @ KvError::Unavailable { .. }) => {
                            Ended::Unserved(error)
                        }
                        other => ended_by(retry::final_error(&other)),
                    };
                }
            };
            let cursor = part.cursor.get_or_insert_with(EventCursor::default);
            let before = cursor.clone();
            let events = past(cursor, message.events);
            if let Some(last) = events.last() {
                *cursor = (*cursor).clone().max(EventCursor::after(last));
            }
            let complete = message.complete_revision;
            *cursor = (*cursor).clone().max(EventCursor::at(complete + 1));
            if *cursor > before {
                // This replica moves the part on: the round of the replicas is over.
                *elsewhere = None;
            }
            let batch = WatchBatch {
                range_id: RangeId(started.range_id),
                served_by: started.served_by,
                start: part.start.clone(),
                end: part.end.clone(),
                events,
                complete_revision: complete,
            };
            let progress_asked = message.requested || self.options.progress_interval.is_some();
            if batch.events.is_empty() && !progress_asked {
                continue;
            }
            if self.sender.send(Ok(batch)).await.is_err() {
                return Ended::Dropped;
            }
        }
    }
}

/// The events at or after `cursor` (a stream sends no other; this keeps a part from going
/// back whatever it is sent).
fn past(cursor: &EventCursor, events: Vec<v1::Event>) -> Vec<Event> {
    events
        .into_iter()
        .map(Event::from)
        .filter(|event| {
            let at = EventCursor {
                revision: event.revision,
                key: event.key.clone(),
            };
            at >= *cursor
        })
        .collect()
}

/// Whether a stream covering up to `covered` (empty = unbounded) covers less than a part
/// ending at `end`.
fn covers_less(covered: &[u8], end: &[u8]) -> bool {
    !covered.is_empty() && (end.is_empty() || covered < end)
}

/// Whether a failed open may be tried again later: the range or its replicas were moving, or
/// no node answered in time.
fn reopenable(error: &KvError) -> bool {
    matches!(
        error,
        KvError::NotLeader { .. }
            | KvError::Unavailable { .. }
            | KvError::Timeout { .. }
            | KvError::KeyOutOfRange { .. }
            | KvError::Overloaded { .. }
    )
}

/// What an error that ended a part's stream (or its opening) makes of the part.
fn ended_by(error: KvError) -> Ended {
    match error {
        error if reopenable(&error) => Ended::Reopen,
        error @ KvError::Compacted { .. } => Ended::Compacted(error),
        error => Ended::Failed(error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(revision: Revision, key: &str) -> v1::Event {
        v1::Event {
            revision,
            key: key.as_bytes().to_vec(),
            ..v1::Event::default()
        }
    }

    #[test]
    fn a_part_never_goes_back_behind_its_cursor() {
        let cursor = EventCursor::after(&Event::from(event(5, "b")));
        let events = vec![
            event(4, "z"),
            event(5, "a"),
            event(5, "b"),
            event(5, "c"),
            event(6, "a"),
        ];
        let kept: Vec<_> = past(&cursor, events)
            .into_iter()
            .map(|e| (e.revision, e.key))
            .collect();
        assert_eq!(kept, vec![(5, b"c".to_vec()), (6, b"a".to_vec())]);
    }

    #[test]
    fn a_stream_covers_less_when_its_range_ends_inside_the_part() {
        assert!(covers_less(b"m", b""));
        assert!(covers_less(b"m", b"z"));
        assert!(!covers_less(b"z", b"z"));
        assert!(!covers_less(b"", b""));
    }
}
