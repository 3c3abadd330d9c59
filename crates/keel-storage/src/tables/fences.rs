//! The `fences` table (format 3): the `Fence` of each fenced user key (the lock and the
//! highest token accepted), keyed by user key and shared by span like `kv`. Every write goes
//! through `write_fence`, which keeps the range's counts in step.

use keel_types::Fence;
use redb::{Table, TableDefinition};

use super::Bytes;
use super::keyed_rows::RowCounts;
use crate::codec::encode;
use crate::error::StorageError;

pub(crate) const FENCES: TableDefinition<Bytes, Bytes> = TableDefinition::new("fences");

/// Writes the fence row of a user key (or removes it, for `None`) and keeps the range's
/// counts (`counts`: fenced keys and coordination bytes) in step.
pub(crate) fn write_fence(
    fences: &mut Table<Bytes, Bytes>,
    mut counts: RowCounts,
    key: &[u8],
    after: Option<&Fence>,
) -> Result<(), StorageError> {
    let encoded = after.map(encode);
    let old = match &encoded {
        Some(value) => fences.insert(key, value.as_slice()),
        None => fences.remove(key),
    }
    .map_err(|e| StorageError::redb("write fence", e))?
    .map(|old| old.value().len());
    counts.replace(key, old, encoded.as_ref().map(Vec::len), "fence");
    Ok(())
}
