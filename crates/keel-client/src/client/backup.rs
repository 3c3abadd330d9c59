//! `Cluster.Backup`: one range's consistent snapshot, streamed from its leader. Opening the
//! stream is a read with the usual retries (leader of the range's start key first, hints
//! followed, endpoints in turn); once bytes flow, a broken stream is the caller's to retry
//! from the start. The bytes are opaque here: keel-client knows no storage format.

use keel_proto::v1;
use keel_proto::v1::backup_chunk::Part;
use keel_proto::v1::cluster_client::ClusterClient;
use keel_types::{KvError, NodeId, RangeDescriptor, Revision};
use tokio::time::Duration;

use super::route::RouteBy;
use super::{Client, Kind};
use crate::results::Served;
use crate::retry;
use crate::stub::Transport;

/// What a range's backup stream holds, from its first message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RangeSnapshot {
    /// The range as its snapshot holds it (span, epoch, conf_version, voters).
    pub descriptor: RangeDescriptor,
    /// The range's revision in the snapshot.
    pub revision: Revision,
    /// The leader's log index the snapshot covers.
    pub applied_index: u64,
    /// Bytes the stream carries.
    pub snapshot_bytes: u64,
    /// The node that took the snapshot.
    pub served_by: NodeId,
}

/// A range's snapshot streaming from its leader (`Client::backup_range`).
pub struct RangeBackup {
    snapshot: RangeSnapshot,
    stream: tonic::Streaming<v1::BackupChunk>,
    received: u64,
    chunk_timeout: Duration,
}

impl RangeBackup {
    pub fn snapshot(&self) -> &RangeSnapshot {
        &self.snapshot
    }

    /// The next chunk of the snapshot's bytes; `None` once all `snapshot_bytes` arrived.
    /// `Unavailable` when the stream broke off, ran long or short, or stalled for the
    /// client's `snapshot_timeout`: take the range's backup again from the start.
    pub async fn next_chunk(&mut self) -> Result<Option<Vec<u8>>, KvError> {
        let range = self.snapshot.descriptor.id;
        let broken = |detail: String| {
            KvError::unavailable(format!("the backup stream of range {range} {detail}"))
        };
        let next = tokio::time::timeout(self.chunk_timeout, self.stream.message()).await;
        let message = match next {
            Err(_) => return Err(broken(format!("stalled for {:?}", self.chunk_timeout))),
            Ok(Err(status)) => return Err(broken(format!("broke off: {}", status.message()))),
            Ok(Ok(message)) => message,
        };
        let expected = self.snapshot.snapshot_bytes;
        match message.and_then(|chunk| chunk.part) {
            None if self.received == expected => Ok(None),
            None => Err(broken(format!(
                "ended after {} of {expected} bytes",
                self.received
            ))),
            Some(Part::Data(data)) if self.received + data.len() as u64 <= expected => {
                self.received += data.len() as u64;
                Ok(Some(data))
            }
            Some(Part::Data(_)) => Err(broken(format!("sent more than {expected} bytes"))),
            Some(Part::Start(_)) => Err(broken("sent a second start".to_string())),
        }
    }
}

/// An opened stream: its first message and the rest.
struct Opened {
    start: v1::BackupStart,
    stream: tonic::Streaming<v1::BackupChunk>,
}

impl Served for Opened {
    fn range_id(&self) -> u64 {
        self.start
            .descriptor
            .as_ref()
            .map_or(0, |range| range.range_id)
    }
}

impl Client {
    /// Opens a stream of `range`'s snapshot, taken by its leader after confirming its
    /// leadership with a quorum: it holds every write acknowledged before the call, and the
    /// range's revision. Sent to the leader of the range's first key when known (any node
    /// forwards it), retried as a read; the leader may build a snapshot first, so opening
    /// may take up to `ClientOptions::snapshot_timeout`. The meta range is refused
    /// (`InvalidArgument`).
    pub async fn backup_range(&self, range: &RangeDescriptor) -> Result<RangeBackup, KvError> {
        let options = &self.inner.options;
        let kind = Kind {
            is_write: false,
            needs_leader: true,
            held: options.snapshot_timeout,
        };
        let request = v1::BackupRequest {
            range_id: range.id.0,
            no_forward: false,
        };
        let timeout = options.request_timeout + options.snapshot_timeout;
        let opened = self
            .call_with(
                kind,
                RouteBy::Key(&range.start),
                timeout,
                retry::decide_read,
                |cluster: ClusterClient<Transport>| open(cluster, request),
            )
            .await?;
        let snapshot = snapshot_of(opened.start)?;
        Ok(RangeBackup {
            snapshot,
            stream: opened.stream,
            received: 0,
            chunk_timeout: options.snapshot_timeout,
        })
    }
}

/// Sends the request and waits for the stream's first message.
async fn open(
    mut cluster: ClusterClient<Transport>,
    request: v1::BackupRequest,
) -> Result<tonic::Response<Opened>, tonic::Status> {
    let mut stream = cluster.backup(request).await?.into_inner();
    match stream.message().await?.and_then(|chunk| chunk.part) {
        Some(Part::Start(start)) => Ok(tonic::Response::new(Opened { start, stream })),
        _ => Err(tonic::Status::internal(
            "the backup stream did not start with its description",
        )),
    }
}

fn snapshot_of(start: v1::BackupStart) -> Result<RangeSnapshot, KvError> {
    let Some(descriptor) = start.descriptor else {
        return Err(KvError::fatal("a backup stream without a range descriptor"));
    };
    Ok(RangeSnapshot {
        descriptor: descriptor.into(),
        revision: start.revision,
        applied_index: start.applied_index,
        snapshot_bytes: start.snapshot_bytes,
        served_by: start.served_by,
    })
}
