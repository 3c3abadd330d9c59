//! A progress line on stderr for long commands (`keel backup`, `keel restore`): redrawn in
//! place at most every 100 ms when stderr is a terminal, never printed otherwise (the
//! command's final line says what was done). Knows nothing of what progresses.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

/// Least time between two redraws.
const REDRAW_INTERVAL: Duration = Duration::from_millis(100);

pub struct Progress {
    terminal: bool,
    drawn: Option<Instant>,
}

impl Progress {
    /// Draws on stderr if it is a terminal.
    pub fn on_stderr() -> Progress {
        Progress {
            terminal: std::io::stderr().is_terminal(),
            drawn: None,
        }
    }

    /// Shows `line` (if the last redraw is old enough, or `force`).
    pub fn show(&mut self, line: &str, force: bool) {
        if !self.terminal {
            return;
        }
        let due = self.drawn.is_none_or(|at| at.elapsed() >= REDRAW_INTERVAL);
        if due || force {
            let mut stderr = std::io::stderr().lock();
            let _ = write!(stderr, "\r\x1b[2K{line}");
            let _ = stderr.flush();
            self.drawn = Some(Instant::now());
        }
    }

    /// Clears the line, so the final report starts on a clean one.
    pub fn clear(&mut self) {
        if self.terminal && self.drawn.take().is_some() {
            let mut stderr = std::io::stderr().lock();
            let _ = write!(stderr, "\r\x1b[2K");
            let _ = stderr.flush();
        }
    }
}
