//! `keel backup --out FILE`: every data range's consistent snapshot, one range after another,
//! into one backup file (keel-backup's format) through keel-client alone.
//!
//! The range table is listed, then each range's snapshot fetched from its leader and written
//! as it arrives; a stream that breaks off is cut out of the file and fetched again (at most
//! `RANGE_ATTEMPTS_MAX` times). A range may split between the listing and its snapshot; its
//! snapshot then covers less than was listed, so once every listed range is in, the spans
//! written are checked for gaps, the table listed again and the ranges holding the missing
//! keys fetched (at most `limits::BACKUP_ROUNDS_MAX` rounds). The file is written to
//! `FILE.tmp`, fsynced and renamed: `FILE` is only ever a complete backup.

use std::path::Path;
use std::time::Duration;

use keel_backup::{BackupHeader, BackupWriter, Gap, RangeHeader};
use keel_client::Client;
use keel_types::{KvError, RangeDescriptor, limits};

use crate::output::backup::{BackedUp, progress};
use crate::progress::Progress;

/// Times one range's snapshot is fetched before the backup gives up.
const RANGE_ATTEMPTS_MAX: u32 = 3;
/// Pause before listing the ranges again: the meta range learns of a split within a couple
/// of seconds (its publisher runs every 2 s).
const RELIST_PAUSE: Duration = Duration::from_millis(500);

/// Writes the backup of the cluster behind `client` to `out`.
pub async fn run(client: &Client, out: &Path) -> Result<BackedUp, KvError> {
    let listed: Vec<RangeDescriptor> = client
        .ranges()
        .await?
        .into_iter()
        .map(|info| info.descriptor)
        .collect();
    if listed.len() > limits::BACKUP_RANGES_MAX {
        return Err(KvError::invalid(format!(
            "the cluster has {} ranges; a backup holds at most {}",
            listed.len(),
            limits::BACKUP_RANGES_MAX
        )));
    }
    let members = client.members().await?;
    let header = BackupHeader {
        created_ms: now_ms(),
        keel_version: env!("CARGO_PKG_VERSION").to_string(),
        nodes: members
            .nodes
            .iter()
            .map(|node| (node.node_id, node.addr.clone()))
            .collect(),
        listed: 0,
    };
    let mut writer = BackupWriter::create(out, header, &listed).map_err(file_error)?;
    let mut progress = Progress::on_stderr();
    let backed_up = write_ranges(client, &mut writer, listed, &mut progress).await;
    progress.clear();
    let revisions = backed_up?;
    let file_bytes = writer.bytes_written();
    let ranges = writer.ranges().iter().cloned().zip(revisions).collect();
    let end = writer.finish().map_err(file_error)?;
    Ok(BackedUp {
        file: out.display().to_string(),
        ranges,
        snapshot_bytes: end.snapshot_bytes,
        file_bytes,
    })
}

/// Writes `listed`, then rounds of the ranges holding what is still missing; returns each
/// written range's revision.
async fn write_ranges(
    client: &Client,
    writer: &mut BackupWriter,
    listed: Vec<RangeDescriptor>,
    progress: &mut Progress,
) -> Result<Vec<u64>, KvError> {
    let mut revisions = Vec::new();
    let mut pending = listed;
    let mut total = pending.len();
    for _ in 0..limits::BACKUP_ROUNDS_MAX {
        for range in &pending {
            let written = writer.ranges().iter().any(|done| done.id == range.id);
            if !written {
                revisions.push(write_range(client, writer, range, progress, total).await?);
            }
        }
        let gaps = keel_backup::gaps(writer.ranges()).map_err(KvError::fatal)?;
        if gaps.is_empty() {
            return Ok(revisions);
        }
        tracing::info!(
            gaps = gaps.len(),
            "ranges split during the backup; listing again"
        );
        tokio::time::sleep(RELIST_PAUSE).await;
        pending = holding(client, &gaps).await?;
        total = writer.ranges().len() + pending.len();
    }
    let gaps = keel_backup::gaps(writer.ranges()).map_err(KvError::fatal)?;
    let gap = gaps.first().map_or_else(String::new, Gap::to_string);
    Err(KvError::unavailable(format!(
        "no snapshot covers {gap} after {} listings of the ranges; try again",
        limits::BACKUP_ROUNDS_MAX
    )))
}

/// The ranges the cluster lists now that hold keys of `gaps`.
async fn holding(client: &Client, gaps: &[Gap]) -> Result<Vec<RangeDescriptor>, KvError> {
    let ranges = client.ranges().await?;
    Ok(ranges
        .into_iter()
        .map(|info| info.descriptor)
        .filter(|range| gaps.iter().any(|gap| gap.overlaps(range)))
        .collect())
}

/// Fetches `range`'s snapshot into the file, again from the start if its stream breaks;
/// returns its revision.
async fn write_range(
    client: &Client,
    writer: &mut BackupWriter,
    range: &RangeDescriptor,
    progress: &mut Progress,
    total: usize,
) -> Result<u64, KvError> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        match stream_range(client, writer, range, progress, total).await {
            Ok(revision) => return Ok(revision),
            Err(Failure::File(error)) => return Err(error),
            Err(Failure::Stream(error)) => {
                writer.abandon_range().map_err(file_error)?;
                if attempt >= RANGE_ATTEMPTS_MAX {
                    return Err(error);
                }
                tracing::info!(range = %range.id, %error, "backup stream failed; fetching the range again");
            }
        }
    }
}

/// Why one fetch of a range failed: the cluster (try again) or the file (give up).
enum Failure {
    Stream(KvError),
    File(KvError),
}

async fn stream_range(
    client: &Client,
    writer: &mut BackupWriter,
    range: &RangeDescriptor,
    progress: &mut Progress,
    total: usize,
) -> Result<u64, Failure> {
    let mut stream = client.backup_range(range).await.map_err(Failure::Stream)?;
    let snapshot = stream.snapshot().clone();
    if snapshot.descriptor.id != range.id {
        let detail = format!("asked for range {}, got {}", range.id, snapshot.descriptor);
        return Err(Failure::Stream(KvError::fatal(detail)));
    }
    let header = RangeHeader {
        descriptor: snapshot.descriptor,
        revision: snapshot.revision,
        applied_index: snapshot.applied_index,
        snapshot_bytes: snapshot.snapshot_bytes,
    };
    let done = writer.ranges().len();
    writer
        .begin_range(header)
        .map_err(|e| Failure::File(file_error(e)))?;
    while let Some(data) = stream.next_chunk().await.map_err(Failure::Stream)? {
        writer
            .write_snapshot(&data)
            .map_err(|e| Failure::File(file_error(e)))?;
        progress.show(&progress_line(writer, done, total), false);
    }
    writer
        .end_range()
        .map_err(|e| Failure::Stream(file_error(e)))?;
    progress.show(&progress_line(writer, done + 1, total), true);
    Ok(snapshot.revision)
}

fn progress_line(writer: &BackupWriter, done: usize, total: usize) -> String {
    format!(
        "backup: {}",
        progress(done, total, writer.bytes_written(), None)
    )
}

/// A failure of the backup file as the command's error (exit 3).
fn file_error(error: keel_backup::BackupError) -> KvError {
    KvError::fatal(error.to_string())
}

fn now_ms() -> u64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    since.map_or(0, |elapsed| elapsed.as_millis() as u64)
}
