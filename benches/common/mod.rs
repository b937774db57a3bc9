//! Workload helpers shared by the benches: a small PRNG, a Zipf sampler, key
//! sequences generated before any timing starts, and RSS readings.
#![allow(dead_code)] // each bench uses a subset

use std::net::{IpAddr, Ipv6Addr};

/// xorshift64*: fast, deterministic, good enough to pick keys.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in `0..n` (multiply-shift; the bias is negligible here).
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }
    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Zipf over ranks `0..n` with exponent `s`: rank `k` has weight `1/(k+1)^s`.
/// Precomputed CDF and a binary search per sample.
#[derive(Debug)]
pub struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    pub fn new(n: usize, s: f64) -> Self {
        let mut cdf = Vec::with_capacity(n);
        let mut acc = 0.0;
        for k in 0..n {
            acc += 1.0 / ((k + 1) as f64).powf(s);
            cdf.push(acc);
        }
        for c in &mut cdf {
            *c /= acc;
        }
        Zipf { cdf }
    }
    pub fn sample(&self, rng: &mut Rng) -> usize {
        let u = rng.unit();
        self.cdf.partition_point(|&c| c < u).min(self.cdf.len() - 1)
    }
}

/// The `i`-th distinct `u64` key (spread over the whole range, so hashes see
/// no sequential pattern).
pub fn u64_key(i: u64) -> u64 {
    i.wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// The `i`-th distinct IPv6 address (the keys an IPv6 flood would use).
pub fn ip_key(i: u64) -> IpAddr {
    IpAddr::V6(Ipv6Addr::from(
        (0x2001_0db8u128 << 96) | u128::from(u64_key(i)),
    ))
}

/// The `i`-th distinct 40-byte `String` key (an API token, say).
pub fn string_key(i: u64) -> String {
    let s = format!("tok_{:036x}", u64_key(i));
    debug_assert_eq!(s.len(), 40);
    s
}

/// How keys are picked from the key space.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dist {
    Uniform,
    /// Zipf with exponent 0.99 (a few hot keys, a long tail).
    Zipf,
}

/// `len` key indices in `0..keys`, generated up front.
pub fn key_sequence(keys: usize, len: usize, dist: Dist, seed: u64) -> Vec<u64> {
    let mut rng = Rng::new(seed);
    match dist {
        Dist::Uniform => (0..len).map(|_| rng.below(keys as u64)).collect(),
        Dist::Zipf => {
            let z = Zipf::new(keys, 0.99);
            // Scatter ranks over indices so the hot keys are not neighbours.
            (0..len)
                .map(|_| (z.sample(&mut rng) as u64).wrapping_mul(2_654_435_761) % keys as u64)
                .collect()
        }
    }
}

/// Resident set size in bytes, from `/proc/self/statm` (0 where unavailable).
pub fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

/// splitmix64: the order keys (or slots) are visited in by `versus` and `floor`.
#[inline(always)]
pub fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Nanoseconds this thread has spent on a CPU (Linux `schedstat`), or
/// `None` where that is not available.
pub fn thread_cpu_ns() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    s.split_whitespace().next()?.parse().ok()
}

/// The median of `v` (the mean of the middle two for an even length).
pub fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

/// The CPU's model name (`/proc/cpuinfo`) and how many CPUs this process
/// may use, for every table a bench prints.
pub fn cpu_name() -> String {
    let model = std::fs::read_to_string("/proc/cpuinfo").ok().and_then(|s| {
        s.lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split(':').nth(1))
            .map(|m| m.trim().to_string())
    });
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!("{}, {cpus} CPUs", model.as_deref().unwrap_or("unknown CPU"))
}

/// A command-line flag's value parsed as a number, or what to change.
pub fn flag_num<T: std::str::FromStr>(
    flag: &str,
    value: Result<String, String>,
) -> Result<T, String>
where
    T::Err: std::fmt::Display,
{
    value?.parse().map_err(|e| format!("{flag}: {e}"))
}
