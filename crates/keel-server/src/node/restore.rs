//! `keel restore`: makes the data dir of the first node of a new cluster from a backup file,
//! offline. Knows nothing of the network; the backup's format is keel-backup's, the ranges'
//! state keel-storage's (`Store::restore_range`, `Store::restore_meta`).
//!
//! 1. The restoring node must be in `--initial-cluster` and have its smallest id: that is the
//!    node that would initialize a fresh cluster, and a node holding the ranges does not, so
//!    no other node initializes one either (they wait, empty, for the ranges to reach them).
//! 2. DIR must be absent or empty. The whole file is verified first (`keel_backup::verify`:
//!    checksums, order, lengths, counts, coverage); a bad file is refused before DIR is
//!    touched.
//! 3. A marker file is written, the store opened, and each range's snapshot streamed from
//!    the file (a reading thread, a bounded queue) into the snapshot directory and restored
//!    with the node as its one voter; its span and epoch must match the backup's record of
//!    it. Then the meta range is written: the restored descriptors, the node, the id
//!    allocator past every restored id. The store is flushed and the marker removed.
//! 4. Any failure deletes what was made in DIR. A restore killed midway leaves the marker,
//!    and `keel serve` refuses such a DIR.
//!
//! Started on DIR, the node leads every range alone; the other nodes of the initial cluster
//! start empty, register, and the rebalancer adds them as replicas (by snapshot) until each
//! range has the replication factor.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use keel_backup::{BackupReader, BackupSummary, Item, RangeHeader};
use keel_storage::{IncomingSnapshot, Store};
use keel_types::{NodeAddr, NodeDescriptor, NodeId, RangeDescriptor, limits};
use tokio::sync::mpsc;
use tracing::info;

use crate::config::{parse_initial_cluster, snapshot_dir_in, store_path_in};

/// A file in a data dir that a restore has not finished; `keel serve` refuses the dir.
pub(crate) const RESTORE_MARKER: &str = "RESTORE-UNFINISHED";

/// The command line of `keel restore`.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct RestoreArgs {
    /// The backup file `keel backup` wrote.
    #[arg(long, value_name = "FILE")]
    pub from: PathBuf,
    /// The data dir to create for the new cluster's first node; absent or empty.
    #[arg(long, value_name = "DIR")]
    pub data_dir: PathBuf,
    /// The id of the node that will serve DIR: the smallest id of --initial-cluster.
    #[arg(long, default_value_t = 1)]
    pub node_id: NodeId,
    /// The new cluster, exactly as its nodes' `keel serve --initial-cluster` will get it:
    /// "1=127.0.0.1:7001,2=127.0.0.1:7002,...".
    #[arg(long)]
    pub initial_cluster: String,
}

/// How far a restore has come.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RestoreProgress {
    pub ranges_done: usize,
    pub ranges_total: usize,
    pub bytes_done: u64,
    pub bytes_total: u64,
}

/// What a restore wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestoreSummary {
    /// The restored ranges as the new cluster has them, in file order.
    pub ranges: Vec<RangeDescriptor>,
    /// Each range's revision, as the backup recorded it.
    pub revisions: Vec<u64>,
    pub snapshot_bytes: u64,
    /// When the backup was started (ms since the Unix epoch).
    pub backup_created_ms: u64,
}

/// Why a restore did not happen.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    /// Nothing was written: the arguments, DIR or the backup file were refused.
    #[error("{0:#}")]
    Refused(anyhow::Error),
    /// Writing DIR failed; what the restore made there was deleted.
    #[error("{0:#}")]
    Failed(anyhow::Error),
}

/// Restores `args.from` into `args.data_dir` (see the module doc), telling `progress` after
/// each range.
pub async fn restore(
    args: RestoreArgs,
    mut progress: impl FnMut(RestoreProgress) + Send,
) -> Result<RestoreSummary, RestoreError> {
    let voter = restoring_node(&args).map_err(RestoreError::Refused)?;
    let existed = check_empty(&args.data_dir).map_err(RestoreError::Refused)?;
    let from = args.from.clone();
    let summary = tokio::task::spawn_blocking(move || keel_backup::verify(&from))
        .await
        .map_err(|e| RestoreError::Failed(e.into()))?
        .map_err(|e| RestoreError::Refused(e.into()))?;
    info!(
        ranges = summary.ranges.len(),
        bytes = summary.end.snapshot_bytes,
        "backup verified"
    );
    let restored = restore_into(&args, &voter, &summary, &mut progress).await;
    if restored.is_err() {
        remove_restored(&args.data_dir, existed);
    }
    let ranges = restored.map_err(RestoreError::Failed)?;
    Ok(RestoreSummary {
        ranges,
        revisions: summary.ranges.iter().map(|range| range.revision).collect(),
        snapshot_bytes: summary.end.snapshot_bytes,
        backup_created_ms: summary.header.created_ms,
    })
}

