//! `KeySpan`: the half-open span of user keys a range owns, recorded in the range's `sm_meta`
//! span row. The tables keyed by user key, lock name or idempotency key alone (`kv`, `ttl`,
//! `locks`, `fences`, `idempotency`, `deadlines`) are shared by the ranges of a file and
//! filtered by it. Knows nothing about redb beyond the bounds of a range read.

use std::ops::Bound;

use keel_types::{NodeId, RangeDescriptor, RangeId};
use serde::{Deserialize, Serialize};

/// The half-open user-key span `[start, end)` a range owns; `end = None` is unbounded.
/// `Default` is the whole keyspace.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct KeySpan {
    #[serde(with = "serde_bytes")]
    pub start: Vec<u8>,
    #[serde(with = "serde_bytes")]
    pub end: Option<Vec<u8>>,
}

impl KeySpan {
    /// The span that owns no key: `[[], [])`, the meta range's.
    pub fn none() -> KeySpan {
        KeySpan {
            start: Vec::new(),
            end: Some(Vec::new()),
        }
    }

    /// The span of a range without a span row: the whole keyspace for `RangeId::FIRST` (files
    /// of formats 1-3, a fresh first range), no key for any other range (the meta range, a
    /// range without state).
    pub fn unrecorded(range: RangeId) -> KeySpan {
        if range == RangeId::FIRST {
            KeySpan::default()
        } else {
            KeySpan::none()
        }
    }

    pub fn contains(&self, key: &[u8]) -> bool {
        key >= self.start.as_slice() && self.end.as_deref().is_none_or(|end| key < end)
    }

    /// Whether the span owns no key at all.
    pub fn is_empty(&self) -> bool {
        self.end
            .as_deref()
            .is_some_and(|end| end <= self.start.as_slice())
    }

    /// Whether the span lies wholly inside `[start, end)`.
    pub fn lies_in(&self, start: &[u8], end: &[u8]) -> bool {
        self.start.as_slice() >= start && self.end.as_deref().is_some_and(|own| own <= end)
    }

    /// The part of `[start, end)` inside this span (`[start, start)` when none is).
    pub fn within(&self, start: Vec<u8>, end: Vec<u8>) -> KeySpan {
        let start = start.max(self.start.clone());
        let end = match &self.end {
            Some(own) => end.min(own.clone()),
            None => end,
        };
        KeySpan {
            end: Some(end.max(start.clone())),
            start,
        }
    }

    /// The part of `[start, end)` (empty `end` = unbounded) inside this span (empty when
    /// none is).
    pub fn part(&self, start: &[u8], end: &[u8]) -> KeySpan {
        let start = start.max(self.start.as_slice()).to_vec();
        let end = match (end.is_empty(), self.end.as_deref()) {
            (true, own) => own.map(<[u8]>::to_vec),
            (false, None) => Some(end.to_vec()),
            (false, Some(own)) => Some(end.min(own).to_vec()),
        };
        KeySpan { start, end }
    }

    /// Whether some key lies in both spans.
    pub fn overlaps(&self, other: &KeySpan) -> bool {
        let before =
            |span: &KeySpan, start: &[u8]| span.end.as_deref().is_none_or(|end| start < end);
        !self.is_empty()
            && !other.is_empty()
            && before(self, &other.start)
            && before(other, &self.start)
    }

    /// Whether every key of `inner` lies in this span (an empty `inner` lies anywhere).
    pub fn covers(&self, inner: &KeySpan) -> bool {
        if inner.is_empty() {
            return true;
        }
        let end_within = match (self.end.as_deref(), inner.end.as_deref()) {
            (None, _) => true,
            (Some(_), None) => false,
            (Some(own), Some(end)) => end <= own,
        };
        inner.start >= self.start && end_within
    }

    /// The part of `[start, end)` (empty `end` = unbounded) inside this span, as redb bounds
    /// (redb reads reversed bounds as empty).
    pub fn clamp<'a>(
        &'a self,
        start: &'a [u8],
        end: &'a [u8],
    ) -> (Bound<&'a [u8]>, Bound<&'a [u8]>) {
        let lower = start.max(self.start.as_slice());
        let upper = match (end.is_empty(), self.end.as_deref()) {
            (true, None) => Bound::Unbounded,
            (true, Some(own)) => Bound::Excluded(own),
            (false, None) => Bound::Excluded(end),
            (false, Some(own)) => Bound::Excluded(end.min(own)),
        };
        (Bound::Included(lower), upper)
    }

    /// The whole span as redb bounds.
    pub fn bounds(&self) -> (Bound<&[u8]>, Bound<&[u8]>) {
        let upper = match self.end.as_deref() {
            None => Bound::Unbounded,
            Some(end) => Bound::Excluded(end),
        };
        (Bound::Included(self.start.as_slice()), upper)
    }

    /// This span as a descriptor of `range` (with the rest of its facts).
    pub fn descriptor(
        &self,
        range: RangeId,
        epoch: u64,
        conf_version: u64,
        replicas: Vec<NodeId>,
    ) -> RangeDescriptor {
        RangeDescriptor {
            id: range,
            start: self.start.clone(),
            end: self.end.clone(),
            epoch,
            conf_version,
            replicas,
        }
    }
}
