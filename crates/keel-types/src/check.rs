//! Consistency checks: what a leader proposes so that every replica of a range hashes the
//! same state (`Check`), the digest a replica computes (`RangeDigest`), and how a leader
//! judges the digests it collects (`judge`, `divergent_buckets`, `divergent_rows`).
//!
//! A range's state is divided into `limits::CHECK_BUCKETS` buckets by a hash of each row's
//! key (`CheckedRow::bucket`): a key's row, its fence and the lock or idempotency record of
//! that name share a bucket, and a client's session shares one with its request records.
//! A replica hashes each bucket's rows in key order, the range's facts (applied log id,
//! membership, revision, clock, span, epoch, and for the meta range its table) apart, and
//! the range hash over both. Two replicas whose range hashes differ differ in at least one
//! bucket; a locating check lists the rows of a few such buckets with a hash of each, which
//! names the rows.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::ids::{NodeId, RangeId};
use crate::limits;

/// A SHA-256 digest.
pub type Hash = [u8; 32];

/// A consistency check as the leader proposes it through the range's log: every replica
/// hashes the range's state as of the entry's log index, once it has applied the entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Check {
    /// Buckets whose rows each replica lists with a hash per row (a locating check); at most
    /// `limits::CHECK_LOCATE_BUCKETS_MAX`, each below `limits::CHECK_BUCKETS`.
    pub locate: Vec<u16>,
}

/// Why a range stopped serving: a check at log index `index` found that no majority of its
/// replicas agree (`Verdict::NoMajority`), so no replica can be trusted to answer. Set and
/// cleared through the range's log (`Command::Hold`), so every replica holds it, a
/// snapshot carries it and it survives restarts and leader changes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hold {
    /// The log index of the check that found no majority.
    pub index: u64,
}

impl fmt::Display for Hold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "its replicas disagree with no majority (consistency check at index {}); it serves \
             again once a check finds a majority (see Consistency checks in docs/OPERATIONS.md)",
            self.index
        )
    }
}

