//! The backup file of `keel backup` and `keel restore`: a versioned, checksummed container of
//! range snapshots. `keel backup` (client side) writes it and `keel restore` (server side)
//! reads it; neither side may depend on the other, so the format lives here, on top of
//! keel-types alone. Knows nothing of the network, the cluster or the storage engine: a
//! range's snapshot is opaque bytes here (keel-storage's snapshot file format).
//!
//! # Layout
//! ```text
//! magic      8 bytes "KEELBKUP"
//! record*    u32 big-endian body length (1 ..= limits::BACKUP_RECORD_BYTES_MAX)
//!            body: format-version byte, then the postcard encoding of a `Record`
//!            32-byte SHA-256 of the length bytes and the body
//! ```
//! Records, in this order: one `Header` (created time, the writing keel's version, the
//! source cluster's nodes, how many `Listed` records follow); one `Listed` per range of the
//! range table as the cluster listed it when the backup started; then per backed-up range
//! one `Range` (its descriptor, revision, applied log index and snapshot length), `Chunk`s
//! of its snapshot bytes (at most `limits::SNAPSHOT_CHUNK_BYTES` each) and one `RangeEnd`
//! (the snapshot's length and SHA-256); last one `End` (ranges, snapshot bytes and records
//! between header and end). Nothing may follow `End`.
//!
//! A reader refuses, naming the byte offset: a file without the magic, a record whose checksum
//! does not match (a flipped bit anywhere), a version it does not know, a record out of order,
//! a range whose bytes or digest differ from its `RangeEnd`, counts that differ from `End`,
//! a file that ends before `End` (truncated) or goes on after it, and ranges that do not
//! cover the keyspace exactly once (`coverage`). So a file `verify` accepts restores every
//! key of the source cluster's data ranges.
//!
//! Format history (every version stays readable): 1, the first.

mod coverage;
mod error;
mod format;
mod reader;
mod writer;

pub use coverage::{Gap, check_coverage, gaps};
pub use error::BackupError;
pub use format::{BackupEnd, BackupHeader, Digest, FORMAT_VERSION, MAGIC, RangeEnd, RangeHeader};
pub use reader::{BackupReader, BackupSummary, Item, verify};
pub use writer::BackupWriter;
