//! The tenant and certificate families as a scrape writes them: who gets a series, with
//! which labels, and on which node.

use keel_types::RangeId;

use super::*;
use crate::access::Access;
use crate::access::quota::Amount;
use crate::access::tls::tests::{END_OF_2030, END_OF_2035, dated_pems};

const FILE: &str = r#"
[[admin]]
name = "ops"
tokens = ["admin-token-0123456789"]

[[tenant]]
name = "acme"
tokens = ["acme-token-0123456789"]
max_keys = 10
max_requests_per_sec = 5

[[tenant]]
name = "globex"
tokens = ["globex-token-0123456789"]
max_bytes = 4096

[[tenant]]
name = "fresh"
tokens = ["fresh-token-0123456789"]
max_keys = 3
max_bytes = 300

[[tenant]]
name = "paced"
tokens = ["paced-token-0123456789"]
max_requests_per_sec = 5

[[tenant]]
name = "open"
tokens = ["open-token-0123456789"]
"#;

/// Every tenant of `FILE`, with tables for all but "fresh" (whose namespace has no range
/// of its own yet).
fn tenants() -> Vec<Arc<Tenant>> {
    let access = Access::parse(FILE).unwrap();
    let amount = |keys, bytes| Amount { keys, bytes };
    for tenant in access.tenants() {
        let table = match tenant.name.as_str() {
            "acme" => vec![(RangeId(4), amount(6, 60)), (RangeId(5), amount(3, 40))],
            "globex" => vec![(RangeId(6), amount(2, 4000))],
            "fresh" => Vec::new(),
            _ => vec![(RangeId(7), amount(1, 1))],
        };
        tenant.set_table(table);
    }
    access.tenants().to_vec()
}

/// The sample lines of `body`, without the `# HELP` and `# TYPE` lines.
fn samples(body: &str) -> Vec<&str> {
    body.lines().filter(|line| !line.starts_with('#')).collect()
}

#[test]
fn tenants_with_a_keys_or_bytes_quota_have_usage_and_quotas() {
    let mut text = Text::new();
    write_tenants(&mut text, &tenants(), true);
    let body = text.finish();
    let expected = [
        "keel_tenant_keys{tenant=\"acme\"} 9",
        "keel_tenant_keys{tenant=\"globex\"} 2",
        "keel_tenant_size_bytes{tenant=\"acme\"} 100",
        "keel_tenant_size_bytes{tenant=\"globex\"} 4000",
        "keel_tenant_quota_keys{tenant=\"acme\"} 10",
        "keel_tenant_quota_keys{tenant=\"fresh\"} 3",
        "keel_tenant_quota_size_bytes{tenant=\"globex\"} 4096",
        "keel_tenant_quota_size_bytes{tenant=\"fresh\"} 300",
    ];
    assert_eq!(samples(&body), expected, "{body}");
    for family in [
        "keel_tenant_keys",
        "keel_tenant_size_bytes",
        "keel_tenant_quota_keys",
        "keel_tenant_quota_size_bytes",
    ] {
        let typed = format!("# TYPE {family} gauge");
        assert!(body.lines().any(|line| line == typed), "{body}");
    }
}

/// What an attacker reading the endpoint could hope for: a tenant without a keys or bytes
/// quota (a rate quota only, or none) shows nowhere, though its usage is in the table; and
/// the only label is the tenant's name.
#[test]
fn a_tenant_without_a_keys_or_bytes_quota_shows_nothing() {
    let mut text = Text::new();
    write_tenants(&mut text, &tenants(), true);
    let body = text.finish();
    for name in ["paced", "open"] {
        assert!(!body.contains(name), "{name} in\n{body}");
    }
    for line in samples(&body) {
        let labels = line.split_once('{').unwrap().1.split_once('}').unwrap().0;
        assert!(labels.starts_with("tenant=\"") && labels.matches('=').count() == 1);
    }
}

#[test]
fn only_the_meta_leader_writes_tenant_samples() {
    let mut text = Text::new();
    write_tenants(&mut text, &tenants(), false);
    let body = text.finish();
    assert_eq!(samples(&body), Vec::<&str>::new(), "{body}");
    assert!(body.contains("# TYPE keel_tenant_keys gauge"), "{body}");
}

#[test]
fn certificates_expire_as_their_files_say_with_tls_on() {
    let (cert, key, ca) = dated_pems(2030, 2035);
    let tls = TlsSettings::from_pem(cert, key, ca).unwrap();
    let check = |tls: Option<&TlsSettings>, expected: &[String]| {
        let mut text = Text::new();
        write_certificates(&mut text, tls);
        let body = text.finish();
        assert_eq!(samples(&body), expected, "{body}");
        assert!(body.contains("# TYPE keel_tls_certificate_expiry_time_seconds gauge"));
    };
    let name = "keel_tls_certificate_expiry_time_seconds";
    check(
        Some(&tls),
        &[
            format!("{name}{{cert=\"node\"}} {END_OF_2030}"),
            format!("{name}{{cert=\"ca\"}} {END_OF_2035}"),
        ],
    );
    check(None, &[]);
}
