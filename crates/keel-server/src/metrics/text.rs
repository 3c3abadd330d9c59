//! The Prometheus text exposition format, version 0.0.4: `# HELP` and `# TYPE` lines, then
//! the family's samples `name{label="value"} number`, histograms as cumulative `_bucket`
//! lines ending at `le="+Inf"`, then `_sum` and `_count`. Knows nothing of what is measured.
//!
//! Names and label names are ours and checked with `assert!` (a bad one is a programmer
//! error); label values and help texts are escaped.
//!
//! Written here rather than with the `prometheus` or `prometheus-client` crates: most of the
//! node's families are read at scrape time from the node's state (Raft status per range,
//! range counts, store counters), which those crates would take only through collectors
//! written against their registries, and the counted ones (`histogram.rs`) are plain atomics
//! the storage writer thread records into; what is left is this writer, a few hundred lines
//! whose output a strict parser of the format checks (tests/it/prometheus.rs).

use std::collections::BTreeSet;
use std::fmt::Write;

use super::histogram::HistogramSnapshot;

/// The content type of the format, for the HTTP answer.
pub(crate) const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// One scrape's text, written family by family.
pub(crate) struct Text {
    out: String,
    /// The family whose samples are being written, and its kind.
    current: Option<(String, Kind)>,
    declared: BTreeSet<String>,
}

impl Text {
    pub fn new() -> Text {
        Text {
            out: String::new(),
            current: None,
            declared: BTreeSet::new(),
        }
    }

    /// Starts the family `name`: its `# HELP` and `# TYPE` lines. Each family once.
    pub fn family(&mut self, name: &str, kind: Kind, help: &str) {
        assert!(valid_name(name), "metric name {name:?}");
        assert!(
            self.declared.insert(name.to_string()),
            "family {name} twice"
        );
        let _ = writeln!(self.out, "# HELP {name} {}", escape_help(help));
        let _ = writeln!(self.out, "# TYPE {name} {}", kind.name());
        self.current = Some((name.to_string(), kind));
    }

    /// One sample of the current (counter or gauge) family.
    pub fn sample(&mut self, labels: &[(&str, &str)], value: f64) {
        let (name, kind) = self.current.clone().expect("a family is started");
        assert!(kind != Kind::Histogram, "{name} takes histograms");
        self.line(&name, labels, None, value);
    }

    /// One histogram of the current (histogram) family: cumulative buckets, sum, count.
    pub fn histogram(&mut self, labels: &[(&str, &str)], histogram: &HistogramSnapshot) {
        let (name, kind) = self.current.clone().expect("a family is started");
        assert!(kind == Kind::Histogram, "{name} is not a histogram");
        let bucket = format!("{name}_bucket");
        let mut cumulative = 0u64;
        for (bound, count) in histogram.bounds.iter().zip(&histogram.counts) {
            cumulative += count;
            let le = number(*bound);
            self.line(&bucket, labels, Some(&le), cumulative as f64);
        }
        let total = histogram.count();
        self.line(&bucket, labels, Some("+Inf"), total as f64);
        self.line(&format!("{name}_sum"), labels, None, histogram.sum);
        self.line(&format!("{name}_count"), labels, None, total as f64);
    }

    pub fn finish(self) -> String {
        self.out
    }

    fn line(&mut self, name: &str, labels: &[(&str, &str)], le: Option<&str>, value: f64) {
        self.out.push_str(name);
        let le = le.map(|le| ("le", le));
        let all: Vec<(&str, &str)> = labels.iter().copied().chain(le).collect();
        if !all.is_empty() {
            self.out.push('{');
            for (i, (label, value)) in all.iter().enumerate() {
                assert!(valid_label(label), "label name {label:?} of {name}");
                if i > 0 {
                    self.out.push(',');
                }
                let _ = write!(self.out, "{label}=\"{}\"", escape_label(value));
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {}", number(value));
    }
}

/// A sample value or bucket bound as the format writes it: integers without a fraction,
/// `+Inf`, `-Inf`, `NaN`.
pub(crate) fn number(value: f64) -> String {
    if value.is_nan() {
        "NaN".to_string()
    } else if value == f64::INFINITY {
        "+Inf".to_string()
    } else if value == f64::NEG_INFINITY {
        "-Inf".to_string()
    } else if value.fract() == 0.0 && value.abs() < 1e15 {
        format!("{value:.0}")
    } else {
        format!("{value}")
    }
}

/// A label value: backslash, double quote and line feed escaped.
pub(crate) fn escape_label(value: &str) -> String {
    let mut escaped = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => escaped.push_str("\\\\"),
            '"' => escaped.push_str("\\\""),
            '\n' => escaped.push_str("\\n"),
            c => escaped.push(c),
        }
    }
    escaped
}

/// A help text: backslash and line feed escaped.
fn escape_help(help: &str) -> String {
    help.replace('\\', "\\\\").replace('\n', "\\n")
}

