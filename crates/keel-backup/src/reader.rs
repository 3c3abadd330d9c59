//! Reading a backup file record by record through a fixed buffer, checking as it goes: every
//! record's checksum and version, the order of records, each range's length and SHA-256, the
//! counts of `End`, the coverage of the keyspace and that nothing follows `End`. A caller
//! that must not act on a bad file (restore) runs `verify` over the whole file first.
//! Blocking I/O; no step holds more than one record in memory.

use std::fs::File;
use std::io::{BufReader, ErrorKind, Read};
use std::path::{Path, PathBuf};

use keel_types::{RangeDescriptor, RangeId, limits};
use sha2::{Digest as _, Sha256};

use crate::coverage::check_coverage;
use crate::error::BackupError;
use crate::format::{
    BackupEnd, BackupHeader, DIGEST_BYTES, FORMAT_VERSION, FrameError, LENGTH_BYTES, MAGIC,
    RangeEnd, RangeHeader, Record, decode_frame,
};

/// Buffer of the input file.
const READ_BUFFER_BYTES: usize = 256 * 1024;

/// What the next record of a backup holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Item {
    /// A range begins.
    Range(RangeHeader),
    /// Bytes of the open range's snapshot.
    Chunk(Vec<u8>),
    /// The open range ended; its length and digest matched.
    RangeEnd,
    /// The backup ended; everything matched.
    End(BackupEnd),
}

/// What a whole, verified backup holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackupSummary {
    pub header: BackupHeader,
    /// The range table as the cluster listed it when the backup started.
    pub listed: Vec<RangeDescriptor>,
    /// The backed-up ranges, in file order.
    pub ranges: Vec<RangeHeader>,
    pub end: BackupEnd,
}

/// Reads every record of the file at `path` and checks it (see the module doc).
pub fn verify(path: &Path) -> Result<BackupSummary, BackupError> {
    let mut reader = BackupReader::open(path)?;
    let mut ranges = Vec::new();
    loop {
        match reader.next_item()? {
            Item::Range(range) => ranges.push(range),
            Item::Chunk(_) | Item::RangeEnd => {}
            Item::End(end) => {
                return Ok(BackupSummary {
                    header: reader.header.clone(),
                    listed: std::mem::take(&mut reader.listed),
                    ranges,
                    end,
                });
            }
        }
    }
}

/// A backup file being read.
pub struct BackupReader {
    input: BufReader<File>,
    path: PathBuf,
    /// Bytes read so far.
    offset: u64,
    header: BackupHeader,
    listed: Vec<RangeDescriptor>,
    /// Records read after the header.
    records: u64,
    /// Ranges read completely.
    ranges: Vec<RangeDescriptor>,
    snapshot_bytes: u64,
    open: Option<OpenRange>,
    ended: bool,
}

/// The range being read.
struct OpenRange {
    header: RangeHeader,
    bytes: u64,
    hasher: Sha256,
}

impl BackupReader {
    /// Opens the file and reads its magic, header and listed range table.
    pub fn open(path: &Path) -> Result<BackupReader, BackupError> {
        let file = File::open(path).map_err(|e| BackupError::io(path, e))?;
        let mut reader = BackupReader {
            input: BufReader::with_capacity(READ_BUFFER_BYTES, file),
            path: path.to_path_buf(),
            offset: 0,
            header: BackupHeader {
                created_ms: 0,
                keel_version: String::new(),
                nodes: Vec::new(),
                listed: 0,
            },
            listed: Vec::new(),
            records: 0,
            ranges: Vec::new(),
            snapshot_bytes: 0,
            open: None,
            ended: false,
        };
        let mut magic = [0u8; MAGIC.len()];
        if !reader.fill(&mut magic)? || magic != MAGIC {
            return Err(BackupError::NotABackup {
                path: path.to_path_buf(),
            });
        }
        reader.header = match reader.read_record("the header")? {
            (Record::Header(header), _) => header,
            (other, at) => return Err(reader.corrupt(at, unexpected(&other, "the header"))),
        };
        reader.read_listed()?;
        Ok(reader)
    }

    pub fn header(&self) -> &BackupHeader {
        &self.header
    }

    /// The range table as the cluster listed it when the backup started.
    pub fn listed(&self) -> &[RangeDescriptor] {
        &self.listed
    }

    /// The next record, checked. After `Item::End`, calling it again is a programmer error.
    pub fn next_item(&mut self) -> Result<Item, BackupError> {
        assert!(!self.ended, "the backup already ended");
        let (record, at) = self.read_record("its End record")?;
        self.records += 1;
        match (record, self.open.is_some()) {
            (Record::Range(header), false) => self.begin_range(header, at),
            (Record::Chunk(data), true) => self.chunk(data, at),
            (Record::RangeEnd(end), true) => self.end_range(&end, at),
            (Record::End(end), false) => {
                self.records -= 1;
                self.end(end, at)
            }
            (other, open) => {
                let expected = match open {
                    true => "a Chunk or RangeEnd record",
                    false => "a Range or End record",
                };
                Err(self.corrupt(at, unexpected(&other, expected)))
            }
        }
    }

    fn read_listed(&mut self) -> Result<(), BackupError> {
        if self.header.listed > limits::BACKUP_RANGES_MAX as u64 {
            let detail = format!(
                "its header lists {} ranges; the limit is {}",
                self.header.listed,
                limits::BACKUP_RANGES_MAX
            );
            return Err(self.corrupt(0, detail));
        }
        for _ in 0..self.header.listed {
            match self.read_record("the listed range table")? {
                (Record::Listed(range), _) => self.listed.push(range),
                (other, at) => return Err(self.corrupt(at, unexpected(&other, "a Listed record"))),
            }
            self.records += 1;
        }
        Ok(())
    }

