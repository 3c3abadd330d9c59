//! Transactions: compares on keys and spans of one range, then one of two branches of ops
//! (reads, puts, span deletes, nested transactions) applied atomically at one revision, the
//! model of etcd's `Txn`. What needs no storage is decided here: whether a compare holds for
//! a span's rows, and which rows a read returns. Validation against the limits is in
//! `validate::check_txn`; applying is keel-storage's.
//!
//! Encodings of these types are persisted inside Raft log entries and request records
//! (format 11; format 12 gave puts their lease fields, `command::legacy` decodes the older
//! shape): variants and fields are only ever appended.

use std::cmp::Ordering;

use serde::{Deserialize, Serialize};

use crate::command::{KeyValue, RequestId};
use crate::ids::Revision;

/// The keys a compare, read or delete covers: the key alone (`end` unset), or the keys of
/// `[key, end)` where an empty `end` means every key from `key` on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TxnSpan {
    #[serde(with = "serde_bytes")]
    pub key: Vec<u8>,
    pub end: Option<serde_bytes::ByteBuf>,
}

impl TxnSpan {
    pub fn key(key: Vec<u8>) -> TxnSpan {
        TxnSpan { key, end: None }
    }

    pub fn range(key: Vec<u8>, end: Vec<u8>) -> TxnSpan {
        TxnSpan {
            key,
            end: Some(serde_bytes::ByteBuf::from(end)),
        }
    }

    /// The exclusive end of the span: `None` = unbounded.
    pub fn end(&self) -> Option<Vec<u8>> {
        match &self.end {
            None => Some(key_successor(&self.key)),
            Some(end) if end.is_empty() => None,
            Some(end) => Some(end.to_vec()),
        }
    }

    pub fn contains(&self, key: &[u8]) -> bool {
        match &self.end {
            None => key == self.key.as_slice(),
            Some(end) => key >= self.key.as_slice() && (end.is_empty() || key < end.as_slice()),
        }
    }

    /// Whether the two spans share a key.
    pub fn overlaps(&self, other: &TxnSpan) -> bool {
        let before = |a: &TxnSpan, b: &TxnSpan| a.end().is_some_and(|end| end <= b.key);
        !before(self, other) && !before(other, self)
    }
}

/// The smallest key after `key`.
fn key_successor(key: &[u8]) -> Vec<u8> {
    let mut next = key.to_vec();
    next.push(0);
    next
}

/// What a compare tests, and against which operand.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum CompareTarget {
    /// The value, byte-wise. Never holds for an absent key.
    Value(#[serde(with = "serde_bytes")] Vec<u8>),
    /// The key's version (0 = absent).
    Version(u64),
    /// The key's create revision (0 = absent).
    CreateRevision(Revision),
    /// The key's mod revision (0 = absent).
    ModRevision(Revision),
    /// (format 12) The etcd lease the key is attached to (0 = none, or absent).
    Lease(i64),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CompareResult {
    Equal,
    NotEqual,
    Greater,
    Less,
}

impl CompareResult {
    fn holds(self, ordering: Ordering) -> bool {
        match self {
            CompareResult::Equal => ordering == Ordering::Equal,
            CompareResult::NotEqual => ordering != Ordering::Equal,
            CompareResult::Greater => ordering == Ordering::Greater,
            CompareResult::Less => ordering == Ordering::Less,
        }
    }
}

/// One test of a transaction: `(key's target) result operand`, e.g. version == 0.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Compare {
    pub span: TxnSpan,
    pub result: CompareResult,
    pub target: CompareTarget,
}

impl Compare {
    /// Whether the compare holds for the live rows of its span: for every row, or, when the
    /// span has none, for an absent key (whose version and revisions are 0 and which has no
    /// value, so a value compare fails).
    pub fn holds(&self, rows: &[KeyValue]) -> bool {
        if rows.is_empty() {
            return self.holds_for(None);
        }
        rows.iter().all(|kv| self.holds_for(Some(kv)))
    }