/// The restoring node, checked against the initial cluster.
fn restoring_node(args: &RestoreArgs) -> anyhow::Result<NodeDescriptor> {
    let cluster = parse_initial_cluster(&args.initial_cluster)?;
    let Some(addr) = cluster.get(&args.node_id) else {
        bail!(
            "node {} is not in --initial-cluster {:?}",
            args.node_id,
            args.initial_cluster
        );
    };
    let smallest = *cluster.keys().next().expect("a parsed cluster has a node");
    if smallest != args.node_id {
        bail!(
            "node {} is not the smallest id of --initial-cluster ({smallest} is): node {smallest} would \
             initialize a fresh cluster beside the restored one; restore with --node-id {smallest}",
            args.node_id
        );
    }
    Ok(NodeDescriptor {
        id: args.node_id,
        addr: NodeAddr::new(addr.clone()),
    })
}

/// Whether `dir` exists; an error if it holds anything.
fn check_empty(dir: &Path) -> anyhow::Result<bool> {
    match std::fs::read_dir(dir) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                bail!(
                    "{} is not empty: a restore makes a new data dir and never writes into one in use",
                    dir.display()
                );
            }
            Ok(true)
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(error) => Err(error).with_context(|| format!("reading {}", dir.display())),
    }
}

/// Everything of step 3: marker, store, ranges, meta range, flush, marker removed.
async fn restore_into(
    args: &RestoreArgs,
    voter: &NodeDescriptor,
    summary: &BackupSummary,
    progress: &mut (impl FnMut(RestoreProgress) + Send),
) -> anyhow::Result<Vec<RangeDescriptor>> {
    let dir = args.data_dir.clone();
    let marker = dir.join(RESTORE_MARKER);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    write_synced(
        &marker,
        b"keel restore has not finished writing this data dir\n",
    )?;
    let store = tokio::task::spawn_blocking(move || {
        Store::open(&store_path_in(&dir), &snapshot_dir_in(&dir))
    })
    .await??;
    let restored = restore_ranges(&store, &args.from, voter, summary, progress).await;
    let written = match restored {
        Ok(ranges) => match store.restore_meta(&ranges, voter).await {
            Ok(()) => Ok(ranges),
            Err(error) => Err(anyhow::Error::from(error).context("writing the meta range")),
        },
        Err(error) => Err(error),
    };
    let closing = store.clone();
    tokio::task::spawn_blocking(move || closing.shutdown()).await?;
    let ranges = written?;
    std::fs::remove_file(&marker).with_context(|| format!("removing {}", marker.display()))?;
    sync_dir(&args.data_dir)?;
    Ok(ranges)
}

/// Reads the ranges of the file at `from` on a blocking thread and restores each into
/// `store`; returns their descriptors as restored.
async fn restore_ranges(
    store: &Store,
    from: &Path,
    voter: &NodeDescriptor,
    summary: &BackupSummary,
    progress: &mut (impl FnMut(RestoreProgress) + Send),
) -> Result<Vec<RangeDescriptor>, anyhow::Error> {
    let mut items = read_items(from.to_path_buf());
    let mut restored = Vec::with_capacity(summary.ranges.len());
    let mut state = RestoreProgress {
        ranges_done: 0,
        ranges_total: summary.ranges.len(),
        bytes_done: 0,
        bytes_total: summary.end.snapshot_bytes,
    };
    let mut open: Option<(RangeHeader, IncomingSnapshot)> = None;
    while let Some(item) = items.recv().await {
        match item? {
            Item::Range(header) => {
                let incoming = store.incoming_snapshot(header.descriptor.id).await?;
                open = Some((header, incoming));
            }
            Item::Chunk(data) => {
                let (_, incoming) = open.as_mut().expect("the reader checks the order");
                incoming.write_chunk(&data).await?;
                state.bytes_done += data.len() as u64;
            }
            Item::RangeEnd => {
                let (header, incoming) = open.take().expect("the reader checks the order");
                restored.push(restore_range(store, &header, incoming, voter).await?);
                state.ranges_done += 1;
                progress(state);
            }
            Item::End(_) => return Ok(restored),
        }
    }
    bail!("the backup reader stopped before the End record")
}

