//! Checks of client input against `limits`. Every public entry point calls these before it
//! does anything, so bad input changes nothing. Messages name the thing and the limit.
//! Limits on keys and names count the bytes after a tenant's prefix (`tenant`), and
//! messages show them without it, as the tenant named them.

use crate::command::{BatchOp, Condition, ReadBound};
use crate::coordination::{Fence, idempotency_key};
use crate::error::KvError;
use crate::ids::Revision;
use crate::limits::{self, human_bytes};
use crate::tenant::namespace_prefix_len;

mod lease;
mod txn;

pub use lease::{check_lease, check_lease_id, check_lease_namespace};
pub use txn::check_txn;

/// A key shown in an error: lossy UTF-8 without a tenant's prefix, cut to 64 bytes.
pub fn show_key(key: &[u8]) -> String {
    let key = named(key);
    let shown = &key[..key.len().min(64)];
    let mut text = format!("{:?}", String::from_utf8_lossy(shown));
    if key.len() > shown.len() {
        text.push_str("...");
    }
    text
}

/// `stored` without the tenant prefix it starts with, if any: the name its tenant gave.
fn named(stored: &[u8]) -> &[u8] {
    &stored[namespace_prefix_len(stored)..]
}

pub fn check_key(key: &[u8]) -> Result<(), KvError> {
    let named = named(key);
    if named.is_empty() {
        return Err(KvError::invalid("key is empty; keys must have 1 to 4 KiB"));
    }
    if named.len() > limits::KEY_BYTES_MAX {
        return Err(KvError::invalid(format!(
            "key is {}; limit is {} (key {})",
            human_bytes(named.len()),
            human_bytes(limits::KEY_BYTES_MAX),
            show_key(key)
        )));
    }
    Ok(())
}

/// Checks a split key: a key as `check_key` wants it, or the bound of a tenant's namespace
/// (its prefix, whose name part is empty).
pub fn check_split_key(at: &[u8]) -> Result<(), KvError> {
    if at.is_empty() {
        return Err(KvError::invalid(
            "split key is empty; the keyspace already starts there",
        ));
    }
    if named(at).is_empty() {
        return Ok(());
    }
    check_key(at)?;
    if crate::pinned::splits_pinned(at) {
        return Err(KvError::invalid(format!(
            "split key {} lies inside the etcd namespace (etcd/), which is kept in one range; split at its start or end instead",
            show_key(at)
        )));
    }
    Ok(())
}

pub fn check_value(key: &[u8], value: &[u8]) -> Result<(), KvError> {
    if value.len() > limits::VALUE_BYTES_MAX {
        return Err(KvError::invalid(format!(
            "value is {}; limit is {} (key {})",
            human_bytes(value.len()),
            human_bytes(limits::VALUE_BYTES_MAX),
            show_key(key)
        )));
    }
    Ok(())
}

pub fn check_condition(key: &[u8], condition: &Condition) -> Result<(), KvError> {
    match condition {
        Condition::Absent => Ok(()),
        Condition::Revision(0) => Err(KvError::invalid(format!(
            "expected revision is 0; revisions start at 1, use expect-absent instead (key {})",
            show_key(key)
        ))),
        Condition::Revision(_) => Ok(()),
        Condition::Value(value) => check_value(key, value),
    }
}

/// Checks a TTL as a client gives it (signed, as in the gRPC API) and returns it: at least
/// 1 ms and at most `TTL_MS_MAX`.
pub fn check_ttl_ms(key: &[u8], ttl_ms: i64) -> Result<u64, KvError> {
    match u64::try_from(ttl_ms) {
        Ok(ttl_ms) if (1..=limits::TTL_MS_MAX).contains(&ttl_ms) => Ok(ttl_ms),
        Ok(0) => Err(KvError::invalid(format!(
            "TTL is 0 ms; it must be 1 ms to 1 year, or unset for no TTL (key {})",
            show_key(key)
        ))),
        Ok(ttl_ms) => Err(KvError::invalid(format!(
            "TTL is {ttl_ms} ms; limit is {} ms (1 year) (key {})",
            limits::TTL_MS_MAX,
            show_key(key)
        ))),
        Err(_) => Err(KvError::invalid(format!(
            "TTL is negative ({ttl_ms} ms); it must be 1 ms to 1 year (key {})",
            show_key(key)
        ))),
    }
}

