//! Test-only faults a node can be told to inject at start (`api/faults.rs` changes others at
//! run time). The settings exist in every build so that configurations read the same;
//! injecting them needs the `fault-injection` cargo feature, and a node built without it
//! refuses a configuration that asks for any. Knows nothing of request semantics beyond
//! "this RPC mutates".

use serde::{Deserialize, Serialize};

/// Faults a node injects; all off by default. Each field is named (in serde) after the key of
/// its `keel serve` setting, and filled from it; without the `fault-injection` feature there
/// are no such settings, so the faults stay off.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Faults {
    /// Percentage (0–100) of mutations (Kv, Lock and Idempotency writes) whose response is
    /// dropped after the mutation was applied; the client sees an error without a Keel detail
    /// (an unknown outcome).
    #[serde(rename = "fault_response_loss_percent")]
    pub response_loss_percent: u32,
    /// Keep storage writes in memory until they are synced, so that killing the process
    /// loses what was not synced, as a power loss would.
    #[serde(rename = "fault_lose_unsynced_writes")]
    pub lose_unsynced_writes: bool,
}

impl Faults {
    pub(crate) fn validate(&self) -> Result<(), String> {
        if *self == Faults::default() {
            return Ok(());
        }
        if !cfg!(feature = "fault-injection") {
            return Err(
                "fault injection was asked for, but this build has no `fault-injection` feature"
                    .to_string(),
            );
        }
        if self.response_loss_percent > 100 {
            return Err(format!(
                "response loss is {}%; it must be 0 to 100",
                self.response_loss_percent
            ));
        }
        Ok(())
    }

    /// Whether to drop the response of the mutation just served.
    pub(crate) fn drop_response(&self) -> bool {
        self.response_loss_percent > 0 && rand::random_range(0..100) < self.response_loss_percent
    }
}
