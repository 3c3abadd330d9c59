//! report.html: one self-contained page (inline CSS and SVG, no scripts, no fonts, nothing
//! fetched) with the verdicts, a timeline of ops per client with fault bands, latency over
//! time and the availability around each fault; for runs with a ranges.jsonl also the range table's changes and the range of
//! each op. Large histories are bucketed or sampled, and the page says so. Knows nothing
//! about how verdicts are reached.

mod availability;
mod latency;
mod ranges;
mod timeline;

use std::collections::BTreeSet;
use std::fmt::Write;

use crate::check::{self, Results, RunDir};
use crate::checker::Verdict;
use crate::fault::FaultEvent;
use crate::history::{Op, Status};
use crate::limits;
use crate::ranges::RangeSnapshot;
use ranges::RangeView;
use serde_json::Value;

/// Width of the plotting area of both charts, in px.
const PLOT_WIDTH_PX: f64 = 1100.0;
/// Room left of the plots for lane and axis labels, in px.
const MARGIN_LEFT_PX: f64 = 90.0;
/// Characters of a checker's details shown on the page; results.json has all of it.
const DETAILS_CHARS_MAX: usize = 20_000;
/// Fault events drawn and listed; the page says when more were left out.
const FAULT_BANDS_MAX: usize = 500;

const CSS: &str = "body{font-family:sans-serif;margin:24px;color:#222;max-width:1260px}\
h1{font-size:22px}h2{font-size:17px;margin-top:28px}\
table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:4px 8px;text-align:left;\
vertical-align:top;font-size:13px}.valid{background:#cfeccf}.invalid{background:#f6c4c4}\
.unknown{background:#f8e3b0}pre{font-size:12px;max-height:360px;overflow:auto;\
background:#f6f6f6;padding:8px}.note{font-size:12px;color:#555}svg{display:block;\
margin:8px 0}svg text{font-size:11px;fill:#333}";

/// The page for a checked run.
pub fn render(run: &RunDir, results: &Results) -> String {
    let history = run.history.as_deref().unwrap_or(&[]);
    let snapshots = run.ranges.as_deref().unwrap_or(&[]);
    let frame = Frame::new(history, &run.faults, snapshots);
    let view = RangeView::new(snapshots, history);
    let mut page = String::new();
    page.push_str("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">");
    page.push_str("<title>keel-jepsen report</title><style>");
    page.push_str(CSS);
    page.push_str("</style></head><body>");
    header(&mut page, run, results, history, view.as_ref());
    checker_table(&mut page, results, history, view.as_ref(), &frame);
    page.push_str("<h2>Operations by client</h2>");
    let mut quoted = BTreeSet::new();
    for result in results.checkers.values() {
        collect_records(&result.details, &mut quoted);
    }
    let chart = timeline::Chart {
        history,
        faults: &run.faults,
        frame: &frame,
        quoted: &quoted,
        ranges: view.as_ref(),
        availability: results.availability.as_ref(),
    };
    timeline::render(&mut page, &chart);
    page.push_str("<h2>Latency over time</h2>");
    latency::render(&mut page, history, &run.faults, &frame);
    fault_table(&mut page, &run.faults, &frame);
    if let Some(measure) = &results.availability {
        availability::section(&mut page, measure, &run.faults, &frame);
    }
    if let Some(view) = &view {
        ranges::section(&mut page, history, view, &frame);
    }
    page.push_str("</body></html>\n");
    page
}

/// The time span shown and its mapping to x pixels.
#[derive(Debug, Clone, Copy)]
struct Frame {
    start_ns: u64,
    end_ns: u64,
}

impl Frame {
    fn new(history: &[Op], faults: &[FaultEvent], snapshots: &[RangeSnapshot]) -> Frame {
        let times = history
            .iter()
            .flat_map(|op| [Some(op.call_ns), op.return_ns])
            .chain(faults.iter().flat_map(|f| [Some(f.start_ns), f.stop_ns]))
            .chain(snapshots.iter().map(|s| Some(s.at_ns)))
            .flatten();
        let (start_ns, end_ns) = times.fold((u64::MAX, 0), |(lo, hi), t| (lo.min(t), hi.max(t)));
        if start_ns > end_ns {
            return Frame {
                start_ns: 0,
                end_ns: 1,
            };
        }
        Frame {
            start_ns,
            end_ns: end_ns.max(start_ns + 1),
        }
    }

    fn x(&self, time_ns: u64) -> f64 {
        let span = (self.end_ns - self.start_ns) as f64;
        let offset = time_ns.clamp(self.start_ns, self.end_ns) - self.start_ns;
        MARGIN_LEFT_PX + offset as f64 / span * PLOT_WIDTH_PX
    }

    fn span_ns(&self) -> u64 {
        self.end_ns - self.start_ns
    }

    /// Seconds since the start of the frame, for labels.
    fn seconds(&self, time_ns: u64) -> f64 {
        time_ns.saturating_sub(self.start_ns) as f64 / 1e9
    }
}

/// Escapes text for HTML content and attribute values.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            _ => out.push(c),
        }
    }
    out
}

