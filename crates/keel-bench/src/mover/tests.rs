//! Which voter leads next, and which completions count as soon after a move.

use keel_types::{RangeDescriptor, RangeId};

use super::*;

fn range(replicas: &[NodeId], leader: Option<NodeId>) -> RangeInfo {
    RangeInfo {
        descriptor: RangeDescriptor {
            id: RangeId(2),
            start: Vec::new(),
            end: None,
            epoch: 1,
            conf_version: 1,
            replicas: replicas.to_vec(),
        },
        leader,
        size_bytes: 0,
        keys: 0,
        requests_per_sec: 0.0,
        counts_age: Duration::ZERO,
    }
}

#[test]
fn leadership_goes_round_the_voters() {
    assert_eq!(next_leader(&range(&[1, 2, 3], Some(1))), Some(2));
    assert_eq!(next_leader(&range(&[3, 1, 2], Some(2))), Some(3));
    assert_eq!(next_leader(&range(&[1, 2, 3], Some(3))), Some(1));
    assert_eq!(next_leader(&range(&[1], Some(1))), None);
    assert_eq!(next_leader(&range(&[1, 2, 3], None)), None);
}

#[tokio::test(start_paused = true)]
async fn completions_within_the_window_after_a_round_count_as_after_a_move() {
    let moves = Moves::new();
    let before = Instant::now();
    assert!(!moves.soon_after_move(before), "no round yet");
    tokio::time::advance(Duration::from_secs(5)).await;
    let round = Instant::now();
    moves.start_round(round);
    assert!(!moves.soon_after_move(before), "before the round");
    assert!(moves.soon_after_move(round));
    assert!(moves.soon_after_move(round + limits::AFTER_MOVE - Duration::from_millis(1)));
    assert!(!moves.soon_after_move(round + limits::AFTER_MOVE));
}

#[test]
fn refusals_are_counted_and_the_first_kept() {
    let moves = Moves::new();
    moves.moved();
    moves.refused("first".to_string());
    moves.refused("second".to_string());
    let counts = moves.counts();
    assert_eq!((counts.done, counts.refused), (1, 2));
    assert_eq!(counts.first_refusal.as_deref(), Some("first"));
}
