//! A small, strict parser of the Prometheus text format (0.0.4), for checking what
//! `/metrics` serves: every line is a `# HELP`/`# TYPE` line, another comment, or
//! `name{label="value",...} value`; every sample belongs to a family a `# TYPE` line declared
//! before it; no series twice; histogram buckets are cumulative, end at `le="+Inf"`, and that
//! bucket equals `_count`. Planted bad lines show that it rejects what it should.

use std::collections::{BTreeMap, BTreeSet};

/// Sorted label pairs.
pub type Labels = Vec<(String, String)>;

/// A parsed scrape: every sample by name and labels.
#[derive(Debug, Default)]
pub struct Scrape {
    pub samples: BTreeMap<(String, Labels), f64>,
    /// Family name → type.
    pub types: BTreeMap<String, String>,
}

impl Scrape {
    /// The value of the series `name` with exactly `labels`.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.samples
            .get(&(name.to_string(), labels_of(labels)))
            .copied()
    }

    /// The samples of `name` whose labels include `labels`.
    pub fn matching(&self, name: &str, labels: &[(&str, &str)]) -> Vec<(&Labels, f64)> {
        let wanted = labels_of(labels);
        self.samples
            .iter()
            .filter(|((n, l), _)| n == name && wanted.iter().all(|w| l.contains(w)))
            .map(|((_, l), v)| (l, *v))
            .collect()
    }
}

fn labels_of(labels: &[(&str, &str)]) -> Labels {
    let mut labels: Labels = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    labels.sort();
    labels
}

/// Parses `text`, or names the first line that breaks a rule.
pub fn parse(text: &str) -> Result<Scrape, String> {
    let mut scrape = Scrape::default();
    let Some(body) = text.strip_suffix('\n') else {
        return Err("the text does not end with a line feed".to_string());
    };
    for (number, line) in body.split('\n').enumerate() {
        let fail = |why: &str| format!("line {}: {why}: {line:?}", number + 1);
        if let Some(comment) = line.strip_prefix('#') {
            comment_line(comment, &mut scrape).map_err(|why| fail(&why))?;
            continue;
        }
        let (name, labels, value) = sample_line(line).map_err(|why| fail(&why))?;
        let family = family_of(&name, &scrape.types).ok_or_else(|| fail("no # TYPE before"))?;
        let histogram = scrape.types[&family] == "histogram";
        if histogram == (name == family) {
            return Err(fail("a sample name does not fit its family's type"));
        }
        if scrape.samples.insert((name, labels), value).is_some() {
            return Err(fail("the series appears twice"));
        }
    }
    check_histograms(&scrape)?;
    Ok(scrape)
}

fn comment_line(comment: &str, scrape: &mut Scrape) -> Result<(), String> {
    let mut words = comment.trim_start().splitn(3, ' ');
    match (words.next(), words.next(), words.next()) {
        (Some("TYPE"), Some(name), Some(kind)) => {
            check_name(name)?;
            if !["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind) {
                return Err(format!("unknown type {kind}"));
            }
            match scrape.types.insert(name.to_string(), kind.to_string()) {
                None => Ok(()),
                Some(_) => Err(format!("family {name} typed twice")),
            }
        }
        (Some("TYPE"), ..) => Err("a # TYPE line needs a name and a type".to_string()),
        (Some("HELP"), Some(name), _) => check_name(name),
        (Some("HELP"), ..) => Err("a # HELP line needs a name".to_string()),
        _ => Ok(()),
    }
}

/// `name{labels} value` → (name, sorted labels, value).
fn sample_line(line: &str) -> Result<(String, Labels, f64), String> {
    let name_end = line.find(['{', ' ']).ok_or("no value")?;
    let name = &line[..name_end];
    check_name(name)?;
    let (labels, rest) = match line[name_end..].strip_prefix('{') {
        Some(rest) => parse_labels(rest)?,
        None => (Vec::new(), &line[name_end..]),
    };
    let value = rest.strip_prefix(' ').ok_or("no space before the value")?;
    if value.contains(' ') {
        return Err("more than a value after the labels (timestamps are not expected)".into());
    }
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        "NaN" => f64::NAN,
        value => value.parse().map_err(|_| format!("value {value:?}"))?,
    };
    Ok((name.to_string(), labels, value))
}

/// The labels after `{`, and the rest of the line after `}`.
fn parse_labels(mut rest: &str) -> Result<(Labels, &str), String> {
    let mut labels = Labels::new();
    let mut seen = BTreeSet::new();
    loop {
        if let Some(after) = rest.strip_prefix('}') {
            labels.sort();
            return Ok((labels, after));
        }
        let eq = rest.find('=').ok_or("a label without =")?;
        let label = &rest[..eq];
        check_label(label)?;
        if !seen.insert(label.to_string()) {
            return Err(format!("label {label} twice"));
        }
        let quoted = rest[eq + 1..]
            .strip_prefix('"')
            .ok_or("an unquoted label value")?;
        let (value, after) = unquote(quoted)?;
        labels.push((label.to_string(), value));
        rest = match after.strip_prefix(',') {
            Some(next) if !next.starts_with('}') => next,
            Some(_) => return Err("a trailing comma".to_string()),
            None if after.starts_with('}') => after,
            None => return Err("labels not separated by a comma".to_string()),
        };
    }
}

/// A label value up to its closing quote, with `\\`, `\"` and `\n` unescaped.
fn unquote(text: &str) -> Result<(String, &str), String> {
    let mut value = String::new();
    let mut chars = text.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return Ok((value, &text[i + 1..])),
            '\\' => match chars.next() {
                Some((_, '\\')) => value.push('\\'),
                Some((_, '"')) => value.push('"'),
                Some((_, 'n')) => value.push('\n'),
                other => return Err(format!("bad escape {other:?}")),
            },
            '\n' => return Err("a line feed in a label value".to_string()),
            c => value.push(c),
        }
    }
    Err("an unclosed label value".to_string())
}

