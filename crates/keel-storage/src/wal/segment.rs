//! One segment file of the node-wide Raft log: bytes appended at its end, made durable by
//! `sync`, read back at any offset. Knows nothing of records, ranges or Raft.
//!
//! The file is extended ahead of the appends with zeros (`RAFT_LOG_PREALLOCATE_BYTES` at a
//! time), so an append overwrites allocated blocks and its `fdatasync` has no size change to
//! commit; what follows the last record is zeros (`record::read` reads them as the end).
//!
//! A segment of a store opened to lose unsynced writes (`StoreOptions::lose_unsynced_writes`,
//! the Jepsen harness's power loss) keeps appended bytes in memory until `sync` writes and
//! fsyncs them, so a killed process loses them as a machine losing power would; reads see
//! them meanwhile.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::error::StorageError;

/// Unsynced bytes a lossy segment holds in memory at most; past it an append fails (and the
/// store poisons), as `lossy::LossyBackend` does.
const UNSYNCED_BYTES_MAX: usize = 1024 * 1024 * 1024;

/// How segments are opened.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Options {
    /// Appends stay in memory until synced (test-only power loss).
    pub lossy: bool,
    /// `limits::RAFT_LOG_PREALLOCATE_BYTES`, or the segment size when that is smaller.
    pub preallocate_bytes: u64,
}

pub(crate) struct Segment {
    path: PathBuf,
    file: File,
    /// Writes stay in memory until `sync` (test-only power loss).
    lossy: bool,
    /// Bytes of zeros the file grows by at a time.
    step: u64,
    tail: Mutex<Tail>,
}

#[derive(Default)]
struct Tail {
    /// Bytes appended so far, synced or not: the offset of the next append.
    len: u64,
    /// Lossy only: the bytes appended since the last sync, which start at `len - pending.len()`.
    pending: Vec<u8>,
    /// Bytes of the file: `len` and the zeros after it.
    allocated: u64,
}

impl Segment {
    /// Opens the existing segment at `path`, whose records end at `len` (what recovery kept).
    pub fn open(path: &Path, len: u64, options: Options) -> Result<Segment, StorageError> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| StorageError::io(path, e))?;
        let allocated = file
            .metadata()
            .map_err(|e| StorageError::io(path, e))?
            .len();
        Ok(Segment {
            path: path.to_path_buf(),
            file,
            lossy: options.lossy,
            step: options.preallocate_bytes,
            tail: Mutex::new(Tail {
                len,
                pending: Vec::new(),
                allocated: allocated.max(len),
            }),
        })
    }

    /// Creates an empty segment at `path` and makes its directory entry durable.
    pub fn create(path: &Path, options: Options) -> Result<Segment, StorageError> {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(path)
            .map_err(|e| StorageError::io(path, e))?;
        sync_parent(path)?;
        Segment::open(path, 0, options)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Bytes appended so far.
    pub fn len(&self) -> u64 {
        self.lock().len
    }

    /// Appends `bytes` at the end; returns the offset they start at. Not durable until `sync`.
    pub fn append(&self, bytes: &[u8]) -> Result<u64, StorageError> {
        let mut tail = self.lock();
        let offset = tail.len;
        let end = offset + bytes.len() as u64;
        if end > tail.allocated {
            let allocated = end.max(tail.allocated + self.step);
            self.zero(tail.allocated, allocated)?;
            tail.allocated = allocated;
        }
        if self.lossy {
            if tail.pending.len() + bytes.len() > UNSYNCED_BYTES_MAX {
                let error = std::io::Error::other("too many unsynced bytes held in memory");
                return Err(StorageError::io(&self.path, error));
            }
            tail.pending.extend_from_slice(bytes);
        } else {
            self.file
                .write_all_at(bytes, offset)
                .map_err(|e| StorageError::io(&self.path, e))?;
        }
        tail.len += bytes.len() as u64;
        Ok(offset)
    }

    /// Makes every appended byte durable (one `fdatasync`).
    pub fn sync(&self) -> Result<(), StorageError> {
        if self.lossy {
            let mut tail = self.lock();
            let start = tail.len - tail.pending.len() as u64;
            self.file
                .write_all_at(&tail.pending, start)
                .map_err(|e| StorageError::io(&self.path, e))?;
            tail.pending.clear();
        }
        self.file
            .sync_data()
            .map_err(|e| StorageError::io(&self.path, e))
    }

    /// `len` bytes at `offset`, which must lie within what was appended.
    pub fn read(&self, offset: u64, len: usize) -> Result<Vec<u8>, StorageError> {
        let mut bytes = vec![0u8; len];
        let mut from_file = len;
        if self.lossy {
            // What starts at or after the last sync is in memory.
            let tail = self.lock();
            let pending_start = tail.len - tail.pending.len() as u64;
            let end = offset + len as u64;
            if end > pending_start {
                let first = offset.max(pending_start);
                let at = usize::try_from(first - pending_start).expect("pending fits in memory");
                from_file = usize::try_from(first - offset).expect("a read fits in memory");
                let in_memory = len - from_file;
                bytes[from_file..].copy_from_slice(&tail.pending[at..at + in_memory]);
            }
        }
        self.file
            .read_exact_at(&mut bytes[..from_file], offset)
            .map_err(|e| StorageError::io(&self.path, e))?;
        Ok(bytes)
    }

    /// Writes zeros over `[start, end)` (made durable by the next `sync`).
    fn zero(&self, start: u64, end: u64) -> Result<(), StorageError> {
        const CHUNK: usize = 1024 * 1024;
        let zeros = vec![0u8; CHUNK];
        let mut at = start;
        while at < end {
            let len = usize::try_from(end - at).map_or(CHUNK, |left| left.min(CHUNK));
            self.file
                .write_all_at(&zeros[..len], at)
                .map_err(|e| StorageError::io(&self.path, e))?;
            at += len as u64;
        }
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Tail> {
        self.tail.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Makes the directory entry of `path` durable: a segment created or deleted stays so after a
/// crash.
pub(crate) fn sync_parent(path: &Path) -> Result<(), StorageError> {
    let parent = path.parent().unwrap_or(Path::new("."));
    File::open(parent)
        .and_then(|dir| dir.sync_all())
        .map_err(|e| StorageError::io(parent, e))
}