/// Checks the number of ops in a write; callers decoding a batch check it before decoding.
pub fn check_op_count(count: usize) -> Result<(), KvError> {
    if count == 0 {
        return Err(KvError::invalid("batch is empty; it needs 1 to 128 ops"));
    }
    if count > limits::BATCH_OPS_MAX {
        return Err(KvError::invalid(format!(
            "batch has {count} ops; limit is {} ops",
            limits::BATCH_OPS_MAX
        )));
    }
    Ok(())
}

/// Checks one op: its key, its value (a put's) and its condition. A single op always fits
/// the batch byte limit, so a lone put or delete needs only this.
pub fn check_op(
    key: &[u8],
    value: Option<&[u8]>,
    condition: Option<&Condition>,
) -> Result<(), KvError> {
    check_key(key)?;
    if let Some(value) = value {
        check_value(key, value)?;
    }
    match condition {
        Some(condition) => check_condition(key, condition),
        None => Ok(()),
    }
}

/// Checks a write of one or more ops: op count, total size, and every key, value and
/// condition.
pub fn check_ops(ops: &[BatchOp]) -> Result<(), KvError> {
    check_op_count(ops.len())?;
    let mut bytes = 0usize;
    for op in ops {
        let value = match op {
            BatchOp::Put { value, ttl_ms, .. } => {
                if let Some(ttl_ms) = *ttl_ms {
                    check_ttl_ms(op.key(), i64::try_from(ttl_ms).unwrap_or(i64::MAX))?;
                }
                Some(value.as_slice())
            }
            BatchOp::Delete { .. } | BatchOp::Increment { .. } => None,
        };
        check_op(op.key(), value, op.condition())?;
        bytes += named(op.key()).len() + value.map_or(0, <[u8]>::len);
        if let Some(Condition::Value(expected)) = op.condition() {
            bytes += expected.len();
        }
    }
    if bytes > limits::BATCH_BYTES_MAX {
        return Err(KvError::invalid(format!(
            "batch is {}; limit is {}",
            human_bytes(bytes),
            human_bytes(limits::BATCH_BYTES_MAX)
        )));
    }
    Ok(())
}

/// Checks a lock name: the same rules as a key (it routes like one).
pub fn check_lock_name(name: &[u8]) -> Result<(), KvError> {
    let named = named(name);
    if named.is_empty() || named.len() > limits::KEY_BYTES_MAX {
        return Err(KvError::invalid(format!(
            "lock name is {}; it must have 1 byte to {} (lock {})",
            human_bytes(named.len()),
            human_bytes(limits::KEY_BYTES_MAX),
            show_key(name)
        )));
    }
    Ok(())
}

/// Checks the owner of a lock or an idempotency record: 1 to `OWNER_BYTES_MAX` bytes.
pub fn check_owner(owner: &[u8]) -> Result<(), KvError> {
    if owner.is_empty() || owner.len() > limits::OWNER_BYTES_MAX {
        return Err(KvError::invalid(format!(
            "owner is {}; it must have 1 to {} (owner {})",
            human_bytes(owner.len()),
            human_bytes(limits::OWNER_BYTES_MAX),
            show_key(owner)
        )));
    }
    Ok(())
}

/// Checks a duration a client gives (signed, as in the gRPC API) against `min..=max` and
/// returns it. `what` names it in the message: `lock TTL of "jobs"`.
pub fn check_duration_ms(what: &str, value_ms: i64, min: u64, max: u64) -> Result<u64, KvError> {
    match u64::try_from(value_ms) {
        Ok(value) if (min..=max).contains(&value) => Ok(value),
        _ => Err(KvError::invalid(format!(
            "{what} is {value_ms} ms; it must be {min} ms to {max} ms"
        ))),
    }
}

