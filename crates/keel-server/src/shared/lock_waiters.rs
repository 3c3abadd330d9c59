//! Who waits for which lock on this node (`LockWaiters`): each running lock queue posts the
//! owners of its waiting acquires (at most `CONSOLE_WAITERS_SHOWN_MAX`, and how many wait in
//! all) and takes its entry down when it stops; the console reads it. The queues themselves
//! live in `locks/`. Knows nothing of what a queue does.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use keel_types::RangeId;
use keel_types::limits::CONSOLE_WAITERS_SHOWN_MAX;

/// A lock's queue: its range and its name.
pub(crate) type WaitedLock = (RangeId, Vec<u8>);

/// The waiters of one lock, first in line first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Waiting {
    /// The first `CONSOLE_WAITERS_SHOWN_MAX` waiters' owners.
    pub owners: Vec<Vec<u8>>,
    /// All waiters, those not named included.
    pub count: usize,
}

#[derive(Default)]
pub(crate) struct LockWaiters {
    posted: Mutex<BTreeMap<WaitedLock, Waiting>>,
}

impl LockWaiters {
    /// Posts the owners of `lock`'s waiting acquires, first in line first (none: takes the
    /// entry down).
    pub fn post<'a>(&self, lock: &WaitedLock, owners: impl ExactSizeIterator<Item = &'a [u8]>) {
        let count = owners.len();
        let mut posted = self.lock();
        if count == 0 {
            posted.remove(lock);
            return;
        }
        let owners = owners
            .take(CONSOLE_WAITERS_SHOWN_MAX)
            .map(<[u8]>::to_vec)
            .collect();
        posted.insert(lock.clone(), Waiting { owners, count });
    }

    /// Takes `lock`'s entry down (its queue stopped).
    pub fn clear(&self, lock: &WaitedLock) {
        self.lock().remove(lock);
    }

    /// Every lock with waiters, by range and name.
    pub fn all(&self) -> BTreeMap<WaitedLock, Waiting> {
        self.lock().clone()
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<WaitedLock, Waiting>> {
        self.posted.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn posts_are_bounded_and_taken_down() {
        let waiters = LockWaiters::default();
        let lock = (RangeId(2), b"job".to_vec());
        let owners: Vec<Vec<u8>> = (0..CONSOLE_WAITERS_SHOWN_MAX + 3)
            .map(|i| format!("w{i}").into_bytes())
            .collect();
        waiters.post(&lock, owners.iter().map(Vec::as_slice));
        let posted = &waiters.all()[&lock];
        assert_eq!(posted.count, CONSOLE_WAITERS_SHOWN_MAX + 3);
        assert_eq!(posted.owners.len(), CONSOLE_WAITERS_SHOWN_MAX);
        assert_eq!(posted.owners[0], b"w0");
        waiters.post(&lock, std::iter::empty());
        assert!(waiters.all().is_empty());
        waiters.post(&lock, owners.iter().take(1).map(Vec::as_slice));
        waiters.clear(&lock);
        assert!(waiters.all().is_empty());
    }
}
