//! `Tables`: the tables an apply writes (and a split the apply carries out), each opened in
//! its write transaction the first time a step needs it, so the steps of an apply pass one
//! value around and pay only for the tables they touch.
//!
//! Opening a table costs a lookup in redb's table of tables, and the commit looks every
//! opened table up once more. A put opens 5 of these 12 (`sm_meta`, `kv` with the `ttl` and
//! `lease_keys` indexes its writes keep, `history`), 7 with a request id (`sessions`,
//! `requests`). With the rows of `sm_meta` it rewrites only when changed
//! (`write_sm_state_since`), a one-put apply transaction runs about a fifth fewer
//! instructions than with every table open and every row rewritten (docs/BENCHMARKS.md).

use redb::{Key, Table, TableDefinition, Value, WriteTransaction};

use super::Bytes;
use super::{
    DEADLINES, FENCES, HISTORY, IDEMPOTENCY, KV, LEASE_KEYS, LEASES, LOCKS, REQUESTS, SESSIONS,
    SM_META, TTL,
};
use crate::error::StorageError;

/// The tables an apply writes, each opened in its transaction on first use (`Lazy::table`).
pub(crate) struct Tables<'txn> {
    /// For the tables only a split or a meta command touches.
    pub txn: &'txn WriteTransaction,
    pub sm_meta: Lazy<'txn, Bytes, Bytes>,
    pub kv: Lazy<'txn, Bytes, Bytes>,
    pub ttl: Lazy<'txn, Bytes, Bytes>,
    pub sessions: Lazy<'txn, Bytes, Bytes>,
    pub requests: Lazy<'txn, Bytes, Bytes>,
    pub locks: Lazy<'txn, Bytes, Bytes>,
    pub fences: Lazy<'txn, Bytes, Bytes>,
    pub idempotency: Lazy<'txn, Bytes, Bytes>,
    pub deadlines: Lazy<'txn, Bytes, Bytes>,
    pub leases: Lazy<'txn, Bytes, Bytes>,
    pub lease_keys: Lazy<'txn, Bytes, Bytes>,
    pub history: Lazy<'txn, (u64, Bytes), Bytes>,
}

impl<'txn> Tables<'txn> {
    /// Opens nothing yet.
    pub fn open(txn: &'txn WriteTransaction) -> Tables<'txn> {
        Tables {
            txn,
            sm_meta: Lazy::new(txn, SM_META, "open sm_meta"),
            kv: Lazy::new(txn, KV, "open kv"),
            ttl: Lazy::new(txn, TTL, "open ttl"),
            sessions: Lazy::new(txn, SESSIONS, "open sessions"),
            requests: Lazy::new(txn, REQUESTS, "open requests"),
            locks: Lazy::new(txn, LOCKS, "open locks"),
            fences: Lazy::new(txn, FENCES, "open fences"),
            idempotency: Lazy::new(txn, IDEMPOTENCY, "open idempotency"),
            deadlines: Lazy::new(txn, DEADLINES, "open deadlines"),
            leases: Lazy::new(txn, LEASES, "open leases"),
            lease_keys: Lazy::new(txn, LEASE_KEYS, "open lease_keys"),
            history: Lazy::new(txn, HISTORY, "open history"),
        }
    }

    /// `kv`, `ttl` and `lease_keys`, opened if no step opened them before: what a kv write
    /// takes.
    pub fn kv_tables(&mut self) -> Result<KvTables<'_, 'txn>, StorageError> {
        Ok((
            self.kv.table()?,
            self.ttl.table()?,
            self.lease_keys.table()?,
        ))
    }
}

/// The `kv` table with the `ttl` and `lease_keys` indexes its writes keep (`write_kv`).
pub(crate) type KvTables<'a, 'txn> = (
    &'a mut Table<'txn, Bytes, Bytes>,
    &'a mut Table<'txn, Bytes, Bytes>,
    &'a mut Table<'txn, Bytes, Bytes>,
);

/// One table of `Tables`: opened in the transaction the first time `table` is called, and
/// kept open until the `Tables` is dropped.
pub(crate) struct Lazy<'txn, K: Key + 'static, V: Value + 'static> {
    txn: &'txn WriteTransaction,
    definition: TableDefinition<'static, K, V>,
    what: &'static str,
    table: Option<Table<'txn, K, V>>,
}

impl<'txn, K: Key + 'static, V: Value + 'static> Lazy<'txn, K, V> {
    fn new(
        txn: &'txn WriteTransaction,
        definition: TableDefinition<'static, K, V>,
        what: &'static str,
    ) -> Self {
        Lazy {
            txn,
            definition,
            what,
            table: None,
        }
    }

    /// The table, opened now if no step opened it before.
    pub fn table(&mut self) -> Result<&mut Table<'txn, K, V>, StorageError> {
        Ok(match self.table {
            Some(ref mut table) => table,
            None => {
                let table = (self.txn.open_table(self.definition))
                    .map_err(|e| StorageError::redb(self.what, e))?;
                self.table.insert(table)
            }
        })
    }
}
