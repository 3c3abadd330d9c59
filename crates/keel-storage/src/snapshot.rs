//! Snapshot files: their record format, the files a range keeps in the snapshot directory,
//! building one from a consistent read of the store, and receiving one from a leader.
//! Knows nothing about gRPC or how chunks travel.
//!
//! A snapshot file is a sequence of records, each a big-endian `u32` length followed by a
//! versioned record (`codec`): one `Header` (applied log id, membership, revision), then
//! (format 2) one `Clock` (the range clock and session horizon), one `Session` per client
//! session and one `Request` per request record of the range, then one `Row` per key (an
//! `ExpiringRow` for a key with an expiry, expired or not), then (format 3) one `Lock`, `Fence`
//! and `Idempotency` record per lock, fenced key and idempotency record of the range's span
//! (free or expired ones included), then `End` with the number of records between header and
//! end, so a truncated file is detected. Format 4 adds a `Range` record (span, epoch,
//! conf_version) right after the header, keeps rows, locks, fences and idempotency records to
//! that span, and for the meta range ends with its `meta` rows (`MetaRange`, `MetaNode`,
//! `MetaNextRangeId`). A format-1 file has only header, rows and end, and installs with clock
//! and horizon 0 and no sessions; a file of format 1 or 2 installs with no locks, fences or
//! idempotency records; a file of format 1-3 installs with the span its range has without a
//! span row (range 1: the whole keyspace), epoch 0 and conf_version 0. Format 7 seals the
//! file: it ends with `SealedEnd` instead of `End`, which adds the SHA-256 of every byte
//! before it, every record carries the header's version and nothing follows, so a changed,
//! lost or added byte anywhere is detected (`StorageError::SnapshotDamaged`); files of older
//! formats are checked for their framing and record count only. Format 10 adds a `Hold`
//! record after `Clock` while the range is held. Format 11 writes every row as a
//! `VersionedRow` (with the key's version) and every request record as a
//! `VersionedRequest`; the rows and records of older files read version 1. Format 12 writes
//! them as `LeasedRow` and `LeasedRequest` (with the key's lease); those of older files read
//! lease 0. Format 12 also writes a `Lease` record per etcd lease of the span, after the
//! idempotency records (the keys attached to each are known from the rows). Files are
//! written and read record by record through fixed-size buffers; no step holds a whole
//! snapshot in memory.
//!
//! A file is checked in full (`verify`) before anything of it is installed or restored, when
//! a receiver has it (`SnapshotFile::verify`) and when the store opens (`verify_dir`), and
//! checked again as it is read while installing.
//!
//! Names in the snapshot directory: `r{range}-{index}-{nonce}.snap` is a complete snapshot
//! (the newest one per range is current; older ones are deleted once a newer one is in
//! place), `*.tmp` is a snapshot being built or received (deleted when the store opens).

