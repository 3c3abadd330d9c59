//! What the tables keyed by user key, lock name or idempotency key alone share (`locks`,
//! `fences`, `idempotency`; `count_rows` also serves quotas): reading a row, counting a
//! span's rows and their bytes, and the counts a write keeps in step (`RowCounts`: its
//! table's rows and the range's `SmState::coordination_bytes`).

use redb::ReadableTable;

use super::Bytes;
use super::span::KeySpan;
use crate::codec::decode;
use crate::error::StorageError;

/// Reads and decodes the row of `key`, if any.
pub(crate) fn read_row<T, R>(
    table: &R,
    key: &[u8],
    what: &'static str,
) -> Result<Option<T>, StorageError>
where
    T: serde::de::DeserializeOwned,
    R: ReadableTable<Bytes, Bytes>,
{
    let row = table
        .get(key)
        .map_err(|e| StorageError::redb("read row", e))?;
    row.map(|value| decode(what, value.value())).transpose()
}

/// Rows of `table` (keyed by user key, lock name or idempotency key) within `span`, and
/// their bytes (`row_bytes`).
pub(crate) fn count_rows<R>(table: &R, span: &KeySpan) -> Result<(u64, u64), StorageError>
where
    R: ReadableTable<Bytes, Bytes>,
{
    let (mut count, mut bytes) = (0, 0);
    for row in table
        .range::<&[u8]>(span.bounds())
        .map_err(|e| StorageError::redb("count rows", e))?
    {
        let (key, value) = row.map_err(|e| StorageError::redb("count rows", e))?;
        count += 1;
        bytes += row_bytes(key.value(), value.value().len());
    }
    Ok((count, bytes))
}

/// What a row of `locks`, `fences` or `idempotency` adds to `SmState::coordination_bytes`:
/// its name or key and its stored value.
pub(crate) fn row_bytes(key: &[u8], stored_len: usize) -> u64 {
    (key.len() + stored_len) as u64
}

/// The counts a write of a `locks`, `fences` or `idempotency` row keeps in step: the rows of
/// its table and the bytes of all three (`SmState::coordination_bytes`).
pub(crate) struct RowCounts<'a> {
    pub rows: &'a mut u64,
    pub bytes: &'a mut u64,
}

impl RowCounts<'_> {
    /// Counts a row of `key` going from a stored value of `before` bytes (if any) to one of
    /// `after` bytes.
    pub fn replace(&mut self, key: &[u8], before: Option<usize>, after: Option<usize>, what: &str) {
        let bytes = |stored: Option<usize>| stored.map_or(0, |len| row_bytes(key, len));
        *self.bytes = (*self.bytes + bytes(after))
            .checked_sub(bytes(before))
            .unwrap_or_else(|| panic!("the range's byte count covers its {what} rows"));
        *self.rows = adjust_count(*self.rows, before.is_some(), after.is_some(), what);
    }
}

/// Counts that nothing reads, for writes whose counts are kept elsewhere (an install's).
#[derive(Debug, Default)]
pub(crate) struct Uncounted {
    rows: u64,
    bytes: u64,
}

impl Uncounted {
    pub fn counts(&mut self) -> RowCounts<'_> {
        RowCounts {
            rows: &mut self.rows,
            bytes: &mut self.bytes,
        }
    }
}

/// A count of rows after one row went from present (`before`) to present (`after`) or not.
fn adjust_count(count: u64, before: bool, after: bool, what: &str) -> u64 {
    match (before, after) {
        (false, true) => count + 1,
        (true, false) => count
            .checked_sub(1)
            .unwrap_or_else(|| panic!("the range's {what} count covers its {what} rows")),
        _ => count,
    }
}