    fn holds_for(&self, kv: Option<&KeyValue>) -> bool {
        let ordering = match (&self.target, kv) {
            (CompareTarget::Value(_), None) => return false,
            (CompareTarget::Value(operand), Some(kv)) => kv.value.as_slice().cmp(operand),
            (CompareTarget::Version(operand), kv) => kv.map_or(0, |kv| kv.version).cmp(operand),
            (CompareTarget::CreateRevision(operand), kv) => {
                kv.map_or(0, |kv| kv.create_revision).cmp(operand)
            }
            (CompareTarget::ModRevision(operand), kv) => {
                kv.map_or(0, |kv| kv.mod_revision).cmp(operand)
            }
            (CompareTarget::Lease(operand), kv) => kv.map_or(0, |kv| kv.lease).cmp(operand),
        };
        self.result.holds(ordering)
    }
}

/// What rows are ordered by before a read's limit is applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SortTarget {
    Key,
    Version,
    CreateRevision,
    ModRevision,
    Value,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sort {
    pub target: SortTarget,
    pub descending: bool,
}

/// Bounds on the revisions of the rows a read returns; 0 = no bound.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RevisionFilter {
    pub mod_revision_min: Revision,
    pub mod_revision_max: Revision,
    pub create_revision_min: Revision,
    pub create_revision_max: Revision,
}

impl RevisionFilter {
    fn keeps(&self, kv: &KeyValue) -> bool {
        let within = |value: Revision, min: Revision, max: Revision| {
            value >= min && (max == 0 || value <= max)
        };
        within(
            kv.mod_revision,
            self.mod_revision_min,
            self.mod_revision_max,
        ) && within(
            kv.create_revision,
            self.create_revision_min,
            self.create_revision_max,
        )
    }
}

/// A read of a span's live rows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TxnRead {
    pub span: TxnSpan,
    /// At most this many rows; 0 = all.
    pub limit: u64,
    /// Key order, ascending, when unset.
    pub sort: Option<Sort>,
    pub filter: RevisionFilter,
    /// Return rows without their values.
    pub keys_only: bool,
    /// Return the count alone.
    pub count_only: bool,
}

/// The answer to a read.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadResult {
    pub kvs: Vec<KeyValue>,
    /// How many live rows the span holds (before the revision filter and the limit).
    pub count: u64,
    /// More rows passed the filter than the limit let through.
    pub more: bool,
}

impl TxnRead {
    /// The answer from the live rows of the span, in key order.
    pub fn select(&self, rows: Vec<KeyValue>) -> ReadResult {
        let mut selection = Selection::new(self);
        selection.push(rows);
        selection.finish()
    }
}

/// A read's answer built from the span's live rows given in key order, a page at a time:
/// with a limit it holds at most about twice the limit of rows, so a read of a large span
/// with a small limit stays small.
pub struct Selection<'r> {
    read: &'r TxnRead,
    kvs: Vec<KeyValue>,
    /// Live rows pushed.
    count: u64,
    /// Of those, the ones the revision filter kept.
    passed: u64,
}

