//! The node-wide Raft log: the log entries of every range of a store, appended to one
//! sequence of segment files, with an index in memory of where each range's entries are.
//! Knows nothing of the state machine, of openraft's traits, of threads or of async: the
//! store's writer thread writes it and syncs it, readers read it from any thread.
//!
//! A batch of changes of any number of ranges (appends, truncations, purges, removals) is
//! one write at the end of the active segment, and one `fdatasync` makes it durable
//! (`Wal::write`, `Wal::sync`). Every record is checksummed (`record`). When the active
//! segment passes `limits::RAFT_LOG_SEGMENT_BYTES`, the next one starts with a checkpoint of
//! every range's purged log id; a segment is deleted once no range has an entry in it and
//! every purge that made it so is durable (`Wal::collect_garbage`).
//!
//! Opening replays every segment in order. A record in the last segment that a torn write
//! left (part of it zeros from a sector boundary on: segments are preallocated with zeros)
//! is what a crash in the middle of a write leaves: the segment is cut there, as redb rolls
//! back a last commit that does not verify, and what was cut was never acknowledged. A
//! record that fails otherwise, or anywhere before the last segment, is damage, and the open
//! fails with `StorageError::Damaged`.

mod record;
mod segment;

use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use keel_types::{RangeId, limits};

use crate::error::StorageError;
use crate::raft_types::{Entry, LogId};
use record::{Read, Record, RecordRef};
use segment::Segment;

/// The file name extension of a segment; its stem is its sequence number.
const SEGMENT_EXTENSION: &str = "seg";

/// A change to one range's log, as the writer hands it over.
pub(crate) enum Change<'a> {
    /// Entries that follow the range's last entry directly.
    Append {
        range: RangeId,
        entries: &'a [Arc<Entry>],
    },
    Truncate {
        range: RangeId,
        first_removed: u64,
    },
    Purge {
        range: RangeId,
        upto: LogId,
    },
    Drop {
        range: RangeId,
    },
}

/// The node-wide Raft log of one store.
pub(crate) struct Wal {
    dir: PathBuf,
    segments: segment::Options,
    /// `limits::RAFT_LOG_SEGMENT_BYTES` (smaller in tests).
    segment_bytes: u64,
    state: Mutex<State>,
}

struct State {
    ranges: BTreeMap<RangeId, RangeLog>,
    /// By sequence number; the last is the active one.
    segments: BTreeMap<u64, Arc<Segment>>,
}

/// Where one range's entries are, and what was purged of it.
#[derive(Default)]
struct RangeLog {
    purged: Option<LogId>,
    /// Contiguous, by index.
    entries: VecDeque<Location>,
    /// Replay only: entries up to this index were missing when a later one was read; a purge
    /// must cover them by the end of the replay.
    gap_until: Option<u64>,
}

#[derive(Debug, Clone, Copy)]
struct Location {
    log_id: LogId,
    segment: u64,
    offset: u64,
    len: u32,
}

impl Wal {
    /// Opens the log in `dir` (created if missing) and replays it. `lossy`: appended bytes
    /// stay in memory until synced (test-only power loss).
    pub fn open(dir: &Path, lossy: bool) -> Result<Wal, StorageError> {
        Wal::open_sized(dir, lossy, limits::RAFT_LOG_SEGMENT_BYTES)
    }

    fn open_sized(dir: &Path, lossy: bool, segment_bytes: u64) -> Result<Wal, StorageError> {
        std::fs::create_dir_all(dir).map_err(|e| StorageError::io(dir, e))?;
        let options = segment::Options {
            lossy,
            preallocate_bytes: limits::RAFT_LOG_PREALLOCATE_BYTES.min(segment_bytes),
        };
        let mut state = State {
            ranges: BTreeMap::new(),
            segments: BTreeMap::new(),
        };
        let found = segment_files(dir)?;
        let last = found.keys().next_back().copied();
        for (seq, path) in found {
            let len = replay(&mut state, seq, &path, Some(seq) == last)?;
            let segment = Segment::open(&path, len, options)?;
            state.segments.insert(seq, Arc::new(segment));
        }
        for (range, log) in &mut state.ranges {
            if let Some(gap_until) = log.gap_until.take()
                && log.purged.is_none_or(|purged| purged.index < gap_until)
            {
                let detail = format!("entries of range {range} up to {gap_until} are missing");
                return Err(StorageError::damaged(dir, detail));
            }
        }
        let wal = Wal {
            dir: dir.to_path_buf(),
            segments: options,
            segment_bytes,
            state: Mutex::new(state),
        };
        if last.is_none() {
            let mut state = wal.lock();
            wal.start_segment(&mut state, 1)?;
            wal.active(&state).sync()?;
        }
        Ok(wal)
    }

