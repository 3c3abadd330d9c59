//! Deciding a transaction (`keel_types::txn`) against a range's rows: its compares, then the
//! ops of the branch they choose, in order, each seeing the writes of the ops before it.
//! Produces the writes to make at the next revision and the result; writes nothing itself
//! (`apply` executes the plan like any write). Knows nothing about sessions, spans of ranges
//! or threads.
//!
//! Work is bounded: the live rows the compares, reads and deletes cover count against
//! `limits::TXN_ROWS_MAX` and the rows the reads and deletes return against
//! `limits::TXN_RESULT_BYTES_MAX`; passing either refuses the whole transaction
//! (`Rejection::TxnTooLarge`), the same way on every replica. A put that keeps the value or
//! lease of an absent key refuses it too (`Rejection::KeyNotFound`); whether the leases its
//! puts name exist and have room is `apply::lease`'s to check, against the lease tables.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;

use keel_types::txn::{Compare, ReadResult, Txn, TxnOp, TxnOpResult, TxnPut, TxnResult, TxnSpan};
use keel_types::{BatchOp, KeyValue, Rejection, Revision, limits};
use redb::ReadableTable;

use super::{op_after, read_kv};
use crate::error::StorageError;
use crate::tables::{self, Bytes};

/// What a transaction does, decided before anything is written.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum TxnPlan {
    Rejected(Rejection),
    /// Write `writes` (`None` = delete) at the next revision; nothing when empty. `leased`:
    /// the keys whose put named their lease, which must exist and be unexpired
    /// (`lease::check_attachments`).
    Apply {
        result: TxnResult,
        writes: BTreeMap<Vec<u8>, Option<KeyValue>>,
        leased: BTreeSet<Vec<u8>>,
    },
}

/// Decides `txn` against the rows of `kv` at `revision` and clock `clock_ms` (a key expired
/// at it counts as absent).
pub(crate) fn plan_txn<R>(
    txn: &Txn,
    kv: &R,
    revision: Revision,
    clock_ms: u64,
) -> Result<TxnPlan, StorageError>
where
    R: ReadableTable<Bytes, Bytes>,
{
    let mut run = Run {
        kv,
        next: revision + 1,
        clock_ms,
        writes: BTreeMap::new(),
        leased: BTreeSet::new(),
        rows: 0,
        bytes: 0,
    };
    match run.txn(txn)? {
        Ok(result) => Ok(TxnPlan::Apply {
            result,
            writes: run.writes,
            leased: run.leased,
        }),
        Err(rejection) => Ok(TxnPlan::Rejected(rejection)),
    }
}

/// A step of the run: its result, or the rejection that refuses the whole transaction (a
/// limit of `limits::TXN_*` passed, a put that keeps what an absent key lacks).
type Step<T> = Result<Result<T, Rejection>, StorageError>;

/// `Rejection::TxnTooLarge` at the span starting at `key`.
fn too_large(key: &[u8]) -> Rejection {
    Rejection::TxnTooLarge { key: key.to_vec() }
}

struct Run<'r, R> {
    kv: &'r R,
    next: Revision,
    clock_ms: u64,
    /// Every key written so far: its state after (`None` = deleted).
    writes: BTreeMap<Vec<u8>, Option<KeyValue>>,
    /// The keys of puts that named a lease.
    leased: BTreeSet<Vec<u8>>,
    /// Live rows covered so far.
    rows: usize,
    /// Bytes of the rows returned so far.
    bytes: usize,
}