use std::io::{self, BufRead, BufReader as StdBufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use keel_types::command::legacy::CommandOutcomeV10;
use keel_types::{
    Fence, Hold, IdempotencyRecord, KeyValue, LockHold, NodeDescriptor, NodeId, NodeState,
    RangeDescriptor, RangeId, Revision, limits,
};
use redb::{Database, ReadTransaction, ReadableDatabase, TableDefinition};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

use crate::codec::{FORMAT_VERSION, decode, encode};
use crate::error::StorageError;
use crate::meta::{self, MetaRow};
use crate::raft_types::{LogId, Snapshot, SnapshotMeta, StoredMembership};
use crate::snapshot_file::SnapshotFile;
use crate::tables::{
    self, Bytes, FENCES, IDEMPOTENCY, KV, KeySpan, LEASES, LOCKS, LeaseRecord, META, REQUESTS,
    RequestRecord, RequestRecordV6, RequestRecordV11, SESSIONS, SM_META, Session, SessionV1,
};

/// Buffer size of snapshot readers and writers.
const SNAPSHOT_BUFFER_BYTES: usize = 64 * 1024;
/// Largest record accepted when reading: a request record whose outcome holds a previous
/// value for every op of a full batch (rows are smaller), plus framing.
const RECORD_BYTES_MAX: usize =
    limits::BATCH_OPS_MAX * (limits::KEY_BYTES_MAX + limits::VALUE_BYTES_MAX + 1024) + 64 * 1024;
/// The first format whose files are sealed (end with `SealedEnd`).
const SEALED_FORMAT: u8 = 7;
const _: () = assert!(
    FORMAT_VERSION >= SEALED_FORMAT,
    "this build writes sealed files"
);

impl SnapshotFile {
    /// Reads the whole file and checks it (`verify`): `Err(SnapshotDamaged)` if it is not
    /// whole, so a receiver refuses it before handing it to openraft, whose failed install
    /// would stop the group.
    pub async fn verify(&self) -> Result<(), StorageError> {
        let path = self.path().to_path_buf();
        tokio::task::spawn_blocking(move || verify(&path))
            .await
            .map_err(|e| StorageError::io(self.path(), io::Error::other(e)))?
    }
}

/// A snapshot being received from a leader, chunk by chunk, into a temporary file.
/// Dropped without `finish`, it deletes its file.
pub struct IncomingSnapshot {
    file: Option<tokio::fs::File>,
    path: PathBuf,
    len_bytes: u64,
}

impl IncomingSnapshot {
    pub(crate) async fn create(
        dir: &Path,
        range: RangeId,
    ) -> Result<IncomingSnapshot, StorageError> {
        let path = dir.join(format!("r{}-incoming-{}.tmp", range.0, nonce()));
        let file = tokio::fs::File::create(&path)
            .await
            .map_err(|e| StorageError::io(&path, e))?;
        Ok(IncomingSnapshot {
            file: Some(file),
            path,
            len_bytes: 0,
        })
    }

    pub async fn write_chunk(&mut self, data: &[u8]) -> io::Result<()> {
        let file = self.file.as_mut().expect("file is present until finish");
        file.write_all(data).await?;
        self.len_bytes += data.len() as u64;
        Ok(())
    }

    /// Flushes and fsyncs the file; the result can be given to `install_snapshot`.
    pub async fn finish(mut self) -> io::Result<SnapshotFile> {
        let mut file = self.file.take().expect("file is present until finish");
        file.flush().await?;
        file.sync_all().await?;
        Ok(SnapshotFile {
            path: std::mem::take(&mut self.path),
            len_bytes: self.len_bytes,
        })
    }
}

impl Drop for IncomingSnapshot {
    fn drop(&mut self) {
        if self.file.is_some() {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// First record of a snapshot file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SnapshotHeader {
    pub last_log_id: Option<LogId>,
    pub last_membership: StoredMembership,
    pub revision: Revision,
}

impl SnapshotHeader {
    pub fn meta(&self) -> SnapshotMeta {
        SnapshotMeta {
            last_log_id: self.last_log_id,
            last_membership: self.last_membership.clone(),
        }
    }
}

/// A `kv` row in a snapshot file, in the shape format 1 wrote (its expiry, if any, goes in
/// `Record::ExpiringRow`; from format 11 its version and expiry in `Record::VersionedRow`,
/// from format 12 with its lease in `Record::LeasedRow`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SnapshotRow {
    #[serde(with = "serde_bytes")]
    pub key: Vec<u8>,
    #[serde(with = "serde_bytes")]
    pub value: Vec<u8>,
    pub create_revision: Revision,
    pub mod_revision: Revision,
}

impl SnapshotRow {
    /// The key with its version (1 for a row of a file older than format 11), expiry and
    /// lease (0 for a row of a file older than format 12).
    pub fn into_key_value(self, version: u64, expires_at_ms: Option<u64>, lease: i64) -> KeyValue {
        KeyValue {
            key: self.key,
            value: self.value,
            create_revision: self.create_revision,
            mod_revision: self.mod_revision,
            version,
            expires_at_ms,
            lease,
        }
    }
}

/// One record of a snapshot file. Variants are only ever appended, so files of every format
/// decode.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum Record {
    Header(SnapshotHeader),
    Row(SnapshotRow),
    /// `records` counts every record between the header and this one (in format 1, the rows).
    End {
        records: u64,
    },
    /// Format 2: the range's clock and session horizon (`tables::SmState`).
    Clock {
        clock_ms: u64,
        session_horizon_ms: u64,
    },
    /// Format 2: a row with an expiry.
    ExpiringRow {
        row: SnapshotRow,
        expires_at_ms: u64,
    },
    /// Format 2 to 5: a client session of the range, without an owner.
    Session {
        client_id: u64,
        session: SessionV1,
    },
    /// Format 2 to 5: a request record of the range, without its request's digest.
    Request {
        client_id: u64,
        sequence: u64,
        outcome: CommandOutcomeV10,
    },
    /// Format 3: a lock of the range, free or not.
    Lock {
        #[serde(with = "serde_bytes")]
        name: Vec<u8>,
        hold: LockHold,
    },
    /// Format 3: the fence of a user key of the range.
    Fence {
        #[serde(with = "serde_bytes")]
        key: Vec<u8>,
        fence: Fence,
    },
    /// Format 3: an idempotency record of the range, expired or not.
    Idempotency {
        #[serde(with = "serde_bytes")]
        key: Vec<u8>,
        record: IdempotencyRecord,
    },
    /// Format 4: the range's span, epoch and conf_version; right after the header.
    Range(RangeFacts),
    /// Format 4: a range descriptor the meta range records.
    MetaRange(RangeDescriptor),
    /// Format 4: a node the meta range records.
    MetaNode(NodeDescriptor),
    /// Format 4: the meta range's next range id.
    MetaNextRangeId(u64),
    /// Format 5: where a node stands, as the meta range records it.
    MetaNodeState(NodeId, NodeState),
    /// Format 6: a client session of the range, with its owner (it replaces `Session`).
    OwnedSession {
        client_id: u64,
        session: Session,
    },
    /// Format 6 to 10: a request record of the range, with its request's digest (it
    /// replaces `Request`).
    DigestedRequest {
        client_id: u64,
        sequence: u64,
        record: RequestRecordV6,
    },
    /// Format 7: the last record (it replaces `End`): `records` as in `End`, and the SHA-256
    /// of every byte of the file before this record's length prefix.
    SealedEnd {
        records: u64,
        checksum: [u8; 32],
    },
    /// Format 10: the range is held (`keel_types::Hold`); right after `Clock`, only when it is.
    Hold(Hold),
    /// Format 11: a row with its version and expiry, if any (it replaces `Row` and
    /// `ExpiringRow`).
    VersionedRow {
        row: SnapshotRow,
        version: u64,
        expires_at_ms: Option<u64>,
    },
    /// Format 11: a request record of the range whose key states carry versions (it replaces
    /// `DigestedRequest`).
    VersionedRequest {
        client_id: u64,
        sequence: u64,
        record: RequestRecordV11,
    },
    /// Format 12: a row with its version, expiry and lease (it replaces `VersionedRow`).
    LeasedRow {
        row: SnapshotRow,
        version: u64,
        expires_at_ms: Option<u64>,
        lease: i64,
    },
    /// Format 12: a request record of the range whose key states carry leases (it replaces
    /// `VersionedRequest`).
    LeasedRequest {
        client_id: u64,
        sequence: u64,
        record: RequestRecord,
    },
    /// Format 12: an etcd lease of the range's span, expired or not, under its `leases` key.
    /// The keys attached to it are not records: the rows' leases rebuild `lease_keys`.
    Lease {
        #[serde(with = "serde_bytes")]
        key: Vec<u8>,
        record: LeaseRecord,
    },
}

/// What a snapshot says about its range besides the header: span, epoch, conf_version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct RangeFacts {
    pub span: KeySpan,
    pub epoch: u64,
    pub conf_version: u64,
}

