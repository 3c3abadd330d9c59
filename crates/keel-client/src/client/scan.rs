//! Scans. A page is gathered from the ranges in key order: each part is routed by the key
//! it starts at, and a range's part ends at its range's end; `scan_page` decides when the
//! page is complete.

use keel_proto::v1;
use keel_proto::v1::kv_client::KvClient;
use keel_types::{Consistency, KvError, ReadBound, Revision, validate};
use tokio::time::Instant;

use super::{Client, read};
use crate::results::{self, ScanResult};
use crate::scan_page::{Next, ScanPage};
use crate::stub::Transport;

/// What every part of a page is read with.
#[derive(Clone, Copy)]
struct Bound {
    consistency: Consistency,
    max_staleness_ms: Option<i64>,
    min_revision: Option<u64>,
    /// Read each range as it was at this revision of its own.
    revision: Option<u64>,
}

impl Client {
    /// One page of the keys of `[start, end)` (empty `end` = to the end of the keyspace), at
    /// most `limit` rows (0 = the default). Follow `next_start` for the next page. A page
    /// may cross range boundaries: it holds what one range holding the whole span would
    /// return, so following `next_start` to the end lists each key once, in key order,
    /// however the ranges are split.
    ///
    /// Within `request_timeout` for the whole page; a range that fails after earlier ranges
    /// gave rows ends the page there (its `next_start` is where it stopped), so the next call
    /// meets the failure.
    pub async fn scan(
        &self,
        start: &[u8],
        end: &[u8],
        limit: u32,
        consistency: Consistency,
    ) -> Result<ScanResult, KvError> {
        self.scan_within(start, end, limit, consistency, ReadBound::default())
            .await
    }

    /// A page as `scan` reads it, from replica states within `bound` (see `get_within`), on
    /// every range the page reads. Revisions count per range, so `min_revision` suits a span
    /// within one range.
    pub async fn scan_within(
        &self,
        start: &[u8],
        end: &[u8],
        limit: u32,
        consistency: Consistency,
        bound: ReadBound,
    ) -> Result<ScanResult, KvError> {
        let bound = Bound {
            consistency,
            max_staleness_ms: super::bounded_staleness_ms(bound)?,
            min_revision: bound.min_revision,
            revision: None,
        };
        self.scan_read(start, end, limit, bound).await
    }

    /// A page as `scan` reads it, with each range read as it was at `revision` of its own
    /// (see `get_at`). Revisions count per range, so a page is one state only within one
    /// range: across ranges it holds each range's state at its own `revision`.
    pub async fn scan_at(
        &self,
        start: &[u8],
        end: &[u8],
        limit: u32,
        revision: Revision,
        consistency: Consistency,
    ) -> Result<ScanResult, KvError> {
        let bound = Bound {
            consistency,
            max_staleness_ms: None,
            min_revision: None,
            revision: validate::check_read_revision(Some(revision))?,
        };
        self.scan_read(start, end, limit, bound).await
    }

    async fn scan_read(
        &self,
        start: &[u8],
        end: &[u8],
        limit: u32,
        bound: Bound,
    ) -> Result<ScanResult, KvError> {
        let limit = validate::check_scan(start, end, limit)?;
        let deadline = Instant::now() + self.inner.options.request_timeout;
        let mut page = ScanPage::new(limit);
        let mut from = start.to_vec();
        loop {
            let part = self
                .scan_part(&from, end, page.rows_left(), bound, deadline)
                .await;
            let part = match part {
                Ok(part) => part,
                Err(_) if !page.is_empty() => return Ok(page.finish(Some(from))),
                Err(error) => return Err(error),
            };
            match page.add(part, &from)? {
                Next::Ask(next) => from = next,
                Next::Done(next) => return Ok(page.finish(next)),
            }
        }
    }

    /// One range's part of a page: the request routed by `from`.
    async fn scan_part(
        &self,
        from: &[u8],
        end: &[u8],
        limit: u32,
        bound: Bound,
        deadline: Instant,
    ) -> Result<ScanResult, KvError> {
        let consistency = bound.consistency;
        let request = v1::ScanRequest {
            start: from.to_vec(),
            end: end.to_vec(),
            limit,
            consistency: v1::Consistency::from(consistency).into(),
            no_forward: true,
            max_staleness_ms: bound.max_staleness_ms,
            min_revision: bound.min_revision,
            revision: bound.revision,
        };
        let timeout = deadline.saturating_duration_since(Instant::now());
        let by = super::read_route(from, consistency);
        let send = |mut kv: KvClient<Transport>, consistency: v1::Consistency| {
            let request = v1::ScanRequest {
                consistency: consistency.into(),
                ..request.clone()
            };
            async move { kv.scan(request).await }
        };
        let asked = v1::Consistency::from(consistency);
        let response = match self
            .call(read(consistency), by, timeout, |kv| send(kv, asked))
            .await
        {
            Err(error) if bound.revision.is_some() => {
                self.read_at_elsewhere(from, error, send).await?
            }
            answer => answer?,
        };
        results::scan(response)
    }
}
