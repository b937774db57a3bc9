//! Draws all five algorithms admitting the same adversarial traffic, and
//! measures the sliding-window counter against the exact log on replayed
//! traffic.
//!
//! `cargo run --release --example plot` writes `docs/img/algorithms.svg` and
//! prints the figures quoted in `docs/algorithms.md`. No plotting
//! dependency: the SVG is written by hand. Everything is deterministic
//! (`ManualClock`, a fixed-seed generator), so the output repeats exactly.

use ratewall::algorithm::Algorithm;
use ratewall::{
    FixedWindow, LeakyBucket, Limiter, ManualClock, Rate, SlidingWindowCounter, SlidingWindowLog,
    TokenBucket, Window,
};
use std::collections::VecDeque;
use std::fmt::Write as _;
use std::time::Duration;

const MS: u64 = 1_000_000;
const SEC: u64 = 1_000_000_000;
/// Every algorithm: 10 per second (burst 10 for the buckets).
const LIMIT: u64 = 10;
const END: u64 = 6 * SEC;

/// The adversarial traffic: request times in ns, sorted.
fn traffic() -> Vec<u64> {
    let mut t = Vec::new();
    // A burst of 15 at the end of window 0 and another at the start of
    // window 1: 30 requests within 100 ms, straddling the boundary.
    t.extend(std::iter::repeat(950 * MS).take(15));
    t.extend(std::iter::repeat(1050 * MS).take(15));
    // Twice the rate, steadily: one every 50 ms from 2 s to 4 s.
    t.extend((0..40).map(|i| 2 * SEC + i * 50 * MS));
    // Quiet, then the boundary burst again at 5 s.
    t.extend(std::iter::repeat(4950 * MS).take(15));
    t.extend(std::iter::repeat(5050 * MS).take(15));
    t.sort_unstable();
    t
}

/// Which requests each limiter admits.
fn admitted<A: Algorithm>(config: A::Config, times: &[u64]) -> Vec<bool> {
    let clock = ManualClock::new();
    let limiter = Limiter::<A, _>::with_clock(config, clock.clone()).expect("valid quota");
    times
        .iter()
        .map(|&t| {
            clock.set_nanos(t);
            limiter.check().is_allowed()
        })
        .collect()
}

/// The most admissions in any rolling window of length `w`.
fn max_rolling(times: &[u64], allowed: &[bool], w: u64) -> usize {
    let ts: Vec<u64> = times
        .iter()
        .zip(allowed)
        .filter(|(_, &a)| a)
        .map(|(&t, _)| t)
        .collect();
    (0..ts.len())
        .map(|i| i + 1 - ts.partition_point(|&s| s + w <= ts[i]))
        .max()
        .unwrap_or(0)
}

fn svg(times: &[u64], rows: &[(&str, Vec<bool>)]) -> String {
    let (left, width, row_h, top) = (190.0, 760.0, 92.0, 40.0);
    let height = top + row_h * rows.len() as f64 + 40.0;
    let x = |t: u64| left + width * t as f64 / END as f64;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{height}" font-family="sans-serif" font-size="12">"#,
        left + width + 20.0
    );
    let _ = writeln!(
        s,
        r#"<rect width="100%" height="100%" fill="white"/><text x="10" y="20" font-size="14" font-weight="bold">Five algorithms, one quota (10 per second), the same adversarial traffic</text>"#
    );
    let _ = writeln!(
        s,
        r##"<text x="10" y="34" fill="#555">bars: requests per 50 ms (green admitted, red denied); line: admitted in the trailing 1 s; dashed: the limit</text>"##
    );
    let bin = 50 * MS;
    for (r, (name, allowed)) in rows.iter().enumerate() {
        let y0 = top + row_h * r as f64 + 10.0;
        let base = y0 + 70.0;
        let max = max_rolling(times, allowed, SEC);
        let _ = writeln!(
            s,
            r#"<text x="10" y="{}" font-weight="bold">{name}</text><text x="10" y="{}">max in any 1 s: {max}</text>"#,
            y0 + 30.0,
            y0 + 46.0
        );
        // Window boundaries.
        for k in 0..=END / SEC {
            let xx = x(k * SEC);
            let _ = writeln!(
                s,
                r##"<line x1="{xx}" y1="{y0}" x2="{xx}" y2="{base}" stroke="#bbb" stroke-dasharray="3,3"/>"##
            );
        }
        let _ = writeln!(
            s,
            r##"<line x1="{left}" y1="{base}" x2="{}" y2="{base}" stroke="#333"/>"##,
            left + width
        );
        // Bars: 4 px per request.
        let px = 4.0;
        let mut b = 0;
        while b * bin < END {
            let (lo, hi) = (b * bin, (b + 1) * bin);
            let inside = times
                .iter()
                .zip(allowed.iter())
                .filter(|(&t, _)| t >= lo && t < hi);
            let (ok, no) = inside.fold(
                (0, 0),
                |(o, n), (_, &a)| if a { (o + 1, n) } else { (o, n + 1) },
            );
            let (bx, bw) = (x(lo) + 1.0, x(hi) - x(lo) - 2.0);
            let _ = writeln!(
                s,
                r##"<rect x="{bx}" y="{}" width="{bw}" height="{}" fill="#2a9d4b"/><rect x="{bx}" y="{}" width="{bw}" height="{}" fill="#d1495b"/>"##,
                base - px * ok as f64,
                px * ok as f64,
                base - px * (ok + no) as f64,
                px * no as f64
            );
            b += 1;
        }
        // Trailing-1 s admitted count, and the limit.
        let ts: Vec<u64> = times
            .iter()
            .zip(allowed)
            .filter(|(_, &a)| a)
            .map(|(&t, _)| t)
            .collect();
        let mut pts = String::new();
        let mut t = 0;
        while t <= END {
            let n = ts.iter().filter(|&&s| s <= t && s + SEC > t).count();
            let _ = write!(pts, "{:.1},{:.1} ", x(t), base - 3.0 * n as f64);
            t += 10 * MS;
        }
        let _ = writeln!(
            s,
            r##"<polyline points="{pts}" fill="none" stroke="#1d3557" stroke-width="1.5"/><line x1="{left}" y1="{}" x2="{}" y2="{}" stroke="#1d3557" stroke-dasharray="6,3"/>"##,
            base - 3.0 * LIMIT as f64,
            left + width,
            base - 3.0 * LIMIT as f64
        );
    }
    let yl = top + row_h * rows.len() as f64 + 20.0;
    for k in 0..=END / SEC {
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{yl}" text-anchor="middle">{k} s</text>"#,
            x(k * SEC)
        );
    }
    s.push_str("</svg>\n");
    s
}