impl RangeFacts {
    /// The facts of a snapshot file of format 1-3, which has no `Range` record: it was taken
    /// before ranges split, so `range` had its unrecorded span, epoch 0 and conf_version 0.
    pub fn unrecorded(range: RangeId) -> RangeFacts {
        RangeFacts {
            span: KeySpan::unrecorded(range),
            epoch: 0,
            conf_version: 0,
        }
    }
}

impl Record {
    /// The record of a row, as this build writes it.
    fn row(kv: KeyValue) -> Record {
        let row = SnapshotRow {
            key: kv.key,
            value: kv.value,
            create_revision: kv.create_revision,
            mod_revision: kv.mod_revision,
        };
        Record::LeasedRow {
            row,
            version: kv.version,
            expires_at_ms: kv.expires_at_ms,
            lease: kv.lease,
        }
    }

    /// The row a row record of any format holds (`None` for another record). Rows of files
    /// older than format 11 have no version: they read version 1; rows of files older than
    /// format 12 have no lease: they read lease 0.
    pub fn into_row(self) -> Option<KeyValue> {
        Some(match self {
            Record::Row(row) => row.into_key_value(1, None, 0),
            Record::ExpiringRow { row, expires_at_ms } => {
                row.into_key_value(1, Some(expires_at_ms), 0)
            }
            Record::VersionedRow {
                row,
                version,
                expires_at_ms,
            } => row.into_key_value(version, expires_at_ms, 0),
            Record::LeasedRow {
                row,
                version,
                expires_at_ms,
                lease,
            } => row.into_key_value(version, expires_at_ms, lease),
            _ => return None,
        })
    }

    /// The client id, sequence and record of a request record of any format (`None` for
    /// another record); the key states in records older than format 11 read version 1, and
    /// those older than format 12 lease 0.
    pub fn into_request(self) -> Option<(u64, u64, RequestRecord)> {
        Some(match self {
            Record::Request {
                client_id,
                sequence,
                outcome,
            } => {
                let record = RequestRecord {
                    digest: None,
                    outcome: outcome.into(),
                };
                (client_id, sequence, record)
            }
            Record::DigestedRequest {
                client_id,
                sequence,
                record,
            } => (client_id, sequence, record.into()),
            Record::VersionedRequest {
                client_id,
                sequence,
                record,
            } => (client_id, sequence, record.into()),
            Record::LeasedRequest {
                client_id,
                sequence,
                record,
            } => (client_id, sequence, record),
            _ => return None,
        })
    }
}

/// Reads a snapshot file record by record through a fixed-size buffer, checking it as it goes
/// (`Tally`): a file that is not whole fails with `SnapshotDamaged` by its end record at the
/// latest. Either end record is returned as `End`, once checked.
pub(crate) struct SnapshotReader {
    reader: BufReader<tokio::fs::File>,
    path: PathBuf,
    record: Vec<u8>,
    tally: Tally,
    /// A record read ahead (looking for `Range` in a file without one); `next` returns it.
    pending: Option<Record>,
}

impl SnapshotReader {
    pub async fn open(path: &Path) -> Result<SnapshotReader, StorageError> {
        let file = tokio::fs::File::open(path)
            .await
            .map_err(|e| StorageError::io(path, e))?;
        Ok(SnapshotReader {
            reader: BufReader::with_capacity(SNAPSHOT_BUFFER_BYTES, file),
            path: path.to_path_buf(),
            record: Vec::new(),
            tally: Tally::default(),
            pending: None,
        })
    }