    /// Appends `changes` in order, in one write; not durable until `sync`.
    pub fn write(&self, changes: &[Change<'_>]) -> Result<(), StorageError> {
        let mut state = self.lock();
        let active = self.active(&state);
        if active.len() >= self.segment_bytes {
            active.sync()?;
            let next = state.segments.keys().next_back().map_or(1, |seq| seq + 1);
            self.start_segment(&mut state, next)?;
        }
        let (seq, segment) = {
            let (seq, segment) = state.segments.last_key_value().expect("an active segment");
            (*seq, segment.clone())
        };
        let mut bytes = Vec::new();
        let mut placed = Vec::new();
        for change in changes {
            if let Change::Append { range, entries } = change {
                for entry in entries.iter() {
                    let at = bytes.len() as u64;
                    let record = RecordRef::Entry {
                        range: *range,
                        entry,
                    };
                    let len = record::frame(&record, &mut bytes);
                    placed.push((at, len));
                }
            } else {
                record::frame(&change.record(), &mut bytes);
            }
        }
        let base = segment.append(&bytes)?;
        let mut placed = placed.into_iter();
        for change in changes {
            match change {
                Change::Append { range, entries } => {
                    let log = state.ranges.entry(*range).or_default();
                    for entry in entries.iter() {
                        let (at, len) = placed.next().expect("one place per entry");
                        let location = Location {
                            log_id: entry.log_id,
                            segment: seq,
                            offset: base + at,
                            len: u32::try_from(len).expect("a frame is below 4 GiB"),
                        };
                        log.append(*range, location);
                    }
                }
                Change::Truncate {
                    range,
                    first_removed,
                } => {
                    if let Some(log) = state.ranges.get_mut(range) {
                        log.truncate(*first_removed);
                    }
                }
                Change::Purge { range, upto } => {
                    state.ranges.entry(*range).or_default().purge(*upto)
                }
                Change::Drop { range } => {
                    state.ranges.remove(range);
                }
            }
        }
        Ok(())
    }

    /// Makes everything written so far durable: one `fdatasync` of the active segment
    /// (a segment is synced before the next one starts).
    pub fn sync(&self) -> Result<(), StorageError> {
        let active = self.active(&self.lock());
        active.sync()
    }

    /// Deletes the segments before the oldest one any range still has an entry in. Call it
    /// only after the purges and removals written so far are durable (`sync`).
    pub fn collect_garbage(&self) -> Result<(), StorageError> {
        let doomed: Vec<Arc<Segment>> = {
            let mut state = self.lock();
            let active = *state
                .segments
                .keys()
                .next_back()
                .expect("an active segment");
            let oldest_live = state
                .ranges
                .values()
                .filter_map(|log| log.entries.front().map(|first| first.segment))
                .min()
                .unwrap_or(active)
                .min(active);
            let kept = state.segments.split_off(&oldest_live);
            std::mem::replace(&mut state.segments, kept)
                .into_values()
                .collect()
        };
        for segment in &doomed {
            std::fs::remove_file(segment.path())
                .map_err(|e| StorageError::io(segment.path(), e))?;
        }
        if let Some(segment) = doomed.first() {
            segment::sync_parent(segment.path())?;
            tracing::debug!(segments = doomed.len(), "raft log segments deleted");
        }
        Ok(())
    }

    /// Entries of `range` with index in `[start, end)` (to the last one for `None`) that the
    /// log holds.
    pub fn read(
        &self,
        range: RangeId,
        start: u64,
        end: Option<u64>,
    ) -> Result<Vec<Entry>, StorageError> {
        let wanted: Vec<(Arc<Segment>, Location)> = {
            let state = self.lock();
            let Some(log) = state.ranges.get(&range) else {
                return Ok(Vec::new());
            };
            log.entries
                .iter()
                .filter(|at| {
                    at.log_id.index >= start && end.is_none_or(|end| at.log_id.index < end)
                })
                .map(|at| (state.segments[&at.segment].clone(), *at))
                .collect()
        };
        let mut entries = Vec::with_capacity(wanted.len());
        for run in wanted.chunk_by(|(_, a), (_, b)| {
            a.segment == b.segment && a.offset + u64::from(a.len) == b.offset
        }) {
            let (segment, first) = &run[0];
            let bytes: usize = run.iter().map(|(_, at)| at.len as usize).sum();
            let read = segment.read(first.offset, bytes)?;
            let mut at = 0;
            for (_, location) in run {
                let frame = &read[at..at + location.len as usize];
                entries.push(record::entry_in(frame, range, location.log_id.index)?);
                at += location.len as usize;
            }
        }
        Ok(entries)
    }

    /// `(purged log id, last log id)` of `range` as the log knows them; the last log id is
    /// the purged one when no entry is left.
    pub fn state(&self, range: RangeId) -> (Option<LogId>, Option<LogId>) {
        let state = self.lock();
        match state.ranges.get(&range) {
            None => (None, None),
            Some(log) => (log.purged, log.last()),
        }
    }

    /// The ranges the log holds anything of.
    pub fn ranges(&self) -> Vec<RangeId> {
        self.lock().ranges.keys().copied().collect()
    }

    /// Bytes of every segment.
    pub fn bytes(&self) -> u64 {
        self.lock()
            .segments
            .values()
            .map(|segment| segment.len())
            .sum()
    }

    fn active(&self, state: &State) -> Arc<Segment> {
        let (_, active) = state.segments.last_key_value().expect("an active segment");
        active.clone()
    }

    /// Creates segment `seq` and writes its checkpoint (durable with the next sync).
    fn start_segment(&self, state: &mut State, seq: u64) -> Result<(), StorageError> {
        let path = self.dir.join(format!("{seq:020}.{SEGMENT_EXTENSION}"));
        let segment = Segment::create(&path, self.segments)?;
        let purged: Vec<(RangeId, LogId)> = state
            .ranges
            .iter()
            .filter_map(|(range, log)| log.purged.map(|purged| (*range, purged)))
            .collect();
        let mut bytes = Vec::new();
        record::frame(&RecordRef::Checkpoint { purged: &purged }, &mut bytes);
        segment.append(&bytes)?;
        state.segments.insert(seq, Arc::new(segment));
        tracing::debug!(segment = seq, "raft log segment started");
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Change<'_> {
    fn record(&self) -> RecordRef<'_> {
        match *self {
            Change::Append { .. } => unreachable!("appends are framed entry by entry"),
            Change::Truncate {
                range,
                first_removed,
            } => RecordRef::Truncate {
                range,
                first_removed,
            },
            Change::Purge { range, upto } => RecordRef::Purge { range, upto },
            Change::Drop { range } => RecordRef::Drop { range },
        }
    }
}

impl RangeLog {
    fn last(&self) -> Option<LogId> {
        self.entries.back().map(|last| last.log_id).or(self.purged)
    }

