//! Writing a backup file: into `FILE.tmp`, range by range, then `End`, fsync and a rename to
//! `FILE`, so `FILE` is either absent, an older complete backup, or this complete one. A
//! range whose snapshot stream broke off is cut back out (`abandon_range`) and may be written
//! again. Blocking I/O through a buffer; knows nothing of where the snapshots come from.

use std::fs::File;
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use keel_types::{RangeDescriptor, limits};
use sha2::{Digest as _, Sha256};

use crate::coverage::check_coverage;
use crate::error::BackupError;
use crate::format::{BackupEnd, BackupHeader, MAGIC, RangeEnd, RangeHeader, Record, encode_frame};

/// Buffer of the output file.
const WRITE_BUFFER_BYTES: usize = 256 * 1024;

/// A backup file being written. Dropped without `finish`, it deletes its temporary file.
pub struct BackupWriter {
    out: Option<BufWriter<File>>,
    temp: PathBuf,
    target: PathBuf,
    /// Bytes written so far.
    offset: u64,
    /// Records written after the header.
    records: u64,
    /// Ranges written completely.
    ranges: Vec<RangeDescriptor>,
    snapshot_bytes: u64,
    open: Option<OpenRange>,
}

/// The range being written.
struct OpenRange {
    header: RangeHeader,
    /// Where its `Range` record starts, and the record count before it.
    start_offset: u64,
    start_records: u64,
    bytes: u64,
    hasher: Sha256,
}

impl BackupWriter {
    /// Starts `target` (written to `target` + ".tmp", replacing a leftover one) with
    /// `header` and the range table `listed` as the cluster listed it.
    pub fn create(
        target: &Path,
        mut header: BackupHeader,
        listed: &[RangeDescriptor],
    ) -> Result<BackupWriter, BackupError> {
        let mut temp = target.as_os_str().to_owned();
        temp.push(".tmp");
        let temp = PathBuf::from(temp);
        let file = File::create(&temp).map_err(|e| BackupError::io(&temp, e))?;
        let mut writer = BackupWriter {
            out: Some(BufWriter::with_capacity(WRITE_BUFFER_BYTES, file)),
            temp,
            target: target.to_path_buf(),
            offset: 0,
            records: 0,
            ranges: Vec::new(),
            snapshot_bytes: 0,
            open: None,
        };
        writer.write_bytes(&MAGIC)?;
        header.listed = listed.len() as u64;
        writer.write_frame(&Record::Header(header))?;
        for range in listed {
            writer.write_record(&Record::Listed(range.clone()))?;
        }
        Ok(writer)
    }

    /// The ranges written completely so far.
    pub fn ranges(&self) -> &[RangeDescriptor] {
        &self.ranges
    }

    /// Bytes written so far.
    pub fn bytes_written(&self) -> u64 {
        self.offset
    }

    /// Opens a range; its snapshot's `header.snapshot_bytes` bytes follow.
    pub fn begin_range(&mut self, header: RangeHeader) -> Result<(), BackupError> {
        assert!(self.open.is_none(), "a range is already open");
        let (start_offset, start_records) = (self.offset, self.records);
        self.write_record(&Record::Range(header.clone()))?;
        self.open = Some(OpenRange {
            header,
            start_offset,
            start_records,
            bytes: 0,
            hasher: Sha256::new(),
        });
        Ok(())
    }

    /// Appends bytes of the open range's snapshot.
    pub fn write_snapshot(&mut self, data: &[u8]) -> Result<(), BackupError> {
        for chunk in data.chunks(limits::SNAPSHOT_CHUNK_BYTES) {
            let open = self.open.as_mut().expect("a range is open");
            open.bytes += chunk.len() as u64;
            open.hasher.update(chunk);
            self.write_record(&Record::Chunk(chunk.to_vec()))?;
        }
        Ok(())
    }