    /// Opens a file and reads its header.
    pub async fn open_with_header(
        path: &Path,
    ) -> Result<(SnapshotReader, SnapshotHeader), StorageError> {
        let mut reader = SnapshotReader::open(path).await?;
        match reader.next().await? {
            Record::Header(header) => Ok((reader, header)),
            _ => unreachable!("the tally refuses a file that does not start with a header"),
        }
    }

    /// Opens a snapshot file and reads its header and range facts.
    /// `None`: the file has no `Range` record (format 1-3).
    pub async fn open_with_facts(
        path: &Path,
    ) -> Result<(SnapshotReader, SnapshotHeader, Option<RangeFacts>), StorageError> {
        let (mut reader, header) = SnapshotReader::open_with_header(path).await?;
        match reader.next().await? {
            Record::Range(facts) => Ok((reader, header, Some(facts))),
            other => {
                reader.pending = Some(other);
                Ok((reader, header, None))
            }
        }
    }

    /// Bytes of the record `next` returned last.
    pub fn last_record_bytes(&self) -> usize {
        self.record.len()
    }

    pub async fn next(&mut self) -> Result<Record, StorageError> {
        if let Some(record) = self.pending.take() {
            return Ok(record);
        }
        let mut length = [0u8; 4];
        self.read_exact_into(&mut length).await?;
        let mut record = std::mem::take(&mut self.record);
        record.resize(record_length(&self.path, length)?, 0);
        let read = self.read_exact_into(&mut record).await;
        let taken = read.and_then(|()| self.tally.take(&self.path, length, &record));
        self.record = record;
        let taken = taken?;
        if self.tally.ended && self.tally.sealed() {
            let rest = self.reader.fill_buf().await;
            let rest = rest.map_err(|e| StorageError::io(&self.path, e))?;
            check_nothing_after(&self.path, rest)?;
        }
        Ok(taken)
    }

    async fn read_exact_into(&mut self, buffer: &mut [u8]) -> Result<(), StorageError> {
        match self.reader.read_exact(buffer).await {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Err(ends_early(&self.path)),
            Err(e) => Err(StorageError::io(&self.path, e)),
        }
    }
}

/// Reads the snapshot file at `path` to its end record, checking every record as
/// `SnapshotReader` does (`Tally`), without keeping any. Blocking.
pub(crate) fn verify(path: &Path) -> Result<(), StorageError> {
    let file = std::fs::File::open(path).map_err(|e| StorageError::io(path, e))?;
    let mut reader = StdBufReader::with_capacity(SNAPSHOT_BUFFER_BYTES, file);
    let read_exact = |reader: &mut StdBufReader<std::fs::File>, buffer: &mut [u8]| match reader
        .read_exact(buffer)
    {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Err(ends_early(path)),
        Err(e) => Err(StorageError::io(path, e)),
    };
    let mut tally = Tally::default();
    let mut record = Vec::new();
    while !tally.ended {
        let mut length = [0u8; 4];
        read_exact(&mut reader, &mut length)?;
        record.resize(record_length(path, length)?, 0);
        read_exact(&mut reader, &mut record)?;
        tally.take(path, length, &record)?;
    }
    if tally.sealed() {
        let rest = reader.fill_buf().map_err(|e| StorageError::io(path, e))?;
        check_nothing_after(path, rest)?;
    }
    Ok(())
}

/// What the records of a snapshot file read so far add up to, and the checks each must pass:
/// a header first; in a sealed file (format 7 on) every record of the header's version; an
/// end record counting the records between header and end and, in a sealed file, holding the
/// SHA-256 of every byte before it.
#[derive(Default)]
struct Tally {
    /// The header's format version; `None` before the header.
    version: Option<u8>,
    /// Records after the header.
    records: u64,
    /// Of every byte before the end record.
    digest: Sha256,
    /// The end record was read and checked.
    ended: bool,
}

impl Tally {
    fn sealed(&self) -> bool {
        self.version.is_some_and(|version| version >= SEALED_FORMAT)
    }

    /// Checks and decodes the next record of the file, `body` after its `length` prefix;
    /// returns either end record as `End`.
    fn take(&mut self, path: &Path, length: [u8; 4], body: &[u8]) -> Result<Record, StorageError> {
        if self.ended {
            return Err(StorageError::damaged(path, "a record after its end record"));
        }
        let version = body.first().copied();
        if let (true, Some(format), Some(record_format)) = (self.sealed(), self.version, version)
            && record_format != format
        {
            let detail = format!("a record of format {record_format} in a file of format {format}");
            return Err(damaged(path, detail));
        }
        let record = decode("snapshot record", body).map_err(|e| match e {
            StorageError::Corrupt { detail, .. } => damaged(path, detail),
            other => other,
        })?;
        match (self.version, record) {
            (None, Record::Header(header)) => {
                self.version = version;
                self.hash(length, body);
                Ok(Record::Header(header))
            }
            (None, _) => Err(damaged(path, "it does not start with a header")),
            (Some(_), Record::End { records }) if !self.sealed() => self.end(path, records),
            (Some(_), Record::SealedEnd { records, checksum }) if self.sealed() => {
                let digest: [u8; 32] = self.digest.clone().finalize().into();
                if digest != checksum {
                    return Err(damaged(path, "its checksum does not match its records"));
                }
                self.end(path, records)
            }
            (Some(format), Record::End { .. } | Record::SealedEnd { .. }) => Err(damaged(
                path,
                format!("an end record that format {format} does not write"),
            )),
            (Some(_), record) => {
                self.hash(length, body);
                self.records += 1;
                Ok(record)
            }
        }
    }

