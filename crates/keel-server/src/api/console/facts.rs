//! What one node tells the console of itself (`NodeFacts`): its hot keys, its recent events
//! and the locks of the ranges it leads (holders from its replica, waiters from its lock
//! queues), each list bounded by `keel_types::limits`. Gathered here (`local`) or asked of a
//! peer through `keel.raft.v1.Raft/ConsoleFacts` (`ask`), within `CONSOLE_PEER_TIMEOUT_MS`.
//! Knows nothing of HTTP or of how the page shows them.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::peer::channels::PeerChannel;
use keel_proto::raft::raft_client::RaftClient;
use keel_types::limits::{CONSOLE_LOCKS_MAX, CONSOLE_PEER_TIMEOUT_MS};
use keel_types::{KvError, LockHold, NodeAddr, NodeId, RangeId};
use serde::{Deserialize, Serialize};

use crate::peer::call::PeerCall;
use crate::shared::Shared;
use crate::shared::events::Event;
use crate::shared::lock_waiters::Waiting;

/// The question: empty, so a later release can add to it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct FactsQuery {}

/// What a node tells of itself.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct NodeFacts {
    pub hot_keys: Vec<HotKeyFact>,
    /// Oldest first.
    pub events: Vec<Event>,
    /// By range and name.
    pub locks: Vec<LockFact>,
    /// Whether locks were left out for `CONSOLE_LOCKS_MAX`.
    pub locks_more: bool,
}

/// A hot key as the node counted it: the tenant whose namespace holds it, the key within
/// it (cut to `HOT_KEY_BYTES_MAX` bytes; `cut` when longer), its estimated requests.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct HotKeyFact {
    pub tenant: Option<String>,
    pub key: Vec<u8>,
    pub cut: bool,
    pub requests: u64,
}

/// A lock of a range the node leads: its holder (none while it is free and acquires wait to
/// take it), and who waits for it, first in line first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct LockFact {
    pub range: RangeId,
    pub name: Vec<u8>,
    pub holder: Option<LockHold>,
    pub waiters: Vec<Vec<u8>>,
    /// All waiters, those not named included.
    pub waiting: u64,
}

/// This node's facts.
pub(crate) async fn local(shared: &Shared) -> NodeFacts {
    let hot_keys = shared
        .metrics
        .hot_keys
        .report()
        .into_iter()
        .map(|(key, requests)| HotKeyFact {
            tenant: key.tenant,
            key: key.prefix,
            cut: key.cut,
            requests,
        })
        .collect();
    let (locks, locks_more) = led_locks(shared).await;
    NodeFacts {
        hot_keys,
        events: shared.events.recent(),
        locks,
        locks_more,
    }
}

/// Asks node `node` at `addr` for its facts.
pub(crate) async fn ask(
    shared: &Shared,
    node: NodeId,
    addr: &NodeAddr,
) -> Result<NodeFacts, KvError> {
    let call = PeerCall {
        node,
        addr,
        range: RangeId(0),
        payload: &FactsQuery {},
        forward: false,
        write: false,
        deadline: Duration::from_millis(CONSOLE_PEER_TIMEOUT_MS),
    };
    let rpc = |mut client: RaftClient<PeerChannel>, message| async move {
        client.console_facts(message).await
    };
    call.send(&shared.peers, shared.node_id, rpc).await
}

/// The locks of the ranges this node leads: those held (read from its replicas) and those
/// its queues hold waiters for, at most `CONSOLE_LOCKS_MAX`; and whether some were left out.
async fn led_locks(shared: &Shared) -> (Vec<LockFact>, bool) {
    let now_ms = shared.clock.now_ms();
    let mut waiting = shared.lock_waiters.all();
    let mut locks: BTreeMap<(RangeId, Vec<u8>), LockFact> = BTreeMap::new();
    let mut more = false;
    let mut groups = shared.groups.all();
    groups.sort_by_key(|group| group.range());
    for group in groups {
        let leads = group.leader().is_some_and(|(id, _)| id == shared.node_id);
        let left = CONSOLE_LOCKS_MAX.saturating_sub(locks.len());
        if !leads || left == 0 {
            more |= leads;
            continue;
        }
        let range = group.range();
        let Ok((held, cut)) = group.state_machine().held_locks(now_ms, left).await else {
            continue;
        };
        more |= cut;
        for (name, hold) in held {
            let key = (range, name);
            let waiters = waiting.remove(&key).unwrap_or_default();
            locks.insert(key.clone(), fact(key, Some(hold), waiters));
        }
    }
    // Acquires that wait for a lock free this instant (a grant on its way).
    for (key, waiters) in waiting {
        if locks.len() == CONSOLE_LOCKS_MAX {
            more = true;
            break;
        }
        locks.insert(key.clone(), fact(key, None, waiters));
    }
    (locks.into_values().collect(), more)
}

fn fact((range, name): (RangeId, Vec<u8>), holder: Option<LockHold>, waiters: Waiting) -> LockFact {
    LockFact {
        range,
        name,
        holder,
        waiting: waiters.count as u64,
        waiters: waiters.owners,
    }
}
