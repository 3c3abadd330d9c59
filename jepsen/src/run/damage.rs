//! What the `disk` fault does to a stopped node's data directory: flip bytes inside the store
//! file, the newest snapshot file or the written part of the newest Raft log segment, or cut
//! the end of the store file off. Offsets come from
//! the plan's `pick`, so the same seed damages the same places of files of the same size.
//! Knows nothing of processes or of what the files hold beyond their names.

use std::fs::OpenOptions;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

use crate::run::plan::Damage;
use crate::run::rng::Rng;

/// The store file in a node's data directory.
pub const STORE_FILE: &str = "keel.redb";
/// The directory of snapshot files in a node's data directory, and their extension.
pub const SNAPSHOT_DIR: &str = "snapshots";
pub const SNAPSHOT_EXTENSION: &str = "snap";
/// The directory of the node-wide Raft log's segment files, and their extension.
pub const LOG_DIR: &str = "keel.raft-log";
pub const SEGMENT_EXTENSION: &str = "seg";
/// Bytes a flip changes, each at its own offset.
pub const FLIPS: usize = 16;
/// Bytes cut off the end of the store file: about one page.
pub const TRUNCATE_BYTES: u64 = 4096;

/// Damages the data in `data_dir` as `damage` says; returns what it did, for faults.jsonl.
pub fn apply(data_dir: &Path, damage: Damage) -> anyhow::Result<String> {
    let store = data_dir.join(STORE_FILE);
    match damage {
        Damage::FlipStore { pick } => flip(&store, pick),
        Damage::FlipSnapshot { pick } => match newest_snapshot(&data_dir.join(SNAPSHOT_DIR))? {
            Some(snapshot) => flip(&snapshot, pick),
            None => Ok(format!("no snapshot file; {}", flip(&store, pick)?)),
        },
        Damage::TruncateStore { .. } => truncate(&store, TRUNCATE_BYTES),
        Damage::FlipLog { pick } => match newest_segment(&data_dir.join(LOG_DIR))? {
            Some(segment) => flip_written(&segment, pick),
            None => Ok(format!("no log segment; {}", flip(&store, pick)?)),
        },
    }
}

/// Inverts `FLIPS` bytes of the written part of `path`: up to its last byte that is not zero
/// (a segment is preallocated with zeros past its records).
pub fn flip_written(path: &Path, pick: u64) -> anyhow::Result<String> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let written = bytes
        .iter()
        .rposition(|&byte| byte != 0)
        .map_or(0, |last| last + 1);
    if written == 0 {
        bail!("{} holds only zeros", path.display());
    }
    let mut rng = Rng::new(pick);
    let mut offsets: Vec<u64> = (0..FLIPS).map(|_| rng.below(written as u64)).collect();
    offsets.sort();
    offsets.dedup();
    let mut file = OpenOptions::new()
        .write(true)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    for offset in &offsets {
        let at = usize::try_from(*offset).expect("an offset within a file read in memory");
        file.seek(SeekFrom::Start(*offset))?;
        file.write_all(&[!bytes[at]])?;
    }
    file.sync_all()?;
    Ok(format!(
        "flipped {} bytes of {LOG_DIR}/{} ({written} bytes written) at {offsets:?}",
        offsets.len(),
        file_name(path)
    ))
}

/// The newest segment of the Raft log in `dir` (the highest sequence number), if any.
fn newest_segment(dir: &Path) -> anyhow::Result<Option<PathBuf>> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(None);
    };
    let mut newest: Option<PathBuf> = None;
    for entry in entries {
        let path = entry?.path();
        if path.extension().and_then(|e| e.to_str()) != Some(SEGMENT_EXTENSION) {
            continue;
        }
        if newest.as_ref().is_none_or(|newest| path > *newest) {
            newest = Some(path);
        }
    }
    Ok(newest)
}

/// Inverts `FLIPS` bytes of `path` at offsets drawn from `pick`.
pub fn flip(path: &Path, pick: u64) -> anyhow::Result<String> {
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    let len = file.metadata()?.len();
    if len == 0 {
        bail!("{} is empty", path.display());
    }
    let mut rng = Rng::new(pick);
    let mut offsets: Vec<u64> = (0..FLIPS).map(|_| rng.below(len)).collect();
    offsets.sort();
    offsets.dedup();
    for offset in &offsets {
        let mut byte = [0u8; 1];
        file.seek(SeekFrom::Start(*offset))?;
        file.read_exact(&mut byte)?;
        byte[0] = !byte[0];
        file.seek(SeekFrom::Start(*offset))?;
        file.write_all(&byte)?;
    }
    file.sync_all()?;
    Ok(format!(
        "flipped {} bytes of {} ({len} bytes) at {offsets:?}",
        offsets.len(),
        file_name(path)
    ))
}