    fn hash(&mut self, length: [u8; 4], body: &[u8]) {
        self.digest.update(length);
        self.digest.update(body);
    }

    /// The end record, which says the file holds `records` records after its header.
    fn end(&mut self, path: &Path, records: u64) -> Result<Record, StorageError> {
        if records != self.records {
            let detail = format!(
                "it holds {} records but its end record says {records}",
                self.records
            );
            return Err(damaged(path, detail));
        }
        self.ended = true;
        Ok(Record::End { records })
    }
}

/// The length of the record a `length` prefix announces, if it is within bounds.
fn record_length(path: &Path, length: [u8; 4]) -> Result<usize, StorageError> {
    let length = u32::from_be_bytes(length) as usize;
    if length > RECORD_BYTES_MAX {
        let detail = format!("a record of {length} bytes exceeds {RECORD_BYTES_MAX}");
        return Err(damaged(path, detail));
    }
    Ok(length)
}

fn check_nothing_after(path: &Path, rest: &[u8]) -> Result<(), StorageError> {
    if rest.is_empty() {
        Ok(())
    } else {
        Err(damaged(path, "bytes follow its end record"))
    }
}

fn ends_early(path: &Path) -> StorageError {
    damaged(path, "it ends before its end record")
}

fn damaged(path: &Path, detail: impl ToString) -> StorageError {
    StorageError::SnapshotDamaged {
        path: path.to_path_buf(),
        detail: detail.to_string(),
    }
}

/// A snapshot file being written, counting its records after the header and hashing every
/// byte for its `SealedEnd` record.
struct SnapshotOut {
    out: BufWriter<std::fs::File>,
    temp: PathBuf,
    records: u64,
    digest: Sha256,
}

impl SnapshotOut {
    fn create(temp: PathBuf) -> Result<SnapshotOut, StorageError> {
        let file = std::fs::File::create(&temp).map_err(|e| StorageError::io(&temp, e))?;
        Ok(SnapshotOut {
            out: BufWriter::with_capacity(SNAPSHOT_BUFFER_BYTES, file),
            temp,
            records: 0,
            digest: Sha256::new(),
        })
    }

    /// Writes `record` with its length prefix.
    fn write(&mut self, record: &Record) -> Result<(), StorageError> {
        let body = encode(record);
        let length = u32::try_from(body.len()).map_err(|e| self.error(io::Error::other(e)))?;
        let length = length.to_be_bytes();
        self.out
            .write_all(&length)
            .and_then(|()| self.out.write_all(&body))
            .map_err(|e| self.error(e))?;
        self.digest.update(length);
        self.digest.update(&body);
        if !matches!(record, Record::Header(_)) {
            self.records += 1;
        }
        Ok(())
    }

    /// Writes the `SealedEnd` record, fsyncs the file and returns its path and length.
    fn finish(mut self) -> Result<(PathBuf, u64), StorageError> {
        let checksum = self.digest.clone().finalize().into();
        self.write(&Record::SealedEnd {
            records: self.records,
            checksum,
        })?;
        let file = self.out.into_inner().map_err(|e| {
            let error = e.into_error();
            StorageError::io(&self.temp, error)
        })?;
        file.sync_all()
            .map_err(|e| StorageError::io(&self.temp, e))?;
        let len_bytes = file
            .metadata()
            .map_err(|e| StorageError::io(&self.temp, e))?
            .len();
        Ok((self.temp, len_bytes))
    }

    fn error(&self, error: io::Error) -> StorageError {
        StorageError::io(&self.temp, error)
    }
}

/// Where the records of a range's state go: a snapshot file (`SnapshotOut`) or a
/// consistency check's digest (`check`).
pub(crate) trait RecordSink {
    fn write(&mut self, record: &Record) -> Result<(), StorageError>;
}

impl RecordSink for SnapshotOut {
    fn write(&mut self, record: &Record) -> Result<(), StorageError> {
        SnapshotOut::write(self, record)
    }
}

/// Writes a snapshot of `range` (the rows of its span, and for the meta range the `meta`
/// table) from one read transaction into a new file, fsyncs it and makes it the range's
/// current snapshot. Blocking.
pub(crate) fn build(
    db: &Database,
    dir: &Path,
    range: RangeId,
) -> Result<(SnapshotMeta, SnapshotFile), StorageError> {
    let txn = db
        .begin_read()
        .map_err(|e| StorageError::redb("begin read", e))?;
    let temp = dir.join(format!("r{}-build-{}.tmp", range.0, nonce()));
    let mut out = SnapshotOut::create(temp)?;
    let header = write_range(&txn, range, &mut out)?;
    let (temp, len_bytes) = out.finish()?;
    let path = publish(dir, range, &temp, header.last_log_id.as_ref())?;
    Ok((header.meta(), SnapshotFile { path, len_bytes }))
}

