//! The `idempotency` table (format 3): each `IdempotencyRecord`, keyed by
//! `idempotency_key(scope, id)`, which routes to a range like a user key, so the table is
//! shared by span like `kv`. Every write goes through `write_deadlined`, which keeps the
//! record's `deadlines` row (when it expires) and the range's counts in step.

use keel_types::IdempotencyRecord;
use redb::TableDefinition;

use super::Bytes;
use super::deadlines::{DEADLINE_IDEMPOTENCY, Deadlined};

pub(crate) const IDEMPOTENCY: TableDefinition<Bytes, Bytes> = TableDefinition::new("idempotency");

impl Deadlined for IdempotencyRecord {
    const KIND: u8 = DEADLINE_IDEMPOTENCY;
    const WHAT: &'static str = "idempotency record";
    fn deadline_ms(&self) -> u64 {
        self.expires_at_ms()
    }
}
