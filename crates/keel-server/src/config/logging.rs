//! `keel serve`'s logs: to stderr, as text or as JSON lines (with the fields of the spans
//! they happen in: node, range, term, log index), at the level the configuration names
//! (`--log-level`, a `RUST_LOG`-style filter); `RUST_LOG`, when set and valid, wins. Knows
//! nothing of what is logged.

use std::io::IsTerminal;

use serde::{Deserialize, Serialize};
use tracing_subscriber::EnvFilter;

/// How log lines are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// One human-readable line per event (colored on a terminal).
    #[default]
    Text,
    /// One JSON object per line, with the current span and the list of spans.
    Json,
}

/// The log settings of a node; each field is named (in serde) after the key of its `keel
/// serve` setting, and filled from it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogSettings {
    #[serde(rename = "log_format")]
    pub format: LogFormat,
    /// A filter in `RUST_LOG` syntax: `info`, `keel_server=debug,info`.
    #[serde(rename = "log_level")]
    pub level: String,
}

impl Default for LogSettings {
    fn default() -> Self {
        LogSettings {
            format: LogFormat::Text,
            level: "info".to_string(),
        }
    }
}

/// Why a level filter does not parse.
pub(crate) fn check_level(level: &str) -> Result<(), String> {
    EnvFilter::try_new(level)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// Installs the process's log subscriber; fails when one is installed already.
pub(crate) fn init(settings: &LogSettings) -> anyhow::Result<()> {
    let from_env = std::env::var("RUST_LOG")
        .ok()
        .filter(|filter| !filter.trim().is_empty())
        .and_then(|filter| EnvFilter::try_new(filter).ok());
    let filter = match from_env {
        Some(filter) => filter,
        None => EnvFilter::try_new(&settings.level)
            .map_err(|e| anyhow::anyhow!("log level {:?}: {e}", settings.level))?,
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let installed = match settings.format {
        LogFormat::Text => builder
            .with_ansi(std::io::stderr().is_terminal())
            .try_init(),
        LogFormat::Json => builder
            .json()
            .with_current_span(true)
            .with_span_list(true)
            .try_init(),
    };
    installed.map_err(|e| anyhow::anyhow!("installing the log subscriber: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_are_filters() {
        let cases: &[(&str, bool)] = &[
            ("info", true),
            ("debug", true),
            ("keel_server=debug,warn", true),
            ("off", true),
            ("keel_server=loud", false),
        ];
        for (level, valid) in cases {
            assert_eq!(check_level(level).is_ok(), *valid, "{level:?}");
        }
    }
}
