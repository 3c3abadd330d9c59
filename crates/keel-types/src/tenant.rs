//! Tenants' namespaces. With authentication on, each tenant's keys, lock names and
//! idempotency scopes are stored under a prefix the server derives from the tenant's name,
//! never from the request: `0xFF 'T' name 0x01`. A tenant names keys without the prefix and
//! sees them without it; whatever bytes it sends, they land after its own prefix, so it
//! cannot name another tenant's. Names are lowercase ASCII letters, digits, `-` and `_`, so
//! no prefix is a prefix of another (the `0x01` ends the name) and none holds a zero byte
//! (idempotency keys end their scope with one). Limits on keys and names apply to the part
//! after the prefix (`namespace_prefix_len`).

use std::fmt;

use crate::limits;
use crate::range::RangeDescriptor;

/// The two bytes every tenant's prefix starts with.
pub const TENANT_MARK: [u8; 2] = [0xFF, b'T'];
/// The byte that ends a tenant's name in its prefix.
const NAME_END: u8 = 0x01;

/// A tenant's name: 1 to `TENANT_NAME_BYTES_MAX` bytes of `a-z`, `0-9`, `-`, `_`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TenantName(String);

impl TenantName {
    pub fn new(name: &str) -> Result<TenantName, String> {
        if name.is_empty() || name.len() > limits::TENANT_NAME_BYTES_MAX {
            return Err(format!(
                "tenant name {name:?} has {} bytes; it must have 1 to {}",
                name.len(),
                limits::TENANT_NAME_BYTES_MAX
            ));
        }
        if !name.bytes().all(name_byte) {
            return Err(format!(
                "tenant name {name:?} may hold only a-z, 0-9, '-' and '_'"
            ));
        }
        Ok(TenantName(name.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for TenantName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn name_byte(byte: u8) -> bool {
    byte.is_ascii_lowercase() || byte.is_ascii_digit() || byte == b'-' || byte == b'_'
}

/// Where one tenant's names are stored: `[prefix, end)` of the keyspace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Namespace {
    prefix: Vec<u8>,
    end: Vec<u8>,
}

impl Namespace {
    pub fn of(tenant: &TenantName) -> Namespace {
        let mut prefix = TENANT_MARK.to_vec();
        prefix.extend_from_slice(tenant.as_str().as_bytes());
        let mut end = prefix.clone();
        prefix.push(NAME_END);
        end.push(NAME_END + 1);
        Namespace { prefix, end }
    }

    /// The first key of the namespace (and the prefix of every one in it).
    pub fn start(&self) -> &[u8] {
        &self.prefix
    }

    /// The first key after the namespace.
    pub fn end(&self) -> &[u8] {
        &self.end
    }

    /// The stored form of a name the tenant gave.
    pub fn confine(&self, name: &[u8]) -> Vec<u8> {
        let mut stored = Vec::with_capacity(self.prefix.len() + name.len());
        stored.extend_from_slice(&self.prefix);
        stored.extend_from_slice(name);
        stored
    }

    /// The stored end of a scan the tenant bounded by `end` (empty: the namespace's end).
    pub fn confine_end(&self, end: &[u8]) -> Vec<u8> {
        match end.is_empty() {
            true => self.end.clone(),
            false => self.confine(end),
        }
    }

    /// The name the tenant knows for `stored`: without the prefix. A key before the
    /// namespace reads as its start (empty); one at or after its end as `None`.
    pub fn reveal(&self, stored: &[u8]) -> Option<Vec<u8>> {
        if let Some(name) = stored.strip_prefix(self.prefix.as_slice()) {
            return Some(name.to_vec());
        }
        (stored < self.prefix.as_slice()).then(Vec::new)
    }

    /// `range` as the tenant sees it: its part inside the namespace, in the tenant's names
    /// (an end at or past the namespace's end is unbounded); `None` when it holds none of it.
    pub fn reveal_range(&self, range: &RangeDescriptor) -> Option<RangeDescriptor> {
        let before_end = range.start.as_slice() < self.end.as_slice();
        let after_start = range.end().is_none_or(|end| end > self.prefix.as_slice());
        if !(before_end && after_start) {
            return None;
        }
        Some(RangeDescriptor {
            start: self.reveal(&range.start).unwrap_or_default(),
            end: range.end().and_then(|end| self.reveal(end)),
            ..range.clone()
        })
    }

    /// Whether `range` lies wholly inside the namespace.
    pub fn holds(&self, range: &RangeDescriptor) -> bool {
        range.start.as_slice() >= self.prefix.as_slice()
            && range.end().is_some_and(|end| end <= self.end.as_slice())
    }
}

/// The length of the tenant prefix `stored` starts with; 0 when it has none. Limits on keys
/// and names count the bytes after it.
pub fn namespace_prefix_len(stored: &[u8]) -> usize {
    let Some(rest) = stored.strip_prefix(TENANT_MARK.as_slice()) else {
        return 0;
    };
    let name_len = rest
        .iter()
        .take(limits::TENANT_NAME_BYTES_MAX + 1)
        .position(|&byte| !name_byte(byte));
    match name_len {
        Some(len) if len > 0 && rest[len] == NAME_END => TENANT_MARK.len() + len + 1,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::RangeId;

    fn tenant(name: &str) -> Namespace {
        Namespace::of(&TenantName::new(name).unwrap())
    }

    fn range(start: &[u8], end: Option<&[u8]>) -> RangeDescriptor {
        RangeDescriptor {
            id: RangeId(7),
            start: start.to_vec(),
            end: end.map(<[u8]>::to_vec),
            epoch: 3,
            conf_version: 1,
            replicas: vec![1, 2, 3],
        }
    }

    #[test]
    fn names_are_checked() {
        assert!(TenantName::new("acme-prod_2").is_ok());
        for bad in ["", "Acme", "a b", "a/b", "a\u{1}", &"x".repeat(65)] {
            assert!(TenantName::new(bad).is_err(), "{bad:?}");
        }
        assert!(TenantName::new(&"x".repeat(64)).is_ok());
    }

    #[test]
    fn no_namespace_holds_another() {
        let (a, ab) = (tenant("a"), tenant("ab"));
        for (one, other) in [(&a, &ab), (&ab, &a)] {
            let inside = one.confine(b"\xff\xff\xff");
            assert!(inside.as_slice() < one.end());
            assert!(!(other.start()..other.end()).contains(&inside.as_slice()));
            assert!(!(other.start()..other.end()).contains(&one.start()));
        }
    }

    #[test]
    fn a_crafted_name_stays_in_its_namespace() {
        let (a, b) = (tenant("a"), tenant("b"));
        let crafted = b.confine(b"secret");
        let stored = a.confine(&crafted);
        assert!(stored.starts_with(a.start()));
        assert!(!(b.start()..b.end()).contains(&stored.as_slice()));
        assert_eq!(a.reveal(&stored), Some(crafted));
        assert!(!a.confine(b"k").contains(&0), "prefixes hold no zero byte");
    }

    #[test]
    fn prefix_length_is_found_only_in_well_formed_prefixes() {
        let a = tenant("acme");
        assert_eq!(namespace_prefix_len(&a.confine(b"key")), a.start().len());
        assert_eq!(namespace_prefix_len(a.start()), a.start().len());
        assert_eq!(namespace_prefix_len(a.end()), 0);
        assert_eq!(namespace_prefix_len(b"\xffT\x01k"), 0);
        assert_eq!(namespace_prefix_len(b"\xffTacme"), 0);
        assert_eq!(namespace_prefix_len(b"plain"), 0);
    }

    #[test]
    fn ranges_are_clipped_to_the_namespace() {
        let a = tenant("a");
        let whole = range(b"", None);
        assert_eq!(a.reveal_range(&whole), Some(range(b"", None)));
        let inside = range(&a.confine(b"m"), Some(&a.confine(b"t")));
        assert_eq!(a.reveal_range(&inside), Some(range(b"m", Some(b"t"))));
        let across_end = range(&a.confine(b"t"), Some(b"\xffU"));
        assert_eq!(a.reveal_range(&across_end), Some(range(b"t", None)));
        assert_eq!(a.reveal_range(&range(b"x", Some(a.start()))), None);
        assert_eq!(a.reveal_range(&range(a.end(), None)), None);
        assert!(a.holds(&inside) && !a.holds(&across_end) && !a.holds(&whole));
    }
}