    /// Appends an entry that must follow the last one directly (or the purged id, if
    /// nothing follows it; anything, for a range the log knows nothing of).
    fn append(&mut self, range: RangeId, location: Location) {
        let index = location.log_id.index;
        if let Some(last) = self.last() {
            assert_eq!(
                index,
                last.index + 1,
                "range {range}: appended log index is not last + 1"
            );
        }
        self.entries.push_back(location);
    }

    /// Replays an entry record: it replaces the entries from its index on; one past a gap
    /// is kept and the gap remembered (a later purge must cover it: the segments that held
    /// the entries were deleted after it).
    fn replay(&mut self, location: Location) {
        let index = location.log_id.index;
        if self.purged.is_some_and(|purged| index <= purged.index) {
            return;
        }
        self.truncate(index);
        if let Some(last) = self.last()
            && index > last.index + 1
        {
            self.entries.clear();
            self.gap_until = Some(self.gap_until.unwrap_or(0).max(index - 1));
        }
        self.entries.push_back(location);
    }

    fn truncate(&mut self, first_removed: u64) {
        while self
            .entries
            .back()
            .is_some_and(|last| last.log_id.index >= first_removed)
        {
            self.entries.pop_back();
        }
    }

    fn purge(&mut self, upto: LogId) {
        if self.purged.is_some_and(|purged| purged.index >= upto.index) {
            return;
        }
        self.purged = Some(upto);
        while self
            .entries
            .front()
            .is_some_and(|first| first.log_id.index <= upto.index)
        {
            self.entries.pop_front();
        }
    }
}

/// The segment files in `dir`, by sequence number.
fn segment_files(dir: &Path) -> Result<BTreeMap<u64, PathBuf>, StorageError> {
    let mut found = BTreeMap::new();
    for item in std::fs::read_dir(dir).map_err(|e| StorageError::io(dir, e))? {
        let path = item.map_err(|e| StorageError::io(dir, e))?.path();
        if path.extension().and_then(|e| e.to_str()) != Some(SEGMENT_EXTENSION) {
            continue;
        }
        let seq = path
            .file_stem()
            .and_then(|stem| stem.to_str())
            .and_then(|stem| stem.parse::<u64>().ok())
            .ok_or_else(|| StorageError::damaged(&path, "not a segment's name"))?;
        found.insert(seq, path);
    }
    Ok(found)
}

/// Replays segment `seq` into `state`; returns the length kept. A torn frame ends the last
/// segment (which is cut there); a torn frame in another segment, or a damaged one anywhere,
/// fails the replay.
fn replay(state: &mut State, seq: u64, path: &Path, last: bool) -> Result<u64, StorageError> {
    let bytes = std::fs::read(path).map_err(|e| StorageError::io(path, e))?;
    let mut at = 0;
    loop {
        match record::read_at(&bytes, at) {
            Read::End => break,
            Read::Frame(record, len) => {
                let location = |log_id| Location {
                    log_id,
                    segment: seq,
                    offset: at as u64,
                    len: u32::try_from(len).expect("a frame is below 4 GiB"),
                };
                replay_record(state, record, location);
                at += len;
            }
            Read::Torn(detail) if last => {
                tracing::warn!(
                    path = %path.display(), offset = at, %detail,
                    "raft log's last write is incomplete; cut off (as after a crash during it)"
                );
                cut(path, at as u64)?;
                break;
            }
            Read::Torn(detail) | Read::Bad(detail) => {
                return Err(StorageError::damaged(
                    path,
                    format!("record at offset {at}: {detail}"),
                ));
            }
        }
    }
    Ok(at as u64)
}

/// Zeros the segment at `path` from `at` on (its blocks stay allocated) and syncs it.
fn cut(path: &Path, at: u64) -> Result<(), StorageError> {
    use std::os::unix::fs::FileExt;
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(|e| StorageError::io(path, e))?;
    let len = file
        .metadata()
        .map_err(|e| StorageError::io(path, e))?
        .len();
    let zeros =
        vec![0u8; usize::try_from(len.saturating_sub(at)).expect("a segment fits in memory")];
    file.write_all_at(&zeros, at)
        .and_then(|()| file.sync_all())
        .map_err(|e| StorageError::io(path, e))
}

fn replay_record(state: &mut State, record: Record, location: impl Fn(LogId) -> Location) {
    match record {
        Record::Checkpoint { purged } => {
            for (range, upto) in purged {
                state.ranges.entry(range).or_default().purge(upto);
            }
        }
        Record::Entry { range, entry } => {
            let log = state.ranges.entry(range).or_default();
            log.replay(location(entry.log_id));
        }
        Record::Truncate {
            range,
            first_removed,
        } => {
            if let Some(log) = state.ranges.get_mut(&range) {
                log.truncate(first_removed);
            }
        }
        Record::Purge { range, upto } => state.ranges.entry(range).or_default().purge(upto),
        Record::Drop { range } => {
            state.ranges.remove(&range);
        }
    }
}

#[cfg(test)]
mod tests;