/// Checks a read's bounds (`max_staleness_ms` 0 to `MAX_STALENESS_MS_MAX`; any revision)
/// and returns them.
pub fn check_read_bound(
    max_staleness_ms: Option<i64>,
    min_revision: Option<u64>,
) -> Result<ReadBound, KvError> {
    let max_staleness_ms = max_staleness_ms
        .map(|ms| check_duration_ms("max_staleness_ms", ms, 0, limits::MAX_STALENESS_MS_MAX))
        .transpose()?;
    Ok(ReadBound {
        max_staleness_ms,
        min_revision,
    })
}

/// Checks the revision a read asks to read at (unset = the current state; 0 is refused).
pub fn check_read_revision(revision: Option<u64>) -> Result<Option<Revision>, KvError> {
    match revision {
        Some(0) => Err(KvError::InvalidArgument {
            message: "revision 0 is no revision: leave it unset to read the current state"
                .to_string(),
        }),
        revision => Ok(revision),
    }
}

/// Checks a lock TTL (1 ms to `TTL_MS_MAX`) and returns it.
pub fn check_lock_ttl_ms(name: &[u8], ttl_ms: i64) -> Result<u64, KvError> {
    let what = format!("TTL of lock {}", show_key(name));
    check_duration_ms(&what, ttl_ms, 1, limits::TTL_MS_MAX)
}

/// Checks a lock-delay (0 to `LOCK_DELAY_MS_MAX`) and returns it.
pub fn check_lock_delay_ms(name: &[u8], delay_ms: i64) -> Result<u64, KvError> {
    let what = format!("lock-delay of lock {}", show_key(name));
    check_duration_ms(&what, delay_ms, 0, limits::LOCK_DELAY_MS_MAX)
}

/// Checks how long an acquire may wait (0 = try once; at most `LOCK_WAIT_MS_MAX`).
pub fn check_lock_wait_ms(name: &[u8], wait_ms: i64) -> Result<u64, KvError> {
    let what = format!("wait for lock {}", show_key(name));
    check_duration_ms(&what, wait_ms, 0, limits::LOCK_WAIT_MS_MAX)
}

/// Checks the fence of a write: a valid lock name and a token a lock can have issued (≥ 1).
pub fn check_fence(fence: &Fence) -> Result<(), KvError> {
    check_lock_name(&fence.lock)?;
    if fence.token == 0 {
        return Err(KvError::invalid(format!(
            "fence token is 0; tokens start at 1 (lock {})",
            show_key(&fence.lock)
        )));
    }
    Ok(())
}

/// Checks an idempotency record's scope (1 to `IDEMPOTENCY_SCOPE_BYTES_MAX` bytes, no zero
/// byte) and id (1 to `IDEMPOTENCY_ID_BYTES_MAX` bytes) and returns the record's key.
pub fn check_idempotency_key(scope: &[u8], id: &[u8]) -> Result<Vec<u8>, KvError> {
    let named_scope = named(scope);
    if named_scope.is_empty() || named_scope.len() > limits::IDEMPOTENCY_SCOPE_BYTES_MAX {
        return Err(KvError::invalid(format!(
            "idempotency scope is {}; it must have 1 to {} (scope {})",
            human_bytes(named_scope.len()),
            human_bytes(limits::IDEMPOTENCY_SCOPE_BYTES_MAX),
            show_key(scope)
        )));
    }
    if scope.contains(&0) {
        return Err(KvError::invalid(format!(
            "idempotency scope {} holds a zero byte; scopes may not",
            show_key(scope)
        )));
    }
    if id.is_empty() || id.len() > limits::IDEMPOTENCY_ID_BYTES_MAX {
        return Err(KvError::invalid(format!(
            "idempotency id is {}; it must have 1 to {} (id {})",
            human_bytes(id.len()),
            human_bytes(limits::IDEMPOTENCY_ID_BYTES_MAX),
            show_key(id)
        )));
    }
    Ok(idempotency_key(scope, id))
}

