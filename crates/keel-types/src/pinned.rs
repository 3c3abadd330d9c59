//! Spans of the keyspace that are kept in one range: the etcd namespace (`ETCD_PREFIX`), in
//! the raw keyspace and in every tenant's namespace. Its range's revision is the revision
//! etcd's API reports, so a transaction, a read at a past revision and the order of its
//! writes all stay inside one Raft group: no split may fall strictly inside it.

use crate::tenant::namespace_prefix_len;

/// The names the etcd API serves live under this prefix (of a tenant's names, for a tenant).
pub const ETCD_PREFIX: &[u8] = b"etcd/";

/// The pinned span `[start, end)` that `key` lies in, if any.
pub fn pinned_span(key: &[u8]) -> Option<(Vec<u8>, Vec<u8>)> {
    let tenant = namespace_prefix_len(key);
    if !key[tenant..].starts_with(ETCD_PREFIX) {
        return None;
    }
    let mut start = key[..tenant].to_vec();
    start.extend_from_slice(ETCD_PREFIX);
    let mut end = start.clone();
    let last = end.last_mut().expect("the prefix is not empty");
    *last += 1;
    Some((start, end))
}

/// Whether a split at `at` would cut a pinned span in two (a split at its start does not).
pub fn splits_pinned(at: &[u8]) -> bool {
    pinned_span(at).is_some_and(|(start, _)| at != start.as_slice())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tenant::{Namespace, TenantName};

    #[test]
    fn the_etcd_namespace_is_pinned_in_the_raw_keyspace_and_each_tenants() {
        assert_eq!(
            pinned_span(b"etcd/a"),
            Some((b"etcd/".to_vec(), b"etcd0".to_vec()))
        );
        assert!(splits_pinned(b"etcd/a") && splits_pinned(b"etcd/\0"));
        assert!(!splits_pinned(b"etcd/") && !splits_pinned(b"etcd0") && !splits_pinned(b"etc"));
        let tenant = Namespace::of(&TenantName::new("acme").unwrap());
        let inside = tenant.confine(b"etcd/x");
        let (start, end) = pinned_span(&inside).unwrap();
        assert_eq!(start, tenant.confine(b"etcd/"));
        assert_eq!(end, tenant.confine(b"etcd0"));
        assert!(splits_pinned(&inside) && !splits_pinned(&tenant.confine(b"etcd/")));
        assert!(!splits_pinned(&tenant.confine(b"other")));
    }
}