/// splitmix64: a fixed-seed generator, so the replay repeats exactly.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Exponential with the given mean.
    fn exp(&mut self, mean: f64) -> f64 {
        -mean * (1.0 - self.unit()).ln()
    }
}

/// Replayed traffic for the accuracy figures: `keys` sources over `span`,
/// 60 % steady (Poisson, rate log-uniform from 0.2x to 4x the limit) and
/// 40 % bursty (bursts of 5 to 40 requests within a second, at Poisson
/// times, averaging 0.2x to 4x the limit). Returns (time, key), sorted.
fn replay(keys: usize, span: u64, limit: u64, w: u64, rng: &mut Rng) -> Vec<(u64, u32)> {
    let mut out = Vec::new();
    let per_ns = limit as f64 / w as f64;
    for k in 0..keys {
        let x = (0.2f64.ln() + rng.unit() * (4.0f64.ln() - 0.2f64.ln())).exp();
        let rate = x * per_ns;
        let mut t = rng.exp(1.0 / rate);
        if k % 5 < 3 {
            while (t as u64) < span {
                out.push((t as u64, k as u32));
                t += rng.exp(1.0 / rate);
            }
        } else {
            let size = 5 + rng.next() % 36;
            let burst_rate = rate / size as f64;
            let mut b = rng.exp(1.0 / burst_rate);
            while (b as u64) < span {
                for _ in 0..size {
                    let s = b + rng.unit() * SEC as f64;
                    if (s as u64) < span {
                        out.push((s as u64, k as u32));
                    }
                }
                b += rng.exp(1.0 / burst_rate);
            }
        }
    }
    out.sort_unstable();
    out
}

