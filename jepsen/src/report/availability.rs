//! The availability section of report.html: the worst of each fault kind, a row per fault
//! event (first read and write after its start and after its heal, longest gap without a
//! success), and the marks of those gaps on the timeline. Knows nothing about how the measure
//! is taken.

use std::fmt::Write;

use super::{FAULT_BANDS_MAX, Frame, escape, fault_colour};
use crate::checker::availability::{Availability, SETTLE_MS};
use crate::fault::FaultEvent;

/// Height of a gap mark along the top of the timeline, in px.
const GAP_MARK_PX: f64 = 3.0;

/// Appends the section: the worst per kind, then one row per event.
pub(super) fn section(
    page: &mut String,
    measure: &Availability,
    faults: &[FaultEvent],
    frame: &Frame,
) {
    page.push_str("<h2>Availability</h2>");
    if measure.events.is_empty() {
        page.push_str("<p>No fault events.</p>");
        return;
    }
    let _ = write!(
        page,
        "<p class=\"note\">Per fault event: from its start (and from its stop, the heal or \
         the restart of the last node) to the return of the first successful read and write \
         called after it, and the longest gap without a successful op of any kind; the \
         window ends {} s after the stop, at the next fault or at the end of the workload, \
         whichever comes first. Failed and indeterminate ops never count; none = no such \
         success in the window. All in seconds.</p>",
        SETTLE_MS / 1000
    );
    worst_table(page, measure, faults);
    event_table(page, measure, faults, frame);
}

/// One black bar per event along the top of the timeline (at `top`), over its longest gap.
pub(super) fn gap_marks(svg: &mut String, measure: &Availability, frame: &Frame, top: f64) {
    for event in measure.events.iter().take(FAULT_BANDS_MAX) {
        let x0 = frame.x(event.gap_start_ns);
        let x1 = frame.x(event.gap_end_ns).max(x0 + 1.0);
        let _ = write!(
            svg,
            "<rect x=\"{x0:.1}\" y=\"{top:.1}\" width=\"{:.1}\" height=\"{GAP_MARK_PX}\" \
             fill=\"#000\"><title>{} on {}: longest gap without a success {:.3} s, from \
             {:.3} s to {:.3} s</title></rect>",
            x1 - x0,
            escape(&event.fault),
            escape(&event.target),
            event.gap_ms / 1e3,
            frame.seconds(event.gap_start_ns),
            frame.seconds(event.gap_end_ns)
        );
    }
}

fn worst_table(page: &mut String, measure: &Availability, faults: &[FaultEvent]) {
    page.push_str(
        "<table><tr><th>fault</th><th>events</th><th>first read</th><th>first write</th>\
         <th>healed read</th><th>healed write</th><th>longest gap</th>\
         <th>events without a read / write</th></tr>",
    );
    for (kind, worst) in &measure.worst {
        let _ = write!(
            page,
            "<tr><td style=\"color:{}\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>\
             <td>{}</td><td>{:.3}</td><td>{} / {}</td></tr>",
            fault_colour(faults, kind),
            escape(kind),
            worst.events,
            seconds(worst.first_read_ms),
            seconds(worst.first_write_ms),
            seconds(worst.healed_read_ms),
            seconds(worst.healed_write_ms),
            worst.gap_ms / 1e3,
            worst.without_read,
            worst.without_write
        );
    }
    page.push_str("</table><p class=\"note\">The worst (largest) of each kind's events.</p>");
}

fn event_table(page: &mut String, measure: &Availability, faults: &[FaultEvent], frame: &Frame) {
    page.push_str(
        "<table><tr><th>fault</th><th>target</th><th>start</th><th>stop</th>\
         <th>window end</th><th>first read</th><th>first write</th><th>healed read</th>\
         <th>healed write</th><th>longest gap</th></tr>",
    );
    for event in measure.events.iter().take(FAULT_BANDS_MAX) {
        let stop = event.stop_ns.map_or("never healed".to_string(), |stop_ns| {
            format!("{:.3}", frame.seconds(stop_ns))
        });
        let _ = write!(
            page,
            "<tr><td style=\"color:{}\">{}</td><td>{}</td><td>{:.3}</td><td>{stop}</td>\
             <td>{:.3}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>\
             <td>{:.3} ({:.3} to {:.3})</td></tr>",
            fault_colour(faults, &event.fault),
            escape(&event.fault),
            escape(&event.target),
            frame.seconds(event.start_ns),
            frame.seconds(event.end_ns),
            seconds(event.first_read_ms),
            seconds(event.first_write_ms),
            seconds(event.healed_read_ms),
            seconds(event.healed_write_ms),
            event.gap_ms / 1e3,
            frame.seconds(event.gap_start_ns),
            frame.seconds(event.gap_end_ns)
        );
    }
    page.push_str("</table>");
    if measure.events.len() > FAULT_BANDS_MAX {
        let _ = write!(
            page,
            "<p class=\"note\">Only the first {FAULT_BANDS_MAX} of {} events are listed; \
             results.json has all.</p>",
            measure.events.len()
        );
    }
}

/// ms as seconds to the ms, or `none`.
fn seconds(value_ms: Option<f64>) -> String {
    value_ms.map_or("none".to_string(), |ms| format!("{:.3}", ms / 1e3))
}
