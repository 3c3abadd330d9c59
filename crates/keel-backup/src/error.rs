//! The backup file's error type. Every variant names the file; corruption also names the
//! byte offset of the record at fault.

use std::io;
use std::path::PathBuf;

use thiserror::Error;

/// Everything that can go wrong reading or writing a backup file.
#[derive(Debug, Error)]
pub enum BackupError {
    /// A file operation failed.
    #[error("I/O error on {}: {source}", .path.display())]
    Io { path: PathBuf, source: io::Error },

    /// The file does not start with the backup magic.
    #[error("{} is not a Keel backup file (it does not start with \"KEELBKUP\")", .path.display())]
    NotABackup { path: PathBuf },

    /// The file ends before its `End` record.
    #[error("{} is truncated at byte {offset}, {detail}", .path.display())]
    Truncated {
        path: PathBuf,
        offset: u64,
        detail: String,
    },

    /// A record is damaged or out of place.
    #[error("{} is corrupt at byte {offset}: {detail}", .path.display())]
    Corrupt {
        path: PathBuf,
        offset: u64,
        detail: String,
    },

    /// A record carries a format version this build does not know.
    #[error(
        "{} has a record of format version {version} at byte {offset}; this build reads versions up to {known}",
        .path.display()
    )]
    UnknownVersion {
        path: PathBuf,
        offset: u64,
        version: u8,
        known: u8,
    },

    /// The writer was asked to finish a backup that would not restore the whole keyspace, or
    /// a range's bytes differ from what its header announced.
    #[error("backup {} is incomplete: {detail}", .path.display())]
    Incomplete { path: PathBuf, detail: String },
}

impl BackupError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: io::Error) -> BackupError {
        BackupError::Io {
            path: path.into(),
            source,
        }
    }
}