/// The sliding counter against the exact log on replayed traffic, two ways:
///
/// - as Cloudflare measured it (every request counts, admitted or not): the
///   estimate `prev*(W-e)/W + cur` of the arrivals against the exact count
///   of arrivals in `(t - W, t]`, and the decisions the two give (`<= L`);
/// - as the limiter runs (only admitted requests count): each decision of a
///   real `SlidingWindowCounter` against the exact log's rule applied to the
///   same admitted history, and the most it admitted in a rolling window.
fn accuracy() {
    let (keys, span, limit, w) = (400usize, 3600 * SEC, 100u64, 60 * SEC);
    let mut rng = Rng(0x5EED_2026);
    let events = replay(keys, span, limit, w, &mut rng);
    let clock = ManualClock::new();
    let window = Window::new(limit, Duration::from_nanos(w));
    let counters: Vec<_> = (0..keys)
        .map(|_| SlidingWindowCounter::with_clock(window, clock.clone()).unwrap())
        .collect();
    let logs: Vec<_> = (0..keys)
        .map(|_| SlidingWindowLog::with_clock(window, clock.clone()).unwrap())
        .collect();
    let (mut by_counter, mut by_log) = (0u64, 0u64);
    // Arrivals: per key (window id, prev, cur) and the exact recent arrivals.
    let mut windows: Vec<(u64, u64, u64)> = vec![(0, 0, 0); keys];
    let mut arrivals: Vec<VecDeque<u64>> = vec![VecDeque::new(); keys];
    // Admissions of the real counter, per key.
    let mut admitted: Vec<VecDeque<u64>> = vec![VecDeque::new(); keys];
    let mut n = 0u64;
    let (mut cf_wrong, mut err_sum, mut err_max, mut err_n) = (0u64, 0.0f64, 0.0f64, 0u64);
    let (mut wrong_allow, mut wrong_deny, mut worst_rolling) = (0u64, 0u64, 0usize);
    let (mut over_keys, mut key_over) = (0usize, vec![false; keys]);
    for &(t, k) in &events {
        let k = k as usize;
        n += 1;
        // Cloudflare's view: the estimator over all arrivals.
        let id = t / w;
        let (sid, prev, cur) = windows[k];
        let (prev, cur) = match id - sid.min(id) {
            0 => (prev, cur),
            1 => (cur, 0),
            _ => (0, 0),
        };
        windows[k] = (id, prev, cur + 1);
        let q = &mut arrivals[k];
        q.push_back(t);
        while q.front().is_some_and(|&s| s + w <= t) {
            q.pop_front();
        }
        let e = (t - id * w) as f64;
        let est = prev as f64 * (w as f64 - e) / w as f64 + (cur + 1) as f64;
        let exact = q.len() as f64;
        if (est <= limit as f64) != (exact <= limit as f64) {
            cf_wrong += 1;
        }
        // The rate error where the rate matters: at half the limit or more.
        if exact >= limit as f64 / 2.0 {
            let err = (est - exact).abs() / exact;
            err_sum += err;
            err_max = err_max.max(err);
            err_n += 1;
        }
        // The limiter's view: its decision against the exact rule on the
        // history it admitted.
        clock.set_nanos(t);
        let allowed = counters[k].check().is_allowed();
        by_counter += u64::from(allowed);
        by_log += u64::from(logs[k].check().is_allowed());
        let a = &mut admitted[k];
        while a.front().is_some_and(|&s| s + w <= t) {
            a.pop_front();
        }
        let exact_allows = (a.len() as u64) < limit;
        match (allowed, exact_allows) {
            (true, false) => wrong_allow += 1,
            (false, true) => wrong_deny += 1,
            _ => {}
        }
        if allowed {
            a.push_back(t);
            worst_rolling = worst_rolling.max(a.len());
            if a.len() as u64 > limit && !key_over[k] {
                key_over[k] = true;
                over_keys += 1;
            }
        }
    }
    println!(
        "accuracy: {keys} keys, 1 h of replayed traffic, limit {limit} per 60 s, {n} requests"
    );
    println!(
        "  counting every request (Cloudflare's measure): {:.3} % of decisions differ from the exact count; rate error at >= half the limit ({err_n} requests): mean {:.2} %, worst {:.0} %",
        100.0 * cf_wrong as f64 / n as f64,
        100.0 * err_sum / err_n as f64,
        100.0 * err_max
    );
    println!(
        "  the limiters (admitted requests count): the counter admitted {by_counter}, the exact log {by_log} ({:+.2} %)",
        100.0 * (by_counter as f64 / by_log as f64 - 1.0)
    );
    println!(
        "  {:.2} % of the counter's admissions were over the exact limit at that instant (the exact rule on the same history would deny them); {:.2} % of its denials the exact rule would allow",
        100.0 * wrong_allow as f64 / by_counter as f64,
        100.0 * wrong_deny as f64 / (n - by_counter) as f64
    );
    println!(
        "  most admitted in one rolling 60 s: {worst_rolling} (limit {limit}); keys that ever went over the limit: {over_keys} of {keys}"
    );
}

fn main() {
    let times = traffic();
    let w = Window::per_second(LIMIT);
    let r = Rate::per_second(LIMIT);
    let rows = vec![
        (
            "token bucket",
            admitted::<ratewall::algorithm::Gcra>(r, &times),
        ),
        (
            "leaky bucket (meter)",
            admitted::<ratewall::algorithm::LeakyGcra>(r, &times),
        ),
        (
            "fixed window",
            admitted::<ratewall::algorithm::FixedCounter>(w, &times),
        ),
        (
            "sliding window counter",
            admitted::<ratewall::algorithm::SlidingCounter>(w, &times),
        ),
        (
            "sliding window log",
            admitted::<ratewall::algorithm::SlidingLog>(w, &times),
        ),
    ];
    println!(
        "adversarial traffic: {} requests, limit {LIMIT} per second",
        times.len()
    );
    for (name, allowed) in &rows {
        println!(
            "  {name:<24} admitted {:>3}, most in any rolling 1 s: {}",
            allowed.iter().filter(|&&a| a).count(),
            max_rolling(&times, allowed, SEC)
        );
    }
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/img/algorithms.svg");
    std::fs::write(path, svg(&times, &rows)).expect("write the SVG");
    println!("wrote {path}");
    accuracy();
    // Keep the aliases in view: these are the types users name.
    let _: Option<(
        TokenBucket,
        LeakyBucket,
        FixedWindow,
        SlidingWindowCounter,
        SlidingWindowLog,
    )> = None;
}
