//! Checks of a transaction against the limits: its size and nesting, every key, span, value
//! and TTL in it, and etcd's rule that one branch never writes a key twice (a put's key is
//! put once and lies in no span the branch deletes; a nested transaction counts with both
//! of its branches).

use crate::error::KvError;
use crate::limits::{self, human_bytes};
use crate::pinned::pinned_span;
use crate::txn::{CompareTarget, Txn, TxnOp, TxnPut, TxnSpan};

use super::{check_key, check_ttl_ms, check_value, show_key};

/// Checks `txn` and everything in it.
pub fn check_txn(txn: &Txn) -> Result<(), KvError> {
    let (ops, depth) = txn.size();
    if ops > limits::TXN_OPS_MAX {
        return Err(KvError::invalid(format!(
            "transaction has {ops} ops (both branches and nested transactions count); limit is {}",
            limits::TXN_OPS_MAX
        )));
    }
    if depth > limits::TXN_DEPTH_MAX {
        return Err(KvError::invalid(format!(
            "transaction nests {depth} deep; limit is {}",
            limits::TXN_DEPTH_MAX
        )));
    }
    let compares = count_compares(txn);
    if compares > limits::TXN_COMPARES_MAX {
        return Err(KvError::invalid(format!(
            "transaction has {compares} compares (nested ones count); limit is {}",
            limits::TXN_COMPARES_MAX
        )));
    }
    let bytes = check_parts(txn)?;
    if bytes > limits::BATCH_BYTES_MAX {
        return Err(KvError::invalid(format!(
            "transaction is {}; limit is {}",
            human_bytes(bytes),
            human_bytes(limits::BATCH_BYTES_MAX)
        )));
    }
    writes_once(txn).map(|_| ())
}

fn count_compares(txn: &Txn) -> usize {
    let nested = txn.success.iter().chain(&txn.failure).map(|op| match op {
        TxnOp::Txn(nested) => count_compares(nested),
        _ => 0,
    });
    txn.compares.len() + nested.sum::<usize>()
}

/// Checks every compare and op; returns the bytes of keys, values and compared values.
fn check_parts(txn: &Txn) -> Result<usize, KvError> {
    let mut bytes = 0;
    for compare in &txn.compares {
        bytes += check_span(&compare.span)?;
        if let CompareTarget::Value(value) = &compare.target {
            check_value(&compare.span.key, value)?;
            bytes += value.len();
        }
    }
    for op in txn.success.iter().chain(&txn.failure) {
        bytes += match op {
            TxnOp::Read(read) => check_span(&read.span)?,
            TxnOp::Delete(delete) => check_span(&delete.span)?,
            TxnOp::Put(put) => check_put(put)?,
            TxnOp::Txn(nested) => check_parts(nested)?,
        };
    }
    Ok(bytes)
}

/// Checks a put's key, value and TTL and etcd's rules for its lease fields (a lease only for
/// a key of a pinned namespace and without a TTL; `ignore_value` with no value and
/// `ignore_lease` with no lease); returns the bytes of key and value.
fn check_put(put: &TxnPut) -> Result<usize, KvError> {
    check_key(&put.key)?;
    check_value(&put.key, &put.value)?;
    if let Some(ttl_ms) = put.ttl_ms {
        check_ttl_ms(&put.key, i64::try_from(ttl_ms).unwrap_or(i64::MAX))?;
    }
    let refusal = if put.lease < 0 {
        Some(format!("lease {} is below 0; 0 means none", put.lease))
    } else if put.lease != 0 && pinned_span(&put.key).is_none() {
        Some("only a key of a pinned namespace such as \"etcd/\" takes a lease".to_string())
    } else if put.lease != 0 && put.ttl_ms.is_some() {
        Some("a key attached to a lease takes no TTL".to_string())
    } else if put.ignore_lease && put.lease != 0 {
        Some("ignore_lease keeps the key's lease, so the put names none".to_string())
    } else if put.ignore_value && !put.value.is_empty() {
        Some("ignore_value keeps the key's value, so the put carries none".to_string())
    } else {
        None
    };
    match refusal {
        Some(why) => Err(KvError::invalid(format!(
            "{why} (key {})",
            show_key(&put.key)
        ))),
        None => Ok(put.key.len() + put.value.len()),
    }
}

/// Checks a span's key and end; returns their bytes.
fn check_span(span: &TxnSpan) -> Result<usize, KvError> {
    check_key(&span.key)?;
    let Some(end) = &span.end else {
        return Ok(span.key.len());
    };
    if !end.is_empty() && end.as_slice() <= span.key.as_slice() {
        return Err(KvError::invalid(format!(
            "span end {} is not after its key {}; an empty end means every key from the key on",
            show_key(end),
            show_key(&span.key)
        )));
    }
    if end.len() > limits::KEY_BYTES_MAX + 1 {
        return Err(KvError::invalid(format!(
            "span end is {}; limit is {} (key {})",
            human_bytes(end.len()),
            human_bytes(limits::KEY_BYTES_MAX + 1),
            show_key(&span.key)
        )));
    }
    Ok(span.key.len() + end.len())
}

/// The writes one run of `txn` may make, whichever branches run: (put keys, delete spans).
type Writes = (Vec<Vec<u8>>, Vec<TxnSpan>);

/// Checks that neither branch writes a key twice; returns the writes of both.
fn writes_once(txn: &Txn) -> Result<Writes, KvError> {
    let success = branch_writes(&txn.success)?;
    let failure = branch_writes(&txn.failure)?;
    let mut puts = success.0;
    puts.extend(failure.0);
    puts.sort();
    puts.dedup();
    let mut deletes = success.1;
    deletes.extend(failure.1);
    Ok((puts, deletes))
}

fn branch_writes(ops: &[TxnOp]) -> Result<Writes, KvError> {
    let mut puts: Vec<Vec<u8>> = Vec::new();
    let mut deletes: Vec<TxnSpan> = Vec::new();
    for op in ops {
        let (op_puts, op_deletes) = match op {
            TxnOp::Read(_) => continue,
            TxnOp::Put(put) => (vec![put.key.clone()], Vec::new()),
            TxnOp::Delete(delete) => (Vec::new(), vec![delete.span.clone()]),
            TxnOp::Txn(nested) => writes_once(nested)?,
        };
        for key in &op_puts {
            if puts.contains(key) {
                return Err(twice(key));
            }
        }
        puts.extend(op_puts);
        deletes.extend(op_deletes);
    }
    for key in &puts {
        if deletes.iter().any(|span| span.contains(key)) {
            return Err(twice(key));
        }
    }
    Ok((puts, deletes))
}

fn twice(key: &[u8]) -> KvError {
    KvError::invalid(format!(
        "transaction writes key {} twice in one branch (a put and another put or a delete)",
        show_key(key)
    ))
}