/// Checks the result stored by `Complete`: at most `IDEMPOTENCY_RESULT_BYTES_MAX`.
pub fn check_idempotency_result(id: &[u8], result: &[u8]) -> Result<(), KvError> {
    if result.len() > limits::IDEMPOTENCY_RESULT_BYTES_MAX {
        return Err(KvError::invalid(format!(
            "idempotency result is {}; limit is {} (id {})",
            human_bytes(result.len()),
            human_bytes(limits::IDEMPOTENCY_RESULT_BYTES_MAX),
            show_key(id)
        )));
    }
    Ok(())
}

/// Checks a scan of `[start, end)` (an empty `end` means the end of the keyspace) and
/// returns the row limit to use (0 means the default).
pub fn check_scan(start: &[u8], end: &[u8], limit: u32) -> Result<u32, KvError> {
    if named(start).len() > limits::KEY_BYTES_MAX {
        return Err(KvError::invalid(format!(
            "scan start is {}; limit is {}",
            human_bytes(named(start).len()),
            human_bytes(limits::KEY_BYTES_MAX)
        )));
    }
    if named(end).len() > limits::KEY_BYTES_MAX {
        return Err(KvError::invalid(format!(
            "scan end is {}; limit is {}",
            human_bytes(named(end).len()),
            human_bytes(limits::KEY_BYTES_MAX)
        )));
    }
    if !end.is_empty() && end <= start {
        return Err(KvError::invalid(format!(
            "scan end {} is not after start {}",
            show_key(end),
            show_key(start)
        )));
    }
    match limit {
        0 => Ok(limits::SCAN_LIMIT_DEFAULT),
        limit if limit > limits::SCAN_LIMIT_MAX => Err(KvError::invalid(format!(
            "scan limit is {limit} rows; limit is {} rows",
            limits::SCAN_LIMIT_MAX
        ))),
        limit => Ok(limit),
    }
}

/// Checks a history page's limit and returns it: 0 is `HISTORY_LIMIT_DEFAULT`, more than
/// `HISTORY_LIMIT_MAX` is refused.
pub fn check_history_limit(limit: u32) -> Result<u32, KvError> {
    match limit {
        0 => Ok(limits::HISTORY_LIMIT_DEFAULT),
        limit if limit > limits::HISTORY_LIMIT_MAX => Err(KvError::invalid(format!(
            "history limit is {limit} events; limit is {} events",
            limits::HISTORY_LIMIT_MAX
        ))),
        limit => Ok(limit),
    }
}

/// A watch request's span and options, checked (`check_watch`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WatchChecked {
    /// `None`: no progress messages.
    pub progress_interval_ms: Option<u64>,
}

/// Checks a watch of `[start, end)` (an empty `end` means the end of the keyspace), the key
/// it resumes at within its start revision, and its progress interval (0 = none).
pub fn check_watch(
    start: &[u8],
    end: &[u8],
    resume_key: &[u8],
    progress_interval_ms: u64,
) -> Result<WatchChecked, KvError> {
    // A resume key may be a key followed by a 0 byte: the first key after it.
    let keys = [
        ("start", start, limits::KEY_BYTES_MAX),
        ("end", end, limits::KEY_BYTES_MAX),
        ("resume key", resume_key, limits::KEY_BYTES_MAX + 1),
    ];
    for (what, key, max) in keys {
        if named(key).len() > max {
            return Err(KvError::invalid(format!(
                "watch {what} is {}; limit is {}",
                human_bytes(named(key).len()),
                human_bytes(max)
            )));
        }
    }
    if !end.is_empty() && end <= start {
        return Err(KvError::invalid(format!(
            "watch end {} is not after start {}",
            show_key(end),
            show_key(start)
        )));
    }
    let progress_interval_ms = match progress_interval_ms {
        0 => None,
        ms => Some(check_duration_ms(
            "watch progress interval",
            i64::try_from(ms).unwrap_or(i64::MAX),
            limits::WATCH_PROGRESS_MS_MIN,
            limits::WATCH_PROGRESS_MS_MAX,
        )?),
    };
    Ok(WatchChecked {
        progress_interval_ms,
    })
}

