//! Draws an adaptive concurrency limit following a simulated backend whose
//! knee drops and recovers, for AIMD and Vegas.
//!
//! `cargo run --release --example plot_adaptive` writes
//! `docs/img/adaptive.svg` and prints the figures quoted in
//! `docs/concurrency.md`. Deterministic (`ManualClock`, no threads), so the
//! output repeats exactly; CI regenerates it and fails on a difference.

#[path = "../tests/support/backend_sim.rs"]
#[allow(dead_code)] // the demo reads what this figure does not
mod backend_sim;

use backend_sim::{algorithms, Point, PHASES, SETTLE_MS};
use std::fmt::Write as _;

fn main() {
    let mut runs = Vec::new();
    for (name, adaptive) in algorithms() {
        let (_, points) = backend_sim::scenario(adaptive);
        println!("{name}:");
        let mut from = 0;
        for p in PHASES {
            let (mean, lat) = backend_sim::settled(&points, p.until_ms - SETTLE_MS, p.until_ms);
            let shed: u64 = points
                .iter()
                .filter(|q| q.t_ms > from && q.t_ms <= p.until_ms)
                .map(|q| q.shed)
                .sum();
            println!(
                "  {:>5}-{:>5} ms knee {:>3}: limit settles at {:.1} ({:+.1}% of the knee), latency {:.1} ms, {} attempts shed",
                from,
                p.until_ms,
                p.knee,
                mean,
                (mean / p.knee as f64 - 1.0) * 100.0,
                lat,
                shed
            );
            from = p.until_ms;
        }
        runs.push((name, points));
    }
    std::fs::write("docs/img/adaptive.svg", svg(&runs)).expect("write docs/img/adaptive.svg");
    println!("wrote docs/img/adaptive.svg");
}

fn svg(runs: &[(&str, Vec<Point>)]) -> String {
    let (w, h, left, top, plot_h) = (900.0, 560.0, 60.0, 30.0, 220.0);
    let end = runs[0].1.last().map_or(1, |p| p.t_ms) as f64;
    let x = |t: u64| left + t as f64 / end * (w - left - 20.0);
    let mut s = String::new();
    let _ = write!(
        s,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
"##
    );
    let colors = ["#d62728", "#1f77b4"];
    // Top: the limits and the knee; bottom: the latencies.
    let limit_max = 160.0;
    let ly = |v: f64| top + plot_h - v.min(limit_max) / limit_max * plot_h;
    let lat_top = top + plot_h + 60.0;
    let lat_max = 40.0;
    let ty = |v: f64| lat_top + plot_h - v.min(lat_max) / lat_max * plot_h;
    let _ = writeln!(
        s,
        r##"<text x="{left}" y="20">limit (permits) and the backend's knee (grey)</text>"##
    );
    let _ = writeln!(
        s,
        r##"<text x="{left}" y="{}">mean latency (ms)</text>"##,
        lat_top - 10.0
    );
    for (axis_top, max, step) in [(top, limit_max, 40.0), (lat_top, lat_max, 10.0)] {
        let mut v = 0.0;
        while v <= max {
            let y = axis_top + plot_h - v / max * plot_h;
            let _ = writeln!(
                s,
                r##"<line x1="{left}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#eee"/><text x="{:.1}" y="{:.1}" text-anchor="end">{v}</text>"##,
                w - 20.0,
                left - 5.0,
                y + 4.0
            );
            v += step;
        }
    }
    let mut t = 0;
    while t as f64 <= end {
        let _ = writeln!(
            s,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
            x(t),
            lat_top + plot_h + 15.0,
            t / 1000
        );
        t += 5000;
    }
    let knee: Vec<String> = runs[0]
        .1
        .iter()
        .map(|p| format!("{:.1},{:.1}", x(p.t_ms), ly(p.knee as f64)))
        .collect();
    let _ = writeln!(
        s,
        r##"<polyline fill="none" stroke="#999" stroke-dasharray="4 3" points="{}"/>"##,
        knee.join(" ")
    );
    for (i, (name, points)) in runs.iter().enumerate() {
        let c = colors[i % colors.len()];
        let limit: Vec<String> = points
            .iter()
            .map(|p| format!("{:.1},{:.1}", x(p.t_ms), ly(p.limit as f64)))
            .collect();
        let lat: Vec<String> = points
            .iter()
            .map(|p| format!("{:.1},{:.1}", x(p.t_ms), ty(p.latency_ms)))
            .collect();
        let _ = writeln!(
            s,
            r##"<polyline fill="none" stroke="{c}" points="{}"/>"##,
            limit.join(" ")
        );
        let _ = writeln!(
            s,
            r##"<polyline fill="none" stroke="{c}" points="{}"/>"##,
            lat.join(" ")
        );
        let _ = writeln!(
            s,
            r##"<text x="{:.1}" y="{:.1}" fill="{c}">{name}</text>"##,
            w - 220.0,
            top + 15.0 + 15.0 * i as f64
        );
    }
    let _ = writeln!(
        s,
        r##"<text x="{:.1}" y="{:.1}" text-anchor="middle">time (s): knee 100, degraded to 40 at 15 s, recovered at 30 s</text>"##,
        w / 2.0,
        h - 10.0
    );
    s.push_str("</svg>\n");
    s
}