/// Restores one range from its received snapshot; the file is deleted afterwards.
async fn restore_range(
    store: &Store,
    header: &RangeHeader,
    incoming: IncomingSnapshot,
    voter: &NodeDescriptor,
) -> anyhow::Result<RangeDescriptor> {
    let range = header.descriptor.id;
    let file = incoming.finish().await?;
    let restored = store.restore_range(range, &file, voter).await;
    let _ = tokio::fs::remove_file(file.path()).await;
    let restored = restored.with_context(|| format!("restoring range {range}"))?;
    let recorded = &header.descriptor;
    if (&restored.start, &restored.end, restored.epoch)
        != (&recorded.start, &recorded.end, recorded.epoch)
    {
        bail!("the snapshot of range {range} holds {restored}, but the backup recorded {recorded}");
    }
    info!(%range, revision = header.revision, "range restored");
    Ok(restored)
}

/// The items of the backup at `path`, read on a blocking thread into a bounded queue.
fn read_items(path: PathBuf) -> mpsc::Receiver<anyhow::Result<Item>> {
    let (sender, receiver) = mpsc::channel(limits::RESTORE_RECORDS_IN_FLIGHT);
    tokio::task::spawn_blocking(move || {
        let mut reader = match BackupReader::open(&path) {
            Ok(reader) => reader,
            Err(error) => return drop(sender.blocking_send(Err(error.into()))),
        };
        loop {
            let item = reader.next_item().map_err(anyhow::Error::from);
            let last = !matches!(item, Ok(Item::Range(_) | Item::Chunk(_) | Item::RangeEnd));
            if sender.blocking_send(item).is_err() || last {
                return;
            }
        }
    });
    receiver
}

/// Deletes what a failed restore made: `dir` itself when it did not exist before, else
/// everything in it.
fn remove_restored(dir: &Path, existed: bool) {
    let removed = match existed {
        false => std::fs::remove_dir_all(dir),
        true => std::fs::read_dir(dir).and_then(|entries| {
            for entry in entries {
                let path = entry?.path();
                match path.is_dir() {
                    true => std::fs::remove_dir_all(&path)?,
                    false => std::fs::remove_file(&path)?,
                }
            }
            Ok(())
        }),
    };
    if let Err(error) = removed {
        tracing::warn!(dir = %dir.display(), %error, "cleaning up after a failed restore");
    }
}

fn write_synced(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let write = || -> std::io::Result<()> {
        let mut file = std::fs::File::create(path)?;
        std::io::Write::write_all(&mut file, bytes)?;
        file.sync_all()
    };
    write().with_context(|| format!("writing {}", path.display()))?;
    sync_dir(path.parent().unwrap_or(Path::new(".")))
}

fn sync_dir(dir: &Path) -> anyhow::Result<()> {
    std::fs::File::open(dir)
        .and_then(|dir| dir.sync_all())
        .with_context(|| format!("syncing {}", dir.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(node_id: NodeId, cluster: &str) -> RestoreArgs {
        RestoreArgs {
            from: PathBuf::from("backup"),
            data_dir: PathBuf::from("dir"),
            node_id,
            initial_cluster: cluster.to_string(),
        }
    }

    #[test]
    fn the_restoring_node_is_the_smallest_of_the_initial_cluster() {
        let cluster = "1=127.0.0.1:7001,2=127.0.0.1:7002,3=127.0.0.1:7003";
        let voter = restoring_node(&args(1, cluster)).unwrap();
        assert_eq!((voter.id, voter.addr.addr.as_str()), (1, "127.0.0.1:7001"));
        let error = restoring_node(&args(2, cluster)).unwrap_err().to_string();
        assert!(error.contains("--node-id 1"), "{error}");
        let error = restoring_node(&args(4, cluster)).unwrap_err().to_string();
        assert!(error.contains("not in --initial-cluster"), "{error}");
    }

    #[test]
    fn only_an_absent_or_empty_dir_is_restored_into() {
        let root = tempfile::tempdir().unwrap();
        assert!(!check_empty(&root.path().join("new")).unwrap());
        assert!(check_empty(root.path()).unwrap());
        std::fs::write(root.path().join("keel.redb"), b"").unwrap();
        let error = check_empty(root.path()).unwrap_err().to_string();
        assert!(error.contains("is not empty"), "{error}");
    }
}
