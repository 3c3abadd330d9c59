//! One page of a scan made of the parts the ranges serve. A server ends its part at its
//! range's end (`next_start` = that end) even when rows remain beyond it; the client asks
//! the next range from there until the page has `limit` rows, the ranges say no more rows
//! follow, or the page reaches `SCAN_PAGE_BYTES_MAX`. So a page spanning ranges holds what
//! a single range would have returned. Pure: no I/O.

use keel_types::validate::show_key;
use keel_types::{KeyValue, KvError, Revision, limits};

use crate::results::ScanResult;

/// A page being gathered.
#[derive(Debug)]
pub(crate) struct ScanPage {
    limit: u32,
    kvs: Vec<KeyValue>,
    bytes: usize,
    /// The first part's revision.
    revision: Option<Revision>,
}

/// What to do after a part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Next {
    /// Ask for the rest of the page from this key.
    Ask(Vec<u8>),
    /// The page is complete; the caller's next page starts here (`None`: no more rows).
    Done(Option<Vec<u8>>),
}

impl ScanPage {
    pub fn new(limit: u32) -> ScanPage {
        ScanPage {
            limit,
            kvs: Vec::new(),
            bytes: 0,
            revision: None,
        }
    }

    /// Rows the page may still take.
    pub fn rows_left(&self) -> u32 {
        let taken = u32::try_from(self.kvs.len()).unwrap_or(u32::MAX);
        self.limit.saturating_sub(taken)
    }

    pub fn is_empty(&self) -> bool {
        self.kvs.is_empty()
    }

    /// Adds the part a range served for a scan from `from`, and says what comes next. A part
    /// whose `next_start` does not move past `from` would make the scan loop forever:
    /// refused as `Fatal`.
    pub fn add(&mut self, part: ScanResult, from: &[u8]) -> Result<Next, KvError> {
        self.revision.get_or_insert(part.revision);
        self.bytes += part
            .kvs
            .iter()
            .map(|kv| kv.key.len() + kv.value.len())
            .sum::<usize>();
        self.kvs.extend(part.kvs);
        let Some(next) = part.next_start else {
            return Ok(Next::Done(None));
        };
        if next.as_slice() <= from {
            return Err(KvError::fatal(format!(
                "scan made no progress: the next part starts at {}, not after {}",
                show_key(&next),
                show_key(from)
            )));
        }
        if self.rows_left() == 0 || self.bytes >= limits::SCAN_PAGE_BYTES_MAX {
            return Ok(Next::Done(Some(next)));
        }
        Ok(Next::Ask(next))
    }

    /// The page, whose successor starts at `next_start`.
    pub fn finish(self, next_start: Option<Vec<u8>>) -> ScanResult {
        ScanResult {
            kvs: self.kvs,
            revision: self.revision.unwrap_or(0),
            next_start,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(key: &str, value_bytes: usize) -> KeyValue {
        KeyValue {
            key: key.as_bytes().to_vec(),
            value: vec![b'v'; value_bytes],
            create_revision: 1,
            mod_revision: 1,
            version: 1,
            expires_at_ms: None,
            lease: 0,
        }
    }

    fn part(keys: &[&str], revision: u64, next: Option<&str>) -> ScanResult {
        ScanResult {
            kvs: keys.iter().map(|key| kv(key, 1)).collect(),
            revision,
            next_start: next.map(|next| next.as_bytes().to_vec()),
        }
    }

    fn ask(key: &str) -> Next {
        Next::Ask(key.as_bytes().to_vec())
    }

    fn done(key: Option<&str>) -> Next {
        Next::Done(key.map(|key| key.as_bytes().to_vec()))
    }

    #[test]
    fn parts_fill_the_page_across_range_ends() {
        // (parts served, each with where it was asked from) -> decision after each part
        type Case = (
            u32,
            Vec<(&'static str, ScanResult)>,
            Vec<Next>,
            Vec<&'static str>,
        );
        let cases: Vec<Case> = vec![
            // One range holds it all.
            (
                5,
                vec![("", part(&["a", "b"], 7, None))],
                vec![done(None)],
                vec!["a", "b"],
            ),
            // A range ends at "m": ask on from there, then the last range ends the scan.
            (
                5,
                vec![
                    ("", part(&["a"], 7, Some("m"))),
                    ("m", part(&["m", "n"], 3, None)),
                ],
                vec![ask("m"), done(None)],
                vec!["a", "m", "n"],
            ),
            // Empty parts (a range without rows in the span) are passed through.
            (
                2,
                vec![
                    ("", part(&[], 7, Some("g"))),
                    ("g", part(&[], 8, Some("p"))),
                    ("p", part(&["p", "q"], 9, Some("r"))),
                ],
                vec![ask("g"), ask("p"), done(Some("r"))],
                vec!["p", "q"],
            ),
            // The limit is reached inside a range: the page ends with its next start.
            (
                2,
                vec![
                    ("", part(&["a"], 7, Some("m"))),
                    ("m", part(&["m"], 3, Some("n"))),
                ],
                vec![ask("m"), done(Some("n"))],
                vec!["a", "m"],
            ),
        ];
        for (limit, parts, expected, keys) in cases {
            let mut page = ScanPage::new(limit);
            let mut got = Vec::new();
            for (from, part) in parts {
                got.push(page.add(part, from.as_bytes()).unwrap());
            }
            assert_eq!(got, expected, "limit {limit}");
            let page = page.finish(None);
            let got_keys: Vec<&[u8]> = page.kvs.iter().map(|kv| kv.key.as_slice()).collect();
            let want_keys: Vec<&[u8]> = keys.iter().map(|key| key.as_bytes()).collect();
            assert_eq!(got_keys, want_keys);
            assert_eq!(page.revision, 7, "the first part's revision");
        }
    }

    #[test]
    fn a_page_stops_at_its_byte_limit_and_refuses_parts_that_do_not_advance() {
        let mut page = ScanPage::new(100);
        let big = ScanResult {
            kvs: vec![kv("a", limits::SCAN_PAGE_BYTES_MAX)],
            revision: 1,
            next_start: Some(b"m".to_vec()),
        };
        assert_eq!(page.add(big, b"").unwrap(), done(Some("m")));
        assert_eq!(page.rows_left(), 99);

        let mut page = ScanPage::new(100);
        let error = page.add(part(&[], 1, Some("k")), b"k").unwrap_err();
        assert!(error.to_string().contains("no progress"), "{error}");
        let error = page.add(part(&[], 1, Some("a")), b"k").unwrap_err();
        assert!(matches!(error, KvError::Fatal { .. }), "{error:?}");
    }
}
