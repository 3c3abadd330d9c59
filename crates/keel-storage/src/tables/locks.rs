//! The `locks` table (format 3): each lock's `LockHold`, keyed by lock name. A lock name
//! routes to a range like a user key, so the ranges of a file share the table and filter it
//! by span. Every write goes through `write_deadlined`, which keeps the lock's `deadlines`
//! row (when it becomes free) and the range's counts in step.

use keel_types::LockHold;
use redb::TableDefinition;

use super::Bytes;
use super::deadlines::{DEADLINE_LOCK, Deadlined};

pub(crate) const LOCKS: TableDefinition<Bytes, Bytes> = TableDefinition::new("locks");

impl Deadlined for LockHold {
    const KIND: u8 = DEADLINE_LOCK;
    const WHAT: &'static str = "lock";
    fn deadline_ms(&self) -> u64 {
        self.available_at_ms()
    }
}
