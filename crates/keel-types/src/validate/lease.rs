//! Checks of lease operations at the edge: the namespace starts a pinned span, the id is
//! etcd's (≥ 0 for a grant, where 0 lets the store choose; > 0 otherwise), and a granted
//! TTL lies within the TTL limits.

use crate::error::KvError;
use crate::lease::LeaseOp;
use crate::limits;
use crate::pinned::pinned_span;

use super::show_key;

/// Checks a lease operation.
pub fn check_lease(op: &LeaseOp) -> Result<(), KvError> {
    check_lease_namespace(op.namespace())?;
    match op {
        LeaseOp::Grant { id, ttl_ms, .. } => {
            if *id < 0 {
                return Err(KvError::invalid(format!(
                    "lease id is {id}; a grant names an id above 0, or 0 to let Keel choose"
                )));
            }
            check_lease_ttl_ms(*ttl_ms)
        }
        LeaseOp::KeepAlive { id, .. } | LeaseOp::Revoke { id, .. } => check_lease_id(*id),
    }
}

/// Checks a lease namespace: the start of a pinned span (`crate::pinned`), so the lease and
/// its keys stay in one range.
pub fn check_lease_namespace(namespace: &[u8]) -> Result<(), KvError> {
    match pinned_span(namespace) {
        Some((start, _)) if start == namespace => Ok(()),
        _ => Err(KvError::invalid(format!(
            "lease namespace {} is not the start of a pinned namespace such as \"etcd/\"",
            show_key(namespace)
        ))),
    }
}

/// Checks the id of an existing lease: above 0.
pub fn check_lease_id(id: i64) -> Result<(), KvError> {
    if id <= 0 {
        return Err(KvError::invalid(format!(
            "lease id is {id}; lease ids are above 0"
        )));
    }
    Ok(())
}

/// Checks a lease's TTL: 1 ms to `limits::TTL_MS_MAX`.
fn check_lease_ttl_ms(ttl_ms: u64) -> Result<(), KvError> {
    if !(1..=limits::TTL_MS_MAX).contains(&ttl_ms) {
        return Err(KvError::invalid(format!(
            "lease TTL is {ttl_ms} ms; it must be 1 ms to {} ms (1 year)",
            limits::TTL_MS_MAX
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(namespace: &[u8], id: i64, ttl_ms: u64) -> LeaseOp {
        LeaseOp::Grant {
            namespace: namespace.to_vec(),
            id,
            ttl_ms,
        }
    }

    fn check(op: LeaseOp, expected: Result<(), &str>) {
        let got = check_lease(&op).map_err(|e| e.to_string());
        match (got, expected) {
            (Ok(()), Ok(())) => {}
            (Err(message), Err(part)) => assert!(message.contains(part), "{op:?}: {message}"),
            (got, expected) => panic!("{op:?}: got {got:?}, expected {expected:?}"),
        }
    }

    #[test]
    fn lease_ops_are_checked() {
        let revoke = |namespace: &[u8], id| LeaseOp::Revoke {
            namespace: namespace.to_vec(),
            id,
        };
        check(grant(b"etcd/", 0, 1), Ok(()));
        check(grant(b"etcd/", 7, limits::TTL_MS_MAX), Ok(()));
        check(grant(b"etcd/", -1, 10), Err("above 0, or 0"));
        check(grant(b"etcd/", 7, 0), Err("lease TTL is 0 ms"));
        check(grant(b"etcd/", 7, limits::TTL_MS_MAX + 1), Err("lease TTL"));
        check(grant(b"etcd/a", 7, 10), Err("not the start of a pinned"));
        check(grant(b"other/", 7, 10), Err("not the start of a pinned"));
        check(revoke(b"etcd/", 3), Ok(()));
        check(revoke(b"etcd/", 0), Err("lease ids are above 0"));
        let keep_alive = LeaseOp::KeepAlive {
            namespace: b"etcd/".to_vec(),
            id: -4,
        };
        check(keep_alive, Err("lease ids are above 0"));
    }
}
