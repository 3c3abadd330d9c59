//! The round robin: each task visits every endpoint once per cycle, and the tasks start on
//! different endpoints.

use super::*;

fn turns(first: usize, len: usize, count: usize) -> Vec<usize> {
    let mut turns = Turns::new(first, len);
    (0..count).map(|_| turns.next()).collect()
}

#[test]
fn every_endpoint_once_per_cycle() {
    assert_eq!(turns(0, 3, 7), [0, 1, 2, 0, 1, 2, 0]);
    assert_eq!(turns(1, 3, 4), [1, 2, 0, 1]);
    assert_eq!(turns(0, 1, 3), [0, 0, 0]);
}

#[test]
fn tasks_start_on_different_endpoints() {
    let firsts: Vec<usize> = (0..5).map(|task| turns(task, 3, 1)[0]).collect();
    assert_eq!(firsts, [0, 1, 2, 0, 1]);
}

#[test]
#[should_panic(expected = "round robin over no endpoint")]
fn no_endpoint_is_a_programmer_error() {
    Turns::new(0, 0);
}
