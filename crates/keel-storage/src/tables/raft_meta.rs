//! The `raft_meta` table: each range's Raft state besides its log, one row per kind, keyed
//! by range id then kind (`meta_key`): the vote and the last purged log id.

use redb::TableDefinition;

use super::Bytes;

pub(crate) const RAFT_META: TableDefinition<Bytes, Bytes> = TableDefinition::new("raft_meta");

/// Kinds of `raft_meta` rows.
pub(crate) const RAFT_VOTE: u8 = 1;
// 2 held the committed log id, written by builds before 2026-12; it is neither written nor read.
pub(crate) const RAFT_PURGED: u8 = 3;