/// `[a-zA-Z_:][a-zA-Z0-9_:]*`
fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// `[a-zA-Z_][a-zA-Z0-9_]*`, not starting with `__` (reserved).
fn valid_label(name: &str) -> bool {
    let mut chars = name.chars();
    !name.starts_with("__")
        && chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;

    type Labels<'a> = Vec<(&'a str, &'a str)>;

    #[test]
    fn numbers_are_written_as_the_format_wants() {
        let cases: &[(f64, &str)] = &[
            (0.0, "0"),
            (3.0, "3"),
            (-7.0, "-7"),
            (0.0001, "0.0001"),
            (2.5, "2.5"),
            (1e15, "1000000000000000"),
            (1e16, "10000000000000000"),
            (f64::INFINITY, "+Inf"),
            (f64::NEG_INFINITY, "-Inf"),
            (f64::NAN, "NaN"),
        ];
        for (value, expected) in cases {
            assert_eq!(number(*value), *expected, "{value}");
        }
    }

    #[test]
    fn label_values_are_escaped() {
        let cases: &[(&str, &str)] = &[
            ("plain", "plain"),
            ("", ""),
            ("a\"b", "a\\\"b"),
            ("back\\slash", "back\\\\slash"),
            ("two\nlines", "two\\nlines"),
            ("\\\"\n", "\\\\\\\"\\n"),
            ("ünïcode …", "ünïcode …"),
            ("tab\tstays", "tab\tstays"),
        ];
        for (value, expected) in cases {
            assert_eq!(escape_label(value), *expected, "{value:?}");
        }
    }

    #[test]
    fn families_have_help_and_type_lines_then_samples() {
        /// (kind, help, samples (labels, value), expected text)
        type Case<'a> = (Kind, &'a str, Vec<(Labels<'a>, f64)>, &'a str);
        let cases: Vec<Case> = vec![
            (
                Kind::Counter,
                "requests",
                vec![(vec![], 3.0)],
                "# HELP keel_x requests\n# TYPE keel_x counter\nkeel_x 3\n",
            ),
            (
                Kind::Gauge,
                "a \\ b\nc",
                vec![
                    (vec![("range_id", "1")], 2.5),
                    (vec![("range_id", "0")], -1.0),
                ],
                "# HELP keel_x a \\\\ b\\nc\n# TYPE keel_x gauge\n\
                 keel_x{range_id=\"1\"} 2.5\nkeel_x{range_id=\"0\"} -1\n",
            ),
            (
                Kind::Gauge,
                "keys",
                vec![(vec![("key", "say \"hi\"\\"), ("range_id", "7")], 1.0)],
                "# HELP keel_x keys\n# TYPE keel_x gauge\n\
                 keel_x{key=\"say \\\"hi\\\"\\\\\",range_id=\"7\"} 1\n",
            ),
        ];
        for (kind, help, samples, expected) in cases {
            let mut text = Text::new();
            text.family("keel_x", kind, help);
            for (labels, value) in &samples {
                text.sample(labels, *value);
            }
            assert_eq!(text.finish(), expected, "{help:?}");
        }
    }

    #[test]
    fn histograms_have_cumulative_buckets_ending_at_inf() {
        /// (bucket counts, sum, labels, expected samples)
        type Case<'a> = (Vec<u64>, f64, Labels<'a>, &'a str);
        let cases: Vec<Case> = vec![
            (
                vec![0, 0, 0],
                0.0,
                vec![],
                "keel_h_bucket{le=\"0.001\"} 0\nkeel_h_bucket{le=\"1\"} 0\n\
                 keel_h_bucket{le=\"+Inf\"} 0\nkeel_h_sum 0\nkeel_h_count 0\n",
            ),
            (
                vec![2, 1, 4],
                12.5,
                vec![("method", "Put")],
                "keel_h_bucket{method=\"Put\",le=\"0.001\"} 2\n\
                 keel_h_bucket{method=\"Put\",le=\"1\"} 3\n\
                 keel_h_bucket{method=\"Put\",le=\"+Inf\"} 7\n\
                 keel_h_sum{method=\"Put\"} 12.5\nkeel_h_count{method=\"Put\"} 7\n",
            ),
        ];
        for (counts, sum, labels, expected) in cases {
            let snapshot = HistogramSnapshot {
                bounds: &[0.001, 1.0],
                counts,
                sum,
            };
            let mut text = Text::new();
            text.family("keel_h", Kind::Histogram, "h");
            text.histogram(&labels, &snapshot);
            let body = text.finish();
            let samples = body.split_once("histogram\n").unwrap().1;
            assert_eq!(samples, expected);
        }
    }

    #[test]
    fn names_are_checked() {
        let cases: &[(&str, bool)] = &[
            ("keel_requests_total", true),
            ("keel:rate", true),
            ("_x", true),
            ("9lives", false),
            ("keel-requests", false),
            ("", false),
        ];
        for (name, valid) in cases {
            assert_eq!(valid_name(name), *valid, "{name:?}");
        }
        let labels: &[(&str, bool)] = &[
            ("range_id", true),
            ("le", true),
            ("__name__", false),
            ("a:b", false),
            ("1a", false),
        ];
        for (label, valid) in labels {
            assert_eq!(valid_label(label), *valid, "{label:?}");
        }
    }

    #[test]
    #[should_panic(expected = "family keel_x twice")]
    fn a_family_is_declared_once() {
        let mut text = Text::new();
        text.family("keel_x", Kind::Gauge, "x");
        text.family("keel_x", Kind::Gauge, "x");
    }
}
