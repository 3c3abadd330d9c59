//! Talking to other nodes: one channel per peer (`channels`), the one way to call a peer's
//! internal RPC and read its failure (`call`), giving up a call to a leader that was
//! replaced meanwhile (`replaced`), and the openraft network over gRPC (`transport`), whose
//! messages ride one stream per peer (`batch`). Knows
//! nothing of what the calls are for, and never names the node context.

pub(crate) mod batch;
pub(crate) mod call;
pub(crate) mod channels;
pub(crate) mod replaced;
pub(crate) mod transport;