/// Writes every record of `range`'s state as `txn` reads it, in snapshot order: header,
/// range facts, clock, sessions and request records, rows, locks, fences and idempotency
/// records, and for the meta range its `meta` rows. Returns the header. Blocking.
pub(crate) fn write_range(
    txn: &ReadTransaction,
    range: RangeId,
    out: &mut impl RecordSink,
) -> Result<SnapshotHeader, StorageError> {
    let sm_meta = txn
        .open_table(SM_META)
        .map_err(|e| StorageError::redb("open sm_meta", e))?;
    let state = tables::read_sm_state(&sm_meta, range)?;
    if state.installing.is_some() {
        return Err(StorageError::SnapshotInstalling { range });
    }
    let header = SnapshotHeader {
        last_log_id: state.applied,
        last_membership: state.membership,
        revision: state.revision,
    };
    out.write(&Record::Header(header.clone()))?;
    out.write(&Record::Range(RangeFacts {
        span: state.span.clone(),
        epoch: state.epoch,
        conf_version: state.conf_version,
    }))?;
    out.write(&Record::Clock {
        clock_ms: state.clock_ms,
        session_horizon_ms: state.session_horizon_ms,
    })?;
    if let Some(hold) = state.hold {
        out.write(&Record::Hold(hold))?;
    }
    write_sessions(txn, range, out)?;
    write_rows(txn, &state.span, out)?;
    write_coordination(txn, &state.span, out)?;
    if range == RangeId::META {
        write_meta_rows(txn, out)?;
    }
    Ok(header)
}

/// Writes the range's sessions, then its request records.
fn write_sessions(
    txn: &ReadTransaction,
    range: RangeId,
    out: &mut impl RecordSink,
) -> Result<(), StorageError> {
    let sessions = txn
        .open_table(SESSIONS)
        .map_err(|e| StorageError::redb("open sessions", e))?;
    let (start, end) = (
        tables::session_key(range, 0),
        tables::session_key(range, u64::MAX),
    );
    for row in sessions
        .range(start.as_slice()..=end.as_slice())
        .map_err(|e| StorageError::redb("read sessions", e))?
    {
        let (key, value) = row.map_err(|e| StorageError::redb("read sessions", e))?;
        let client_id = tables::session_key_client(key.value());
        let session = Session::decode(value.value())?;
        out.write(&Record::OwnedSession { client_id, session })?;
    }
    let requests = txn
        .open_table(REQUESTS)
        .map_err(|e| StorageError::redb("open requests", e))?;
    let (start, end) = (
        tables::request_key(range, 0, 0),
        tables::request_key(range, u64::MAX, u64::MAX),
    );
    for row in requests
        .range(start.as_slice()..=end.as_slice())
        .map_err(|e| StorageError::redb("read request records", e))?
    {
        let (key, value) = row.map_err(|e| StorageError::redb("read request records", e))?;
        let (client_id, sequence) = tables::request_key_parts(key.value());
        let record = RequestRecord::decode(value.value())?;
        out.write(&Record::LeasedRequest {
            client_id,
            sequence,
            record,
        })?;
    }
    Ok(())
}

/// Writes the rows of `span`, expired ones included: replicas keep them until a cleanup.
fn write_rows(
    txn: &ReadTransaction,
    span: &KeySpan,
    out: &mut impl RecordSink,
) -> Result<(), StorageError> {
    let kv = txn
        .open_table(KV)
        .map_err(|e| StorageError::redb("open kv", e))?;
    for row in kv
        .range::<&[u8]>(span.bounds())
        .map_err(|e| StorageError::redb("read kv", e))?
    {
        let (key, value) = row.map_err(|e| StorageError::redb("read kv", e))?;
        let kv = tables::decode_kv(key.value(), value.value())?;
        out.write(&Record::row(kv))?;
    }
    Ok(())
}

/// Writes the locks, fences, idempotency records and leases of `span`, free or expired
/// ones included: replicas keep them until a reclaim (a lease until it is revoked).
fn write_coordination(
    txn: &ReadTransaction,
    span: &KeySpan,
    out: &mut impl RecordSink,
) -> Result<(), StorageError> {
    write_keyed(txn, LOCKS, span, out, |name, hold| Record::Lock {
        name,
        hold,
    })?;
    write_keyed(txn, FENCES, span, out, |key, fence| Record::Fence {
        key,
        fence,
    })?;
    write_keyed(txn, IDEMPOTENCY, span, out, |key, record| {
        Record::Idempotency { key, record }
    })?;
    write_keyed(txn, LEASES, span, out, |key, record| Record::Lease {
        key,
        record,
    })
}