// A lone op is within the batch byte limit whatever its sizes, as `check_op` assumes.
const _: () =
    assert!(limits::KEY_BYTES_MAX + 2 * limits::VALUE_BYTES_MAX <= limits::BATCH_BYTES_MAX);

#[cfg(test)]
mod tests {
    use super::*;

    fn put(key: &[u8], value: usize) -> BatchOp {
        BatchOp::Put {
            key: key.to_vec(),
            value: vec![b'x'; value],
            condition: None,
            return_previous: false,
            ttl_ms: None,
        }
    }

    /// `None` = accepted; `Some(text)` = rejected with a message containing `text`.
    fn check(result: Result<(), KvError>, expected: Option<&str>) {
        match (result, expected) {
            (Ok(()), None) => {}
            (Err(KvError::InvalidArgument { message }), Some(text)) => {
                assert!(message.contains(text), "{message:?} lacks {text:?}")
            }
            (result, expected) => panic!("got {result:?}, expected {expected:?}"),
        }
    }

    #[test]
    fn no_split_key_cuts_the_etcd_namespace() {
        let inside = Some("lies inside the etcd namespace");
        check(check_split_key(b"etcd/a"), inside);
        check(check_split_key(b"etcd/"), None);
        check(check_split_key(b"etcd0"), None);
        check(check_split_key(b"etcd"), None);
    }

    #[test]
    fn limits_count_the_name_after_a_tenant_prefix() {
        let acme = crate::tenant::Namespace::of(&crate::tenant::TenantName::new("acme").unwrap());
        assert!(check_key(&acme.confine(&[b'k'; limits::KEY_BYTES_MAX])).is_ok());
        assert!(check_key(&acme.confine(&[b'k'; limits::KEY_BYTES_MAX + 1])).is_err());
        assert!(
            check_key(&acme.confine(b"")).is_err(),
            "an empty name is empty"
        );
        assert!(check_lock_name(&acme.confine(b"")).is_err());
        assert!(
            check_split_key(acme.start()).is_ok(),
            "a namespace's bound splits"
        );
        assert!(check_split_key(b"").is_err());
        let message = check_key(&acme.confine(&[b'k'; limits::KEY_BYTES_MAX + 1]))
            .unwrap_err()
            .to_string();
        assert!(
            message.contains("\"kkk") && !message.contains("acme"),
            "{message}"
        );
    }

    #[test]
    fn ops_are_checked_against_limits() {
        let big_key = vec![b'k'; limits::KEY_BYTES_MAX + 1];
        let max_key = vec![b'k'; limits::KEY_BYTES_MAX];
        let cases: Vec<(Vec<BatchOp>, Option<&str>)> = vec![
            (vec![put(b"a", 0)], None),
            (vec![put(&max_key, limits::VALUE_BYTES_MAX)], None),
            (vec![], Some("batch is empty")),
            (vec![put(b"", 1)], Some("key is empty")),
            (vec![put(&big_key, 1)], Some("limit is 4 KiB")),
            (
                vec![put(b"cart:7", limits::VALUE_BYTES_MAX + 1)],
                Some("limit is 1 MiB (key \"cart:7\")"),
            ),
            (
                (0..=limits::BATCH_OPS_MAX).map(|_| put(b"a", 1)).collect(),
                Some("batch has 129 ops; limit is 128 ops"),
            ),
            (
                (0..5).map(|_| put(b"a", limits::VALUE_BYTES_MAX)).collect(),
                Some("limit is 4 MiB"),
            ),
            (
                vec![BatchOp::Delete {
                    key: b"a".to_vec(),
                    condition: Some(Condition::Revision(0)),
                    return_previous: false,
                }],
                Some("revisions start at 1"),
            ),
            (
                vec![BatchOp::Delete {
                    key: b"a".to_vec(),
                    condition: Some(Condition::Value(vec![0; limits::VALUE_BYTES_MAX + 1])),
                    return_previous: false,
                }],
                Some("limit is 1 MiB"),
            ),
        ];
        for (ops, expected) in cases {
            check(check_ops(&ops), expected);
        }
    }

