//! The console: a read-only page the metrics endpoint serves at `/` (`PAGE`, one HTML file
//! with its CSS and script, embedded in the binary) and the data it shows, at
//! `/console/state.json` (`state`). The data is cluster-wide: the nodes and the range table
//! as `Cluster.Members` and `Cluster.Ranges` answer them (from the meta range's leader), and
//! each node's own facts (`facts`: hot keys, recent events, locks of the ranges it leads)
//! asked of every node at once within `CONSOLE_PEER_TIMEOUT_MS`; a node that does not answer
//! in time is marked so. Names (keys, lock names, owners) are shown as the CLI shows them
//! (`show_key`), a tenant's without its internal prefix but with the tenant's name. Every
//! list is bounded by `keel_types::limits`. Knows nothing of HTTP.

pub(crate) mod facts;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use keel_proto::v1::{MembersRequest, MembersResponse, RangesRequest, RangesResponse};
use keel_types::limits::{
    CONSOLE_EVENTS_MAX, CONSOLE_LOCKS_MAX, CONSOLE_RANGES_MAX, HOT_KEYS_REPORTED_MAX,
};
use keel_types::tenant::{TENANT_MARK, namespace_prefix_len};
use keel_types::validate::show_key;
use keel_types::{KvError, NodeAddr, NodeId};
use serde_json::{Value, json};

use crate::api::cluster::ClusterService;
use crate::api::console::facts::{LockFact, NodeFacts};
use crate::requests::router::Audience;
use crate::shared::Shared;
use crate::shared::events::{Event, What};

/// The page, served at `/`.
pub(crate) const PAGE: &str = include_str!("console/index.html");

/// What the console is made of, before it is shown.
pub(crate) struct View {
    /// The node answering.
    pub node_id: NodeId,
    /// Unix milliseconds on its clock.
    pub now_ms: u64,
    pub members: Result<MembersResponse, KvError>,
    pub ranges: Result<RangesResponse, KvError>,
    /// Each node asked, with its facts or why it gave none.
    pub facts: BTreeMap<NodeId, Result<NodeFacts, KvError>>,
}

/// `/console/state.json`: the cluster as this node can tell it now, as JSON.
pub(crate) async fn state(shared: &Arc<Shared>) -> String {
    // The page is read by people, who dial client addresses.
    let cluster = ClusterService::new(shared.clone(), Audience::Clients);
    let members = cluster.serve_members(MembersRequest { no_forward: false });
    let ranges = cluster.serve_ranges(&RangesRequest { no_forward: false });
    let (members, ranges) = futures::join!(members, ranges);
    let asked = nodes_to_ask(shared, members.as_ref().ok());
    let answers = asked.into_iter().map(|(node, addr)| async move {
        let facts = match (node == shared.node_id, addr) {
            (true, _) => Ok(facts::local(shared).await),
            (false, Some(addr)) => facts::ask(shared, node, &addr).await,
            (false, None) => Err(KvError::unavailable("its address is not known here")),
        };
        (node, facts)
    });
    let facts = futures::future::join_all(answers)
        .await
        .into_iter()
        .collect();
    let view = View {
        node_id: shared.node_id,
        now_ms: shared.clock.now_ms(),
        members,
        ranges,
        facts,
    };
    render(&view).to_string()
}

/// The nodes to ask for their facts, with the address to reach each: the members, else (no
/// answer from the meta range's leader) the nodes this node knows of.
fn nodes_to_ask(
    shared: &Shared,
    members: Option<&MembersResponse>,
) -> BTreeMap<NodeId, Option<NodeAddr>> {
    let mut ids: BTreeSet<NodeId> = match members {
        Some(members) => members.nodes.iter().map(|node| node.node_id).collect(),
        None => shared.heartbeats.all().into_keys().collect(),
    };
    ids.extend(shared.cluster.keys());
    ids.insert(shared.node_id);
    ids.into_iter()
        .map(|id| (id, shared.node_addr(id)))
        .collect()
}