/// The declared family a sample name belongs to: itself, or a histogram's base name.
fn family_of(name: &str, types: &BTreeMap<String, String>) -> Option<String> {
    if types.contains_key(name) {
        return Some(name.to_string());
    }
    ["_bucket", "_sum", "_count"].iter().find_map(|suffix| {
        let base = name.strip_suffix(suffix)?;
        (types.get(base)? == "histogram").then(|| base.to_string())
    })
}

/// Per histogram series: buckets rise, the last is `+Inf`, it equals `_count`, `_sum` exists.
fn check_histograms(scrape: &Scrape) -> Result<(), String> {
    let mut buckets: BTreeMap<(String, Labels), Vec<(f64, f64)>> = BTreeMap::new();
    for ((name, labels), value) in &scrape.samples {
        let Some(base) = name.strip_suffix("_bucket") else {
            continue;
        };
        let le = labels
            .iter()
            .find(|(label, _)| label == "le")
            .ok_or(format!("{name} without le"))?;
        let bound: f64 = match le.1.as_str() {
            "+Inf" => f64::INFINITY,
            bound => bound.parse().map_err(|_| format!("{name}: le {bound:?}"))?,
        };
        let rest: Labels = labels.iter().filter(|(l, _)| l != "le").cloned().collect();
        buckets
            .entry((base.to_string(), rest))
            .or_default()
            .push((bound, *value));
    }
    for ((base, labels), mut series) in buckets {
        series.sort_by(|a, b| a.0.total_cmp(&b.0));
        if series.windows(2).any(|pair| pair[1].1 < pair[0].1) {
            return Err(format!("{base}{labels:?}: buckets are not cumulative"));
        }
        let last = series.last().expect("one bucket at least");
        if last.0 != f64::INFINITY {
            return Err(format!("{base}{labels:?}: no le=\"+Inf\" bucket"));
        }
        let count = scrape
            .samples
            .get(&(format!("{base}_count"), labels.clone()));
        if count != Some(&last.1) {
            return Err(format!("{base}{labels:?}: _count {count:?} != +Inf bucket"));
        }
        if !scrape
            .samples
            .contains_key(&(format!("{base}_sum"), labels.clone()))
        {
            return Err(format!("{base}{labels:?}: no _sum"));
        }
    }
    Ok(())
}

fn check_name(name: &str) -> Result<(), String> {
    let mut chars = name.chars();
    let first = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':');
    match first && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
        true => Ok(()),
        false => Err(format!("bad metric name {name:?}")),
    }
}

fn check_label(label: &str) -> Result<(), String> {
    let mut chars = label.chars();
    let first = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    match first && chars.all(|c| c.is_ascii_alphanumeric() || c == '_') {
        true => Ok(()),
        false => Err(format!("bad label name {label:?}")),
    }
}

#[test]
fn the_parser_accepts_good_text_and_rejects_planted_bad_lines() {
    let good = "# HELP keel_up Up.\n# TYPE keel_up gauge\nkeel_up{node_id=\"1\",k=\"a\\\"b\\\\c\\nd\"} 1\n\
                # TYPE keel_h histogram\nkeel_h_bucket{le=\"0.1\"} 1\nkeel_h_bucket{le=\"+Inf\"} 2\n\
                keel_h_sum 0.3\nkeel_h_count 2\n";
    let scrape = parse(good).unwrap();
    assert_eq!(
        scrape.value("keel_up", &[("node_id", "1"), ("k", "a\"b\\c\nd")]),
        Some(1.0)
    );
    let cases: &[(&str, &str)] = &[
        ("keel_bogus 1\n", "no # TYPE before"),
        ("keel_up{node_id=\"1\" 1\n", "labels not separated"),
        ("keel_up{node_id=1} 1\n", "unquoted"),
        ("keel_up{node_id=\"1\",} 1\n", "trailing comma"),
        ("keel_up{node_id=\"1\"} one\n", "value"),
        ("keel_up{node_id=\"1\"} 1 1700000000\n", "timestamps"),
        ("keel_up{node_id=\"1\"}  1\n", "timestamps"),
        ("keel-up 1\n", "bad metric name"),
        ("keel_h_sum 0.4\n", "twice"),
        ("keel_up{x=\"\\t\"} 1\n", "bad escape"),
        ("# TYPE keel_up gauge\n", "typed twice"),
        ("# TYPE keel_x wobbly\n", "unknown type"),
        ("keel_h_bucket{le=\"0.5\"} 0\n", "not cumulative"),
        ("keel_h 1\n", "does not fit"),
        ("keel_up_count 1\n", "no # TYPE before"),
    ];
    for (bad, why) in cases {
        let error = parse(&format!("{good}{bad}")).expect_err(bad);
        assert!(error.contains(why), "{bad:?}: {error}");
    }
    let not_cumulative = good
        .replace("le=\"+Inf\"} 2", "le=\"+Inf\"} 0")
        .replace("_count 2", "_count 0");
    assert!(
        parse(&not_cumulative)
            .unwrap_err()
            .contains("not cumulative")
    );
    let no_inf = good.replace("keel_h_bucket{le=\"+Inf\"} 2\n", "");
    assert!(parse(&no_inf).unwrap_err().contains("+Inf"));
    let wrong_count = good.replace("_count 2", "_count 3");
    assert!(parse(&wrong_count).unwrap_err().contains("_count"));
    assert!(
        parse("# TYPE keel_up gauge\nkeel_up 1")
            .unwrap_err()
            .contains("line feed")
    );
}
