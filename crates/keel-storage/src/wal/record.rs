//! The records of the node-wide Raft log and how they are framed in a segment. Knows nothing
//! of files or of the in-memory index.
//!
//! A frame is the record's length (u32, little-endian), the CRC-32C of the record (u32,
//! little-endian), then the record: `codec::encode` of a `Record`, so it carries the format
//! version like every other stored record.

use keel_types::RangeId;
use serde::{Deserialize, Serialize};

use crate::codec;
use crate::error::StorageError;
use crate::raft_types::{Entry, LogId};

/// Bytes of a frame's header: length and checksum.
pub(crate) const FRAME_HEADER_BYTES: usize = 8;

/// One record of the log, as read back.
#[derive(Debug, Deserialize)]
pub(crate) enum Record {
    /// The first record of every segment: each range's purged log id when the segment was
    /// started, so the log still knows them after the segments before it are deleted.
    Checkpoint { purged: Vec<(RangeId, LogId)> },
    /// One entry of one range's log. An entry at or below the range's last index replaces
    /// it and every entry after it (openraft's truncate-then-append).
    Entry { range: RangeId, entry: Entry },
    /// Every entry of the range from `first_removed` on is gone.
    Truncate { range: RangeId, first_removed: u64 },
    /// Every entry of the range up to and including `upto` is gone, and `upto` is its
    /// purged log id.
    Purge { range: RangeId, upto: LogId },
    /// The range's replica was removed: forget all of it.
    Drop { range: RangeId },
}

/// A record to write, borrowing what it holds: the same shape as `Record`, field for field
/// and variant for variant, so postcard encodes it the same way (`record_ref_encodes_as_record`).
#[derive(Debug, Serialize)]
pub(crate) enum RecordRef<'a> {
    Checkpoint { purged: &'a [(RangeId, LogId)] },
    Entry { range: RangeId, entry: &'a Entry },
    Truncate { range: RangeId, first_removed: u64 },
    Purge { range: RangeId, upto: LogId },
    Drop { range: RangeId },
}

/// Appends the frame of `record` to `out`; returns the frame's length.
pub(crate) fn frame(record: &RecordRef<'_>, out: &mut Vec<u8>) -> usize {
    let body = codec::encode(record);
    let len = u32::try_from(body.len()).expect("a log record is far below 4 GiB");
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&crc32c::crc32c(&body).to_le_bytes());
    out.extend_from_slice(&body);
    FRAME_HEADER_BYTES + body.len()
}

/// What is found at the start of `bytes`.
#[derive(Debug)]
pub(crate) enum Read {
    /// A whole frame that checks out: the record and the frame's length.
    Frame(Record, usize),
    /// Nothing more: no byte left, or zeros where the next frame's header would be (the
    /// segment's preallocated tail).
    End,
    /// A frame that a write cut short left: part of it is zeros from a sector boundary to
    /// the next (unwritten sectors of a preallocated file read as zeros), or it runs past
    /// the end of the file.
    Torn(String),
    /// A frame whose checksum or record does not check out, with no sign of a torn write:
    /// damage.
    Bad(String),
}

/// Bytes of a disk sector: a write torn by a crash leaves whole sectors unwritten.
const SECTOR_BYTES: usize = 512;

/// Reads the frame at the start of `bytes`.
pub(crate) fn read(bytes: &[u8]) -> Read {
    read_at(bytes, 0)
}

/// Reads the frame at offset `at` of a whole segment's `bytes`, telling a torn frame from a
/// damaged one: a frame that fails is torn when it runs past the end or when one of its
/// pieces between sector boundaries is all zeros (as etcd's WAL tells them apart).
pub(crate) fn read_at(file: &[u8], at: usize) -> Read {
    let bytes = &file[at..];
    if bytes.is_empty() {
        return Read::End;
    }
    let Some(header) = bytes.get(..FRAME_HEADER_BYTES) else {
        return Read::Torn(format!("a frame header cut short at {} bytes", bytes.len()));
    };
    let len = u32::from_le_bytes(header[..4].try_into().expect("4 bytes")) as usize;
    let crc = u32::from_le_bytes(header[4..].try_into().expect("4 bytes"));
    if len == 0 && crc == 0 {
        return Read::End;
    }
    let Some(body) = bytes.get(FRAME_HEADER_BYTES..FRAME_HEADER_BYTES + len) else {
        return Read::Torn(format!(
            "a record of {len} bytes with {} left",
            bytes.len() - FRAME_HEADER_BYTES
        ));
    };
    if crc32c::crc32c(body) != crc {
        let detail = format!("a record of {len} bytes fails its checksum");
        return match has_zero_piece(file, at, at + FRAME_HEADER_BYTES + len) {
            true => Read::Torn(detail),
            false => Read::Bad(detail),
        };
    }
    match codec::decode::<Record>("raft log record", body) {
        Ok(record) => Read::Frame(record, FRAME_HEADER_BYTES + len),
        Err(error) => Read::Bad(error.to_string()),
    }
}

/// Whether a piece of `file[start..end]` between sector boundaries is all zeros.
fn has_zero_piece(file: &[u8], start: usize, end: usize) -> bool {
    let mut piece_start = start;
    while piece_start < end {
        let piece_end = ((piece_start / SECTOR_BYTES + 1) * SECTOR_BYTES).min(end);
        if file[piece_start..piece_end].iter().all(|&byte| byte == 0) {
            return true;
        }
        piece_start = piece_end;
    }
    false
}

/// Decodes the entry in a frame read back from where the index says it is.
pub(crate) fn entry_in(frame: &[u8], range: RangeId, index: u64) -> Result<Entry, StorageError> {
    match read(frame) {
        Read::Frame(
            Record::Entry {
                range: found,
                entry,
            },
            _,
        ) if found == range && entry.log_id.index == index => Ok(entry),
        Read::Frame(record, _) => Err(StorageError::corrupt(
            "raft log record",
            format!("expected entry {index} of range {range}, found {record:?}"),
        )),
        Read::End => Err(StorageError::corrupt("raft log record", "no frame")),
        Read::Torn(detail) | Read::Bad(detail) => {
            Err(StorageError::corrupt("raft log record", detail))
        }
    }
}