fn status_colour(status: Status) -> &'static str {
    match status {
        Status::Ok => "#2e9d47",
        Status::Fail => "#d23c3c",
        Status::Info => "#e8a317",
    }
}

/// A colour per fault kind, in order of first appearance.
fn fault_colour(faults: &[FaultEvent], kind: &str) -> &'static str {
    const PALETTE: [&str; 6] = [
        "#5b6ee1", "#b45bd6", "#3aa6b9", "#c97a40", "#7a8b2e", "#d6588f",
    ];
    let mut kinds: Vec<&str> = Vec::new();
    for event in faults.iter().take(FAULT_BANDS_MAX) {
        if !kinds.contains(&event.fault.as_str()) {
            kinds.push(&event.fault);
        }
    }
    let index = kinds.iter().position(|k| *k == kind).unwrap_or(0);
    PALETTE[index % PALETTE.len()]
}

/// Shaded bands for the fault intervals, `top` to `top + height`; an unhealed fault runs to
/// the end of the frame.
fn fault_bands(svg: &mut String, faults: &[FaultEvent], frame: &Frame, top: f64, height: f64) {
    for event in faults.iter().take(FAULT_BANDS_MAX) {
        let x0 = frame.x(event.start_ns);
        let x1 = frame.x(event.stop_ns.unwrap_or(frame.end_ns)).max(x0 + 1.0);
        let stop = event.stop_ns.map_or("never healed".to_string(), |s| {
            format!("{:.3} s", frame.seconds(s))
        });
        let _ = write!(
            svg,
            "<rect x=\"{x0:.1}\" y=\"{top:.1}\" width=\"{:.1}\" height=\"{height:.1}\" \
             fill=\"{}\" fill-opacity=\"0.16\"><title>{} on {}: {:.3} s to {}</title></rect>",
            x1 - x0,
            fault_colour(faults, &event.fault),
            escape(&event.fault),
            escape(&event.target),
            frame.seconds(event.start_ns),
            stop
        );
    }
}

/// A time axis with "nice" second ticks at `y`.
fn time_axis(svg: &mut String, frame: &Frame, y: f64) {
    let span_s = frame.span_ns() as f64 / 1e9;
    let rough = span_s / 10.0;
    let magnitude = 10f64.powf(rough.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * magnitude)
        .find(|s| *s >= rough)
        .unwrap_or(magnitude * 10.0);
    let _ = write!(
        svg,
        "<line x1=\"{MARGIN_LEFT_PX}\" y1=\"{y}\" x2=\"{}\" y2=\"{y}\" stroke=\"#888\"/>",
        MARGIN_LEFT_PX + PLOT_WIDTH_PX
    );
    let mut tick = 0.0;
    while tick <= span_s + step * 1e-9 {
        let x = frame.x(frame.start_ns + (tick * 1e9) as u64);
        let _ = write!(
            svg,
            "<line x1=\"{x:.1}\" y1=\"{y}\" x2=\"{x:.1}\" y2=\"{}\" stroke=\"#888\"/>\
             <text x=\"{x:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
            y + 4.0,
            y + 16.0,
            seconds_label(tick, step)
        );
        tick += step;
    }
}

fn seconds_label(seconds: f64, step: f64) -> String {
    let decimals = if step >= 1.0 {
        0
    } else {
        (-step.log10().floor()) as usize
    };
    format!("{seconds:.decimals$} s")
}

fn header(
    page: &mut String,
    run: &RunDir,
    results: &Results,
    history: &[Op],
    view: Option<&RangeView>,
) {
    let verdict = results.valid.as_str();
    let _ = write!(
        page,
        "<h1>keel-jepsen: <span class=\"{verdict}\">&nbsp;{verdict}&nbsp;</span></h1>"
    );
    if let Some(spec) = &run.spec {
        let _ = write!(
            page,
            "<p>workload <b>{}</b> ({} clients), nemesis <b>{}</b>, {} nodes, seed {}, time limit {} s</p>",
            escape(&spec.workload),
            escape(&check::client_mode(spec)),
            escape(&spec.nemesis.join(", ")),
            spec.nodes,
            spec.seed,
            spec.time_limit_s
        );
    }
    let count = |status| history.iter().filter(|op| op.status() == status).count();
    let _ = write!(
        page,
        "<p>{} ops: {} ok, {} fail, {} indeterminate; {} fault events",
        history.len(),
        count(Status::Ok),
        count(Status::Fail),
        count(Status::Info),
        run.faults.len()
    );
    if let Some(view) = view {
        let _ = write!(
            page,
            "; {} range-table snapshots, {} changes",
            view.snapshots.len(),
            view.changes.len() - 1
        );
    }
    page.push_str("</p>");
}

