//! A load generator for `ratewall-server`, and its comparison with the
//! transport's floor.
//!
//! ```text
//! cargo build --release -p ratewall-server --example loadgen
//! target/release/examples/loadgen --rounds 5 --seconds 5
//! ```
//!
//! Each round starts the release binary twice on loopback, alternately
//! first: once limiting (`--descriptors` limits per call, each keyed by a
//! value drawn from `--keys` values, all within their limits so every call
//! does the full admission work) and once answering OK without limiting
//! (the floor: the same server, the same gRPC transport, no limiter). For
//! each it measures the most calls per second `--concurrency` callers on
//! `--connections` connections get (closed loop), then the latency at a
//! fixed offered load (`--offered`, calls per second, open loop: a late
//! call's latency counts from when it was due). It prints every round and
//! the median ratio limiting/floor with its spread, and where the CPU went
//! in the closed loop: microseconds of CPU per call of the generator, the
//! server and each `--watch-pid` process (a `redis-server`, say), from
//! `/proc/<pid>/stat` (Linux).
//!
//! Loopback only; each server is stopped by PID when its run ends.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use tonic::transport::Channel;

#[derive(Debug, Clone)]
struct Args {
    rounds: usize,
    seconds: f64,
    concurrency: usize,
    connections: usize,
    descriptors: usize,
    keys: usize,
    offered: u64,
    server: PathBuf,
    store: Vec<String>,
    /// Other processes whose CPU per call is reported (a Redis server).
    watch: Vec<u32>,
}

fn parse_args() -> Args {
    let exe = std::env::current_exe().expect("the example's path");
    // target/release/examples/loadgen -> target/release/ratewall-server
    let server = exe
        .parent()
        .and_then(|p| p.parent())
        .map(|p| p.join("ratewall-server"))
        .unwrap_or_default();
    let mut a = Args {
        rounds: 5,
        seconds: 5.0,
        concurrency: 64,
        connections: 4,
        descriptors: 3,
        keys: 10_000,
        offered: 5_000,
        server,
        store: Vec::new(),
        watch: Vec::new(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--rounds" => a.rounds = value().parse().expect("--rounds N"),
            "--seconds" => a.seconds = value().parse().expect("--seconds S"),
            "--concurrency" => a.concurrency = value().parse().expect("--concurrency N"),
            "--connections" => a.connections = value().parse().expect("--connections N"),
            "--descriptors" => a.descriptors = value().parse().expect("--descriptors N"),
            "--keys" => a.keys = value().parse().expect("--keys N"),
            "--offered" => a.offered = value().parse().expect("--offered CALLS_PER_SECOND"),
            "--server" => a.server = PathBuf::from(value()),
            // Extra flags for the limiting server (a store, say).
            "--server-flag" => a.store.push(value()),
            "--watch-pid" => a.watch.push(value().parse().expect("--watch-pid PID")),
            other => panic!("unknown flag {other}; see the file's documentation"),
        }
    }
    assert!(a.concurrency > 0 && a.connections > 0 && a.descriptors > 0 && a.keys > 0);
    a
}

/// A server process, killed by PID when dropped.
struct Spawned {
    child: Child,
    grpc: SocketAddr,
}

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn(args: &Args, dir: &std::path::Path, floor: bool) -> Spawned {
    let mut cmd = Command::new(&args.server);
    cmd.arg("--config-dir")
        .arg(dir)
        .args(["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"])
        .env("RATEWALL_LOG", "error")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    if floor {
        cmd.arg("--answer-ok-without-limiting");
    } else {
        cmd.args(&args.store);
    }
    let mut child = cmd.spawn().unwrap_or_else(|e| {
        panic!(
            "cannot start {}: {e} (build it with --release)",
            args.server.display()
        )
    });
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("piped"))
        .read_line(&mut line)
        .expect("the server's first line");
    let grpc = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("grpc="))
        .unwrap_or_else(|| panic!("the server did not start: {line:?}"))
        .parse()
        .expect("an address");
    Spawned { child, grpc }
}

/// Calls per second and latency percentiles of one run.
#[derive(Debug, Clone, Copy)]
struct Run {
    calls_per_sec: f64,
    calls: u64,
    p50_us: f64,
    p99_us: f64,
    over_limit: u64,
}

/// CPU time (user and system, all threads) a process has used, in
/// microseconds: fields 14 and 15 of `/proc/<pid>/stat`, in the kernel's
/// user-visible ticks of 10 ms (USER_HZ is 100 on Linux). None off Linux or
/// for a process gone.
fn cpu_us(pid: &str) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces: count after its ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    let mut f = rest.split_whitespace().skip(11);
    let user: u64 = f.next()?.parse().ok()?;
    let system: u64 = f.next()?.parse().ok()?;
    Some((user + system) * 10_000)
}

/// The CPU time of the generator, the server and the watched processes.
fn cpu_now(server: u32, watch: &[u32]) -> Vec<Option<u64>> {
    let mut out = vec![cpu_us("self"), cpu_us(&server.to_string())];
    out.extend(watch.iter().map(|p| cpu_us(&p.to_string())));
    out
}

fn request(args: &Args, n: u64) -> RateLimitRequest {
    RateLimitRequest {
        domain: "bench".into(),
        descriptors: (0..args.descriptors)
            .map(|d| RateLimitDescriptor {
                entries: vec![Entry {
                    key: format!("k{d}"),
                    // A spread of keys: the keyed tables do real lookups.
                    value: format!(
                        "v{}",
                        (n.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 20) % args.keys as u64
                    ),
                }],
                ..RateLimitDescriptor::default()
            })
            .collect(),
        hits_addend: 1,
    }
}