    /// Closes the open range; `Incomplete` (and the range is cut out again) when its bytes
    /// differ from what its header announced.
    pub fn end_range(&mut self) -> Result<(), BackupError> {
        let open = self.open.as_ref().expect("a range is open");
        if open.bytes != open.header.snapshot_bytes {
            let detail = format!(
                "range {} sent {} snapshot bytes of {}",
                open.header.descriptor.id, open.bytes, open.header.snapshot_bytes
            );
            self.abandon_range()?;
            return Err(self.incomplete(detail));
        }
        let open = self.open.take().expect("a range is open");
        let end = RangeEnd {
            snapshot_bytes: open.bytes,
            sha256: open.hasher.finalize().into(),
        };
        self.write_record(&Record::RangeEnd(end))?;
        self.snapshot_bytes += open.bytes;
        self.ranges.push(open.header.descriptor);
        Ok(())
    }

    /// Cuts the open range out of the file, as if it had never been begun.
    pub fn abandon_range(&mut self) -> Result<(), BackupError> {
        let Some(open) = self.open.take() else {
            return Ok(());
        };
        let out = self.out.as_mut().expect("the file is open until finish");
        let file = out
            .flush()
            .map(|()| out.get_mut())
            .map_err(|e| BackupError::io(&self.temp, e))?;
        file.set_len(open.start_offset)
            .and_then(|()| file.seek(SeekFrom::Start(open.start_offset)).map(|_| ()))
            .map_err(|e| BackupError::io(&self.temp, e))?;
        self.offset = open.start_offset;
        self.records = open.start_records;
        Ok(())
    }

    /// Writes `End`, fsyncs, renames the file into place and fsyncs its directory.
    /// `Incomplete` when a range is still open or the ranges do not cover the keyspace
    /// exactly once (nothing is renamed; the temporary file is deleted).
    pub fn finish(mut self) -> Result<BackupEnd, BackupError> {
        if let Some(open) = &self.open {
            let detail = format!("range {} is still open", open.header.descriptor.id);
            return Err(self.incomplete(detail));
        }
        check_coverage(&self.ranges).map_err(|detail| self.incomplete(detail))?;
        let end = BackupEnd {
            ranges: self.ranges.len() as u64,
            snapshot_bytes: self.snapshot_bytes,
            records: self.records,
        };
        self.write_frame(&Record::End(end))?;
        let out = self.out.take().expect("the file is open until finish");
        let placed = place(out, &self.temp, &self.target);
        if placed.is_err() {
            let _ = std::fs::remove_file(&self.temp);
        }
        placed.map(|()| end)
    }

    fn incomplete(&self, detail: String) -> BackupError {
        BackupError::Incomplete {
            path: self.target.clone(),
            detail,
        }
    }

    /// Writes a record after the header, counting it.
    fn write_record(&mut self, record: &Record) -> Result<(), BackupError> {
        self.write_frame(record)?;
        self.records += 1;
        Ok(())
    }

    fn write_frame(&mut self, record: &Record) -> Result<(), BackupError> {
        self.write_bytes(&encode_frame(record))
    }

    fn write_bytes(&mut self, bytes: &[u8]) -> Result<(), BackupError> {
        let out = self.out.as_mut().expect("the file is open until finish");
        out.write_all(bytes)
            .map_err(|e| BackupError::io(&self.temp, e))?;
        self.offset += bytes.len() as u64;
        Ok(())
    }
}

impl Drop for BackupWriter {
    fn drop(&mut self) {
        if self.out.take().is_some() {
            let _ = std::fs::remove_file(&self.temp);
        }
    }
}

/// Flushes and fsyncs `temp`, renames it to `target` and fsyncs the directory.
fn place(out: BufWriter<File>, temp: &Path, target: &Path) -> Result<(), BackupError> {
    let file = out
        .into_inner()
        .map_err(|e| BackupError::io(temp, e.into_error()))?;
    file.sync_all().map_err(|e| BackupError::io(temp, e))?;
    drop(file);
    std::fs::rename(temp, target).map_err(|e| BackupError::io(temp, e))?;
    sync_parent(target)
}

fn sync_parent(path: &Path) -> Result<(), BackupError> {
    let parent = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    File::open(parent)
        .and_then(|dir| dir.sync_all())
        .map_err(|e| BackupError::io(parent, e))
}