/// The verdicts, then the details of every checker that did not pass (with, for runs with
/// ranges, the range of each op it quoted).
fn checker_table(
    page: &mut String,
    results: &Results,
    history: &[Op],
    view: Option<&RangeView>,
    frame: &Frame,
) {
    page.push_str("<h2>Checkers</h2><table><tr><th>checker</th><th>result</th>");
    page.push_str("<th>time</th><th>summary</th></tr>");
    for (name, result) in &results.checkers {
        let verdict = result.result.as_str();
        let summary = result.details["summary"].as_str().unwrap_or("");
        let _ = write!(
            page,
            "<tr><td>{}</td><td class=\"{verdict}\">{verdict}</td><td>{:.3} ms</td><td>{}</td></tr>",
            escape(name),
            result.elapsed_ms,
            escape(summary)
        );
    }
    page.push_str("</table>");
    for (name, result) in &results.checkers {
        if result.result == Verdict::Valid {
            continue;
        }
        let mut text = serde_json::to_string_pretty(&result.details).unwrap_or_default();
        if text.len() > DETAILS_CHARS_MAX {
            let cut = (0..=DETAILS_CHARS_MAX)
                .rev()
                .find(|i| text.is_char_boundary(*i))
                .unwrap_or(0);
            text.truncate(cut);
            text.push_str("\n… (cut; results.json has the rest)");
        }
        let _ = write!(page, "<h2>{} details</h2><ul>", escape(name));
        let mut explanations = Vec::new();
        collect_explanations(&result.details, &mut explanations);
        for explanation in &explanations {
            let _ = write!(page, "<li>{}</li>", escape(explanation));
        }
        let _ = write!(page, "</ul><pre>{}</pre>", escape(&text));
        if let Some(view) = view {
            let mut records = BTreeSet::new();
            collect_records(&result.details, &mut records);
            ranges::quoted_ops(page, history, view, &records, frame);
        }
    }
}

/// The `explanation` and `reason` strings of a checker's details, at most
/// `limits::DETAILS_ITEMS_MAX`, in document order.
fn collect_explanations<'a>(details: &'a Value, found: &mut Vec<&'a str>) {
    match details {
        Value::Object(fields) => {
            for (name, value) in fields {
                match value.as_str() {
                    Some(text) if name == "explanation" || name == "reason" => {
                        if found.len() < limits::DETAILS_ITEMS_MAX {
                            found.push(text);
                        }
                    }
                    _ => collect_explanations(value, found),
                }
            }
        }
        Value::Array(items) => items
            .iter()
            .for_each(|item| collect_explanations(item, found)),
        _ => {}
    }
}

/// The record numbers (1-based) of the ops quoted as evidence in a checker's details.
fn collect_records(details: &Value, found: &mut BTreeSet<usize>) {
    match details {
        Value::Object(fields) => {
            if let (Some(record), Some(_)) = (fields.get("record"), fields.get("op"))
                && let Some(record) = record.as_u64()
            {
                found.insert(record as usize);
            }
            fields
                .values()
                .for_each(|value| collect_records(value, found));
        }
        Value::Array(items) => items.iter().for_each(|item| collect_records(item, found)),
        _ => {}
    }
}

fn fault_table(page: &mut String, faults: &[FaultEvent], frame: &Frame) {
    page.push_str("<h2>Faults</h2>");
    if faults.is_empty() {
        page.push_str("<p>No fault events.</p>");
        return;
    }
    page.push_str("<table><tr><th>fault</th><th>target</th><th>start</th><th>stop</th></tr>");
    for event in faults.iter().take(FAULT_BANDS_MAX) {
        let stop = event.stop_ns.map_or("never healed".to_string(), |s| {
            format!("{:.3} s", frame.seconds(s))
        });
        let _ = write!(
            page,
            "<tr><td style=\"color:{}\">{}</td><td>{}</td><td>{:.3} s</td><td>{}</td></tr>",
            fault_colour(faults, &event.fault),
            escape(&event.fault),
            escape(&event.target),
            frame.seconds(event.start_ns),
            stop
        );
    }
    page.push_str("</table>");
    if faults.len() > FAULT_BANDS_MAX {
        let _ = write!(
            page,
            "<p class=\"note\">Only the first {FAULT_BANDS_MAX} of {} fault events are drawn \
             and listed.</p>",
            faults.len()
        );
    }
}
