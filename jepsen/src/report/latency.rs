//! The latency chart: call time on x, latency on a log scale on y, one dot per op (circles
//! for reads, squares for writes), over shaded fault bands. Indeterminate ops have no latency
//! and are ticked along the top. Above `limits::REPORT_SCATTER_POINTS_MAX` ops the chart
//! samples evenly and always keeps the slowest op of each time bucket. Knows nothing about
//! checkers.

use std::fmt::Write;

use super::timeline::bucket_of;
use super::{Frame, MARGIN_LEFT_PX, PLOT_WIDTH_PX, fault_bands, status_colour, time_axis};
use crate::fault::FaultEvent;
use crate::history::{Op, OpKind, Status};
use crate::limits;

/// Height of the plot area in px, and of the strip for indeterminate ops above it.
const PLOT_HEIGHT_PX: f64 = 300.0;
const INFO_STRIP_PX: f64 = 16.0;
/// Space between the strip and the plot, so their labels do not collide.
const STRIP_GAP_PX: f64 = 10.0;
/// The smallest latency on the axis: 1 µs.
const LATENCY_FLOOR_NS: f64 = 1e3;

/// Appends the chart and its note to the page.
pub(super) fn render(page: &mut String, history: &[Op], faults: &[FaultEvent], frame: &Frame) {
    let chosen = sample(history, frame);
    let scale = Scale::new(history);
    let top = INFO_STRIP_PX + STRIP_GAP_PX;
    let height = top + PLOT_HEIGHT_PX + 30.0;
    let width = MARGIN_LEFT_PX + PLOT_WIDTH_PX + 10.0;
    let _ = write!(
        page,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" \
         role=\"img\" aria-label=\"latency over time\">"
    );
    fault_bands(page, faults, frame, 0.0, top + PLOT_HEIGHT_PX);
    latency_axis(page, &scale, top);
    let _ = write!(
        page,
        "<text x=\"{}\" y=\"11\" text-anchor=\"end\">no return</text>",
        MARGIN_LEFT_PX - 6.0
    );
    for &index in &chosen {
        dot(page, &history[index], frame, &scale, top);
    }
    time_axis(page, frame, top + PLOT_HEIGHT_PX + 4.0);
    page.push_str("</svg>");
    let sampling = if chosen.len() < history.len() {
        format!(
            "{} of {} ops drawn: an even sample plus the slowest op of each of {} time buckets",
            chosen.len(),
            history.len(),
            limits::REPORT_BUCKETS
        )
    } else {
        format!("all {} ops drawn", history.len())
    };
    let _ = write!(
        page,
        "<p class=\"note\">x = call time, y = latency (log scale); circles = reads, squares = \
         writes; green = ok, red = fail; amber ticks along the top = indeterminate. {sampling}.</p>"
    );
}

/// The ops to draw, by index: all of them, or an even sample plus each bucket's slowest op.
fn sample(history: &[Op], frame: &Frame) -> Vec<usize> {
    let max = limits::REPORT_SCATTER_POINTS_MAX;
    if history.len() <= max {
        return (0..history.len()).collect();
    }
    let stride = history.len().div_ceil(max - limits::REPORT_BUCKETS);
    let mut slowest: Vec<Option<(u64, usize)>> = vec![None; limits::REPORT_BUCKETS];
    for (index, op) in history.iter().enumerate() {
        if let Some(latency) = op.latency_ns().filter(|_| op.status() != Status::Info) {
            let bucket = bucket_of(frame, op.call_ns, limits::REPORT_BUCKETS);
            if slowest[bucket].is_none_or(|(l, _)| latency > l) {
                slowest[bucket] = Some((latency, index));
            }
        }
    }
    let mut chosen: Vec<usize> = (0..history.len()).step_by(stride).collect();
    chosen.extend(slowest.into_iter().flatten().map(|(_, index)| index));
    chosen.sort_unstable();
    chosen.dedup();
    chosen
}

/// A log scale from `LATENCY_FLOOR_NS` up to the next power of ten above the slowest op.
struct Scale {
    decades_low: f64,
    decades_high: f64,
}

impl Scale {
    fn new(history: &[Op]) -> Scale {
        let slowest = history.iter().filter_map(Op::latency_ns).max().unwrap_or(0) as f64;
        let decades_low = LATENCY_FLOOR_NS.log10();
        let decades_high = slowest.max(LATENCY_FLOOR_NS * 10.0).log10().ceil();
        Scale {
            decades_low,
            decades_high,
        }
    }

    /// The y of a latency, measured down from the plot's top edge.
    fn y(&self, latency_ns: u64) -> f64 {
        let decades = (latency_ns as f64).max(LATENCY_FLOOR_NS).log10();
        let share = (decades - self.decades_low) / (self.decades_high - self.decades_low);
        PLOT_HEIGHT_PX * (1.0 - share)
    }
}

fn latency_axis(svg: &mut String, scale: &Scale, top: f64) {
    let labels = [
        "1 ns", "10 ns", "100 ns", "1 µs", "10 µs", "100 µs", "1 ms", "10 ms",
    ];
    let more = ["100 ms", "1 s", "10 s", "100 s", "1000 s"];
    let mut decade = scale.decades_low as usize;
    while decade as f64 <= scale.decades_high {
        let y = top + scale.y(10u64.pow(decade as u32));
        let label = labels
            .get(decade)
            .or_else(|| more.get(decade - labels.len()))
            .copied()
            .unwrap_or("");
        let _ = write!(
            svg,
            "<line x1=\"{MARGIN_LEFT_PX}\" y1=\"{y:.1}\" x2=\"{}\" y2=\"{y:.1}\" stroke=\"#ddd\"/>\
             <text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{label}</text>",
            MARGIN_LEFT_PX + PLOT_WIDTH_PX,
            MARGIN_LEFT_PX - 6.0,
            y + 4.0
        );
        decade += 1;
    }
}

fn dot(svg: &mut String, op: &Op, frame: &Frame, scale: &Scale, top: f64) {
    let x = frame.x(op.call_ns);
    let status = op.status();
    let colour = status_colour(status);
    let latency = op.latency_ns().filter(|_| status != Status::Info);
    let Some(latency) = latency else {
        let _ = write!(
            svg,
            "<line x1=\"{x:.1}\" y1=\"2\" x2=\"{x:.1}\" y2=\"{:.1}\" stroke=\"{colour}\"/>",
            INFO_STRIP_PX - 2.0
        );
        return;
    };
    let y = top + scale.y(latency);
    let read = matches!(op.op, OpKind::Get | OpKind::Read);
    if read {
        let _ = write!(
            svg,
            "<circle cx=\"{x:.1}\" cy=\"{y:.1}\" r=\"2\" fill=\"{colour}\" fill-opacity=\"0.7\"/>"
        );
    } else {
        let _ = write!(
            svg,
            "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"4\" height=\"4\" fill=\"{colour}\" \
             fill-opacity=\"0.7\"/>",
            x - 2.0,
            y - 2.0
        );
    }
}
