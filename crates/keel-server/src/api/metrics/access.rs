//! The families of a scrape that come from who may call the node: each tenant's keys and
//! bytes against its quotas, and when the TLS certificates expire. Knows nothing of HTTP or
//! of how usage is counted (`api/tenant_usage.rs` refreshes it).
//!
//! The tenant series are written by the node leading the meta range only: every node's
//! table comes from the meta leader's range table, so one node's series are the cluster's,
//! and a sum over nodes counts each tenant once. Only tenants with a keys or bytes quota
//! have them (the only ones whose usage is counted), so at most `limits::TENANTS_MAX`
//! tenants, labelled with the name the tokens file gives them, as `keel_hot_key_requests`
//! labels a tenant's keys. No label names a key or a value.

use std::sync::Arc;

use crate::access::Tenant;
use crate::access::tls::TlsSettings;
use crate::metrics::text::{Kind, Text};

/// The tenant families; samples only when `meta_leader`.
pub(super) fn write_tenants(text: &mut Text, tenants: &[Arc<Tenant>], meta_leader: bool) {
    let counted: Vec<&Tenant> = match meta_leader {
        true => tenants
            .iter()
            .map(Arc::as_ref)
            .filter(|tenant| tenant.counts_usage())
            .collect(),
        false => Vec::new(),
    };
    let usage: [Family; 2] = [
        (
            "keel_tenant_keys",
            "On the meta range's leader, for each tenant with a keys or bytes quota: the keys, locks, fenced keys and idempotency records of its namespace, as its ranges' leaders last reported them (refreshed every 2 s; none while the namespace has no range of its own).",
            |tenant| tenant.usage().map(|usage| usage.keys),
        ),
        (
            "keel_tenant_size_bytes",
            "On the meta range's leader, for each tenant with a keys or bytes quota: the bytes of its namespace as its bytes quota counts them, as its ranges' leaders last reported them (refreshed every 2 s; none while the namespace has no range of its own).",
            |tenant| tenant.usage().map(|usage| usage.bytes),
        ),
    ];
    let quotas: [Family; 2] = [
        (
            "keel_tenant_quota_keys",
            "On the meta range's leader: the tenant's max_keys (--auth-tokens), for tenants with one.",
            |tenant| tenant.quotas.keys,
        ),
        (
            "keel_tenant_quota_size_bytes",
            "On the meta range's leader: the tenant's max_bytes (--auth-tokens), for tenants with one.",
            |tenant| tenant.quotas.bytes,
        ),
    ];
    for (name, help, value) in usage.into_iter().chain(quotas) {
        text.family(name, Kind::Gauge, help);
        for tenant in &counted {
            if let Some(value) = value(tenant) {
                text.sample(&[("tenant", tenant.name.as_str())], value as f64);
            }
        }
    }
}

/// The certificate family; samples only with TLS on.
pub(super) fn write_certificates(text: &mut Text, tls: Option<&TlsSettings>) {
    text.family(
        "keel_tls_certificate_expiry_time_seconds",
        Kind::Gauge,
        "When the TLS certificates this node serves with expire, in seconds since the Unix epoch (the earliest notAfter of the file's certificates): cert=\"node\" the chain of --tls-cert, cert=\"ca\" the CA file of --tls-ca. Read at start.",
    );
    let Some(tls) = tls else {
        return;
    };
    let expiry = tls.expiry();
    text.sample(&[("cert", "node")], expiry.chain_secs as f64);
    text.sample(&[("cert", "ca")], expiry.ca_secs as f64);
}

/// A tenant family: name, help, and the tenant's value if it has one.
type Family = (&'static str, &'static str, fn(&Tenant) -> Option<u64>);

#[cfg(test)]
mod tests;