/// One row of a range's state, as a locating check names it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum CheckedRow {
    Key(#[serde(with = "serde_bytes")] Vec<u8>),
    Lock(#[serde(with = "serde_bytes")] Vec<u8>),
    Fence(#[serde(with = "serde_bytes")] Vec<u8>),
    Idempotency(#[serde(with = "serde_bytes")] Vec<u8>),
    Session {
        client_id: u64,
    },
    Request {
        client_id: u64,
        sequence: u64,
    },
    /// (format 12) An etcd lease, by its key in the `leases` table.
    Lease(#[serde(with = "serde_bytes")] Vec<u8>),
}

impl CheckedRow {
    /// The row's bucket: FNV-1a (64 bit) of its key (a client's id, big-endian, for sessions
    /// and request records) modulo `limits::CHECK_BUCKETS`. Fixed here for every release:
    /// replicas must agree on it.
    pub fn bucket(&self) -> u16 {
        let hash = match self {
            CheckedRow::Key(key)
            | CheckedRow::Lock(key)
            | CheckedRow::Fence(key)
            | CheckedRow::Idempotency(key)
            | CheckedRow::Lease(key) => fnv1a(key),
            CheckedRow::Session { client_id } | CheckedRow::Request { client_id, .. } => {
                fnv1a(&client_id.to_be_bytes())
            }
        };
        (hash % limits::CHECK_BUCKETS as u64) as u16
    }
}

impl fmt::Display for CheckedRow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let show = crate::validate::show_key;
        match self {
            CheckedRow::Key(key) => write!(f, "key {}", show(key)),
            CheckedRow::Lock(name) => write!(f, "lock {}", show(name)),
            CheckedRow::Fence(key) => write!(f, "fence of key {}", show(key)),
            CheckedRow::Idempotency(key) => write!(f, "idempotency record {}", show(key)),
            CheckedRow::Session { client_id } => write!(f, "session of client {client_id}"),
            CheckedRow::Request {
                client_id,
                sequence,
            } => write!(f, "request record {client_id}/{sequence}"),
            CheckedRow::Lease(key) => {
                // A `leases` key: the namespace, then the id (8 bytes, big-endian).
                let (namespace, id) = key.split_at(key.len().saturating_sub(8));
                let id = <[u8; 8]>::try_from(id).map_or(0, i64::from_be_bytes);
                write!(f, "lease {id} of namespace {}", show(namespace))
            }
        }
    }
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// What one replica hashed of a range at a check's log index.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RangeDigest {
    /// The storage format whose encoding of the rows was hashed: digests of different
    /// formats are not compared.
    pub format: u8,
    /// SHA-256 over `facts` and every bucket's hash.
    pub hash: Hash,
    /// SHA-256 of the range's facts: applied log id, membership, revision, clock, span,
    /// epoch, conf_version, and the meta range's table.
    pub facts: Hash,
    /// SHA-256 of each bucket's rows, `limits::CHECK_BUCKETS` of them.
    pub buckets: Vec<Hash>,
    /// Rows hashed, and the bytes of their encoding.
    pub rows: u64,
    pub bytes: u64,
    /// For a locating check: the rows of the asked buckets with the SHA-256 of each, in the
    /// order hashed, at most `limits::CHECK_LOCATE_ROWS_MAX`.
    pub located: Vec<(CheckedRow, Hash)>,
    /// More rows of the asked buckets than `located` holds.
    pub located_cut: bool,
}

/// What one replica answered for a check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReplicaAnswer {
    Digest(RangeDigest),
    /// Its state could not be read or decoded at the check's index: it counts as differing.
    Unreadable(String),
    /// No digest: not applied in time, its checker busy, the check's index passed by a
    /// snapshot, or the node unreachable. It is neither for nor against.
    NoDigest(String),
}

/// The verdict on one check of one range.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Verdict {
    /// Every replica answered with the same hash.
    Consistent,
    /// No two answers differ, but not every replica gave one that could be compared.
    Unconfirmed,
    /// A majority of the replicas agree and the others (`CheckReport::divergent`) differ.
    Divergent,
    /// Answers differ and no hash is held by a majority of the replicas.
    NoMajority,
}

impl Verdict {
    pub fn name(self) -> &'static str {
        match self {
            Verdict::Consistent => "consistent",
            Verdict::Unconfirmed => "unconfirmed",
            Verdict::Divergent => "divergent",
            Verdict::NoMajority => "no-majority",
        }
    }

    /// Whether the check found replicas that disagree (an alarm).
    pub fn is_alarm(self) -> bool {
        matches!(self, Verdict::Divergent | Verdict::NoMajority)
    }
}

/// One replica's part in a check report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaCheck {
    pub node: NodeId,
    /// The range hash it answered; `None` with `problem` set otherwise.
    pub hash: Option<Hash>,
    pub problem: Option<String>,
    /// Rows found to differ from the majority's (at most `limits::CHECK_REPORTED_ROWS_MAX`).
    pub rows: Vec<CheckedRow>,
    /// Buckets that differ from the majority's, in all.
    pub buckets_differing: u32,
}

/// The outcome of one check of one range, as its leader judged it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckReport {
    pub range: RangeId,
    /// The log index of the check every replica hashed at.
    pub index: u64,
    pub verdict: Verdict,
    /// Every voter of the range, in node order.
    pub replicas: Vec<ReplicaCheck>,
    /// Replicas that differ from the majority (`Verdict::Divergent`), in node order.
    pub divergent: Vec<NodeId>,
    /// When the leader finished the check (Unix milliseconds, its clock).
    pub checked_at_ms: u64,
    /// Rows hashed on the leader's replica.
    pub rows: u64,
    /// The node that led the check.
    pub leader: NodeId,
    /// Replicas re-created from the majority after the check (`Verdict::Divergent`).
    pub repaired: Vec<NodeId>,
    /// What the repair did instead, or why it could not (empty: nothing to say).
    pub repair_note: String,
}

/// A comparable answer: a digest's (format, hash), or a node's own unreadable state.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Opinion {
    Hash(u8, Hash),
    Unreadable(NodeId),
}