/// The JSON the page reads.
pub(crate) fn render(view: &View) -> Value {
    let mut errors = Vec::new();
    if let Err(error) = &view.members {
        errors.push(format!("nodes: {error}"));
    }
    if let Err(error) = &view.ranges {
        errors.push(format!("ranges: {error}"));
    }
    let answered: Vec<(NodeId, &NodeFacts)> = view
        .facts
        .iter()
        .filter_map(|(node, facts)| Some((*node, facts.as_ref().ok()?)))
        .collect();
    let (ranges, ranges_more) = ranges_json(view);
    let (locks, locks_more) = locks_json(&answered, view.now_ms);
    json!({
        "node_id": view.node_id,
        "now_ms": view.now_ms,
        "meta_leader_id": view.ranges.as_ref().ok().map(|ranges| ranges.meta_leader_id),
        "errors": errors,
        "nodes": nodes_json(view),
        "ranges": ranges,
        "ranges_more": ranges_more,
        "hot_keys": hot_keys_json(&answered),
        "events": events_json(&answered),
        "locks": locks,
        "locks_more": locks_more,
    })
}

/// A key, lock name or owner as the CLI shows it; a tenant's with the tenant's name first.
pub(crate) fn shown(stored: &[u8]) -> String {
    match tenant_of(stored) {
        Some(tenant) => format!("{tenant}: {}", show_key(stored)),
        None => show_key(stored),
    }
}

/// The tenant whose namespace holds `stored`, if any.
fn tenant_of(stored: &[u8]) -> Option<String> {
    let prefix_len = namespace_prefix_len(stored);
    // The prefix is the mark, the name (lowercase ASCII) and one end byte.
    let name = stored.get(TENANT_MARK.len()..prefix_len.checked_sub(1)?)?;
    Some(String::from_utf8_lossy(name).into_owned())
}

/// Every node asked (the members first, with how the meta range's leader judges them).
fn nodes_json(view: &View) -> Vec<Value> {
    let members = view.members.as_ref().map(|m| m.nodes.as_slice());
    let mut nodes: BTreeMap<NodeId, Value> = BTreeMap::new();
    for node in members.unwrap_or_default() {
        let entry = json!({
            "id": node.node_id,
            "addr": node.addr,
            "state": node.state,
            "liveness": node.liveness,
            "heartbeat_age_ms": node.heartbeat_age_ms,
            "replicas": node.replicas,
            "leaders": node.leaders,
        });
        nodes.insert(node.node_id, entry);
    }
    for (id, facts) in &view.facts {
        let entry = nodes.entry(*id).or_insert_with(
            || json!({ "id": id, "addr": null, "state": "unknown", "liveness": "unknown" }),
        );
        entry["answered"] = json!(facts.is_ok());
        if let Err(error) = facts {
            entry["facts_error"] = json!(error.to_string());
        }
    }
    nodes.into_values().collect()
}

/// The ranges in key order, at most `CONSOLE_RANGES_MAX`, and how many more there are.
fn ranges_json(view: &View) -> (Vec<Value>, usize) {
    let Ok(table) = &view.ranges else {
        return (Vec::new(), 0);
    };
    let mut ranges: Vec<Value> = Vec::new();
    for range in table.ranges.iter().take(CONSOLE_RANGES_MAX) {
        let Some(descriptor) = &range.descriptor else {
            continue;
        };
        ranges.push(json!({
            "id": descriptor.range_id,
            "start": shown(&descriptor.start),
            "end": descriptor.end.as_deref().map(shown),
            "epoch": descriptor.epoch,
            "replicas": descriptor.replicas,
            "leader": range.leader_id,
            "size_bytes": range.size_bytes,
            "keys": range.keys,
            "requests_per_sec": range.requests_per_sec,
            "counts_age_ms": range.counts_age_ms,
        }));
    }
    let more = table.ranges.len().saturating_sub(CONSOLE_RANGES_MAX);
    (ranges, more)
}

/// The hot keys of all nodes, summed per key, the `HOT_KEYS_REPORTED_MAX` hottest first.
fn hot_keys_json(answered: &[(NodeId, &NodeFacts)]) -> Vec<Value> {
    // By (tenant, key, cut): requests, and the nodes that counted it.
    type Sums<'a> = BTreeMap<(Option<&'a str>, &'a [u8], bool), (u64, BTreeSet<NodeId>)>;
    let mut sums: Sums = BTreeMap::new();
    for (node, facts) in answered {
        for hot in &facts.hot_keys {
            let key = (hot.tenant.as_deref(), hot.key.as_slice(), hot.cut);
            let (requests, nodes) = sums.entry(key).or_default();
            *requests += hot.requests;
            nodes.insert(*node);
        }
    }
    let mut hot: Vec<_> = sums.into_iter().collect();
    hot.sort_by(|a, b| b.1.0.cmp(&a.1.0).then_with(|| a.0.cmp(&b.0)));
    hot.into_iter()
        .take(HOT_KEYS_REPORTED_MAX)
        .map(|((tenant, key, cut), (requests, nodes))| {
            let mut text = show_key(key);
            if cut {
                text.push('…');
            }
            json!({ "tenant": tenant, "key": text, "requests": requests, "nodes": nodes })
        })
        .collect()
}