impl<R> Run<'_, R>
where
    R: ReadableTable<Bytes, Bytes>,
{
    fn txn(&mut self, txn: &Txn) -> Step<TxnResult> {
        let mut succeeded = true;
        for compare in &txn.compares {
            match self.compare(compare)? {
                Ok(true) => {}
                Ok(false) => succeeded = false,
                Err(rejection) => return Ok(Err(rejection)),
            }
        }
        let branch = if succeeded {
            &txn.success
        } else {
            &txn.failure
        };
        let mut results = Vec::with_capacity(branch.len());
        for op in branch {
            match self.op(op)? {
                Ok(result) => results.push(result),
                Err(rejection) => return Ok(Err(rejection)),
            }
        }
        Ok(Ok(TxnResult { succeeded, results }))
    }

    fn compare(&mut self, compare: &Compare) -> Step<bool> {
        Ok(self
            .live_rows(&compare.span)?
            .map(|rows| compare.holds(&rows)))
    }

    fn op(&mut self, op: &TxnOp) -> Step<TxnOpResult> {
        match op {
            TxnOp::Read(read) => {
                let rows = match self.live_rows(&read.span)? {
                    Ok(rows) => rows,
                    Err(too_large) => return Ok(Err(too_large)),
                };
                let result: ReadResult = read.select(rows);
                Ok(self
                    .returned(&read.span, &result.kvs)
                    .map(|()| TxnOpResult::Read(result)))
            }
            TxnOp::Put(put) => {
                let current = self.current(&put.key)?;
                let after = match put_after(put, current.as_ref(), self.next, self.clock_ms) {
                    Ok(after) => after,
                    Err(rejection) => return Ok(Err(rejection)),
                };
                if put.lease != 0 {
                    self.leased.insert(put.key.clone());
                }
                self.writes.insert(put.key.clone(), Some(after));
                let previous = current.filter(|_| put.previous);
                let span = TxnSpan::key(put.key.clone());
                Ok(self
                    .returned(&span, previous.as_slice())
                    .map(|()| TxnOpResult::Put { previous }))
            }
            TxnOp::Delete(delete) => {
                let rows = match self.live_rows(&delete.span)? {
                    Ok(rows) => rows,
                    Err(too_large) => return Ok(Err(too_large)),
                };
                for row in &rows {
                    self.writes.insert(row.key.clone(), None);
                }
                let deleted = rows.len() as u64;
                let previous = if delete.previous { rows } else { Vec::new() };
                Ok(self
                    .returned(&delete.span, &previous)
                    .map(|()| TxnOpResult::Delete { deleted, previous }))
            }
            TxnOp::Txn(nested) => Ok(self.txn(nested)?.map(TxnOpResult::Txn)),
        }
    }

    /// The key's state now: written by an earlier op, else stored; absent when expired.
    fn current(&self, key: &[u8]) -> Result<Option<KeyValue>, StorageError> {
        let current = match self.writes.get(key) {
            Some(written) => written.clone(),
            None => read_kv(self.kv, key)?,
        };
        Ok(current.filter(|kv| !kv.is_expired(self.clock_ms)))
    }

    /// The live rows of `span` in key order, the writes of earlier ops included, counted
    /// against `TXN_ROWS_MAX` (a scan also stops once it has examined four times that many
    /// stored rows, expired ones included).
    fn live_rows(&mut self, span: &TxnSpan) -> Step<Vec<KeyValue>> {
        if span.end.is_none() {
            let rows: Vec<KeyValue> = self.current(&span.key)?.into_iter().collect();
            return Ok(self.covered(span, rows));
        }
        let end = span.end();
        let bounds = (
            Bound::Included(span.key.as_slice()),
            end.as_deref().map_or(Bound::Unbounded, Bound::Excluded),
        );
        let mut rows = BTreeMap::new();
        let stored = self
            .kv
            .range::<&[u8]>(bounds)
            .map_err(|e| StorageError::redb("read kv span", e))?;
        for (examined, row) in stored.enumerate() {
            let too_many = self.rows + rows.len() > limits::TXN_ROWS_MAX
                || examined >= limits::TXN_ROWS_MAX * 4;
            if too_many {
                return Ok(Err(too_large(&span.key)));
            }
            let (key, value) = row.map_err(|e| StorageError::redb("read kv span", e))?;
            if self.writes.contains_key(key.value()) {
                continue;
            }
            let kv = tables::decode_kv(key.value(), value.value())?;
            if !kv.is_expired(self.clock_ms) {
                rows.insert(kv.key.clone(), kv);
            }
        }
        for (key, written) in self.writes.range::<[u8], _>(bounds) {
            if let Some(kv) = written {
                rows.insert(key.clone(), kv.clone());
            }
        }
        Ok(self.covered(span, rows.into_values().collect()))
    }

    /// Counts `rows` as covered; refused when that passes `TXN_ROWS_MAX`.
    fn covered(&mut self, span: &TxnSpan, rows: Vec<KeyValue>) -> Result<Vec<KeyValue>, Rejection> {
        self.rows += rows.len();
        if self.rows > limits::TXN_ROWS_MAX {
            return Err(too_large(&span.key));
        }
        Ok(rows)
    }

    /// Counts rows an op returns against `TXN_RESULT_BYTES_MAX`.
    fn returned(&mut self, span: &TxnSpan, rows: &[KeyValue]) -> Result<(), Rejection> {
        self.bytes += rows
            .iter()
            .map(|kv| kv.key.len() + kv.value.len())
            .sum::<usize>();
        if self.bytes > limits::TXN_RESULT_BYTES_MAX {
            return Err(too_large(&span.key));
        }
        Ok(())
    }
}

/// The key's state after `put` over `current` (its live state) at revision `next`: a put
/// as `apply::op_after` makes it, attached to `put.lease`, keeping the current value for
/// `ignore_value` and the current lease for `ignore_lease`, which need the key to exist
/// (`KeyNotFound`, as etcd answers).
fn put_after(
    put: &TxnPut,
    current: Option<&KeyValue>,
    next: Revision,
    clock_ms: u64,
) -> Result<KeyValue, Rejection> {
    let keeps = put.ignore_value || put.ignore_lease;
    if keeps && current.is_none() {
        return Err(Rejection::KeyNotFound {
            key: put.key.clone(),
        });
    }
    let kept = |ignore: bool| current.filter(|_| ignore);
    let value = kept(put.ignore_value).map_or(&put.value, |kv| &kv.value);
    let op = BatchOp::Put {
        key: put.key.clone(),
        value: value.clone(),
        condition: None,
        return_previous: false,
        ttl_ms: put.ttl_ms,
    };
    let (after, _) = op_after(&op, 0, current, next, clock_ms).expect("a put is never refused");
    let after = after.expect("a put stores a row");
    let lease = kept(put.ignore_lease).map_or(put.lease, |kv| kv.lease);
    Ok(KeyValue { lease, ..after })
}