/// Judges the answers of every voter of a range. Returns the verdict, the nodes that differ
/// from the majority, and the majority's digest (`None` without a majority).
pub fn judge(
    answers: &BTreeMap<NodeId, ReplicaAnswer>,
) -> (Verdict, Vec<NodeId>, Option<&RangeDigest>) {
    let mut opinions: BTreeMap<Opinion, Vec<NodeId>> = BTreeMap::new();
    for (node, answer) in answers {
        let opinion = match answer {
            ReplicaAnswer::Digest(digest) => Opinion::Hash(digest.format, digest.hash),
            ReplicaAnswer::Unreadable(_) => Opinion::Unreadable(*node),
            ReplicaAnswer::NoDigest(_) => continue,
        };
        opinions.entry(opinion).or_default().push(*node);
    }
    let majority = opinions
        .iter()
        .find(|(_, nodes)| nodes.len() * 2 > answers.len());
    let differing = |format: Option<u8>| -> Vec<NodeId> {
        let mut nodes: Vec<NodeId> = opinions
            .iter()
            .filter(|(opinion, _)| match (opinion, format) {
                (Opinion::Hash(other, _), Some(format)) => *other == format,
                _ => true,
            })
            .flat_map(|(_, nodes)| nodes.iter().copied())
            .collect();
        nodes.sort_unstable();
        nodes
    };
    match majority {
        Some((Opinion::Hash(format, hash), agreeing)) => {
            let divergent: Vec<NodeId> = differing(Some(*format))
                .into_iter()
                .filter(|node| !agreeing.contains(node))
                .collect();
            let digest = agreeing.first().and_then(|node| match &answers[node] {
                ReplicaAnswer::Digest(digest) if digest.hash == *hash => Some(digest),
                _ => None,
            });
            let verdict = match (divergent.is_empty(), agreeing.len() == answers.len()) {
                (false, _) => Verdict::Divergent,
                (true, true) => Verdict::Consistent,
                (true, false) => Verdict::Unconfirmed,
            };
            (verdict, divergent, digest)
        }
        // Only a node's own unreadable state could be a "majority" of one answer in all.
        Some((Opinion::Unreadable(_), _)) => (Verdict::NoMajority, Vec::new(), None),
        None if opinions.len() > 1 => (Verdict::NoMajority, Vec::new(), None),
        None => (Verdict::Unconfirmed, Vec::new(), None),
    }
}

/// The buckets in which `digest` differs from `majority`, in order.
pub fn divergent_buckets(majority: &RangeDigest, digest: &RangeDigest) -> Vec<u16> {
    let pairs = majority.buckets.iter().zip(&digest.buckets);
    let differing = pairs.enumerate().filter(|(_, (a, b))| a != b);
    differing.map(|(bucket, _)| bucket as u16).collect()
}

/// The rows a locating check found to differ between `majority` and `digest`: present in
/// one and not the other, or with different hashes. When either side's rows were cut at
/// `limits::CHECK_LOCATE_ROWS_MAX`, a row missing from one side may only lie past its cut,
/// so only rows present in both with different hashes are reported. At most
/// `limits::CHECK_REPORTED_ROWS_MAX`, in row order.
pub fn divergent_rows(majority: &RangeDigest, digest: &RangeDigest) -> Vec<CheckedRow> {
    let theirs: BTreeMap<&CheckedRow, &Hash> =
        majority.located.iter().map(|(r, h)| (r, h)).collect();
    let ours: BTreeMap<&CheckedRow, &Hash> = digest.located.iter().map(|(r, h)| (r, h)).collect();
    let cut = majority.located_cut || digest.located_cut;
    let rows: BTreeSet<&CheckedRow> = theirs.keys().chain(ours.keys()).copied().collect();
    rows.into_iter()
        .filter(|row| match (theirs.get(row), ours.get(row)) {
            (Some(a), Some(b)) => a != b,
            _ => !cut,
        })
        .take(limits::CHECK_REPORTED_ROWS_MAX)
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests;
