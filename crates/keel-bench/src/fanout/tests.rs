use std::time::Duration;

use tokio::time::Instant;

use super::*;

#[test]
fn a_stamped_payload_carries_its_send_time_and_a_plain_one_none() {
    let stamped = Payload::new(vec![b'v'; 16], true);
    let sent = stamped.bytes().into_owned();
    assert_eq!(&sent[STAMP_BYTES..], &[b'v'; 8]);
    // The stamp replaces the first bytes with an instant of this process: it has an age.
    assert!(sent[..STAMP_BYTES] != [b'v'; STAMP_BYTES]);
    assert!(age(&sent).is_some());
    // Unstamped: the constant bytes, whose "stamp" lies far in the future.
    let plain = Payload::new(vec![b'v'; 16], false);
    assert_eq!(age(&plain.bytes()), None);
    // Too short to carry a stamp: written as they are.
    let short = Payload::new(vec![b'v'; 4], true);
    assert_eq!(&*short.bytes(), b"vvvv");
    assert_eq!(age(b"vvvv"), None);
}

/// A feed that yields the given messages, then pends or ends.
struct Scripted {
    messages: Vec<Result<Vec<Vec<u8>>, Failure>>,
    then_end: bool,
}

impl Feed for Scripted {
    async fn next(&mut self) -> Option<Result<Vec<Vec<u8>>, Failure>> {
        match self.messages.is_empty() {
            false => Some(self.messages.remove(0)),
            true if self.then_end => None,
            true => std::future::pending().await,
        }
    }
}

#[tokio::test]
async fn watchers_count_stamped_events_in_the_window_and_the_errors_that_end_them() {
    let stamped = || Payload::new(vec![0; 8], true).bytes().into_owned();
    let window = Window {
        start: Instant::now(),
        end: Instant::now() + Duration::from_millis(200),
    };
    let feeds = vec![
        Scripted {
            messages: vec![
                Ok(vec![stamped(), stamped()]),
                Ok(vec![b"unstamped".to_vec()]),
            ],
            then_end: false,
        },
        Scripted {
            messages: vec![Ok(vec![stamped()]), Err(Failure::bench("lost"))],
            then_end: false,
        },
        Scripted {
            messages: Vec::new(),
            then_end: true,
        },
    ];
    let tally = watch(feeds, window).await;
    assert_eq!(tally.latencies_us.len(), 3);
    assert_eq!(tally.errors, 2);
}