/// Writes one record per row of `table` within `span`, made by `record` from the row's key
/// and decoded value.
fn write_keyed<T: DeserializeOwned>(
    txn: &ReadTransaction,
    table: TableDefinition<'static, Bytes, Bytes>,
    span: &KeySpan,
    out: &mut impl RecordSink,
    record: impl Fn(Vec<u8>, T) -> Record,
) -> Result<(), StorageError> {
    let rows = txn
        .open_table(table)
        .map_err(|e| StorageError::redb("open table for snapshot", e))?;
    for row in rows
        .range::<&[u8]>(span.bounds())
        .map_err(|e| StorageError::redb("read table for snapshot", e))?
    {
        let (key, value) = row.map_err(|e| StorageError::redb("read table for snapshot", e))?;
        let value = decode("coordination row", value.value())?;
        out.write(&record(key.value().to_vec(), value))?;
    }
    Ok(())
}

/// Writes every row of the meta range's `meta` table.
fn write_meta_rows(txn: &ReadTransaction, out: &mut impl RecordSink) -> Result<(), StorageError> {
    let table = txn
        .open_table(META)
        .map_err(|e| StorageError::redb("open meta", e))?;
    for row in meta::read_rows(&table)? {
        out.write(&match row {
            MetaRow::Range(range) => Record::MetaRange(range),
            MetaRow::Node(node) => Record::MetaNode(node),
            MetaRow::NextRangeId(next) => Record::MetaNextRangeId(next),
            MetaRow::NodeState(node, state) => Record::MetaNodeState(node, state),
        })?;
    }
    Ok(())
}

/// The range facts of a snapshot file of `range` (see `SnapshotReader::open_with_facts`).
pub(crate) async fn read_facts(path: &Path, range: RangeId) -> Result<RangeFacts, StorageError> {
    let (_, _, facts) = SnapshotReader::open_with_facts(path).await?;
    Ok(facts.unwrap_or_else(|| RangeFacts::unrecorded(range)))
}

/// Renames a complete temporary file to a snapshot name, fsyncs the directory and deletes
/// the range's older snapshots. Blocking.
pub(crate) fn publish(
    dir: &Path,
    range: RangeId,
    temp: &Path,
    last_log_id: Option<&LogId>,
) -> Result<PathBuf, StorageError> {
    let index = last_log_id.map_or(0, |log_id| log_id.index);
    let path = dir.join(format!("r{}-{index:020}-{}.snap", range.0, nonce()));
    std::fs::rename(temp, &path).map_err(|e| StorageError::io(temp, e))?;
    sync_dir(dir)?;
    // Only older snapshots go: a concurrent build or install may have put a newer one in
    // place, and `current` prefers it.
    for (other_index, other) in snapshot_files(dir, range)? {
        if other != path && other_index <= index {
            match std::fs::remove_file(&other) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => {
                    return Err(StorageError::io(&other, e));
                }
                _ => {}
            }
        }
    }
    Ok(path)
}

/// Brings a snapshot file given to `install_snapshot` into the snapshot directory as the
/// range's current snapshot: renamed if it was received into this directory, copied
/// otherwise, left alone if it already is a snapshot of this directory. Blocking.
pub(crate) fn adopt(
    dir: &Path,
    range: RangeId,
    snapshot: &SnapshotFile,
    last_log_id: Option<&LogId>,
) -> Result<SnapshotFile, StorageError> {
    let source = snapshot.path();
    let canonical = |path: &Path| path.canonicalize().map_err(|e| StorageError::io(path, e));
    let ours = source.parent().map(canonical).transpose()? == Some(canonical(dir)?);
    let is_temp = source.extension().is_some_and(|ext| ext == "tmp");
    let path = match (ours, is_temp) {
        (true, false) => source.to_path_buf(),
        (true, true) => publish(dir, range, source, last_log_id)?,
        (false, _) => {
            let temp = dir.join(format!("r{}-copy-{}.tmp", range.0, nonce()));
            std::fs::copy(source, &temp).map_err(|e| StorageError::io(source, e))?;
            let file = std::fs::File::open(&temp).map_err(|e| StorageError::io(&temp, e))?;
            file.sync_all().map_err(|e| StorageError::io(&temp, e))?;
            publish(dir, range, &temp, last_log_id)?
        }
    };
    Ok(SnapshotFile {
        path,
        len_bytes: snapshot.len_bytes(),
    })
}

/// The range's current snapshot: the complete snapshot file with the greatest last log id.
/// Leftovers of a crash between rename and cleanup are deleted. A file that disappears while
/// it is looked at (replaced by a newer snapshot) is skipped and the directory listed again.
pub(crate) async fn current(dir: &Path, range: RangeId) -> Result<Option<Snapshot>, StorageError> {
    loop {
        let dir_owned = dir.to_path_buf();
        let files = tokio::task::spawn_blocking(move || snapshot_files(&dir_owned, range))
            .await
            .map_err(|e| StorageError::io(dir, io::Error::other(e)))??;
        let mut vanished = false;
        let mut newest: Option<(SnapshotHeader, PathBuf)> = None;
        for (_, path) in files {
            let header = match SnapshotReader::open_with_header(&path).await {
                Ok((_, header)) => header,
                Err(StorageError::Io { source, .. })
                    if source.kind() == io::ErrorKind::NotFound =>
                {
                    vanished = true;
                    continue;
                }
                Err(error) => return Err(error),
            };
            let newer = newest
                .as_ref()
                .is_none_or(|(best, _)| header.last_log_id > best.last_log_id);
            let stale = if newer {
                newest.replace((header, path)).map(|(_, older)| older)
            } else {
                Some(path)
            };
            if let Some(stale) = stale {
                let _ = tokio::fs::remove_file(&stale).await;
            }
        }
        match newest {
            None if vanished => continue,
            None => return Ok(None),
            // A concurrent lookup may have removed it as stale just now: look again.
            Some((header, path)) => match snapshot_at(header, path).await {
                Err(StorageError::Io { source, .. })
                    if source.kind() == io::ErrorKind::NotFound => {}
                found => return found.map(Some),
            },
        }
    }
}