async fn channels(args: &Args, addr: SocketAddr) -> Vec<RateLimitServiceClient<Channel>> {
    let mut out = Vec::new();
    for _ in 0..args.connections {
        let ch = Channel::from_shared(format!("http://{addr}"))
            .expect("a URI")
            .connect()
            .await
            .expect("a connection");
        out.push(RateLimitServiceClient::new(ch));
    }
    out
}

fn percentile(sorted: &[u32], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    f64::from(sorted[i])
}

/// `offered == 0`: closed loop, as fast as the callers go; otherwise each
/// caller sends at its share of `offered` per second.
async fn run(args: &Args, addr: SocketAddr, offered: u64) -> Run {
    let clients = channels(args, addr).await;
    let deadline = Instant::now() + Duration::from_secs_f64(args.seconds);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..args.concurrency {
        let mut client = clients[i % clients.len()].clone();
        let args = args.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut over = 0u64;
            let mut n = i as u64;
            let mut tick = (offered > 0).then(|| {
                let every = Duration::from_secs_f64(args.concurrency as f64 / offered as f64);
                let mut t = tokio::time::interval(every);
                t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
                t
            });
            while Instant::now() < deadline {
                let due = match &mut tick {
                    Some(t) => t.tick().await.into_std(),
                    None => Instant::now(),
                };
                if due >= deadline {
                    break;
                }
                let r = client
                    .should_rate_limit(request(&args, n))
                    .await
                    .expect("a call");
                over += u64::from(r.into_inner().overall_code != 1);
                lat.push(u32::try_from(due.elapsed().as_micros()).unwrap_or(u32::MAX));
                n += args.concurrency as u64;
            }
            (lat, over)
        }));
    }
    let mut all = Vec::new();
    let mut over_limit = 0;
    for t in tasks {
        let (lat, over) = t.await.expect("a caller");
        all.extend(lat);
        over_limit += over;
    }
    let took = start.elapsed().as_secs_f64();
    all.sort_unstable();
    Run {
        calls_per_sec: all.len() as f64 / took,
        calls: all.len() as u64,
        p50_us: percentile(&all, 0.5),
        p99_us: percentile(&all, 0.99),
        over_limit,
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[tokio::main]
async fn main() {
    let args = parse_args();
    let dir = std::env::temp_dir().join(format!("ratewall-loadgen-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    // One limit per descriptor key, each far above what a key gets (a few
    // calls a second) and within its algorithm's bounds: every call is
    // admitted after the full check.
    let mut yaml = String::from("domain: bench\ndescriptors:\n");
    let policies = [
        "1000000/s",
        "16000/s sliding-window",
        "1000000/s fixed-window",
    ];
    for d in 0..args.descriptors {
        yaml.push_str(&format!(
            "  - key: k{d}\n    rate_limit:\n      policy: \"{}\"\n",
            policies[d % policies.len()]
        ));
    }
    std::fs::write(dir.join("bench.yaml"), yaml).expect("the configuration");
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.to_owned())
        })
        .unwrap_or_default();
    println!(
        "{cpu}; {} rounds of {} s; {} callers on {} connections; {} descriptors per call over {} keys; latency at {} calls/s offered",
        args.rounds, args.seconds, args.concurrency, args.connections, args.descriptors, args.keys, args.offered
    );
    println!(
        "round  server    calls/s   p50 µs   p99 µs (at offered load)   CPU µs per call: generator, server{}",
        ", watched".repeat(args.watch.len())
    );
    let mut ratios = Vec::new();
    let (mut floor_p99, mut limit_p99) = (Vec::new(), Vec::new());
    for round in 0..args.rounds {
        let mut got = [None, None];
        // Alternate which goes first.
        let order = if round % 2 == 0 {
            [true, false]
        } else {
            [false, true]
        };
        for floor in order {
            let server = spawn(&args, &dir, floor);
            let before = cpu_now(server.child.id(), &args.watch);
            let max = run(&args, server.grpc, 0).await;
            let after = cpu_now(server.child.id(), &args.watch);
            let per_call: Vec<String> = before
                .iter()
                .zip(&after)
                .map(|(b, a)| match (b, a) {
                    (Some(b), Some(a)) => format!("{:.1}", (a - b) as f64 / max.calls as f64),
                    _ => "?".into(),
                })
                .collect();
            let at = run(&args, server.grpc, args.offered).await;
            assert_eq!(
                max.over_limit + at.over_limit,
                0,
                "calls over the limit: the benchmark's limits are too low"
            );
            println!(
                "{round:>5}  {:<8} {:>9.0} {:>8.0} {:>8.0}   {}",
                if floor { "floor" } else { "limiting" },
                max.calls_per_sec,
                at.p50_us,
                at.p99_us,
                per_call.join(", ")
            );
            got[usize::from(!floor)] = Some((max, at));
        }
        let (f, l) = (got[0].unwrap(), got[1].unwrap());
        ratios.push(l.0.calls_per_sec / f.0.calls_per_sec);
        floor_p99.push(f.1.p99_us);
        limit_p99.push(l.1.p99_us);
    }
    let (lo, hi) = ratios
        .iter()
        .fold((f64::MAX, f64::MIN), |(lo, hi), &r| (lo.min(r), hi.max(r)));
    println!(
        "limiting / floor calls per second: median {:.3} (spread {lo:.3}..{hi:.3}); p99 at offered load: floor {:.0} µs, limiting {:.0} µs (medians)",
        median(&mut ratios),
        median(&mut floor_p99),
        median(&mut limit_p99),
    );
    let _ = std::fs::remove_dir_all(&dir);
}
