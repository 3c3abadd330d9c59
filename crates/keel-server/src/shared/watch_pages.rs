//! The pages of a range's events its watches on this node read (`WatchPages`): the streams
//! of one range that stand at the same cursor (every stream caught up with the replica does,
//! after each apply) take one read of the range's whole span between them, each keeping its
//! own part, instead of a read each. A range keeps its last page while a stream of it is
//! open; a stream that finds the page read from another cursor, or before an apply it knows
//! of, reads a new one. When it reads the page that follows the last one (the streams are
//! caught up and an apply woke them) it first lingers in proportion to the range's streams
//! (`linger`), so that each of them sends one message for several applies instead of one
//! per apply. Knows nothing of gRPC or of the streams' filters.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use keel_raft::RaftGroup;
use keel_storage::{RangeEventsPage, RangeRead, StorageError};
use keel_types::limits::{WATCH_LINGER_MAX_MS, WATCH_LINGER_PER_STREAM_US};
use keel_types::{EventCursor, RangeId};

/// Every range's `RangePages` that some stream holds.
#[derive(Default)]
pub(crate) struct WatchPages {
    ranges: Mutex<HashMap<RangeId, Weak<RangePages>>>,
}

impl WatchPages {
    /// The pages of `range`, shared with every other stream of it open now.
    pub fn of(&self, range: RangeId) -> Arc<RangePages> {
        let mut ranges = self.ranges.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(pages) = ranges.get(&range).and_then(Weak::upgrade) {
            return pages;
        }
        ranges.retain(|_, pages| pages.strong_count() > 0);
        let pages = Arc::new(RangePages::default());
        ranges.insert(range, Arc::downgrade(&pages));
        pages
    }
}

/// One range's last page of events and the cursor it was read from.
#[derive(Default)]
pub(crate) struct RangePages {
    last: tokio::sync::Mutex<Option<(EventCursor, Arc<RangeEventsPage>)>>,
}

/// A page, or why the range's events from the cursor cannot be read.
pub(crate) enum PageRead {
    /// `read`: this call read it (else another stream's read is shared).
    Page {
        page: Arc<RangeEventsPage>,
        read: bool,
    },
    Compacted {
        compact_revision: u64,
    },
}

impl RangePages {
    /// The range's events from `from` on, within `bounds` (`StateMachine::range_events`),
    /// read by `group` after it applied log index `seen`: the last page when it was read
    /// from `from` with that apply in it, else a new read (which becomes the last page).
    /// One read at a time per range: the streams that wait for it take its page. A read of
    /// the page right after the last complete one first waits `linger(streams)`, `streams`
    /// being how many streams of the range are open on this node.
    pub async fn read(
        &self,
        group: &RaftGroup,
        (from, seen): (&EventCursor, u64),
        bounds: (usize, u64),
        streams: usize,
    ) -> Result<PageRead, StorageError> {
        let mut last = self.last.lock().await;
        if let Some((cursor, page)) = last.as_ref() {
            if cursor == from && page.applied_index >= seen {
                return Ok(PageRead::Page {
                    page: page.clone(),
                    read: false,
                });
            }
            let follows =
                page.page.next.is_none() && *from == EventCursor::at(page.page.revision + 1);
            if let Some(wait) = linger(streams).filter(|_| follows) {
                tokio::time::sleep(wait).await;
            }
        }
        match group
            .state_machine()
            .range_events(from.clone(), bounds)
            .await?
        {
            RangeRead::Events(page) => {
                let page = Arc::new(page);
                *last = Some((from.clone(), page.clone()));
                Ok(PageRead::Page { page, read: true })
            }
            RangeRead::Compacted { compact_revision } => {
                Ok(PageRead::Compacted { compact_revision })
            }
        }
    }
}

/// How long caught-up streams of a range linger after an apply, when `streams` of them are
/// open on this node: `WATCH_LINGER_PER_STREAM_US` each, at most `WATCH_LINGER_MAX_MS`; none
/// under a millisecond (the timer's grain).
fn linger(streams: usize) -> Option<Duration> {
    let wait = Duration::from_micros(WATCH_LINGER_PER_STREAM_US.saturating_mul(streams as u64))
        .min(Duration::from_millis(WATCH_LINGER_MAX_MS));
    (wait >= Duration::from_millis(1)).then_some(wait)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lingering_grows_with_the_streams_from_a_millisecond_up_to_its_bound() {
        assert_eq!(linger(1), None);
        assert_eq!(linger(33), None);
        assert_eq!(linger(34), Some(Duration::from_micros(1_020)));
        assert_eq!(linger(100), Some(Duration::from_millis(3)));
        assert_eq!(linger(1_000), Some(Duration::from_millis(10)));
    }
}