/// Cuts `bytes` off the end of `path` (all of it if it is shorter).
pub fn truncate(path: &Path, bytes: u64) -> anyhow::Result<String> {
    let file = OpenOptions::new()
        .write(true)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    let len = file.metadata()?.len();
    let kept = len.saturating_sub(bytes);
    file.set_len(kept)?;
    file.sync_all()?;
    Ok(format!(
        "cut {} ({len} bytes) to {kept} bytes",
        file_name(path)
    ))
}

/// The newest complete snapshot file in `dir` (by modification time), if any.
fn newest_snapshot(dir: &Path) -> anyhow::Result<Option<PathBuf>> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(None);
    };
    let mut newest: Option<(std::time::SystemTime, PathBuf)> = None;
    for entry in entries {
        let path = entry?.path();
        if path.extension().and_then(|e| e.to_str()) != Some(SNAPSHOT_EXTENSION) {
            continue;
        }
        let modified = std::fs::metadata(&path)?.modified()?;
        if newest.as_ref().is_none_or(|(time, _)| modified > *time) {
            newest = Some((modified, path));
        }
    }
    Ok(newest.map(|(_, path)| path))
}

fn file_name(path: &Path) -> String {
    let parent = path
        .parent()
        .and_then(Path::file_name)
        .map(|name| name.to_string_lossy().into_owned());
    let name = path
        .file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_default();
    match parent.as_deref() {
        Some(SNAPSHOT_DIR) => format!("{SNAPSHOT_DIR}/{name}"),
        _ => name,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_flips_land_in_the_written_part_of_the_newest_segment() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join(LOG_DIR);
        std::fs::create_dir(&log).unwrap();
        let older = log.join("00000000000000000001.seg");
        let newer = log.join("00000000000000000002.seg");
        std::fs::write(&older, vec![0x5au8; 4_000]).unwrap();
        let mut segment = vec![0x5au8; 1_000];
        segment.extend(vec![0u8; 9_000]);
        std::fs::write(&newer, &segment).unwrap();

        let said = apply(dir.path(), Damage::FlipLog { pick: 3 }).unwrap();
        assert!(
            said.contains("keel.raft-log/00000000000000000002.seg"),
            "{said}"
        );
        assert_eq!(std::fs::read(&older).unwrap(), vec![0x5au8; 4_000]);
        let flipped = std::fs::read(&newer).unwrap();
        let changed: Vec<usize> = (0..segment.len())
            .filter(|&at| segment[at] != flipped[at])
            .collect();
        assert!(!changed.is_empty(), "{said}");
        assert!(changed.iter().all(|&at| at < 1_000), "{changed:?}");
    }

    #[test]
    fn flips_change_bytes_and_truncation_shortens() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join(SNAPSHOT_DIR)).unwrap();
        let store = dir.path().join(STORE_FILE);
        let original = vec![0x5au8; 10_000];
        std::fs::write(&store, &original).unwrap();

        let said = apply(dir.path(), Damage::FlipStore { pick: 7 }).unwrap();
        let flipped = std::fs::read(&store).unwrap();
        let changed = original
            .iter()
            .zip(&flipped)
            .filter(|(a, b)| a != b)
            .count();
        assert!((1..=FLIPS).contains(&changed), "{said}");

        // No snapshot file: the store is flipped instead, and the note says so.
        let said = apply(dir.path(), Damage::FlipSnapshot { pick: 8 }).unwrap();
        assert!(said.starts_with("no snapshot file"), "{said}");

        let snapshot = dir.path().join(SNAPSHOT_DIR).join("r2-10-1.snap");
        std::fs::write(&snapshot, [1u8; 100]).unwrap();
        let said = apply(dir.path(), Damage::FlipSnapshot { pick: 9 }).unwrap();
        assert!(said.contains("snapshots/r2-10-1.snap"), "{said}");
        assert_ne!(std::fs::read(&snapshot).unwrap(), vec![1u8; 100]);

        apply(dir.path(), Damage::TruncateStore { pick: 0 }).unwrap();
        assert_eq!(
            std::fs::metadata(&store).unwrap().len(),
            10_000 - TRUNCATE_BYTES
        );
    }
}
