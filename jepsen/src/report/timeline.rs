//! The timeline chart: one lane per client, one bar per op from call to return, coloured by
//! outcome, over shaded fault bands; for runs with a ranges.jsonl a lane of range-table
//! changes under them. Above `limits::REPORT_TIMELINE_OPS_MAX` ops each lane is cut into time
//! buckets showing the worst outcome in each. Knows nothing about checkers.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;

use super::availability;
use super::ranges::{self, RangeView};
use super::{Frame, MARGIN_LEFT_PX, PLOT_WIDTH_PX, escape, fault_bands, status_colour, time_axis};
use crate::checker::availability::Availability;
use crate::fault::FaultEvent;
use crate::history::{Op, Status};
use crate::limits;

/// Width of the bar of an indeterminate op, which has no return to end at, in px.
const INFO_BAR_PX: f64 = 6.0;
/// Room above the first lane, for its label, in px.
const TOP_PX: f64 = 6.0;
/// Characters of an op's JSON shown in its tooltip.
const TOOLTIP_CHARS_MAX: usize = 300;
/// Height of the lane of range-table changes, in px.
const RANGE_LANE_PX: f64 = 16.0;

/// What the chart draws.
pub(super) struct Chart<'a> {
    pub(super) history: &'a [Op],
    pub(super) faults: &'a [FaultEvent],
    pub(super) frame: &'a Frame,
    /// Record numbers (1-based) of ops quoted as evidence; they are outlined.
    pub(super) quoted: &'a BTreeSet<usize>,
    /// The range table, when the run has one: a lane of its changes, and each op's range in
    /// its tooltip.
    pub(super) ranges: Option<&'a RangeView<'a>>,
    /// The availability measure, when the run has one: each fault's longest gap without a
    /// success is marked along the top.
    pub(super) availability: Option<&'a Availability>,
}

/// Appends the chart and its note to the page.
pub(super) fn render(page: &mut String, chart: &Chart) {
    let Chart {
        history,
        faults,
        frame,
        ranges: view,
        ..
    } = *chart;
    let lanes = Lanes::new(history);
    let lane_px = if lanes.count <= 24 { 14.0 } else { 8.0 };
    let lanes_px = TOP_PX + lanes.count as f64 * lane_px;
    let plot_px = lanes_px + view.map_or(0.0, |_| RANGE_LANE_PX);
    let height = plot_px + 30.0;
    let width = MARGIN_LEFT_PX + PLOT_WIDTH_PX + 10.0;
    let _ = write!(
        page,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" \
         role=\"img\" aria-label=\"operations by client over time\">"
    );
    lane_labels(page, &lanes, lane_px);
    let bucketed = history.len() > limits::REPORT_TIMELINE_OPS_MAX;
    if bucketed {
        buckets(page, history, &lanes, frame, lane_px);
    } else {
        bars(page, chart, &lanes, lane_px);
    }
    // Over the bars, translucent, so that dense lanes do not hide them.
    fault_bands(page, faults, frame, 0.0, plot_px);
    if let Some(measure) = chart.availability {
        availability::gap_marks(page, measure, frame, 0.0);
    }
    if let Some(view) = view {
        ranges::lane(page, view, frame, lanes_px, RANGE_LANE_PX);
    }
    time_axis(page, frame, plot_px + 4.0);
    page.push_str("</svg>");
    note(page, chart, &lanes, bucketed);
}

/// Which lane each client gets. Up to `limits::REPORT_LANES_MAX` clients get a lane each;
/// beyond that, clients in id order share lanes evenly.
struct Lanes {
    of_client: BTreeMap<u64, usize>,
    clients: usize,
    count: usize,
}

impl Lanes {
    fn new(history: &[Op]) -> Lanes {
        let mut of_client: BTreeMap<u64, usize> = history.iter().map(|op| (op.client, 0)).collect();
        let clients = of_client.len();
        let count = clients.clamp(1, limits::REPORT_LANES_MAX);
        for (rank, lane) in of_client.values_mut().enumerate() {
            *lane = rank * count / clients;
        }
        Lanes {
            of_client,
            clients,
            count,
        }
    }

    fn y(&self, client: u64, lane_px: f64) -> f64 {
        TOP_PX + self.of_client[&client] as f64 * lane_px
    }
}

fn lane_labels(svg: &mut String, lanes: &Lanes, lane_px: f64) {
    let mut labelled = vec![false; lanes.count];
    for (client, lane) in &lanes.of_client {
        if labelled[*lane] || (lane_px < 10.0 && lane % 4 != 0) {
            continue;
        }
        labelled[*lane] = true;
        let suffix = if lanes.clients > lanes.count { "+" } else { "" };
        let _ = write!(
            svg,
            "<text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">client {client}{suffix}</text>",
            MARGIN_LEFT_PX - 6.0,
            TOP_PX + *lane as f64 * lane_px + lane_px * 0.8
        );
    }
}

