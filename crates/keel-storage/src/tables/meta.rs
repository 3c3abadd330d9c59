//! The `meta` table (format 4): the meta range's (range 0's) table of the cluster, keyed by
//! kind then range or node id: range descriptors, nodes, (format 5) node states and the
//! range id allocator. No other range reads or writes it; `crate::meta` reads, plans and
//! writes its rows.

use redb::TableDefinition;

use super::Bytes;

pub(crate) const META: TableDefinition<Bytes, Bytes> = TableDefinition::new("meta");

/// Kinds of `meta` rows (the first byte of their key).
pub(crate) const META_RANGE: u8 = 1;
pub(crate) const META_NODE: u8 = 2;
pub(crate) const META_NEXT_RANGE_ID: u8 = 3;
/// Format 5: where a node stands (`NodeState`), by node id.
pub(crate) const META_NODE_STATE: u8 = 4;

/// Key of a `meta` row: its kind, then (for descriptors and nodes) the id, big-endian, so rows
/// of one kind sort by id.
pub(crate) fn meta_row_key(kind: u8, id: u64) -> [u8; 9] {
    let mut key = [0u8; 9];
    key[0] = kind;
    key[1..].copy_from_slice(&id.to_be_bytes());
    key
}
