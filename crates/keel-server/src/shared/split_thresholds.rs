//! The split settings the split driver (`ranges/split_driver.rs`) uses now. Knows nothing of
//! how ranges split.

use std::sync::{Mutex, PoisonError};

use crate::config::SplitSettings;

/// The split settings the driver uses: those the node was configured with, which the
/// test-only `Faults.SetSplitThresholds` may change while it runs (never the check interval).
pub(crate) struct SplitThresholds {
    settings: Mutex<SplitSettings>,
}

impl SplitThresholds {
    pub(crate) fn new(settings: SplitSettings) -> SplitThresholds {
        SplitThresholds {
            settings: Mutex::new(settings),
        }
    }

    /// The settings now.
    pub(crate) fn get(&self) -> SplitSettings {
        *self.settings.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Replaces the settings with what `change` makes of them, if that is within the bounds
    /// of the configuration (`SplitSettings::validate`); returns the settings before and now.
    #[cfg(feature = "fault-injection")]
    pub(crate) fn update(
        &self,
        change: impl FnOnce(SplitSettings) -> SplitSettings,
    ) -> Result<(SplitSettings, SplitSettings), crate::config::ConfigError> {
        let mut settings = self.settings.lock().unwrap_or_else(PoisonError::into_inner);
        let previous = *settings;
        let changed = change(previous);
        changed.validate()?;
        *settings = changed;
        Ok((previous, changed))
    }
}

#[cfg(all(test, feature = "fault-injection"))]
mod tests {
    use super::*;

    #[test]
    fn thresholds_change_within_the_configured_bounds() {
        use crate::config::ConfigError;
        let thresholds = SplitThresholds::new(SplitSettings::default());
        let small = |settings| SplitSettings {
            range_bytes_max: 1_024,
            ..settings
        };
        assert_eq!(thresholds.update(small).unwrap().1.range_bytes_max, 1_024);
        let tiny = |settings| SplitSettings {
            range_bytes_max: 10,
            ..settings
        };
        assert_eq!(
            thresholds.update(tiny),
            Err(ConfigError::RangeSplitBytes(10))
        );
        let long = |settings| SplitSettings {
            load_secs: 61,
            ..settings
        };
        assert_eq!(
            thresholds.update(long),
            Err(ConfigError::RangeSplitLoadSecs(61))
        );
        let expected = SplitSettings {
            range_bytes_max: 1_024,
            ..SplitSettings::default()
        };
        assert_eq!(
            thresholds.get(),
            expected,
            "a refused change changes nothing"
        );
    }
}