/// The events of all nodes, each once (as the first node to see it saw it), newest first,
/// at most `CONSOLE_EVENTS_MAX`.
fn events_json(answered: &[(NodeId, &NodeFacts)]) -> Vec<Value> {
    let mut merged: BTreeMap<_, (&Event, BTreeSet<NodeId>)> = BTreeMap::new();
    for (node, facts) in answered {
        for event in &facts.events {
            let (first, seen_by) = merged
                .entry(event.identity())
                .or_insert((event, BTreeSet::new()));
            if event.at_ms < first.at_ms {
                *first = event;
            }
            seen_by.insert(*node);
        }
    }
    let mut events: Vec<_> = merged.into_values().collect();
    events.sort_by(|a, b| {
        b.0.at_ms
            .cmp(&a.0.at_ms)
            .then_with(|| b.0.identity().cmp(&a.0.identity()))
    });
    events
        .into_iter()
        .take(CONSOLE_EVENTS_MAX)
        .map(|(event, seen_by)| event_json(event, &seen_by))
        .collect()
}

fn event_json(event: &Event, seen_by: &BTreeSet<NodeId>) -> Value {
    let identity = event.identity();
    let (detail, nodes): (String, Vec<NodeId>) = match &event.what {
        What::Split { at, other, .. } => (
            format!(
                "split at {}; range {} took the other side",
                shown(at),
                other.0
            ),
            seen_by.iter().copied().collect(),
        ),
        What::Replicas { before, after, .. } => {
            let nodes: BTreeSet<NodeId> = before.iter().chain(after).copied().collect();
            let detail = format!("replicas {before:?} → {after:?}");
            (detail, nodes.into_iter().collect())
        }
        What::Leader { term, leader } => {
            (format!("node {leader} leads (term {term})"), vec![*leader])
        }
    };
    json!({
        "at_ms": event.at_ms,
        "kind": identity.kind,
        "range": event.range.0,
        "detail": detail,
        "nodes": nodes,
    })
}

/// The locks all nodes lead, by range and name (a lock two nodes report across a leader
/// change: the one with the newer holder), at most `CONSOLE_LOCKS_MAX`; and whether some
/// were left out.
fn locks_json(answered: &[(NodeId, &NodeFacts)], now_ms: u64) -> (Vec<Value>, bool) {
    let mut locks: BTreeMap<(u64, &[u8]), (NodeId, &LockFact)> = BTreeMap::new();
    let mut more = false;
    for (node, facts) in answered {
        more |= facts.locks_more;
        for lock in &facts.locks {
            let token = |lock: &LockFact| lock.holder.as_ref().map(|hold| hold.token);
            let key = (lock.range.0, lock.name.as_slice());
            match locks.get(&key) {
                Some((_, kept)) if token(kept) >= token(lock) => {}
                _ => drop(locks.insert(key, (*node, lock))),
            }
        }
    }
    more |= locks.len() > CONSOLE_LOCKS_MAX;
    let shown_locks = locks
        .into_values()
        .take(CONSOLE_LOCKS_MAX)
        .map(|(node, lock)| lock_json(node, lock, now_ms))
        .collect();
    (shown_locks, more)
}

fn lock_json(node: NodeId, lock: &LockFact, now_ms: u64) -> Value {
    let holder = lock.holder.as_ref().map(|hold| {
        json!({
            "owner": show_key(&hold.owner),
            "token": hold.token,
            "expires_at_ms": hold.expires_at_ms,
            "expires_in_ms": hold.expires_at_ms.saturating_sub(now_ms),
        })
    });
    let waiters: Vec<String> = lock.waiters.iter().map(|owner| show_key(owner)).collect();
    json!({
        "name": show_key(&lock.name),
        "tenant": tenant_of(&lock.name),
        "range": lock.range.0,
        "leader": node,
        "holder": holder,
        "waiters": waiters,
        "waiting": lock.waiting,
    })
}

#[cfg(test)]
mod tests;
