//! `Tables`: the tables an apply writes (and a split the apply carries out), open at once in
//! its write transaction, so the steps of an apply pass one value around.

use redb::{Table, WriteTransaction};

use super::Bytes;
use super::{
    DEADLINES, FENCES, HISTORY, IDEMPOTENCY, KV, LEASE_KEYS, LEASES, LOCKS, REQUESTS, SESSIONS,
    SM_META, TTL,
};
use crate::error::StorageError;

/// The tables an apply writes, open in its transaction.
pub(crate) struct Tables<'txn> {
    /// For the tables only a split or a meta command touches.
    pub txn: &'txn WriteTransaction,
    pub sm_meta: Table<'txn, Bytes, Bytes>,
    pub kv: Table<'txn, Bytes, Bytes>,
    pub ttl: Table<'txn, Bytes, Bytes>,
    pub sessions: Table<'txn, Bytes, Bytes>,
    pub requests: Table<'txn, Bytes, Bytes>,
    pub locks: Table<'txn, Bytes, Bytes>,
    pub fences: Table<'txn, Bytes, Bytes>,
    pub idempotency: Table<'txn, Bytes, Bytes>,
    pub deadlines: Table<'txn, Bytes, Bytes>,
    pub leases: Table<'txn, Bytes, Bytes>,
    pub lease_keys: Table<'txn, Bytes, Bytes>,
    pub history: Table<'txn, (u64, Bytes), Bytes>,
}

impl<'txn> Tables<'txn> {
    pub fn open(txn: &'txn WriteTransaction) -> Result<Tables<'txn>, StorageError> {
        let open = |table, name| {
            txn.open_table(table)
                .map_err(|e| StorageError::redb(name, e))
        };
        Ok(Tables {
            txn,
            sm_meta: open(SM_META, "open sm_meta")?,
            kv: open(KV, "open kv")?,
            ttl: open(TTL, "open ttl")?,
            sessions: open(SESSIONS, "open sessions")?,
            requests: open(REQUESTS, "open requests")?,
            locks: open(LOCKS, "open locks")?,
            fences: open(FENCES, "open fences")?,
            idempotency: open(IDEMPOTENCY, "open idempotency")?,
            deadlines: open(DEADLINES, "open deadlines")?,
            leases: open(LEASES, "open leases")?,
            lease_keys: open(LEASE_KEYS, "open lease_keys")?,
            history: txn
                .open_table(HISTORY)
                .map_err(|e| StorageError::redb("open history", e))?,
        })
    }
}
