//! The floor of a keyed check, measured on the machine it runs on (issue 24,
//! item 1): an 8-byte `lock cmpxchg` (`AtomicU64::compare_exchange`) against
//! a 16-byte `cmpxchg16b` (`portable_atomic::AtomicU128::compare_exchange`,
//! what `src/keyed/table.rs` uses through `src/sync.rs`), and an 8-byte load
//! against a 16-byte one, on one line (L1) and over working sets sized for
//! L2, L3 and DRAM.
//!
//! ```text
//! cargo bench --bench floor -- [--rounds 7] [--ops 4000000] [--sizes line,l1,l2,l3,dram]
//!                              [--dram-mib 1024] [--only load,cas,check] [--md out.md]
//!                              [--on-cpu] [--width 8|16]
//! ```
//!
//! Each access goes to a slot picked by splitmix64 of a counter (the next
//! address never depends on the last access's result, so loads may overlap;
//! a locked exchange is a full barrier, so exchanges cannot). Both widths
//! use arrays of the same size in bytes. Operations:
//! - `load`: one `Acquire` load of the slot;
//! - `cas`: one `compare_exchange(0, 0)` of the slot (always succeeds; the
//!   locked read-modify-write runs either way);
//! - `check`: what the keyed check does to its slot: an `Acquire` load, then
//!   `compare_exchange(v, v + 1)` on the value read;
//! - `index`: only the slot's index (the loop's own cost, subtracted by the
//!   reader if wanted).
//!
//! Every (operation, size) point runs `--rounds` rounds, the 8-byte and the
//! 16-byte side alternating which goes first; each side's time is wall time
//! (`--on-cpu`: this thread's time on a CPU from
//! `/proc/thread-self/schedstat`, which on a KVM guest may advance in 4 ms
//! ticks: use it only with runs of a second or more). Reported: ns per operation, the median of the rounds
//! and their min-max, and the median of the per-round ratios 16 B / 8 B.
//!
//! `--width 8|16` runs one side only (the other reads NaN), for exact
//! instruction counts: under callgrind, (Ir at `--ops 2N` - Ir at `--ops N`)
//! / N with `--rounds 1` is one operation plus the loop (`index`), the
//! unmeasured pass being the same `min(ops, 2^20)` both times when
//! `N >= 2^20`; `sh benches/floor-ir.sh` prints them.

mod common;

use common::{cpu_name, flag_num, median, splitmix64, thread_cpu_ns};
use portable_atomic::AtomicU128;
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The `c`-th slot of a stream over `0..n` (multiply-high, no division).
#[inline(always)]
fn index(c: u64, n: usize) -> usize {
    ((u128::from(splitmix64(c)) * n as u128) >> 64) as usize
}

/// Whether times are on-CPU (`--on-cpu`) rather than wall.
static ON_CPU: AtomicBool = AtomicBool::new(false);

/// ns per operation of `ops` calls of `f(slot index)` over `n` slots.
fn time_ns<F: FnMut(usize) -> u64>(n: usize, ops: u64, mut f: F) -> f64 {
    // Relaxed: a setting written before any measurement.
    let cpu = ON_CPU.load(Ordering::Relaxed).then(thread_cpu_ns).flatten();
    let start = Instant::now();
    let mut acc = 0u64;
    for c in 0..ops {
        acc = acc.wrapping_add(f(index(c, n)));
    }
    black_box(acc);
    let wall = start.elapsed().as_nanos() as f64;
    let ns = match (cpu, cpu.and_then(|_| thread_cpu_ns())) {
        (Some(a), Some(b)) if b > a => (b - a) as f64,
        _ => wall,
    };
    ns / ops as f64
}

#[derive(Clone, Copy, PartialEq)]
enum Op {
    Index,
    Load,
    Cas,
    Check,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Index => "index",
            Op::Load => "load",
            Op::Cas => "cas",
            Op::Check => "check",
        }
    }
}

