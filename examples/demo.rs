//! ratewall's main job, in process and with no set-up:
//! `cargo run --release --example demo`.
//!
//! It plays a scripted burst through each limiter on the real clock, prints
//! what each request got, and ends with checks per second on this machine.

use ratewall::{LeakyBucket, Rate, TokenBucket};
use std::hint::black_box;
use std::thread::sleep;
use std::time::{Duration, Instant};

/// The script: (pause before the group, requests in the group).
const SCRIPT: &[(u64, usize)] = &[(0, 8), (250, 3), (500, 4)];

fn main() {
    println!("ratewall demo: a scripted burst on the real clock\n");
    token_bucket();
    leaky_bucket();
    throughput();
}

fn header(title: &str) {
    println!("{title}");
    println!(
        "  {:>7}  {:>3}  {:>7}  {:>9}  {:>11}  {:>11}",
        "t (ms)", "#", "allowed", "remaining", "retry_after", "reset_after"
    );
}

fn row(start: Instant, i: usize, d: &ratewall::Decision) {
    println!(
        "  {:>7.1}  {:>3}  {:>7}  {:>9}  {:>11}  {:>11}",
        start.elapsed().as_secs_f64() * 1e3,
        i,
        if d.is_allowed() { "yes" } else { "NO" },
        d.remaining(),
        fmt_ms(d.retry_after()),
        fmt_ms(d.reset_after()),
    );
}

fn fmt_ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

fn token_bucket() {
    let bucket = TokenBucket::new(Rate::per_second(10).burst(5)).expect("valid rate");
    header("Token bucket: 10/s, burst 5 (8 at once, 3 after 250 ms, 4 after 500 ms more)");
    let start = Instant::now();
    let mut n = 0;
    for &(pause, count) in SCRIPT {
        sleep(Duration::from_millis(pause));
        for _ in 0..count {
            n += 1;
            row(start, n, &bucket.check());
        }
    }
    let d = loop {
        let d = bucket.check();
        if !d.is_allowed() {
            break d;
        }
    };
    println!(
        "  a denied client is told: Retry-After: {}   RateLimit: {}\n",
        d.retry_after_secs(),
        d.ratelimit_header("default")
    );
}

fn leaky_bucket() {
    let leaky = LeakyBucket::new(Rate::per_second(10).burst(5)).expect("valid rate");
    println!("Leaky bucket as a meter: 10/s, capacity 5 (same script)");
    header("");
    let start = Instant::now();
    let mut n = 0;
    for &(pause, count) in SCRIPT {
        sleep(Duration::from_millis(pause));
        for _ in 0..count {
            n += 1;
            row(start, n, &leaky.check());
        }
    }
    let shaper = LeakyBucket::new(Rate::per_second(20).burst(4)).expect("valid rate");
    println!("\nLeaky bucket as a shaper: 20/s, queue of 4; 6 requests arrive at once");
    let start = Instant::now();
    for i in 1..=6 {
        match shaper.reserve() {
            Ok(slot) => println!("  #{i}: queued, departs after {:>6}", fmt_ms(slot.delay())),
            Err(full) => println!(
                "  #{i}: queue full, retry in {}",
                fmt_ms(full.retry_after())
            ),
        }
    }
    let waited = shaper.acquire();
    println!(
        "  acquire() blocked {} for the next place ({:.0} ms since the burst)\n",
        fmt_ms(waited),
        start.elapsed().as_secs_f64() * 1e3
    );
}

/// Checks per second on one thread: the allow path (a rate too high to ever
/// deny) and the deny path (an exhausted bucket).
fn throughput() {
    let run = Duration::from_millis(400);
    let allow = TokenBucket::new(Rate::per_second(1_000_000_000)).expect("valid rate");
    let deny = TokenBucket::new(Rate::per_day(1).burst(1)).expect("valid rate");
    let _ = deny.check();
    println!(
        "Checks per second, one thread ({} clock):",
        clock_name(allow.clock())
    );
    for (name, bucket) in [("allow path", &allow), ("deny path", &deny)] {
        let (ops, elapsed) = measure(run, || bucket.check().is_allowed());
        println!(
            "  {name:<11} {:>6.1} M checks/s  ({:.1} ns/check)",
            ops as f64 / elapsed.as_secs_f64() / 1e6,
            elapsed.as_nanos() as f64 / ops as f64
        );
    }
}

fn measure(run: Duration, mut f: impl FnMut() -> bool) -> (u64, Duration) {
    let start = Instant::now();
    let mut ops = 0u64;
    while start.elapsed() < run {
        for _ in 0..1024 {
            black_box(f());
        }
        ops += 1024;
    }
    (ops, start.elapsed())
}

#[cfg(feature = "quanta")]
fn clock_name(c: &ratewall::QuantaClock) -> String {
    format!("QuantaClock, source {}", c.source())
}

#[cfg(not(feature = "quanta"))]
fn clock_name<C: ratewall::Clock>(c: &C) -> String {
    format!("{c:?}")
}
