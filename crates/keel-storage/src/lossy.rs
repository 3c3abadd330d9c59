//! A redb storage backend that keeps every write in memory until redb syncs, so that a
//! process killed with `kill -9` loses what it had not synced, as a machine losing power
//! would. Test-only (cargo feature `fault-injection`): it is how the Jepsen-style harness
//! makes "acknowledged before fsync" bugs visible. Knows nothing of tables or Raft.
//!
//! Writes go to 4 KiB pages held in memory over the file; reads see those pages first;
//! `sync_data` writes them to the file, resizes it, fsyncs it and forgets them. Memory is
//! bounded: past `UNSYNCED_BYTES_MAX` of pending pages a write fails, and the store poisons.

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::ops::Bound;
use std::sync::Mutex;

use redb::backends::FileBackend;
use redb::{BackendError, StorageBackend};

const PAGE_BYTES: u64 = 4096;
/// Unsynced bytes one file may hold in memory.
const UNSYNCED_BYTES_MAX: usize = 1024 * 1024 * 1024;

/// The pages written since the last sync, and the length the file will have.
#[derive(Debug, Default)]
struct Pending {
    pages: BTreeMap<u64, Box<[u8]>>,
    len: Option<u64>,
}

/// A backend that loses unsynced writes when the process dies.
#[derive(Debug)]
pub struct LossyBackend {
    file: FileBackend,
    pending: Mutex<Pending>,
}

impl LossyBackend {
    pub fn new(file: File) -> io::Result<LossyBackend> {
        let file = FileBackend::new(file).map_err(io::Error::other)?;
        Ok(LossyBackend {
            file,
            pending: Mutex::default(),
        })
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending.lock().expect("pending pages lock poisoned")
    }

    /// Page `index` as it reads now: pending, else from the file (zeros past its end).
    fn page(&self, pending: &Pending, index: u64) -> io::Result<Box<[u8]>> {
        if let Some(page) = pending.pages.get(&index) {
            return Ok(page.clone());
        }
        let mut page = vec![0u8; PAGE_BYTES as usize].into_boxed_slice();
        let file_len = self.file.len()?;
        let start = index * PAGE_BYTES;
        if start < file_len {
            let readable = (file_len - start).min(PAGE_BYTES) as usize;
            self.file.read(start, &mut page[..readable])?;
        }
        Ok(page)
    }
}

impl StorageBackend for LossyBackend {
    fn len(&self) -> io::Result<u64> {
        match self.pending().len {
            Some(len) => Ok(len),
            None => self.file.len(),
        }
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        let pending = self.pending();
        let mut done = 0usize;
        while done < out.len() {
            let at = offset + done as u64;
            let (index, within) = (at / PAGE_BYTES, (at % PAGE_BYTES) as usize);
            let take = (PAGE_BYTES as usize - within).min(out.len() - done);
            let page = self.page(&pending, index)?;
            out[done..done + take].copy_from_slice(&page[within..within + take]);
            done += take;
        }
        Ok(())
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        let mut pending = self.pending();
        let first_gone = len.div_ceil(PAGE_BYTES);
        pending.pages.split_off(&first_gone);
        let tail = (len % PAGE_BYTES) as usize;
        if tail != 0 {
            let index = len / PAGE_BYTES;
            let mut page = self.page(&pending, index)?;
            page[tail..].fill(0);
            pending.pages.insert(index, page);
        }
        pending.len = Some(len);
        Ok(())
    }

    fn sync_data(&self) -> io::Result<()> {
        let mut pending = self.pending();
        let len = match pending.len {
            Some(len) => len,
            None => self.file.len()?,
        };
        if self.file.len()? != len {
            self.file.set_len(len)?;
        }
        for (index, page) in &pending.pages {
            let start = index * PAGE_BYTES;
            let end = (start + PAGE_BYTES).min(len);
            if start < end {
                self.file.write(start, &page[..(end - start) as usize])?;
            }
        }
        self.file.sync_data()?;
        *pending = Pending::default();
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        let mut pending = self.pending();
        let mut done = 0usize;
        while done < data.len() {
            let at = offset + done as u64;
            let (index, within) = (at / PAGE_BYTES, (at % PAGE_BYTES) as usize);
            let take = (PAGE_BYTES as usize - within).min(data.len() - done);
            let mut page = self.page(&pending, index)?;
            page[within..within + take].copy_from_slice(&data[done..done + take]);
            pending.pages.insert(index, page);
            done += take;
        }
        if pending.pages.len() * PAGE_BYTES as usize > UNSYNCED_BYTES_MAX {
            return Err(io::Error::other(format!(
                "lossy backend: more than {UNSYNCED_BYTES_MAX} bytes written without a sync"
            )));
        }
        let end = offset + data.len() as u64;
        if pending.len.is_some_and(|len| len < end) {
            pending.len = Some(end);
        }
        Ok(())
    }

    fn close(&self) -> io::Result<()> {
        self.file.close()
    }

    fn try_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.file.try_lock_range(start, end)
    }

    fn try_lock_shared_range(
        &self,
        start: Bound<u64>,
        end: Bound<u64>,
    ) -> Result<bool, BackendError> {
        self.file.try_lock_shared_range(start, end)
    }

    fn lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.file.lock_range(start, end)
    }

    fn lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.file.lock_shared_range(start, end)
    }

    fn unlock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.file.unlock_range(start, end)
    }

    fn query_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.file.query_lock_range(start, end)
    }
}

#[cfg(test)]
mod tests {
    use redb::{Database, Durability, ReadableDatabase, TableDefinition};

    use super::*;

    const TABLE: TableDefinition<&str, &str> = TableDefinition::new("t");

    fn put(db: &Database, key: &str, durability: Durability) {
        let mut txn = db.begin_write().unwrap();
        txn.set_durability(durability).unwrap();
        txn.open_table(TABLE).unwrap().insert(key, "v").unwrap();
        txn.commit().unwrap();
    }

    fn has(db: &Database, key: &str) -> bool {
        let txn = db.begin_read().unwrap();
        let table = txn.open_table(TABLE).unwrap();
        table.get(key).unwrap().is_some()
    }

    /// The fault injector must inject: while the process lives every commit reads back;
    /// after it dies, the file holds the synced commits and not the unsynced ones.
    #[test]
    fn a_crash_loses_exactly_the_unsynced_commits() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lossy.redb");
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .unwrap();
        let backend = LossyBackend::new(file).unwrap();
        let db = Database::builder().create_with_backend(backend).unwrap();
        put(&db, "synced", Durability::Immediate);
        put(&db, "unsynced", Durability::None);
        assert!(has(&db, "synced") && has(&db, "unsynced"));

        // The process dies here: nothing of the database runs again, not even its drop. Its
        // file lock lives on in this process, so the next "boot" opens a copy of the file.
        std::mem::forget(db);
        let after = dir.path().join("after-crash.redb");
        std::fs::copy(&path, &after).unwrap();
        let reopened = Database::create(&after).unwrap();
        assert!(has(&reopened, "synced"), "a synced commit survives");
        assert!(!has(&reopened, "unsynced"), "an unsynced commit is lost");
    }
}