/// One slot width: the 8-byte `AtomicU64` or the 16-byte `AtomicU128`.
trait Slot: Sync {
    fn new() -> Self;
    /// Acquire: as the table's slot load (a slot's state is read with it).
    fn load(&self) -> u64;
    /// `compare_exchange(cur, new)` with the table's AcqRel/Acquire (the
    /// ordering does not change the instruction on x86: every locked
    /// read-modify-write is a full barrier); true if it won.
    fn cas(&self, cur: u64, new: u64) -> bool;
}

impl Slot for AtomicU64 {
    fn new() -> Self {
        AtomicU64::new(0)
    }
    #[inline(always)]
    fn load(&self) -> u64 {
        // Acquire: see the trait.
        AtomicU64::load(self, Ordering::Acquire)
    }
    #[inline(always)]
    fn cas(&self, cur: u64, new: u64) -> bool {
        // AcqRel/Acquire: see the trait.
        self.compare_exchange(cur, new, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }
}

impl Slot for AtomicU128 {
    fn new() -> Self {
        AtomicU128::new(0)
    }
    #[inline(always)]
    fn load(&self) -> u64 {
        // Acquire: see the trait. The low half is the table's state word.
        AtomicU128::load(self, Ordering::Acquire) as u64
    }
    #[inline(always)]
    fn cas(&self, cur: u64, new: u64) -> bool {
        // AcqRel/Acquire: see the trait. The high half (the table's
        // fingerprint) stays 0, so the exchange compares all 16 bytes.
        self.compare_exchange(
            u128::from(cur),
            u128::from(new),
            Ordering::AcqRel,
            Ordering::Acquire,
        )
        .is_ok()
    }
}

/// ns per operation; NaN for a side left out (`--width`: an empty slice).
fn run<S: Slot>(op: Op, a: &[S], ops: u64) -> f64 {
    let n = a.len();
    if n == 0 {
        return f64::NAN;
    }
    match op {
        Op::Index => time_ns(n, ops, |i| i as u64),
        Op::Load => time_ns(n, ops, |i| a[i].load()),
        Op::Cas => time_ns(n, ops, |i| u64::from(a[i].cas(0, 0))),
        Op::Check => time_ns(n, ops, |i| {
            // The keyed check's load, then its exchange from the value read.
            let v = a[i].load();
            u64::from(a[i].cas(v, v.wrapping_add(1)))
        }),
    }
}

struct Opts {
    rounds: usize,
    ops: u64,
    sizes: Vec<String>,
    dram_mib: usize,
    only: Vec<String>,
    md: Option<String>,
    /// Only one side (8 or 16 bytes), for callgrind; 0 = both.
    width: u32,
}

fn parse() -> Result<Opts, String> {
    let mut o = Opts {
        rounds: 7,
        ops: 4_000_000,
        sizes: ["line", "l1", "l2", "l3", "dram"]
            .map(String::from)
            .to_vec(),
        dram_mib: 1024,
        only: Vec::new(),
        md: None,
        width: 0,
    };
    let list = |s: String| s.split(',').map(str::to_string).collect::<Vec<_>>();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--rounds" => o.rounds = flag_num("--rounds", val())?,
            "--ops" => o.ops = flag_num("--ops", val())?,
            "--sizes" => o.sizes = list(val()?),
            "--dram-mib" => o.dram_mib = flag_num("--dram-mib", val())?,
            "--only" => o.only = list(val()?),
            "--md" => o.md = Some(val()?),
            "--width" => o.width = flag_num("--width", val())?,
            // Relaxed: a setting written before any measurement.
            "--on-cpu" => ON_CPU.store(true, Ordering::Relaxed),
            "--bench" => {} // passed by `cargo bench`
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if ![0, 8, 16].contains(&o.width) {
        return Err(format!("--width {}: use 8 or 16", o.width));
    }
    if o.rounds == 0 || o.ops == 0 {
        return Err("--rounds and --ops must be at least 1".into());
    }
    for s in &o.sizes {
        if bytes_of(s, o.dram_mib).is_none() {
            return Err(format!(
                "unknown size {s}: use line, l1, l2, l3, dram or a size in KiB such as 256k"
            ));
        }
    }
    Ok(o)
}

/// Working-set bytes of a named size: one line; 16 KiB (half the 32 KiB
/// L1d); 512 KiB (half the 1 MiB L2); 16 MiB (half the 32 MiB L3);
/// `--dram-mib` (default 1 GiB, 32x the L3); or `NNNk` KiB.
fn bytes_of(name: &str, dram_mib: usize) -> Option<usize> {
    Some(match name {
        "line" => 64,
        "l1" => 16 << 10,
        "l2" => 512 << 10,
        "l3" => 16 << 20,
        "dram" => dram_mib << 20,
        k => k.strip_suffix('k')?.parse::<usize>().ok()? << 10,
    })
}

fn range(v: &[f64]) -> (f64, f64) {
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (lo, hi)
}

fn main() {
    let o = match parse() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("floor: {e}");
            std::process::exit(2);
        }
    };
    let cpu = cpu_name();
    let ops_list = [Op::Index, Op::Load, Op::Cas, Op::Check];
    let want = |op: Op| o.only.is_empty() || o.only.iter().any(|w| w == op.name());
    let mut md = format!(
        "{cpu}, {} rounds of {} operations per side, 8 B and 16 B alternating; \
         ns per operation ({}): median (min-max); ratio = median of the rounds' 16 B / 8 B.\n\n\
         | size | op | 8 B ns | 16 B ns | ratio 16/8 (min-max) |\n|---|---|---:|---:|---:|\n",
        o.rounds,
        o.ops,
        // Relaxed: a setting.
        if ON_CPU.load(Ordering::Relaxed) {
            "on a CPU"
        } else {
            "wall time"
        }
    );
    let started = Instant::now();
    for size in &o.sizes {
        let bytes = bytes_of(size, o.dram_mib).expect("checked in parse");
        let a8: Vec<AtomicU64> = (0..(bytes / 8).max(1)).map(|_| Slot::new()).collect();
        let a16: Vec<AtomicU128> = (0..(bytes / 16).max(1)).map(|_| Slot::new()).collect();
        // The line case visits one slot only; `--width` leaves a side empty.
        let (mut s8, mut s16) = if size == "line" {
            (&a8[..1], &a16[..1])
        } else {
            (&a8[..], &a16[..])
        };
        match o.width {
            8 => s16 = &[],
            16 => s8 = &[],
            _ => {}
        }
        for op in ops_list.into_iter().filter(|&op| want(op)) {
            // One unmeasured pass each: page faults, caches warmed to the set.
            let warm = o.ops.min(1 << 20).max((bytes / 64) as u64);
            let _ = (run(op, s8, warm), run(op, s16, warm));
            let mut r8 = Vec::new();
            let mut r16 = Vec::new();
            for r in 0..o.rounds {
                let (a, b) = if r % 2 == 0 {
                    let a = run(op, s8, o.ops);
                    (a, run(op, s16, o.ops))
                } else {
                    let b = run(op, s16, o.ops);
                    (run(op, s8, o.ops), b)
                };
                eprintln!(
                    "  {size:>5} {:<6} round {r}: 8 B {a:>7.2} ns, 16 B {b:>7.2} ns",
                    op.name()
                );
                r8.push(a);
                r16.push(b);
            }
            let ratios: Vec<f64> = r8.iter().zip(&r16).map(|(a, b)| b / a).collect();
            let ((l8, h8), (l16, h16), (lr, hr)) = (range(&r8), range(&r16), range(&ratios));
            md.push_str(&format!(
                "| {size} ({}) | {} | {:.2} ({l8:.2}-{h8:.2}) | {:.2} ({l16:.2}-{h16:.2}) | {:.2} ({lr:.2}-{hr:.2}) |\n",
                human(if size == "line" { 64 } else { bytes }),
                op.name(),
                median(&r8),
                median(&r16),
                median(&ratios),
            ));
        }
    }
    md.push_str(&format!(
        "\n({:.0} s in all)\n",
        started.elapsed().as_secs_f64()
    ));
    println!("{md}");
    if let Some(path) = &o.md {
        std::fs::write(path, &md).expect("write --md");
    }
}

fn human(bytes: usize) -> String {
    match bytes {
        b if b >= 1 << 30 => format!("{} GiB", b >> 30),
        b if b >= 1 << 20 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}
