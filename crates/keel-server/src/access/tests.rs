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
fn etcd_users_are_the_entries_and_their_passwords_their_tokens() {
    let access = Access::parse(FILE).unwrap();
    assert!(access.authenticate("acme", "acme-token-0123456789"));
    assert!(access.authenticate("acme", "acme-second-0123456789"));
    assert!(access.authenticate("ops", "admin-token-0123456789"));
    // An attacker who holds one tenant's token cannot log in as another, nor guess.
    assert!(!access.authenticate("globex", "acme-token-0123456789"));
    assert!(!access.authenticate("acme", "globex-token-0123456789"));
    assert!(!access.authenticate("ops", "acme-token-0123456789"));
    assert!(!access.authenticate("acme", "acme-token-012345678"));
    assert!(!access.authenticate("acme", ""));
    assert!(!access.authenticate("", "acme-token-0123456789"));
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
fn a_file_of_more_tenants_than_the_limit_is_refused() {
    let file = |tenants: usize| {
        let entry = |i| format!("[[tenant]]\nname = \"t{i}\"\ntokens = [\"token-{i:0>16}\"]\n");
        (0..tenants).map(entry).collect::<String>()
    };
    let most = Access::parse(&file(limits::TENANTS_MAX)).unwrap();
    assert_eq!(most.tenants().len(), limits::TENANTS_MAX);
    let error = Access::parse(&file(limits::TENANTS_MAX + 1)).unwrap_err();
    let expected = format!(
        "it lists {} tenants; limit is {}",
        limits::TENANTS_MAX + 1,
        limits::TENANTS_MAX
    );
    assert_eq!(error, expected);
}

#[test]
fn usage_is_the_tables_ranges_summed_once_it_lists_one() {
    let access = Access::parse(FILE).unwrap();
    let acme = tenant(&access, "acme-token-0123456789");
    assert_eq!(acme.usage(), None, "no table yet");
    let amount = |keys, bytes| Amount { keys, bytes };
    acme.set_table(vec![
        (RangeId(4), amount(2, 20)),
        (RangeId(5), amount(4, 7)),
    ]);
    assert_eq!(acme.usage(), Some(amount(6, 27)));
    acme.set_table(vec![(RangeId(4), Amount::default())]);
    assert_eq!(acme.usage(), Some(Amount::default()), "an empty namespace");
    acme.set_table(Vec::new());
    assert_eq!(acme.usage(), None, "no range of its own");
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

fn keys(keys: u64) -> Amount {
    Amount { keys, bytes: 0 }
}

#[test]
fn reservations_in_flight_count_until_released() {
    let access = Access::parse(FILE).unwrap();
    let acme = tenant(&access, "acme-token-0123456789");
    let range = RangeId(4);
    let nothing = Amount::default();
    assert!(acme.reserve(range, keys(0), nothing, keys(6)).is_ok());
    let refused = acme.reserve(range, keys(0), nothing, keys(5));
    assert!(
        matches!(&refused, Err(KvError::QuotaExceeded { quota, limit: 10, .. }) if quota == "keys"),
        "6 reserved + 5 > 10: {refused:?}"
    );
    assert!(acme.reserve(range, keys(0), nothing, keys(4)).is_ok());
    // The first write applies (6 live) and gives its reservation back; an admission that
    // read the live counts before the release sees 0 live but still counts the 6.
    let before = acme.released();
    acme.release(keys(6));
    assert!(acme.reserve(range, keys(0), before, keys(1)).is_err());
    assert!(
        acme.reserve(range, keys(6), acme.released(), keys(1))
            .is_err()
    );
    acme.release(keys(4));
    assert!(
        acme.reserve(range, keys(9), acme.released(), keys(1))
            .is_ok()
    );
    assert!(
        acme.reserve(range, keys(12), acme.released(), nothing)
            .is_ok(),
        "a write that adds nothing goes through"
    );
}

#[test]
fn a_namespace_split_in_two_shares_the_room_by_the_table() {
    let access = Access::parse(FILE).unwrap();
    let acme = tenant(&access, "acme-token-0123456789");
    acme.set_table(vec![(RangeId(4), keys(2)), (RangeId(5), keys(4))]);
    let nothing = Amount::default();
    // 4 left, 2 each: range 4 may hold 4.
    assert!(acme.reserve(RangeId(4), keys(3), nothing, keys(1)).is_ok());
    assert!(acme.reserve(RangeId(4), keys(3), nothing, keys(1)).is_err());
}

#[test]
fn the_tenant_of_a_stored_key_is_found_by_its_prefix() {
    let access = Access::parse(FILE).unwrap();
    let acme = tenant(&access, "acme-token-0123456789");
    let stored = acme.namespace.confine(b"k");
    assert_eq!(access.tenant_of(&stored).unwrap().name, acme.name);
    assert!(access.tenant_of(b"k").is_none());
    assert!(access.tenant_of(b"\xffTnobody\x01k").is_none());
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
    let listing = acme.admit(Call::Listing, now);
    assert!(
        matches!(&listing, Err(KvError::QuotaExceeded { .. })),
        "listings draw tokens too: {listing:?}"
    );
    assert!(
        acme.admit(Call::Read, now + Duration::from_millis(500))
            .is_ok()
    );
    assert!(
        acme.admit(Call::Read, now + Duration::from_millis(500))
            .is_err()
    );
    let later = now + Duration::from_secs(10);
    let too_large = acme.admit(Call::Batch { ops: 3 }, later);
    assert!(
        matches!(&too_large, Err(KvError::InvalidArgument { message }) if message.contains("at most 2 ops")),
        "a batch of 3 ops can never pass a bucket of 2: {too_large:?}"
    );
    assert!(acme.admit(Call::Batch { ops: 2 }, later).is_ok());
    assert!(acme.admit(Call::Write, later).is_err(), "the batch drew 2");
    let globex = tenant(&access, "globex-token-0123456789");
    for _ in 0..100 {
        assert!(globex.admit(Call::Read, now).is_ok(), "no quota, no limit");
    }
}