    #[test]
    fn ttls_are_checked_against_limits() {
        assert_eq!(check_ttl_ms(b"k", 1), Ok(1));
        assert_eq!(
            check_ttl_ms(b"k", limits::TTL_MS_MAX as i64),
            Ok(limits::TTL_MS_MAX)
        );
        let rejected = [
            (0, "TTL is 0 ms"),
            (-5, "TTL is negative"),
            (limits::TTL_MS_MAX as i64 + 1, "(1 year)"),
        ];
        for (ttl_ms, text) in rejected {
            check(check_ttl_ms(b"k", ttl_ms).map(|_| ()), Some(text));
        }
        let with_ttl = |ttl_ms| BatchOp::Put {
            key: b"k".to_vec(),
            value: Vec::new(),
            condition: None,
            return_previous: false,
            ttl_ms: Some(ttl_ms),
        };
        check(check_ops(&[with_ttl(0)]), Some("TTL is 0 ms"));
        check(check_ops(&[with_ttl(u64::MAX)]), Some("(1 year)"));
        check(check_ops(&[with_ttl(30_000)]), None);
        let increment = BatchOp::Increment {
            key: Vec::new(),
            delta: 1,
        };
        check(check_ops(&[increment]), Some("key is empty"));
    }

    #[test]
    fn scans_are_checked_against_limits() {
        assert_eq!(check_scan(b"", b"", 0), Ok(limits::SCAN_LIMIT_DEFAULT));
        assert_eq!(check_scan(b"a", b"b", 5), Ok(5));
        check(
            check_scan(b"b", b"a", 5).map(|_| ()),
            Some("not after start"),
        );
        check(
            check_scan(b"a", b"a", 5).map(|_| ()),
            Some("not after start"),
        );
        check(
            check_scan(b"", b"", limits::SCAN_LIMIT_MAX + 1).map(|_| ()),
            Some("limit is 10000 rows"),
        );
    }

    #[test]
    fn coordination_input_is_checked_against_limits() {
        let long = vec![b'a'; limits::KEY_BYTES_MAX + 1];
        let cases: Vec<(Result<(), KvError>, Option<&str>)> = vec![
            (check_lock_name(b"jobs"), None),
            (check_lock_name(b""), Some("lock name is 0 bytes")),
            (check_lock_name(&long), Some("lock name is 4.0 KiB")),
            (check_owner(b"worker-1"), None),
            (check_owner(b""), Some("owner is 0 bytes")),
            (
                check_owner(&[b'o'; 257]),
                Some("it must have 1 to 256 bytes"),
            ),
            (check_lock_ttl_ms(b"l", 1).map(drop), None),
            (
                check_lock_ttl_ms(b"l", 0).map(drop),
                Some("TTL of lock \"l\" is 0 ms"),
            ),
            (check_lock_ttl_ms(b"l", -5).map(drop), Some("is -5 ms")),
            (check_lock_delay_ms(b"l", 0).map(drop), None),
            (
                check_lock_delay_ms(b"l", 60_001).map(drop),
                Some("0 ms to 60000 ms"),
            ),
            (
                check_lock_wait_ms(b"l", 300_001).map(drop),
                Some("wait for lock"),
            ),
            (
                check_fence(&Fence {
                    lock: b"l".to_vec(),
                    token: 0,
                }),
                Some("fence token is 0"),
            ),
            (check_idempotency_key(b"pay", b"o-1").map(drop), None),
            (
                check_idempotency_key(b"", b"o-1").map(drop),
                Some("scope is 0 bytes"),
            ),
            (
                check_idempotency_key(b"p\0y", b"o").map(drop),
                Some("zero byte"),
            ),
            (
                check_idempotency_key(b"p", b"").map(drop),
                Some("id is 0 bytes"),
            ),
            (check_idempotency_result(b"o", &[0; 64 * 1024]), None),
            (
                check_idempotency_result(b"o", &[0; 64 * 1024 + 1]),
                Some("limit is 64 KiB"),
            ),
        ];
        for (result, expected) in cases {
            check(result, expected);
        }
    }
}