    fn begin_range(&mut self, header: RangeHeader, at: u64) -> Result<Item, BackupError> {
        let id = header.descriptor.id;
        if id == RangeId::META || self.ranges.iter().any(|range| range.id == id) {
            return Err(self.corrupt(at, format!("range {id} is backed up twice or is meta")));
        }
        if self.ranges.len() >= limits::BACKUP_RANGES_MAX {
            let detail = format!("more than {} ranges", limits::BACKUP_RANGES_MAX);
            return Err(self.corrupt(at, detail));
        }
        self.open = Some(OpenRange {
            header: header.clone(),
            bytes: 0,
            hasher: Sha256::new(),
        });
        Ok(Item::Range(header))
    }

    fn chunk(&mut self, data: Vec<u8>, at: u64) -> Result<Item, BackupError> {
        let open = self.open.as_mut().expect("a range is open");
        open.bytes += data.len() as u64;
        open.hasher.update(&data);
        if open.bytes > open.header.snapshot_bytes {
            let detail = format!(
                "range {} holds more than the {} snapshot bytes its header announced",
                open.header.descriptor.id, open.header.snapshot_bytes
            );
            return Err(self.corrupt(at, detail));
        }
        Ok(Item::Chunk(data))
    }

    fn end_range(&mut self, end: &RangeEnd, at: u64) -> Result<Item, BackupError> {
        let open = self.open.take().expect("a range is open");
        let id = open.header.descriptor.id;
        let counted = open.bytes;
        if counted != open.header.snapshot_bytes || counted != end.snapshot_bytes {
            let detail = format!(
                "range {id} holds {counted} snapshot bytes; its header says {} and its end {}",
                open.header.snapshot_bytes, end.snapshot_bytes
            );
            return Err(self.corrupt(at, detail));
        }
        let digest: [u8; DIGEST_BYTES] = open.hasher.finalize().into();
        if digest != end.sha256 {
            let detail = format!("the snapshot of range {id} does not match its SHA-256");
            return Err(self.corrupt(at, detail));
        }
        self.snapshot_bytes += counted;
        self.ranges.push(open.header.descriptor);
        Ok(Item::RangeEnd)
    }

    fn end(&mut self, end: BackupEnd, at: u64) -> Result<Item, BackupError> {
        let found = BackupEnd {
            ranges: self.ranges.len() as u64,
            snapshot_bytes: self.snapshot_bytes,
            records: self.records,
        };
        if found != end {
            let detail = format!("the file holds {found:?} but its End record says {end:?}");
            return Err(self.corrupt(at, detail));
        }
        check_coverage(&self.ranges).map_err(|detail| self.corrupt(at, detail))?;
        let mut extra = [0u8; 1];
        if self.fill(&mut extra)? {
            let detail = "bytes follow the End record".to_string();
            return Err(self.corrupt(self.offset - 1, detail));
        }
        self.ended = true;
        Ok(Item::End(end))
    }

    /// Reads one framed record; returns it and the offset it started at. `waiting_for` names
    /// what a file ending here lacks.
    fn read_record(&mut self, waiting_for: &str) -> Result<(Record, u64), BackupError> {
        let at = self.offset;
        let mut length = [0u8; LENGTH_BYTES];
        if !self.fill(&mut length)? {
            return Err(self.truncated(format!("before {waiting_for}")));
        }
        let body_len = u32::from_be_bytes(length) as usize;
        if body_len == 0 || body_len > limits::BACKUP_RECORD_BYTES_MAX {
            let detail = format!(
                "a record of {body_len} bytes (limit {})",
                limits::BACKUP_RECORD_BYTES_MAX
            );
            return Err(self.corrupt(at, detail));
        }
        let mut rest = vec![0u8; body_len + DIGEST_BYTES];
        if !self.fill(&mut rest)? {
            return Err(self.truncated(format!("inside the record that starts at byte {at}")));
        }
        match decode_frame(length, &rest) {
            Ok(record) => Ok((record, at)),
            Err(FrameError::Checksum) => {
                Err(self.corrupt(at, "the record's SHA-256 does not match".to_string()))
            }
            Err(FrameError::UnknownVersion(version)) => Err(BackupError::UnknownVersion {
                path: self.path.clone(),
                offset: at,
                version,
                known: FORMAT_VERSION,
            }),
            Err(FrameError::Body(detail)) => Err(self.corrupt(at, detail)),
        }
    }

    /// Fills `buffer`; `false` when the file ended first (clean at a record boundary or not:
    /// the caller decides).
    fn fill(&mut self, buffer: &mut [u8]) -> Result<bool, BackupError> {
        match self.input.read_exact(buffer) {
            Ok(()) => {
                self.offset += buffer.len() as u64;
                Ok(true)
            }
            Err(e) if e.kind() == ErrorKind::UnexpectedEof => Ok(false),
            Err(e) => Err(BackupError::io(&self.path, e)),
        }
    }

    fn corrupt(&self, offset: u64, detail: String) -> BackupError {
        BackupError::Corrupt {
            path: self.path.clone(),
            offset,
            detail,
        }
    }

    fn truncated(&self, detail: String) -> BackupError {
        BackupError::Truncated {
            path: self.path.clone(),
            offset: self.offset,
            detail,
        }
    }
}

fn unexpected(record: &Record, expected: &str) -> String {
    format!("a {} record where {expected} belongs", record.name())
}

#[cfg(test)]
mod tests;
