//! Table tests of session state: sequences, `completed_below`, and when a session is replaced.

use std::sync::atomic::{AtomicU64, Ordering};

use super::*;

const AGE_MAX_MS: u64 = 300_000;

fn open(state: &mut State) -> RequestId {
    state.open(7, 1_000, 0)
}

/// (sequence, completed_below) of an id.
fn pair(id: RequestId) -> (u64, u64) {
    (id.sequence, id.completed_below)
}

#[test]
fn sequences_start_at_one_and_completed_below_is_the_lowest_in_flight() {
    let mut state = State::default();
    assert_eq!(state.assign(0, AGE_MAX_MS), None, "no session yet");
    let first = open(&mut state);
    assert_eq!((first.client_id, first.client_started_ms), (7, 1_000));
    let second = state.assign(0, AGE_MAX_MS).unwrap();
    let third = state.assign(0, AGE_MAX_MS).unwrap();
    assert_eq!(
        [pair(first), pair(second), pair(third)],
        [(1, 1), (2, 1), (3, 1)]
    );
    // The second ends first: the first still holds completed_below back.
    state.finish(&second);
    assert_eq!(pair(state.assign(0, AGE_MAX_MS).unwrap()), (4, 1));
    state.finish(&first);
    assert_eq!(pair(state.assign(0, AGE_MAX_MS).unwrap()), (5, 3));
}

#[test]
fn with_nothing_in_flight_completed_below_is_the_request_itself() {
    let mut state = State::default();
    let first = open(&mut state);
    state.finish(&first);
    let second = state.assign(0, AGE_MAX_MS).unwrap();
    state.finish(&second);
    assert_eq!(pair(state.assign(0, AGE_MAX_MS).unwrap()), (3, 3));
}

#[test]
fn sessions_are_replaced_when_old_or_when_the_window_is_full() {
    let mut state = State::default();
    open(&mut state);
    assert!(
        state.assign(AGE_MAX_MS, AGE_MAX_MS).is_some(),
        "at the limit"
    );
    assert_eq!(state.assign(AGE_MAX_MS + 1, AGE_MAX_MS), None, "too old");

    let mut state = State::default();
    let first_of_window = open(&mut state);
    for _ in 1..limits::REQUESTS_PER_SESSION_MAX {
        assert!(state.assign(0, AGE_MAX_MS).is_some());
    }
    assert_eq!(state.assign(0, AGE_MAX_MS), None, "window full");
    state.finish(&first_of_window);
    assert!(state.assign(0, AGE_MAX_MS).is_some(), "window moved on");
}

#[test]
fn ids_of_a_replaced_session_do_not_touch_the_new_one() {
    let mut state = State::default();
    let old = open(&mut state);
    let new = state.open(8, 2_000, 10);
    assert_eq!(pair(new), (1, 1));
    let next = state.assign(10, AGE_MAX_MS).unwrap();
    state.finish(&old);
    state.finish(&RequestId { sequence: 1, ..old });
    assert_eq!(pair(state.assign(10, AGE_MAX_MS).unwrap()), (3, 1));
    assert_eq!(next.client_id, 8);
}

#[tokio::test]
async fn concurrent_first_writes_open_one_session_and_dropped_ids_complete() {
    let clock = keel_types::ManualClock::new(0);
    let sessions = Sessions::new(clock.clone(), Duration::from_millis(AGE_MAX_MS));
    let counter = AtomicU64::new(0);
    let opened = &counter;
    let open = move || async move {
        let count = opened.fetch_add(1, Ordering::SeqCst) + 1;
        Ok((count, 1_000))
    };
    let (a, b) = tokio::join!(sessions.begin(open), sessions.begin(open));
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(counter.load(Ordering::SeqCst), 1);
    assert_eq!((a.id().client_id, b.id().client_id), (1, 1));
    assert_ne!(a.id().sequence, b.id().sequence);
    drop((a, b));
    let c = sessions.begin(open).await.unwrap();
    assert_eq!(pair(c.id()), (3, 3));
    // Past the age limit a new session is opened; retiring it forces another.
    clock.advance_ms(AGE_MAX_MS + 1);
    let d = sessions.begin(open).await.unwrap();
    assert_eq!((d.id().client_id, d.id().sequence), (2, 1));
    sessions.retire(&c.id());
    assert_eq!(sessions.begin(open).await.unwrap().id().client_id, 2);
    sessions.retire(&d.id());
    assert_eq!(sessions.begin(open).await.unwrap().id().client_id, 3);
}
