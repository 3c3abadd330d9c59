use std::time::Duration;

use tonic::metadata::MetadataValue;

use super::*;

const FILE: &str = r#"
[[admin]]
name = "ops"
tokens = ["admin-token-0123456789"]

[[tenant]]
name = "acme"
tokens = ["acme-token-0123456789", "acme-second-0123456789"]
max_keys = 10
max_requests_per_sec = 2

[[tenant]]
name = "globex"
tokens = ["globex-token-0123456789"]
"#;

fn bearer(token: &str) -> MetadataMap {
    let mut metadata = MetadataMap::new();
    let value: MetadataValue<_> = format!("Bearer {token}").parse().unwrap();
    metadata.insert("authorization", value);
    metadata
}

/// The tenant `token` names (as a client's request, not a peer's).
fn tenant(access: &Access, token: &str) -> Arc<Tenant> {
    match access.caller(&bearer(token), false).unwrap() {
        Caller::Tenant(tenant) => tenant,
        other => panic!("not a tenant: {other:?}"),
    }
}

#[test]
fn tokens_name_their_callers() {
    let access = Access::parse(FILE).unwrap();
    let acme = tenant(&access, "acme-second-0123456789");
    assert_eq!(acme.name.as_str(), "acme");
    assert_eq!(acme.quotas.keys, Some(10));
    let globex = tenant(&access, "globex-token-0123456789");
    assert_ne!(acme.namespace, globex.namespace);
    assert!(
        matches!(
            access.caller(&bearer("globex-token-0123456789"), true),
            Ok(Caller::Tenant(_))
        ),
        "a token counts before the peer's certificate"
    );
    assert!(matches!(
        access.caller(&bearer("admin-token-0123456789"), false),
        Ok(Caller::Admin)
    ));
    assert_eq!(access.tenants().len(), 2);
}

#[test]
fn a_missing_or_unknown_token_is_refused_unless_a_peer_sends_none() {
    let access = Access::parse(FILE).unwrap();
    let refused = |metadata: &MetadataMap, peer| {
        matches!(
            access.caller(metadata, peer),
            Err(KvError::Unauthenticated { .. })
        )
    };
    assert!(refused(&MetadataMap::new(), false));
    assert!(refused(&bearer("acme-token-012345678X"), false));
    assert!(
        refused(&bearer("acme-token-012345678X"), true),
        "a peer's bad token too"
    );
    let mut basic = MetadataMap::new();
    basic.insert("authorization", "Basic YWNtZQ==".parse().unwrap());
    assert!(refused(&basic, false));
    assert!(matches!(
        access.caller(&MetadataMap::new(), true),
        Ok(Caller::System)
    ));
}

#[test]
fn bad_files_are_refused_with_the_reason() {
    let cases = [
        ("", "no tokens"),
        (
            "[[tenant]]\nname = \"Acme\"\ntokens = [\"0123456789abcdef\"]",
            "a-z",
        ),
        (
            "[[tenant]]\nname = \"a\"\ntokens = [\"short\"]",
            "16 to 256",
        ),
        (
            "[[tenant]]\nname = \"a\"\ntokens = [\"0123456789 abcdef\"]",
            "visible ASCII",
        ),
        ("[[tenant]]\nname = \"a\"\ntokens = []", "has no tokens"),
        (
            "[[tenant]]\nname = \"a\"\ntokens = [\"0123456789abcdef\"]\n[[tenant]]\nname = \"a\"\ntokens = [\"0123456789abcdeg\"]",
            "listed twice",
        ),
        (
            "[[tenant]]\nname = \"a\"\ntokens = [\"0123456789abcdef\"]\n[[admin]]\nname = \"b\"\ntokens = [\"0123456789abcdef\"]",
            "more than once",
        ),
        (
            "[[tenant]]\nname = \"a\"\ntokens = [\"0123456789abcdef\"]\nmax_requests_per_sec = 0",
            "leave it out",
        ),
        (
            "[[tenant]]\nname = \"a\"\ntokens = [\"0123456789abcdef\"]\nmax_keyz = 3",
            "unknown field",
        ),
    ];
    for (text, reason) in cases {
        let error = Access::parse(text).unwrap_err();
        assert!(error.contains(reason), "{text:?}: {error}");
    }
}

#[test]
fn tenants_may_not_administer() {
    let access = Access::parse(FILE).unwrap();
    let acme = access
        .caller(&bearer("acme-token-0123456789"), false)
        .unwrap();
    assert!(matches!(
        acme.admit(Call::Admin),
        Err(KvError::PermissionDenied { .. })
    ));
    assert!(acme.admit(Call::Listing).is_ok());
    let admin = access
        .caller(&bearer("admin-token-0123456789"), false)
        .unwrap();
    assert!(admin.admit(Call::Admin).is_ok());
    assert!(admin.namespace().is_none() && acme.namespace().is_some());
}

#[test]
fn keys_quota_refuses_growing_writes_only() {
    let access = Access::parse(FILE).unwrap();
    let acme = tenant(&access, "acme-token-0123456789");
    let now = Instant::now();
    let later = |secs| now + Duration::from_secs(secs);
    assert!(acme.admit(Call::Write { grows: true }, now).is_ok());
    acme.set_usage(Usage { keys: 10, bytes: 0 });
    let refused = acme.admit(Call::Write { grows: true }, later(1));
    assert!(
        matches!(&refused, Err(KvError::QuotaExceeded { quota, limit: 10, .. }) if quota == "keys"),
        "{refused:?}"
    );
    assert!(
        acme.admit(Call::Write { grows: false }, later(2)).is_ok(),
        "a delete goes through"
    );
    assert!(acme.admit(Call::Read, later(3)).is_ok());
}

#[test]
fn requests_per_sec_quota_refills_over_time() {
    let access = Access::parse(FILE).unwrap();
    let acme = tenant(&access, "acme-token-0123456789");
    let now = Instant::now();
    assert!(acme.admit(Call::Read, now).is_ok());
    assert!(acme.admit(Call::Read, now).is_ok());
    let refused = acme.admit(Call::Read, now);
    assert!(
        matches!(&refused, Err(KvError::QuotaExceeded { quota, limit: 2, .. }) if quota == "requests_per_sec"),
        "{refused:?}"
    );
    assert!(
        acme.admit(Call::Listing, now).is_ok(),
        "listings are not counted"
    );
    assert!(
        acme.admit(Call::Read, now + Duration::from_millis(500))
            .is_ok()
    );
    assert!(
        acme.admit(Call::Read, now + Duration::from_millis(500))
            .is_err()
    );
    let globex = tenant(&access, "globex-token-0123456789");
    for _ in 0..100 {
        assert!(globex.admit(Call::Read, now).is_ok(), "no quota, no limit");
    }
}