/// One bar per op, with its record (and range) as a tooltip.
fn bars(svg: &mut String, chart: &Chart, lanes: &Lanes, lane_px: f64) {
    let frame = chart.frame;
    for (index, op) in chart.history.iter().enumerate() {
        let outline = if chart.quoted.contains(&(index + 1)) {
            " stroke=\"#000\" stroke-width=\"1.5\""
        } else {
            ""
        };
        let status = op.status();
        let x0 = frame.x(op.call_ns);
        let x1 = match (status, op.return_ns) {
            (Status::Info, _) | (_, None) => x0 + INFO_BAR_PX,
            (_, Some(return_ns)) => frame.x(return_ns).max(x0 + 1.0),
        };
        let mut tooltip = op.to_line();
        if tooltip.len() > TOOLTIP_CHARS_MAX {
            let cut = (0..=TOOLTIP_CHARS_MAX)
                .rev()
                .find(|i| tooltip.is_char_boundary(*i))
                .unwrap_or(0);
            tooltip.truncate(cut);
            tooltip.push('…');
        }
        let range = chart
            .ranges
            .map_or(String::new(), |view| format!(" ({})", view.op_text(index)));
        let _ = write!(
            svg,
            "<rect x=\"{x0:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"{}\"{outline}>\
             <title>record {}{range}: {}</title></rect>",
            lanes.y(op.client, lane_px) + 1.0,
            x1 - x0,
            lane_px - 2.0,
            status_colour(status),
            index + 1,
            escape(&tooltip)
        );
    }
}

/// Per lane, ops counted into time buckets by call time; runs of buckets with the same worst
/// outcome are drawn as one rectangle.
fn buckets(svg: &mut String, history: &[Op], lanes: &Lanes, frame: &Frame, lane_px: f64) {
    let bucket_count = limits::REPORT_BUCKETS;
    let mut counts = vec![[0u32; 3]; lanes.count * bucket_count];
    for op in history {
        let lane = lanes.of_client[&op.client];
        let bucket = bucket_of(frame, op.call_ns, bucket_count);
        counts[lane * bucket_count + bucket][severity(op.status())] += 1;
    }
    let bucket_px = PLOT_WIDTH_PX / bucket_count as f64;
    for lane in 0..lanes.count {
        let row = &counts[lane * bucket_count..(lane + 1) * bucket_count];
        let mut start = 0;
        while start < bucket_count {
            let level = worst(&row[start]);
            let mut end = start + 1;
            while end < bucket_count && worst(&row[end]) == level {
                end += 1;
            }
            if let Some(level) = level {
                let total = row[start..end].iter().fold([0u32; 3], |mut sum, c| {
                    (0..3).for_each(|i| sum[i] += c[i]);
                    sum
                });
                let _ = write!(
                    svg,
                    "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"{}\">\
                     <title>{} ok, {} fail, {} indeterminate</title></rect>",
                    MARGIN_LEFT_PX + start as f64 * bucket_px,
                    TOP_PX + lane as f64 * lane_px + 1.0,
                    (end - start) as f64 * bucket_px,
                    lane_px - 2.0,
                    status_colour(SEVERITY_ORDER[level]),
                    total[0],
                    total[1],
                    total[2]
                );
            }
            start = end;
        }
    }
}

/// Outcomes from least to most severe; an index into per-bucket counts.
const SEVERITY_ORDER: [Status; 3] = [Status::Ok, Status::Fail, Status::Info];

fn severity(status: Status) -> usize {
    SEVERITY_ORDER
        .iter()
        .position(|s| *s == status)
        .expect("every status has a severity")
}

/// The most severe outcome counted in a bucket, None when it is empty.
fn worst(counts: &[u32; 3]) -> Option<usize> {
    (0..3).rev().find(|i| counts[*i] > 0)
}

pub(super) fn bucket_of(frame: &Frame, time_ns: u64, bucket_count: usize) -> usize {
    let offset = time_ns.clamp(frame.start_ns, frame.end_ns) - frame.start_ns;
    let bucket = (offset as u128 * bucket_count as u128 / (frame.span_ns() as u128 + 1)) as usize;
    bucket.min(bucket_count - 1)
}

fn note(page: &mut String, chart: &Chart, lanes: &Lanes, bucketed: bool) {
    let (ops, frame) = (chart.history.len(), chart.frame);
    let mut colours = "green = ok, red = fail (definitely not applied), amber = indeterminate \
                       (drawn as a short bar: it has no return); shaded bands = faults"
        .to_string();
    if chart
        .availability
        .is_some_and(|measure| !measure.events.is_empty())
    {
        colours.push_str("; black bars along the top = each fault's longest gap without a success");
    }
    if chart.ranges.is_some() {
        colours.push_str(
            "; diamonds in the ranges lane = the range table as first seen (hollow) and each \
             change of it (hover for what changed)",
        );
    }
    let drawing = if bucketed {
        let bucket_ms = frame.span_ns() as f64 / limits::REPORT_BUCKETS as f64 / 1e6;
        format!(
            "{ops} ops are more than {}, so each lane is cut into {} buckets of {bucket_ms:.1} ms \
             by call time and each shows the worst outcome in it (indeterminate &gt; fail &gt; \
             ok); hover for counts",
            limits::REPORT_TIMELINE_OPS_MAX,
            limits::REPORT_BUCKETS
        )
    } else {
        format!(
            "every one of the {ops} ops is drawn; hover for its record{}; ops quoted as \
             evidence are outlined in black",
            if chart.ranges.is_some() {
                " and range"
            } else {
                ""
            }
        )
    };
    let sharing = if lanes.clients > lanes.count {
        format!(
            "; {} clients share {} lanes (a label names the first)",
            lanes.clients, lanes.count
        )
    } else {
        String::new()
    };
    let _ = write!(page, "<p class=\"note\">{colours}. {drawing}{sharing}.</p>");
}