async fn snapshot_at(header: SnapshotHeader, path: PathBuf) -> Result<Snapshot, StorageError> {
    let len_bytes = tokio::fs::metadata(&path)
        .await
        .map_err(|e| StorageError::io(&path, e))?
        .len();
    Ok(Snapshot {
        meta: header.meta(),
        snapshot: SnapshotFile { path, len_bytes },
    })
}

/// Deletes temporary files of snapshots that were being built or received. Blocking.
pub(crate) fn remove_unfinished(dir: &Path) -> Result<(), StorageError> {
    for entry in std::fs::read_dir(dir).map_err(|e| StorageError::io(dir, e))? {
        let path = entry.map_err(|e| StorageError::io(dir, e))?.path();
        if path.extension().is_some_and(|ext| ext == "tmp") {
            std::fs::remove_file(&path).map_err(|e| StorageError::io(&path, e))?;
        }
    }
    Ok(())
}

/// Checks every complete snapshot file in `dir` (`verify`) as the store opens. The range's
/// state in the store is what counts, so a damaged file (or one of a format this build does
/// not read) is deleted, and openraft builds a new snapshot from that state when it needs
/// one — unless `installing(range)`: the range is in the middle of installing its current
/// snapshot, which only that file can finish, and the store refuses to open (`Damaged`).
/// Blocking.
pub(crate) fn verify_dir(
    dir: &Path,
    installing: impl Fn(RangeId) -> Result<bool, StorageError>,
) -> Result<(), StorageError> {
    let mut deleted = false;
    for (range, _, path) in complete_files(dir)? {
        let detail = match verify(&path) {
            Ok(()) => continue,
            Err(StorageError::SnapshotDamaged { detail, .. }) => detail,
            // A changed header version, or a newer build's file: unreadable either way.
            Err(unknown @ StorageError::UnknownVersion { .. }) => unknown.to_string(),
            Err(error) => return Err(error),
        };
        if installing(range)? {
            let detail = format!(
                "{detail}; range {range} is in the middle of installing it, and only it can \
                 finish the install"
            );
            return Err(StorageError::damaged(&path, detail));
        }
        tracing::error!(
            path = %path.display(), %detail, %range,
            "snapshot file is damaged; deleted (the range's state in the store is intact)"
        );
        std::fs::remove_file(&path).map_err(|e| StorageError::io(&path, e))?;
        deleted = true;
    }
    if deleted {
        sync_dir(dir)?;
    }
    Ok(())
}

/// Deletes every complete snapshot file of `range` (its replica left this store). Blocking.
pub(crate) fn remove_all(dir: &Path, range: RangeId) -> Result<(), StorageError> {
    for (_, path) in snapshot_files(dir, range)? {
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                return Err(StorageError::io(&path, e));
            }
            _ => {}
        }
    }
    sync_dir(dir)
}

/// Complete snapshot files of `range` with the log index in their names. Blocking.
fn snapshot_files(dir: &Path, range: RangeId) -> Result<Vec<(u64, PathBuf)>, StorageError> {
    let files = complete_files(dir)?.into_iter();
    let of_range = files.filter(|(of, _, _)| *of == range);
    Ok(of_range.map(|(_, index, path)| (index, path)).collect())
}

/// Every complete snapshot file in `dir`, with the range and log index in its name. Blocking.
fn complete_files(dir: &Path) -> Result<Vec<(RangeId, u64, PathBuf)>, StorageError> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| StorageError::io(dir, e))? {
        let path = entry.map_err(|e| StorageError::io(dir, e))?.path();
        let name = path
            .file_name()
            .and_then(|name| name.to_str())
            .unwrap_or_default();
        let Some(stem) = name.strip_prefix('r').and_then(|n| n.strip_suffix(".snap")) else {
            continue;
        };
        let mut parts = stem.split('-').map(str::parse::<u64>);
        if let (Some(Ok(range)), Some(Ok(index))) = (parts.next(), parts.next()) {
            files.push((RangeId(range), index, path));
        }
    }
    Ok(files)
}

fn sync_dir(dir: &Path) -> Result<(), StorageError> {
    let handle = std::fs::File::open(dir).map_err(|e| StorageError::io(dir, e))?;
    handle.sync_all().map_err(|e| StorageError::io(dir, e))
}

/// A name part unique within this process and, by the clock, across restarts.
fn nonce() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_nanos());
    format!("{nanos:x}-{}", COUNTER.fetch_add(1, Ordering::Relaxed))
}

#[cfg(test)]
mod tests;
