//! Appends JSON-lines records (history ops, fault events) to a file as they happen, through a
//! buffer flushed every `FLUSH_INTERVAL` and at the end, so a crashed run still leaves most
//! of its history. Knows nothing of what the records mean.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Serialize;

/// Longest time a completed record waits in the buffer.
pub const FLUSH_INTERVAL: Duration = Duration::from_millis(500);

/// A JSON-lines file open for appending records from many tasks.
#[derive(Debug)]
pub struct Recorder {
    path: String,
    limit: usize,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    writer: BufWriter<File>,
    records: usize,
    last_flush: Instant,
    /// The first write error; later records are dropped and `finish` reports it.
    error: Option<String>,
}

impl Recorder {
    /// Creates (or truncates) `path`; at most `limit` records are written, the rest dropped
    /// and reported by `finish`.
    pub fn create(path: &Path, limit: usize) -> std::io::Result<Recorder> {
        let file = File::create(path)?;
        Ok(Recorder {
            path: path.display().to_string(),
            limit,
            state: Mutex::new(State {
                writer: BufWriter::new(file),
                records: 0,
                last_flush: Instant::now(),
                error: None,
            }),
        })
    }

    /// Appends one record as one line; flushes when the buffer has waited long enough.
    pub fn record<T: Serialize>(&self, record: &T) {
        let mut state = self.state.lock().expect("recorder lock poisoned");
        if state.error.is_some() {
            return;
        }
        if state.records == self.limit {
            state.error = Some(format!(
                "{}: more than {} records; limit is {}",
                self.path, self.limit, self.limit
            ));
            return;
        }
        let mut line = serde_json::to_vec(record).expect("records always serialize");
        line.push(b'\n');
        if let Err(error) = state.writer.write_all(&line) {
            state.error = Some(format!("{}: {error}", self.path));
            return;
        }
        state.records += 1;
        if state.last_flush.elapsed() >= FLUSH_INTERVAL {
            state.last_flush = Instant::now();
            if let Err(error) = state.writer.flush() {
                state.error = Some(format!("{}: {error}", self.path));
            }
        }
    }

    /// Flushes and returns how many records were written, or the first error.
    pub fn finish(&self) -> Result<usize, String> {
        let mut state = self.state.lock().expect("recorder lock poisoned");
        if let Some(error) = &state.error {
            return Err(error.clone());
        }
        state
            .writer
            .flush()
            .map_err(|error| format!("{}: {error}", self.path))?;
        Ok(state.records)
    }
}
