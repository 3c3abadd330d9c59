//! The records of a backup file and their framing: length, versioned body, SHA-256. Pure
//! encoding and decoding; the reader and writer do the I/O.

use keel_types::{NodeId, RangeDescriptor, limits};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

/// The first 8 bytes of every backup file.
pub const MAGIC: [u8; 8] = *b"KEELBKUP";
/// The format version this build writes.
pub const FORMAT_VERSION: u8 = 1;
/// The oldest format version this build reads.
const FORMAT_VERSION_MIN: u8 = 1;
/// Bytes of the length prefix of a record.
pub(crate) const LENGTH_BYTES: usize = 4;
/// Bytes of the SHA-256 after a record's body.
pub(crate) const DIGEST_BYTES: usize = 32;

/// A SHA-256 digest.
pub type Digest = [u8; DIGEST_BYTES];

/// The first record: what the backup is of.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackupHeader {
    /// When the backup started, in milliseconds since the Unix epoch (the writer's clock).
    pub created_ms: u64,
    /// The version of the `keel` that wrote the file.
    pub keel_version: String,
    /// The source cluster's nodes (id, address), as its range table named them.
    pub nodes: Vec<(NodeId, String)>,
    /// How many `Listed` records follow the header (the writer sets it).
    pub listed: u64,
}

/// Opens one backed-up range; its snapshot's bytes follow in chunks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RangeHeader {
    /// The range as its snapshot describes it: span, epoch, conf_version and its voters in
    /// the source cluster.
    pub descriptor: RangeDescriptor,
    /// The range's revision in the snapshot (that of the last write it holds).
    pub revision: u64,
    /// The source replica's log index the snapshot covers.
    pub applied_index: u64,
    /// Length of the snapshot that follows.
    pub snapshot_bytes: u64,
}

/// Closes one backed-up range.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RangeEnd {
    pub snapshot_bytes: u64,
    /// SHA-256 of the snapshot's bytes.
    pub sha256: Digest,
}

/// The last record: what came before it, so a file cut at a record boundary is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackupEnd {
    /// Backed-up ranges.
    pub ranges: u64,
    /// Snapshot bytes of all ranges.
    pub snapshot_bytes: u64,
    /// Records between the header and this one.
    pub records: u64,
}

/// One record of a backup file. Variants are only ever appended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Record {
    Header(BackupHeader),
    /// A range of the table the cluster listed when the backup started.
    Listed(RangeDescriptor),
    Range(RangeHeader),
    /// Bytes of the open range's snapshot.
    Chunk(#[serde(with = "serde_bytes")] Vec<u8>),
    RangeEnd(RangeEnd),
    End(BackupEnd),
}

impl Record {
    pub fn name(&self) -> &'static str {
        match self {
            Record::Header(_) => "Header",
            Record::Listed(_) => "Listed",
            Record::Range(_) => "Range",
            Record::Chunk(_) => "Chunk",
            Record::RangeEnd(_) => "RangeEnd",
            Record::End(_) => "End",
        }
    }
}

/// A record framed for the file: length, version byte and body, SHA-256.
pub(crate) fn encode_frame(record: &Record) -> Vec<u8> {
    let frame = vec![0u8, 0, 0, 0, FORMAT_VERSION];
    let mut frame = postcard::to_extend(record, frame).expect("encoding into a Vec cannot fail");
    let body_len = frame.len() - LENGTH_BYTES;
    assert!(
        body_len <= limits::BACKUP_RECORD_BYTES_MAX,
        "a backup record of {body_len} bytes exceeds the limit"
    );
    frame[..LENGTH_BYTES].copy_from_slice(&(body_len as u32).to_be_bytes());
    let digest = Sha256::digest(&frame);
    frame.extend_from_slice(&digest);
    frame
}

/// Why a frame's bytes do not decode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum FrameError {
    Checksum,
    UnknownVersion(u8),
    Body(String),
}

/// The record of a frame whose length prefix was `length` and whose body and digest are
/// `rest` (body, then `DIGEST_BYTES`).
pub(crate) fn decode_frame(length: [u8; LENGTH_BYTES], rest: &[u8]) -> Result<Record, FrameError> {
    let (body, digest) = rest.split_at(rest.len() - DIGEST_BYTES);
    let mut hasher = Sha256::new();
    hasher.update(length);
    hasher.update(body);
    if hasher.finalize().as_slice() != digest {
        return Err(FrameError::Checksum);
    }
    let Some((&version, body)) = body.split_first() else {
        return Err(FrameError::Body("an empty record".to_string()));
    };
    if !(FORMAT_VERSION_MIN..=FORMAT_VERSION).contains(&version) {
        return Err(FrameError::UnknownVersion(version));
    }
    let (record, trailing) =
        postcard::take_from_bytes(body).map_err(|e| FrameError::Body(e.to_string()))?;
    if !trailing.is_empty() {
        return Err(FrameError::Body(format!(
            "{} bytes after the record",
            trailing.len()
        )));
    }
    Ok(record)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(frame: &[u8]) -> Result<Record, FrameError> {
        let length: [u8; LENGTH_BYTES] = frame[..LENGTH_BYTES].try_into().unwrap();
        decode_frame(length, &frame[LENGTH_BYTES..])
    }

    #[test]
    fn frames_round_trip_and_carry_their_length_and_version() {
        let records = [
            Record::Chunk(vec![7; 1000]),
            Record::End(BackupEnd {
                ranges: 3,
                snapshot_bytes: 99,
                records: 12,
            }),
        ];
        for record in records {
            let frame = encode_frame(&record);
            let length = u32::from_be_bytes(frame[..4].try_into().unwrap()) as usize;
            assert_eq!(frame.len(), LENGTH_BYTES + length + DIGEST_BYTES);
            assert_eq!(frame[LENGTH_BYTES], FORMAT_VERSION);
            assert_eq!(decode(&frame), Ok(record));
        }
    }

    #[test]
    fn every_flipped_bit_is_caught() {
        let frame = encode_frame(&Record::Chunk(b"snapshot bytes".to_vec()));
        for bit in 0..(frame.len() - LENGTH_BYTES) * 8 {
            let mut damaged = frame.clone();
            damaged[LENGTH_BYTES + bit / 8] ^= 1 << (bit % 8);
            assert_eq!(decode(&damaged), Err(FrameError::Checksum), "bit {bit}");
        }
    }

    #[test]
    fn unknown_versions_and_trailing_bytes_are_refused() {
        let reframe = |body: Vec<u8>| {
            let mut frame = (body.len() as u32).to_be_bytes().to_vec();
            frame.extend_from_slice(&body);
            let digest = Sha256::digest(&frame);
            frame.extend_from_slice(&digest);
            frame
        };
        let frame = encode_frame(&Record::Chunk(vec![1, 2, 3]));
        let body = frame[LENGTH_BYTES..frame.len() - DIGEST_BYTES].to_vec();
        for version in [0, FORMAT_VERSION + 1] {
            let mut other = body.clone();
            other[0] = version;
            assert_eq!(
                decode(&reframe(other)),
                Err(FrameError::UnknownVersion(version))
            );
        }
        let mut longer = body.clone();
        longer.push(0);
        assert!(matches!(decode(&reframe(longer)), Err(FrameError::Body(_))));
        assert!(matches!(
            decode(&reframe(Vec::new())),
            Err(FrameError::Body(_))
        ));
    }
}
