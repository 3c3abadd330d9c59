//! Whether a set of range spans covers the keyspace exactly once: pure functions with table
//! tests. The writer uses `gaps` to find what split away from a range before its snapshot was
//! taken; the reader refuses a file that fails `check_coverage`.

use keel_types::{RangeDescriptor, RangeId, validate};

/// A part of the keyspace no range covers: `[start, end)`, `end = None` unbounded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gap {
    pub start: Vec<u8>,
    pub end: Option<Vec<u8>>,
}

impl Gap {
    /// Whether some key of `range` lies in the gap.
    pub fn overlaps(&self, range: &RangeDescriptor) -> bool {
        let before_end = |start: &[u8], end: Option<&[u8]>| end.is_none_or(|end| start < end);
        before_end(&range.start, self.end.as_deref()) && before_end(&self.start, range.end())
    }
}

impl std::fmt::Display for Gap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let end = match &self.end {
            Some(end) => validate::show_key(end),
            None => "+inf".to_string(),
        };
        write!(f, "[{}, {end})", validate::show_key(&self.start))
    }
}

/// The parts of the keyspace none of `ranges` covers, in key order; `Err` naming two ranges
/// whose spans overlap (or a range with an empty span).
pub fn gaps(ranges: &[RangeDescriptor]) -> Result<Vec<Gap>, String> {
    let mut sorted: Vec<&RangeDescriptor> = ranges.iter().collect();
    sorted.sort_by(|a, b| a.start.cmp(&b.start));
    let mut gaps = Vec::new();
    // Where the covered prefix of the keyspace ends: `None` once it reaches +inf.
    let mut covered: Option<Vec<u8>> = Some(Vec::new());
    let mut previous: Option<&RangeDescriptor> = None;
    for range in sorted {
        if range.end().is_some_and(|end| end <= range.start.as_slice()) {
            return Err(format!("range {range} has an empty span"));
        }
        let Some(cursor) = &covered else {
            let previous = previous.expect("the keyspace end was reached by a range");
            return Err(format!("ranges {previous} and {range} overlap"));
        };
        if range.start < *cursor {
            let previous = previous.expect("a range starts before the keyspace");
            return Err(format!("ranges {previous} and {range} overlap"));
        }
        if range.start > *cursor {
            gaps.push(Gap {
                start: cursor.clone(),
                end: Some(range.start.clone()),
            });
        }
        covered = range.end.clone();
        previous = Some(range);
    }
    if let Some(cursor) = covered {
        gaps.push(Gap {
            start: cursor,
            end: None,
        });
    }
    Ok(gaps)
}

/// `Ok` when `ranges` are data ranges with distinct ids that cover the keyspace exactly once
/// and the first range (which never moves from the keyspace's start) is among them.
pub fn check_coverage(ranges: &[RangeDescriptor]) -> Result<(), String> {
    let mut ids: Vec<RangeId> = ranges.iter().map(|range| range.id).collect();
    ids.sort();
    if let Some(pair) = ids.windows(2).find(|pair| pair[0] == pair[1]) {
        return Err(format!("range {} appears twice", pair[0]));
    }
    if ids.first() == Some(&RangeId::META) {
        return Err("the meta range is not a data range".to_string());
    }
    let missing = gaps(ranges)?;
    if let Some(gap) = missing.first() {
        return Err(format!(
            "no range covers {gap} ({} gaps in all)",
            missing.len()
        ));
    }
    let first = ranges.iter().find(|range| range.start.is_empty());
    match first {
        Some(range) if range.id == RangeId::FIRST => Ok(()),
        Some(range) => Err(format!(
            "range {range} starts the keyspace; range {} must",
            RangeId::FIRST
        )),
        None => unreachable!("a covered keyspace has a range at its start"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(id: u64, start: &str, end: Option<&str>) -> RangeDescriptor {
        RangeDescriptor {
            id: RangeId(id),
            start: start.as_bytes().to_vec(),
            end: end.map(|end| end.as_bytes().to_vec()),
            epoch: 1,
            conf_version: 1,
            replicas: vec![1, 2, 3],
        }
    }

    fn gap(start: &str, end: Option<&str>) -> Gap {
        Gap {
            start: start.as_bytes().to_vec(),
            end: end.map(|end| end.as_bytes().to_vec()),
        }
    }

    #[test]
    fn gaps_are_listed_in_key_order() {
        let cases: Vec<(Vec<RangeDescriptor>, Vec<Gap>)> = vec![
            (vec![], vec![gap("", None)]),
            (vec![range(1, "", None)], vec![]),
            (vec![range(2, "m", None), range(1, "", Some("m"))], vec![]),
            (vec![range(1, "", Some("m"))], vec![gap("m", None)]),
            (vec![range(2, "m", None)], vec![gap("", Some("m"))]),
            (
                vec![range(1, "", Some("c")), range(3, "f", Some("k"))],
                vec![gap("c", Some("f")), gap("k", None)],
            ),
        ];
        for (ranges, expected) in cases {
            assert_eq!(gaps(&ranges), Ok(expected), "{ranges:?}");
        }
    }

    #[test]
    fn overlaps_and_empty_spans_are_refused() {
        let cases = [
            vec![range(1, "", Some("m")), range(2, "k", None)],
            vec![range(1, "", None), range(2, "k", None)],
            vec![range(1, "", Some("m")), range(2, "m", Some("m"))],
        ];
        for ranges in cases {
            assert!(gaps(&ranges).is_err(), "{ranges:?}");
        }
    }

    #[test]
    fn coverage_needs_every_key_once_and_the_first_range_at_the_start() {
        let ok = [range(1, "", Some("m")), range(7, "m", None)];
        assert_eq!(check_coverage(&ok), Ok(()));
        let refused: [(Vec<RangeDescriptor>, &str); 4] = [
            (vec![range(1, "", Some("m"))], "no range covers"),
            (vec![range(2, "", None)], "r1 must"),
            (
                vec![range(1, "", Some("m")), range(1, "m", None)],
                "appears twice",
            ),
            (vec![range(0, "", None)], "meta range"),
        ];
        for (ranges, message) in refused {
            let error = check_coverage(&ranges).unwrap_err();
            assert!(error.contains(message), "{ranges:?}: {error}");
        }
    }

    #[test]
    fn a_gap_overlaps_the_ranges_that_hold_its_keys() {
        let hole = gap("c", Some("f"));
        assert!(hole.overlaps(&range(5, "c", Some("f"))));
        assert!(hole.overlaps(&range(5, "d", Some("e"))));
        assert!(hole.overlaps(&range(5, "a", None)));
        assert!(!hole.overlaps(&range(5, "f", None)));
        assert!(!hole.overlaps(&range(5, "", Some("c"))));
        assert!(gap("k", None).overlaps(&range(5, "z", None)));
    }
}