impl<'r> Selection<'r> {
    pub fn new(read: &'r TxnRead) -> Selection<'r> {
        Selection {
            read,
            kvs: Vec::new(),
            count: 0,
            passed: 0,
        }
    }

    /// Takes the next rows of the span, in key order after those pushed before.
    pub fn push(&mut self, rows: impl IntoIterator<Item = KeyValue>) {
        for mut kv in rows {
            self.count += 1;
            if !self.read.filter.keeps(&kv) {
                continue;
            }
            self.passed += 1;
            if self.read.count_only {
                continue;
            }
            if self.read.keys_only {
                kv.value = Vec::new();
            }
            self.kvs.push(kv);
        }
        let limit = self.limit();
        if limit > 0 && self.kvs.len() >= limit.saturating_mul(2) {
            self.trim();
        }
    }

    /// Bytes of keys and values held now.
    pub fn bytes(&self) -> usize {
        self.kvs
            .iter()
            .map(|kv| kv.key.len() + kv.value.len())
            .sum()
    }

    pub fn finish(mut self) -> ReadResult {
        self.trim();
        let limit = self.limit();
        ReadResult {
            kvs: self.kvs,
            count: self.count,
            more: limit > 0 && self.passed > limit as u64,
        }
    }

    fn limit(&self) -> usize {
        usize::try_from(self.read.limit).unwrap_or(usize::MAX)
    }

    /// Sorts the rows held (stably: rows equal under the target stay in key order) and keeps
    /// the first `limit`.
    fn trim(&mut self) {
        if let Some(sort) = self.read.sort {
            self.kvs.sort_by(|a, b| {
                let ordering = sort_key(sort.target, a, b);
                if sort.descending {
                    ordering.reverse()
                } else {
                    ordering
                }
            });
        }
        let limit = self.limit();
        if limit > 0 {
            self.kvs.truncate(limit);
        }
    }
}

fn sort_key(target: SortTarget, a: &KeyValue, b: &KeyValue) -> Ordering {
    match target {
        SortTarget::Key => a.key.cmp(&b.key),
        SortTarget::Version => a.version.cmp(&b.version),
        SortTarget::CreateRevision => a.create_revision.cmp(&b.create_revision),
        SortTarget::ModRevision => a.mod_revision.cmp(&b.mod_revision),
        SortTarget::Value => a.value.cmp(&b.value),
    }
}

/// A put inside a transaction.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TxnPut {
    #[serde(with = "serde_bytes")]
    pub key: Vec<u8>,
    #[serde(with = "serde_bytes")]
    pub value: Vec<u8>,
    /// From the instant the leader stamped into the command; `None` = no TTL.
    pub ttl_ms: Option<u64>,
    /// Return the key's state before the put.
    pub previous: bool,
    /// (format 12) The etcd lease to attach the key to (`crate::lease`; its namespace is the
    /// start of the key's pinned span); 0 detaches it from any lease, as etcd's put without
    /// a lease does.
    pub lease: i64,
    /// (format 12) Keep the key's value (`value` is empty); the key must exist.
    pub ignore_value: bool,
    /// (format 12) Keep the key's lease (`lease` is 0); the key must exist.
    pub ignore_lease: bool,
}

/// A delete of every live key of a span.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TxnDelete {
    pub span: TxnSpan,
    /// Return the deleted rows.
    pub previous: bool,
}

/// One op of a branch. Each sees the effects of the ops before it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum TxnOp {
    Read(TxnRead),
    Put(TxnPut),
    Delete(TxnDelete),
    Txn(Box<Txn>),
}

/// Compares, then `success` if every compare holds, else `failure`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Txn {
    pub compares: Vec<Compare>,
    pub success: Vec<TxnOp>,
    pub failure: Vec<TxnOp>,
}

impl Txn {
    /// Every op in both branches, nested ones included, and the nesting depth (1 = none).
    pub fn size(&self) -> (usize, usize) {
        let mut ops = 0;
        let mut depth = 1;
        for op in self.success.iter().chain(&self.failure) {
            ops += 1;
            if let TxnOp::Txn(nested) = op {
                let (nested_ops, nested_depth) = nested.size();
                ops += nested_ops;
                depth = depth.max(nested_depth + 1);
            }
        }
        (ops, depth)
    }

    /// Every key or span the transaction names, compares included: all must lie in the
    /// range that applies it.
    pub fn spans(&self) -> Vec<TxnSpan> {
        let mut spans: Vec<TxnSpan> = self.compares.iter().map(|c| c.span.clone()).collect();
        for op in self.success.iter().chain(&self.failure) {
            match op {
                TxnOp::Read(read) => spans.push(read.span.clone()),
                TxnOp::Put(put) => spans.push(TxnSpan::key(put.key.clone())),
                TxnOp::Delete(delete) => spans.push(delete.span.clone()),
                TxnOp::Txn(nested) => spans.extend(nested.spans()),
            }
        }
        spans
    }
}

/// A client's transaction as the leader proposes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TxnMutation {
    /// `None`: applied without deduplication.
    pub request: Option<RequestId>,
    /// The leader's clock when it proposed the command (see `Mutation::now_ms`).
    pub now_ms: u64,
    pub txn: Txn,
}

/// What one op of the branch taken did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum TxnOpResult {
    Read(ReadResult),
    Put {
        previous: Option<KeyValue>,
    },
    Delete {
        deleted: u64,
        previous: Vec<KeyValue>,
    },
    Txn(TxnResult),
}

/// Which branch ran, and what each of its ops did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TxnResult {
    pub succeeded: bool,
    pub results: Vec<TxnOpResult>,
}

#[cfg(test)]
mod tests;
