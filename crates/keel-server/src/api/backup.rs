//! `Cluster.Backup`: a consistent snapshot of one data range for `keel backup`, taken on the
//! range's leader (`RaftGroup::backup_snapshot`: ReadIndex first) and streamed in chunks as
//! the client reads them, or forwarded once to the leader and relayed. Knows nothing of the
//! backup file the client writes.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt, stream};
use keel_proto::v1::backup_chunk::Part;
use keel_proto::v1::cluster_client::ClusterClient;
use keel_proto::v1::{BackupChunk, BackupRequest, BackupStart};
use keel_raft::BackupSnapshot;
use keel_types::{KvError, NodeAddr, NodeId, RangeId};
use tonic::Status;
use tracing::{debug, info};

use crate::peer::call::{To, call};
use crate::shared::Shared;
use crate::status::to_status;

/// The chunks of a backup stream, as tonic sends them.
pub(crate) type BackupStream = Pin<Box<dyn Stream<Item = Result<BackupChunk, Status>> + Send>>;

/// Serves `request` here when this node leads the range, else forwards it once to the
/// leader (unless the caller forbade it) and relays the leader's stream.
pub(crate) async fn backup(
    shared: &Arc<Shared>,
    request: BackupRequest,
) -> Result<BackupStream, Status> {
    shared.health.check().map_err(|e| to_status(&e))?;
    let range = RangeId(request.range_id);
    if range == RangeId::META {
        return Err(to_status(&KvError::invalid(
            "the meta range is not backed up: a restore writes it anew",
        )));
    }
    match snapshot_here(shared, range).await {
        Ok(snapshot) => {
            info!(%range, bytes = snapshot.len_bytes, revision = snapshot.summary.revision, "backup snapshot streaming");
            Ok(chunks(shared.node_id, snapshot))
        }
        Err(KvError::NotLeader {
            leader: Some(leader),
            ..
        }) if !request.no_forward => forward(shared, leader, request).await,
        Err(error) => Err(to_status(&error)),
    }
}

/// This node's snapshot of `range`, if it leads it.
async fn snapshot_here(shared: &Shared, range: RangeId) -> Result<BackupSnapshot, KvError> {
    let Some(group) = shared.groups.get(range) else {
        return Err(KvError::NotLeader {
            range_id: range,
            leader: shared.replica_hint(range),
        });
    };
    group.backup_snapshot(snapshot_timeout(shared)).await
}

fn snapshot_timeout(shared: &Shared) -> Duration {
    Duration::from_millis(shared.timings.snapshot_timeout_ms)
}

/// The stream of a snapshot: its `start`, then its bytes, read from the file only as fast
/// as the client takes them.
fn chunks(node_id: NodeId, snapshot: BackupSnapshot) -> BackupStream {
    let summary = snapshot.summary;
    let start = BackupChunk {
        part: Some(Part::Start(BackupStart {
            descriptor: Some(summary.descriptor.into()),
            revision: summary.revision,
            applied_index: summary.applied_index,
            snapshot_bytes: snapshot.len_bytes,
            served_by: node_id,
        })),
    };
    let data = stream::unfold(Some(snapshot.reader), |reader| async move {
        let mut reader = reader?;
        match reader.next_chunk().await {
            Ok(Some(data)) => {
                let chunk = BackupChunk {
                    part: Some(Part::Data(data)),
                };
                Some((Ok(chunk), Some(reader)))
            }
            Ok(None) => None,
            Err(error) => {
                let error = KvError::fatal(format!("reading the backup snapshot: {error}"));
                Some((Err(to_status(&error)), None))
            }
        }
    });
    Box::pin(stream::once(async { Ok(start) }).chain(data))
}

/// Sends the request (marked `no_forward`) to `leader` and relays its stream. The leader
/// answers once its snapshot is ready, so the wait includes building it.
async fn forward(
    shared: &Shared,
    (leader_id, leader_addr): (NodeId, NodeAddr),
    request: BackupRequest,
) -> Result<BackupStream, Status> {
    debug!(
        leader_id,
        range_id = request.range_id,
        "forwarding a backup to the leader"
    );
    let request = BackupRequest {
        no_forward: true,
        ..request
    };
    let deadline = shared.forward_deadline(false) + snapshot_timeout(shared);
    let backup = |mut leader: ClusterClient<_>| async move { leader.backup(request).await };
    match call(
        &shared.peers,
        To::Node(leader_id, &leader_addr),
        deadline,
        backup,
    )
    .await
    {
        Ok(response) => Ok(Box::pin(response.into_inner())),
        Err(error) => Err(error.into_status(false)),
    }
}
