//! The pages of a range's events its watches on this node read (`WatchPages`): the streams
//! of one range that stand at the same cursor (every stream caught up with the replica does,
//! after each apply) take one read of the range's whole span between them, each keeping its
//! own part, instead of a read each. A range keeps its last page while a stream of it is
//! open; a stream that finds the page read from another cursor, or before an apply it knows
//! of, reads a new one. Knows nothing of gRPC or of the streams' filters.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use keel_raft::RaftGroup;
use keel_storage::{RangeEventsPage, RangeRead, StorageError};
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
    /// One read at a time per range: the streams that wait for it take its page.
    pub async fn read(
        &self,
        group: &RaftGroup,
        from: &EventCursor,
        seen: u64,
        bounds: (usize, u64),
    ) -> Result<PageRead, StorageError> {
        let mut last = self.last.lock().await;
        if let Some((cursor, page)) = last.as_ref()
            && cursor == from
            && page.applied_index >= seen
        {
            return Ok(PageRead::Page {
                page: page.clone(),
                read: false,
            });
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
