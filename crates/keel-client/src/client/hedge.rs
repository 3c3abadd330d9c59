//! Asking nodes for an answer any of them can give (the range table, a new session): the
//! first node at once, and the next one whenever `HEDGE_AFTER` passes without an answer or
//! an ask fails; the first answer wins and the asks still out are dropped. A node that is
//! paused or cut off answers nothing until the ask's own timeout (seconds); hedging lets
//! another node answer meanwhile, and a node that is only slow is not given up: its answer
//! still counts if it comes first. An ask costs one call, and only a slow ask brings another.

use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

/// How long an ask goes unanswered before the next node is asked too: an answer any node
/// gives from memory takes a few milliseconds.
pub(super) const HEDGE_AFTER: Duration = Duration::from_millis(250);

/// The first answer of `ask` over `candidates` (in order, hedged as above), or every
/// failure once all of them failed.
pub(super) async fn first_answer<C, T, E, F, Fut>(
    candidates: Vec<C>,
    hedge_after: Duration,
    ask: F,
) -> Result<T, Vec<E>>
where
    F: Fn(C) -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let mut left = candidates.into_iter();
    let mut asks: Vec<Pin<Box<Fut>>> = Vec::new();
    let mut failures = Vec::new();
    // Each turn asks one node more: at the start, after a failure, after `hedge_after`.
    loop {
        if let Some(candidate) = left.next() {
            asks.push(Box::pin(ask(candidate)));
        }
        if asks.is_empty() {
            return Err(failures);
        }
        let more = left.len() > 0;
        let answered = tokio::select! {
            answered = any(&mut asks) => Some(answered),
            () = tokio::time::sleep(hedge_after), if more => None,
        };
        if let Some((index, answer)) = answered {
            drop(asks.swap_remove(index));
            match answer {
                Ok(answer) => return Ok(answer),
                Err(failure) => failures.push(failure),
            }
        }
    }
}

/// The first of `asks` to finish: its index and output.
async fn any<Fut: Future>(asks: &mut [Pin<Box<Fut>>]) -> (usize, Fut::Output) {
    poll_fn(|cx| {
        for (index, ask) in asks.iter_mut().enumerate() {
            if let Poll::Ready(output) = ask.as_mut().poll(cx) {
                return Poll::Ready((index, output));
            }
        }
        Poll::Pending
    })
    .await
}

#[cfg(test)]
mod tests {
    use std::future::pending;
    use std::sync::Mutex;

    use super::*;

    /// What each candidate does when asked: answer, fail, or never answer.
    #[derive(Clone, Copy)]
    enum Does {
        Answer,
        Fail,
        Hang,
    }

    async fn run(candidates: &[Does]) -> (Result<usize, Vec<usize>>, Vec<usize>) {
        let asked = Mutex::new(Vec::new());
        let indexed: Vec<(usize, Does)> = candidates.iter().copied().enumerate().collect();
        let answer = first_answer(indexed, Duration::from_millis(10), |(index, does)| {
            asked.lock().unwrap().push(index);
            async move {
                match does {
                    Does::Answer => Ok(index),
                    Does::Fail => Err(index),
                    Does::Hang => pending().await,
                }
            }
        })
        .await;
        (answer, asked.into_inner().unwrap())
    }

    #[tokio::test]
    async fn the_first_answer_wins_past_nodes_that_fail_or_hang() {
        use Does::*;
        // The first answers: nobody else is asked.
        assert_eq!(run(&[Answer, Answer]).await, (Ok(0), vec![0]));
        // A failure asks the next at once.
        assert_eq!(run(&[Fail, Answer, Answer]).await, (Ok(1), vec![0, 1]));
        // A hanging node is hedged: the next is asked and answers.
        assert_eq!(run(&[Hang, Hang, Answer]).await, (Ok(2), vec![0, 1, 2]));
        // Every node failed: every failure, in order.
        assert_eq!(run(&[Fail, Fail]).await, (Err(vec![0, 1]), vec![0, 1]));
        assert_eq!(run(&[]).await, (Err(vec![]), vec![]));
    }

    #[tokio::test]
    async fn a_slow_node_that_answers_first_still_counts() {
        let answer = first_answer(
            vec![0u64, 1],
            Duration::from_millis(10),
            |index| async move {
                match index {
                    0 => {
                        tokio::time::sleep(Duration::from_millis(30)).await;
                        Ok::<u64, ()>(0)
                    }
                    _ => pending().await,
                }
            },
        )
        .await;
        assert_eq!(answer, Ok(0));
    }
}
