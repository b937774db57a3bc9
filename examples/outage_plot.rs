//! Draws what an operator sees of a Redis outage: decisions over time by
//! where they came from, while a real `redis-server` is killed and
//! restarted, with the two store events marked.
//!
//! `cargo run --release --example outage_plot --features redis` writes
//! `docs/img/outage.svg` (quoted in `docs/operations.md`) and prints the
//! events and totals. Needs `redis-server` on the PATH. A real run on a
//! real clock: the figure changes a little from run to run.
//!
//! The run: one `RedisLimiter`, 100 per second (burst 20) on one key,
//! `FailurePolicy::FallbackShare { instances: 1 }`, checked about 200
//! times a second for 8 s; Redis killed (`kill -9`) at 2.5 s and started
//! again at 5.5 s.

use ratewall::redis::{DecisionSource, FailurePolicy, RedisBackend, RedisLimiter, StoreEvent};
use ratewall::{Policy, Rate};
use std::fmt::Write as _;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const RUN: Duration = Duration::from_secs(8);
const KILL_AT: Duration = Duration::from_millis(2500);
const RESTART_AT: Duration = Duration::from_millis(5500);
/// The width of one bar.
const BUCKET: Duration = Duration::from_millis(250);

/// A `redis-server` on `port`, with no persistence.
fn redis_server(port: u16, dir: &std::path::Path) -> Child {
    let child = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no", "--dir"])
        .arg(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server on the PATH");
    let start = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "redis-server did not start"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    child
}

/// Per bucket: allowed by Redis, allowed by the fallback, denied.
#[derive(Clone, Copy, Default)]
struct Bar {
    redis: u32,
    fallback: u32,
    denied: u32,
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port");
    let dir = std::env::temp_dir().join(format!("ratewall-outage-{port}"));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let mut server = redis_server(port, &dir);
    let backend = RedisBackend::builder(format!("redis://127.0.0.1:{port}"))
        .timeout(Duration::from_millis(50))
        .build()
        .expect("a backend");
    let start = Instant::now();
    let events: Arc<Mutex<Vec<(Duration, StoreEvent)>>> = Arc::default();
    let seen = events.clone();
    let limiter = RedisLimiter::builder(
        Policy::token_bucket(Rate::per_second(100).burst(20)),
        &backend,
    )
    .name("outage-plot")
    .on_failure(FailurePolicy::FallbackShare { instances: 1 })
    .on_store_event(move |e: &StoreEvent| seen.lock().unwrap().push((start.elapsed(), e.clone())))
    .build()
    .expect("a limiter");
    let _ = limiter.reset_key(b"client").await;

    let mut bars = vec![Bar::default(); (RUN.as_millis() / BUCKET.as_millis()) as usize];
    let mut tick = tokio::time::interval(Duration::from_millis(5));
    let (mut killed, mut restarted) = (false, false);
    let (mut errors, mut checks) = (0u32, 0u32);
    loop {
        tick.tick().await;
        let t = start.elapsed();
        if t >= RUN {
            break;
        }
        if !killed && t >= KILL_AT {
            let _ = server.kill();
            let _ = server.wait();
            killed = true;
        }
        if !restarted && t >= RESTART_AT {
            server = redis_server(port, &dir);
            restarted = true;
        }
        let i = ((t.as_millis() / BUCKET.as_millis()) as usize).min(bars.len() - 1);
        checks += 1;
        match limiter.check_key(b"client").await {
            Ok(d) if !d.is_allowed() => bars[i].denied += 1,
            Ok(d) if d.source() == DecisionSource::Redis => bars[i].redis += 1,
            Ok(_) => bars[i].fallback += 1,
            Err(_) => errors += 1,
        }
    }
    let _ = server.kill();
    let _ = server.wait();
    let _ = std::fs::remove_dir_all(&dir);

    let events = events.lock().unwrap().clone();
    println!("{checks} checks in {} s, {errors} errors", RUN.as_secs());
    for (t, e) in &events {
        println!("  at {:.2} s: {e}", t.as_secs_f64());
    }
    let sum = |f: fn(&Bar) -> u32| bars.iter().map(f).sum::<u32>();
    println!(
        "  allowed by Redis {}, by the local fallback {}, denied {}",
        sum(|b| b.redis),
        sum(|b| b.fallback),
        sum(|b| b.denied)
    );
    let svg = draw(&bars, &events);
    std::fs::write("docs/img/outage.svg", svg).expect("write docs/img/outage.svg");
    println!("wrote docs/img/outage.svg");
}

/// Stacked bars per bucket (Redis, fallback, denied), the outage shaded,
/// the events marked. Written by hand, as `examples/plot.rs` does.
fn draw(bars: &[Bar], events: &[(Duration, StoreEvent)]) -> String {
    let (w, h, left, top, bottom) = (760.0, 340.0, 50.0, 40.0, 50.0);
    let plot_h = h - top - bottom;
    let plot_w = w - left - 20.0;
    let max = bars
        .iter()
        .map(|b| b.redis + b.fallback + b.denied)
        .max()
        .unwrap_or(1)
        .max(1) as f64;
    let bw = plot_w / bars.len() as f64;
    let x_of = |t: Duration| left + plot_w * t.as_secs_f64() / RUN.as_secs_f64();
    let y_of = |n: f64| top + plot_h * (1.0 - n / max);
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = write!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = write!(
        s,
        r#"<text x="{left}" y="20" font-size="14">Decisions per {} ms while Redis is killed at {} s and restarted at {} s</text>"#,
        BUCKET.as_millis(),
        KILL_AT.as_secs_f64(),
        RESTART_AT.as_secs_f64()
    );
    // The outage, shaded.
    let _ = write!(
        s,
        "<rect x=\"{:.1}\" y=\"{top}\" width=\"{:.1}\" height=\"{plot_h}\" fill=\"#eeeeee\"/>",
        x_of(KILL_AT),
        x_of(RESTART_AT) - x_of(KILL_AT)
    );
    for (i, b) in bars.iter().enumerate() {
        let x = left + i as f64 * bw + 1.0;
        let mut base = 0.0;
        for (n, color) in [
            (b.redis, "#4878a8"),
            (b.fallback, "#e0a030"),
            (b.denied, "#c04040"),
        ] {
            let n = f64::from(n);
            if n > 0.0 {
                let _ = write!(
                    s,
                    r#"<rect x="{x:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{color}"/>"#,
                    y_of(base + n),
                    bw - 2.0,
                    y_of(base) - y_of(base + n)
                );
            }
            base += n;
        }
    }
    for (t, e) in events {
        let (label, color) = match e {
            StoreEvent::Failing { .. } => ("Failing", "#c04040"),
            _ => ("Recovered", "#308030"),
        };
        let x = x_of(*t);
        let _ = write!(
            s,
            r#"<line x1="{x:.1}" y1="{top}" x2="{x:.1}" y2="{:.1}" stroke="{color}" stroke-dasharray="4,3"/><text x="{:.1}" y="{:.1}" fill="{color}">{label} event ({:.2} s)</text>"#,
            top + plot_h,
            x + 4.0,
            top + 14.0,
            t.as_secs_f64()
        );
    }
    // Axes and labels.
    let _ = write!(
        s,
        r#"<line x1="{left}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="black"/><line x1="{left}" y1="{top}" x2="{left}" y2="{:.1}" stroke="black"/>"#,
        top + plot_h,
        left + plot_w,
        top + plot_h,
        top + plot_h
    );
    for sec in 0..=RUN.as_secs() {
        let x = x_of(Duration::from_secs(sec));
        let _ = write!(
            s,
            r#"<text x="{x:.1}" y="{:.1}" text-anchor="middle">{sec} s</text>"#,
            top + plot_h + 16.0
        );
    }
    let _ = write!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{max}</text><text x="{:.1}" y="{:.1}" text-anchor="end">0</text>"#,
        left - 4.0,
        top + 4.0,
        left - 4.0,
        top + plot_h
    );
    let legend_y = h - 12.0;
    for (i, (label, color)) in [
        ("allowed by Redis", "#4878a8"),
        ("allowed by the local fallback (FallbackShare)", "#e0a030"),
        ("denied", "#c04040"),
    ]
    .iter()
    .enumerate()
    {
        let x = left + [0.0, 150.0, 470.0][i];
        let _ = write!(
            s,
            r#"<rect x="{x}" y="{:.1}" width="12" height="12" fill="{color}"/><text x="{:.1}" y="{legend_y}">{label}</text>"#,
            legend_y - 10.0,
            x + 16.0
        );
    }
    s.push_str("</svg>\n");
    s
}
