//! Tests of the refresh rules: the plan as a table, and sharing and rate limiting with
//! fetches that count themselves (no timing: the interval is an hour or zero).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use keel_types::{RangeDescriptor, RangeId};

use super::*;
use crate::range_table::Entry;

const HOUR: Duration = Duration::from_secs(3_600);

#[test]
fn refreshes_are_shared_rate_limited_and_never_outlive_the_deadline() {
    let now = Instant::now();
    let ms = Duration::from_millis;
    let interval = ms(100);
    let later = now + Duration::from_secs(5);
    use Plan::*;
    use Urgency::*;
    let cases = [
        // Someone fetched after the caller looked: nothing to do, however urgent.
        (None, (3, 4), Wait, later, Done),
        (Some(now), (3, 4), IfAllowed, later, Done),
        // Never fetched: fetch.
        (None, (0, 0), IfAllowed, later, Fetch),
        // The interval has passed: fetch.
        (Some(now - ms(100)), (2, 2), IfAllowed, later, Fetch),
        (Some(now - ms(250)), (2, 2), Wait, later, Fetch),
        // Within the interval: wait for the rest of it, or skip if not urgent.
        (
            Some(now - ms(30)),
            (2, 2),
            Wait,
            later,
            WaitThenFetch(ms(70)),
        ),
        (Some(now - ms(30)), (2, 2), IfAllowed, later, Skip),
        // The deadline comes first: skip.
        (Some(now - ms(30)), (2, 2), Wait, now + ms(50), Skip),
    ];
    for (fetched_at, generations, urgency, deadline, expected) in cases {
        let plan = plan_refresh(now, fetched_at, interval, generations, urgency, deadline);
        assert_eq!(plan, expected, "{fetched_at:?} {generations:?} {urgency:?}");
    }
}

fn one_range_table() -> RangeTable {
    let entry = Entry {
        descriptor: RangeDescriptor {
            id: RangeId::FIRST,
            start: Vec::new(),
            end: None,
            epoch: 0,
            conf_version: 0,
            replicas: vec![1],
        },
        leader: None,
    };
    let nodes = BTreeMap::from([(1, "127.0.0.1:7001".to_string())]);
    RangeTable::new(vec![entry], nodes).unwrap()
}

/// A fetch that counts its calls and finds `fetched`.
fn counting(
    calls: &Arc<AtomicUsize>,
    fetched: fn() -> Fetched,
) -> impl FnOnce() -> std::future::Ready<Fetched> {
    let calls = calls.clone();
    move || {
        calls.fetch_add(1, Ordering::SeqCst);
        std::future::ready(fetched())
    }
}

#[tokio::test]
async fn concurrent_first_requests_share_one_fetch() {
    let cache = Arc::new(RangeCache::new(HOUR));
    assert_eq!(cache.wanted(), Some(Urgency::Wait));
    let calls = Arc::new(AtomicUsize::new(0));
    let deadline = Instant::now() + HOUR;
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let (cache, calls) = (cache.clone(), calls.clone());
        tasks.spawn(async move {
            let fetch = counting(&calls, || Fetched::Table(one_range_table()));
            cache.refresh(0, Urgency::Wait, deadline, fetch).await;
        });
    }
    tasks.join_all().await;
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(cache.generation(), 1);
    assert_eq!(cache.wanted(), None);
    let (picked, uri, _) = cache.pick(Some(b"k"), &[], &[], 0);
    assert_eq!(picked, Picked::Range(RangeId::FIRST));
    assert_eq!(uri.as_deref(), Some("127.0.0.1:7001"));
}

#[tokio::test]
async fn stale_marks_and_refusals_fetch_at_most_once_per_interval() {
    let cache = RangeCache::new(HOUR);
    let calls = Arc::new(AtomicUsize::new(0));
    let table = || Fetched::Table(one_range_table());
    let soon = Instant::now() + Duration::from_millis(10);
    cache
        .refresh(0, Urgency::Wait, soon, counting(&calls, table))
        .await;
    cache.mark_stale();
    assert_eq!(cache.wanted(), Some(Urgency::IfAllowed));
    // Within the hour: neither a suspicion nor a refusal with a near deadline fetches.
    cache
        .refresh(1, Urgency::IfAllowed, soon, counting(&calls, table))
        .await;
    cache
        .refresh(1, Urgency::Wait, soon, counting(&calls, table))
        .await;
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(cache.wanted(), Some(Urgency::IfAllowed), "still suspected");

    // With no interval, a refusal fetches at once and clears the suspicion.
    let eager = RangeCache::new(Duration::ZERO);
    eager
        .refresh(0, Urgency::Wait, soon, counting(&calls, table))
        .await;
    eager.mark_stale();
    eager
        .refresh(1, Urgency::Wait, soon, counting(&calls, table))
        .await;
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    assert_eq!(eager.wanted(), None);
}

#[tokio::test]
async fn unsupported_clusters_route_without_a_table_and_failures_keep_what_there_was() {
    let cache = RangeCache::new(Duration::ZERO);
    let calls = Arc::new(AtomicUsize::new(0));
    let soon = Instant::now() + Duration::from_millis(10);
    cache
        .refresh(0, Urgency::Wait, soon, counting(&calls, || Fetched::Failed))
        .await;
    assert_eq!(cache.mode(), Mode::Unknown);
    assert_eq!(cache.wanted(), Some(Urgency::IfAllowed), "try again later");
    assert_eq!(cache.pick(Some(b"k"), &[], &[], 0).0, Picked::Unrouted);

    cache
        .refresh(
            1,
            Urgency::Wait,
            soon,
            counting(&calls, || Fetched::Unsupported),
        )
        .await;
    assert_eq!(cache.mode(), Mode::Unsupported);
    assert_eq!(cache.wanted(), None);
    assert_eq!(
        cache.pick(Some(b"k"), &[], &[], 0),
        (Picked::Whole, None, 2)
    );
    assert_eq!(cache.pick(None, &[], &[], 0).0, Picked::Unrouted);
    assert_eq!(cache.group(&[b"a", b"b"]), vec![vec![0, 1]]);
    assert_eq!(cache.spans(&[b"a", b"b"]), None);

    let table = || Fetched::Table(one_range_table());
    cache
        .refresh(2, Urgency::Wait, soon, counting(&calls, table))
        .await;
    cache
        .refresh(3, Urgency::Wait, soon, counting(&calls, || Fetched::Failed))
        .await;
    assert!(
        matches!(cache.mode(), Mode::Known(_)),
        "a failed fetch keeps the table"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 4);
}
