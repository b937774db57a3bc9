//! The differential core, shared by the fuzz targets (`fuzz/fuzz_targets/*.rs`)
//! and by the stable corpus replay (`tests/fuzz_corpus.rs`), which both
//! include this file with `#[path]`.
//!
//! Each `run_*` function decodes bytes with `arbitrary` into a quota and a
//! sequence of operations (check with cost n, check at a caller's time, peek,
//! refund, reset, change quota, advance time, step time backwards, jump to any
//! instant up to `u64::MAX`), runs them on ratewall with a `ManualClock` and on
//! a naive reference model, and asserts after every step that every field of
//! every decision agrees. A disagreement or a panic (including an arithmetic
//! overflow: fuzz builds keep debug assertions) is a crash.
//!
//! The models never call ratewall's internals; they are written from the
//! documented rules in `u128`.
#![allow(dead_code)]

pub mod gcra;

use arbitrary::{Arbitrary, Unstructured};
use ratewall::{
    ConfigError, Decision, InsufficientCapacity, LeakyBucket, ManualClock, Rate, TokenBucket,
    Tracking,
};
use std::fmt::Debug;
use std::time::Duration;

/// Operations per input, so one input stays fast.
pub const MAX_STEPS: usize = 400;

/// Time stands still after 2^63 ns (clock.rs: `HORIZON`).
pub const HORIZON: u128 = 1 << 63;

/// The fields every decision exposes, as the model computes them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dec {
    pub allowed: bool,
    pub limit: u64,
    pub remaining: u64,
    pub retry_ns: u128,
    pub reset_ns: u128,
}

/// Asserts that ratewall's decision has every field the model expects.
#[track_caller]
pub fn assert_decision(real: &Decision, model: &Dec, ctx: &dyn Debug) {
    let seen = Dec {
        allowed: real.is_allowed(),
        limit: real.limit(),
        remaining: real.remaining(),
        retry_ns: real.retry_after().as_nanos(),
        reset_ns: real.reset_after().as_nanos(),
    };
    assert_eq!(seen, *model, "decision differs from the model at {ctx:?}");
    assert_eq!(real.tracking(), Tracking::Tracked, "at {ctx:?}");
    if !real.is_allowed() {
        assert!(
            real.retry_after_secs() >= 1,
            "a denial says retry now at {ctx:?}"
        );
    }
}

/// The model of a limiter's view of a `ManualClock`: the clock's value and the
/// high-water mark of the readings the limiter used (a step back reads as
/// time standing still), clamped at the horizon.
#[derive(Clone, Copy, Debug, Default)]
pub struct TimeModel {
    pub clock: u64,
    pub floor: u64,
}

impl TimeModel {
    /// The limiter reads the clock.
    pub fn read(&mut self) -> u128 {
        let c = self.clock;
        self.observe(c)
    }
    /// The caller passes a reading (`check_at`).
    pub fn observe(&mut self, t: u64) -> u128 {
        self.floor = self.floor.max(t);
        u128::from(self.floor).min(HORIZON)
    }
}

/// Time operations, applied to the real clock and the model together.
#[derive(Arbitrary, Clone, Copy, Debug)]
pub enum TimeOp {
    AdvanceNs(u32),
    AdvanceMs(u16),
    AdvanceSecs(u32),
    StepBackNs(u32),
    StepBackMs(u16),
    /// Any instant, up to `u64::MAX` (past the horizon).
    Set(u64),
}

impl TimeOp {
    pub fn apply(self, clock: &ManualClock, model: &mut TimeModel) {
        let before = model.clock;
        let after = match self {
            TimeOp::AdvanceNs(ns) => before.saturating_add(u64::from(ns)),
            TimeOp::AdvanceMs(ms) => before.saturating_add(u64::from(ms) * 1_000_000),
            TimeOp::AdvanceSecs(s) => before.saturating_add(u64::from(s) * 1_000_000_000),
            TimeOp::StepBackNs(ns) => before.saturating_sub(u64::from(ns)),
            TimeOp::StepBackMs(ms) => before.saturating_sub(u64::from(ms) * 1_000_000),
            TimeOp::Set(t) => t,
        };
        match self {
            TimeOp::AdvanceNs(ns) => clock.advance(Duration::from_nanos(ns.into())),
            TimeOp::AdvanceMs(ms) => clock.advance(Duration::from_millis(ms.into())),
            TimeOp::AdvanceSecs(s) => clock.advance(Duration::from_secs(s.into())),
            TimeOp::StepBackNs(ns) => clock.step_back(Duration::from_nanos(ns.into())),
            TimeOp::StepBackMs(ms) => clock.step_back(Duration::from_millis(ms.into())),
            TimeOp::Set(t) => clock.set_nanos(t),
        }
        model.clock = after;
        assert_eq!(
            ratewall::Clock::now(clock),
            after,
            "ManualClock after {self:?}"
        );
    }
}

/// Small, mostly valid rates: the bucket targets explore behaviour.
#[derive(Arbitrary, Clone, Copy, Debug)]
pub struct SmallRate {
    count: u16,
    period: SmallPeriod,
    burst: Option<u8>,
}

#[derive(Arbitrary, Clone, Copy, Debug)]
enum SmallPeriod {
    Ns(u16),
    Us(u16),
    Ms(u16),
    Secs(u16),
    Minute,
    Hour,
}

/// Arbitrary numbers: the configuration target explores validation and the
/// arithmetic at its edges. Besides any value, each field can land next to a
/// validation boundary (computed here from the documented rules), where
/// off-by-one mistakes live and where uniformly random numbers never land.
#[derive(Arbitrary, Clone, Copy, Debug)]
pub struct WildRate {
    count: u64,
    period: WildPeriod,
    burst: WildBurst,
}

#[derive(Arbitrary, Clone, Copy, Debug)]
enum WildPeriod {
    Any {
        secs: u64,
        nanos: u32,
    },
    Ns(u64),
    /// 2^62 ns (the longest period) + delta.
    NearLongest(i16),
    /// `count` ns (one request per ns, the highest rate) + delta.
    NearCount(i16),
    /// Where rounding `period / count` up changes the rate by exactly 0.1%
    /// (the largest error accepted), + delta. Makes `count` a multiple of 1001.
    NearImprecise {
        interval: u16,
        delta: i16,
    },
}

#[derive(Arbitrary, Clone, Copy, Debug)]
enum WildBurst {
    Default,
    Any(u64),
    /// The largest burst (2^62 ns / interval) + delta.
    NearMax(i16),
}

fn offset(base: u128, delta: i16) -> u64 {
    let v = base as i128 + i128::from(delta);
    v.clamp(0, i128::from(u64::MAX)) as u64
}
/// A generator of rates for the bucket runners.
pub trait RateSpec: for<'a> Arbitrary<'a> + Copy + Debug {
    fn parts(&self) -> (u64, Duration, Option<u64>);
    fn rate(&self) -> Rate {
        let (count, period, burst) = self.parts();
        let r = Rate::new(count, period);
        match burst {
            Some(b) => r.burst(b),
            None => r,
        }
    }
    fn model(&self) -> Result<gcra::Quota, Vec<ConfigError>> {
        let (count, period, burst) = self.parts();
        gcra::violations(count, period, burst)
    }
}

impl RateSpec for SmallRate {
    fn parts(&self) -> (u64, Duration, Option<u64>) {
        let period = match self.period {
            SmallPeriod::Ns(n) => Duration::from_nanos(n.into()),
            SmallPeriod::Us(n) => Duration::from_micros(n.into()),
            SmallPeriod::Ms(n) => Duration::from_millis(n.into()),
            SmallPeriod::Secs(n) => Duration::from_secs(n.into()),
            SmallPeriod::Minute => Duration::from_secs(60),
            SmallPeriod::Hour => Duration::from_secs(3600),
        };
        (self.count.into(), period, self.burst.map(u64::from))
    }
}

impl RateSpec for WildRate {
    fn parts(&self) -> (u64, Duration, Option<u64>) {
        let mut count = u128::from(self.count);
        if let WildPeriod::NearImprecise { .. } = self.period {
            count = 1001 * (count % (1 << 30)).max(1);
        }
        let period = match self.period {
            WildPeriod::Any { secs, nanos } => Duration::new(secs, nanos % 1_000_000_000),
            WildPeriod::Ns(ns) => Duration::from_nanos(ns),
            WildPeriod::NearLongest(d) => Duration::from_nanos(offset(gcra::MAX_TOLERANCE, d)),
            WildPeriod::NearCount(d) => Duration::from_nanos(offset(count, d)),
            // With k = interval, c = 1001m and x = k*c/1001 = k*m: the period
            // k*c - x = 1000x has interval k (for k <= 1000) and rounding
            // error x, so error * 1000 == period: the last accepted value.
            WildPeriod::NearImprecise { interval, delta } => {
                let k = u128::from(interval.max(1));
                Duration::from_nanos(offset(k * count - k * count / 1001, delta))
            }
        };
        let burst = match self.burst {
            WildBurst::Default => None,
            WildBurst::Any(b) => Some(b),
            WildBurst::NearMax(d) => {
                let p = period.as_nanos();
                let interval = if count > 0 && p >= count {
                    p.div_ceil(count)
                } else {
                    1
                };
                Some(offset(gcra::MAX_TOLERANCE / interval, d))
            }
        };
        (count as u64, period, burst)
    }
}

/// One step of a bucket run.
#[derive(Arbitrary, Clone, Copy, Debug)]
pub enum BucketOp<R> {
    Check(u8),
    CheckHuge(u64),
    /// `check_n_at` at the clock's reading moved by `ms` (back or ahead).
    CheckAt {
        ms: u16,
        ahead: bool,
        n: u8,
    },
    Peek(u8),
    Refund(u8),
    RefundHuge(u64),
    Reset,
    Time(TimeOp),
    SetQuota(R),
    IsIdle,
    Now,
    /// Leaky shaping (`reserve_n`); a plain check on the token bucket.
    Reserve(u8),
}

/// What the runner needs from a bucket limiter.
pub trait Subject: Sized + Debug {
    fn build(rate: Rate, clock: ManualClock) -> Result<Self, ConfigError>;
    fn check_n(&self, n: u64) -> Result<Decision, InsufficientCapacity>;
    fn check_n_at(&self, t: u64, n: u64) -> Result<Decision, InsufficientCapacity>;
    fn peek_n(&self, n: u64) -> Result<Decision, InsufficientCapacity>;
    fn refund(&self, n: u64);
    fn reset(&self);
    fn set_quota(&self, rate: Rate) -> Result<(), ConfigError>;
    fn quota(&self) -> Rate;
    fn capacity(&self) -> u64;
    fn is_idle(&self) -> bool;
    fn now(&self) -> u64;
    /// `Some((delay, decision))` or `Some(denial)` for the leaky bucket; `None` elsewhere.
    #[allow(clippy::type_complexity)]
    fn reserve_n(
        &self,
        n: u64,
    ) -> Option<Result<Result<(u128, Decision), Decision>, InsufficientCapacity>>;
}

macro_rules! bucket_subject {
    ($ty:ty, $reserve:expr) => {
        impl Subject for $ty {
            fn build(rate: Rate, clock: ManualClock) -> Result<Self, ConfigError> {
                <$ty>::with_clock(rate, clock)
            }
            fn check_n(&self, n: u64) -> Result<Decision, InsufficientCapacity> {
                <$ty>::check_n(self, n)
            }
            fn check_n_at(&self, t: u64, n: u64) -> Result<Decision, InsufficientCapacity> {
                <$ty>::check_n_at(self, t, n)
            }
            fn peek_n(&self, n: u64) -> Result<Decision, InsufficientCapacity> {
                <$ty>::peek_n(self, n)
            }
            fn refund(&self, n: u64) {
                <$ty>::refund(self, n)
            }
            fn reset(&self) {
                <$ty>::reset(self)
            }
            fn set_quota(&self, rate: Rate) -> Result<(), ConfigError> {
                <$ty>::set_quota(self, rate)
            }
            fn quota(&self) -> Rate {
                <$ty>::quota(self)
            }
            fn capacity(&self) -> u64 {
                <$ty>::capacity(self)
            }
            fn is_idle(&self) -> bool {
                <$ty>::is_idle(self)
            }
            fn now(&self) -> u64 {
                <$ty>::now(self)
            }
            fn reserve_n(
                &self,
                n: u64,
            ) -> Option<Result<Result<(u128, Decision), Decision>, InsufficientCapacity>> {
                let f: fn(
                    &$ty,
                    u64,
                ) -> Option<
                    Result<Result<(u128, Decision), Decision>, InsufficientCapacity>,
                > = $reserve;
                f(self, n)
            }
        }
    };
}

bucket_subject!(TokenBucket<ManualClock>, |_, _| None);
bucket_subject!(LeakyBucket<ManualClock>, |l, n| Some(
    l.reserve_n(n)
        .map(|r| r.map(|res| (res.delay().as_nanos(), res.decision())))
));

/// Decodes and runs one bucket scenario; panics on any disagreement.
pub fn run_bucket<S: Subject, R: RateSpec>(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let Ok(spec) = R::arbitrary(&mut u) else {
        return;
    };
    let clock = ManualClock::new();
    let mut time = TimeModel::default();
    let mut model = match (S::build(spec.rate(), clock.clone()), spec.model()) {
        (Ok(real), Ok(q)) => (real, gcra::Bucket::new(q)),
        (Err(e), Err(allowed)) => {
            assert!(
                allowed.contains(&e),
                "{spec:?}: ratewall says {e:?}, the rules broken are {allowed:?}"
            );
            return;
        }
        (Ok(real), Err(v)) => panic!("{spec:?} accepted ({real:?}) but breaks {v:?}"),
        (Err(e), Ok(q)) => panic!("{spec:?} rejected with {e:?} but is valid: {q:?}"),
    };
    let (real, bucket) = (&model.0, &mut model.1);
    let mut quota = spec.rate();
    for step in 0..MAX_STEPS {
        if u.is_empty() {
            break;
        }
        let Ok(op) = BucketOp::<R>::arbitrary(&mut u) else {
            break;
        };
        let ctx = (step, op, time, bucket.tat);
        let check = |got: Result<Decision, InsufficientCapacity>,
                     want: Option<Dec>,
                     n: u64,
                     cap| match (got, want) {
            (Ok(d), Some(m)) => assert_decision(&d, &m, &ctx),
            (Err(e), None) => assert_eq!(
                e,
                InsufficientCapacity {
                    requested: n,
                    capacity: cap
                },
                "at {ctx:?}"
            ),
            (got, want) => panic!("at {ctx:?}: ratewall {got:?}, model {want:?}"),
        };
        let cap = bucket.quota.burst;
        match op {
            BucketOp::Check(n) => {
                let n = u64::from(n);
                let got = real.check_n(n);
                let t = time.read();
                check(got, bucket.check(t, n, true), n, cap);
            }
            BucketOp::CheckHuge(n) => {
                let got = real.check_n(n);
                let t = time.read();
                check(got, bucket.check(t, n, true), n, cap);
            }
            BucketOp::CheckAt { ms, ahead, n } => {
                let delta = u64::from(ms) * 1_000_000;
                let at = if ahead {
                    time.clock.saturating_add(delta)
                } else {
                    time.clock.saturating_sub(delta)
                };
                let n = u64::from(n);
                let got = real.check_n_at(at, n);
                let t = time.observe(at);
                check(got, bucket.check(t, n, true), n, cap);
            }
            BucketOp::Peek(n) => {
                let n = u64::from(n);
                let got = real.peek_n(n);
                let t = time.read();
                check(got, bucket.check(t, n, false), n, cap);
            }
            BucketOp::Refund(n) => {
                real.refund(n.into());
                let t = time.read();
                bucket.refund(t, n.into());
            }
            BucketOp::RefundHuge(n) => {
                real.refund(n);
                let t = time.read();
                bucket.refund(t, n);
            }
            BucketOp::Reset => {
                real.reset();
                bucket.tat = 0;
            }
            BucketOp::Time(op) => op.apply(&clock, &mut time),
            BucketOp::SetQuota(r) => match (real.set_quota(r.rate()), r.model()) {
                (Ok(()), Ok(q)) => {
                    let t = time.read();
                    bucket.set_quota(t, q);
                    quota = r.rate();
                }
                (Err(e), Err(v)) => assert!(v.contains(&e), "at {ctx:?}: {e:?} not in {v:?}"),
                (got, want) => panic!("at {ctx:?}: set_quota {got:?}, model {want:?}"),
            },
            BucketOp::IsIdle => {
                let got = real.is_idle();
                let t = time.read();
                assert_eq!(got, bucket.is_idle(t), "is_idle at {ctx:?}");
            }
            BucketOp::Now => {
                let got = real.now();
                time.read();
                assert_eq!(got, time.floor, "now() at {ctx:?}");
            }
            BucketOp::Reserve(n) => {
                let n = u64::from(n);
                let Some(got) = real.reserve_n(n) else {
                    continue;
                };
                let t = time.read();
                let want = bucket.check(t, n, true);
                match (got, want) {
                    (Ok(Ok((delay, d))), Some(m)) if m.allowed => {
                        assert_decision(&d, &m, &ctx);
                        // The place starts where the queue ended: max(tat, t) - t.
                        let own = u128::from(n.max(1)) * bucket.quota.emission;
                        assert_eq!(delay, m.reset_ns - own, "reserve delay at {ctx:?}");
                    }
                    (Ok(Err(d)), Some(m)) if !m.allowed => assert_decision(&d, &m, &ctx),
                    (Err(e), None) => assert_eq!(e.requested, n, "at {ctx:?}"),
                    (got, want) => panic!("at {ctx:?}: reserve {got:?}, model {want:?}"),
                }
            }
        }
        // Reading the configuration touches no clock: compare after every step.
        assert_eq!(real.capacity(), bucket.quota.burst, "capacity at {ctx:?}");
        assert_eq!(real.quota(), quota, "quota at {ctx:?}");
    }
}

/// The token bucket target.
pub fn run_token_bucket(data: &[u8]) {
    run_bucket::<TokenBucket<ManualClock>, SmallRate>(data);
}

/// The leaky bucket target (meter and shaper).
pub fn run_leaky_bucket(data: &[u8]) {
    run_bucket::<LeakyBucket<ManualClock>, SmallRate>(data);
}

/// The configuration target: arbitrary numbers for every parameter, costs
/// and instants must give a valid limiter or a typed error, never a panic or
/// an overflow, and then behave exactly like the model.
pub fn run_config(data: &[u8]) {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    match which % 5 {
        0 => run_bucket::<TokenBucket<ManualClock>, WildRate>(rest),
        1 => run_bucket::<LeakyBucket<ManualClock>, WildRate>(rest),
        2 => run_window::<FixedWindow<ManualClock>, WildWindow>(rest),
        3 => run_window::<SlidingWindowCounter<ManualClock>, WildWindow>(rest),
        _ => run_window::<SlidingWindowLog<ManualClock>, WildWindow>(rest),
    }
}

// ---------------------------------------------------------------------------
// Windows: fixed window, sliding-window counter, sliding-window log.

pub mod window;

use ratewall::{FixedWindow, SlidingWindowCounter, SlidingWindowLog, Window};

/// A generator of window quotas.
pub trait WindowSpec: for<'a> Arbitrary<'a> + Copy + Debug {
    fn parts(&self, kind: window::Kind) -> (u64, Duration);
    fn window(&self, kind: window::Kind) -> Window {
        let (limit, length) = self.parts(kind);
        Window::new(limit, length)
    }
}

/// Small, mostly valid windows.
#[derive(Arbitrary, Clone, Copy, Debug)]
pub struct SmallWindow {
    limit: u8,
    length: SmallLength,
}

#[derive(Arbitrary, Clone, Copy, Debug)]
enum SmallLength {
    Ms(u16),
    Secs(u8),
    Minute,
    /// The algorithm's shortest window + delta ns.
    NearShortest(i8),
}

impl WindowSpec for SmallWindow {
    fn parts(&self, kind: window::Kind) -> (u64, Duration) {
        let length = match self.length {
            SmallLength::Ms(ms) => Duration::from_millis(ms.into()),
            SmallLength::Secs(s) => Duration::from_secs(s.into()),
            SmallLength::Minute => Duration::from_secs(60),
            SmallLength::NearShortest(d) => {
                Duration::from_nanos(offset(kind.bounds().1.into(), d.into()))
            }
        };
        (self.limit.into(), length)
    }
}

/// Arbitrary numbers, and values next to each documented boundary.
#[derive(Arbitrary, Clone, Copy, Debug)]
pub struct WildWindow {
    limit: WildLimit,
    length: WildLength,
}

#[derive(Arbitrary, Clone, Copy, Debug)]
enum WildLimit {
    Any(u64),
    /// The algorithm's largest limit + delta.
    NearMax(i16),
}

#[derive(Arbitrary, Clone, Copy, Debug)]
enum WildLength {
    Any {
        secs: u64,
        nanos: u32,
    },
    Ns(u64),
    /// 2^62 ns + delta.
    NearLongest(i16),
    /// The algorithm's shortest window + delta.
    NearShortest(i16),
}

impl WindowSpec for WildWindow {
    fn parts(&self, kind: window::Kind) -> (u64, Duration) {
        let (max_limit, min_ns) = kind.bounds();
        let limit = match self.limit {
            WildLimit::Any(l) => l,
            WildLimit::NearMax(d) => offset(max_limit.into(), d),
        };
        let length = match self.length {
            WildLength::Any { secs, nanos } => Duration::new(secs, nanos % 1_000_000_000),
            WildLength::Ns(ns) => Duration::from_nanos(ns),
            WildLength::NearLongest(d) => Duration::from_nanos(offset(gcra::MAX_TOLERANCE, d)),
            WildLength::NearShortest(d) => Duration::from_nanos(offset(min_ns.into(), d)),
        };
        (limit, length)
    }
}

/// One step of a window run.
#[derive(Arbitrary, Clone, Copy, Debug)]
pub enum WindowOp<W> {
    Check(u8),
    CheckHuge(u64),
    CheckAt {
        ms: u16,
        ahead: bool,
        n: u8,
    },
    Peek(u8),
    Refund(u8),
    RefundHuge(u64),
    Reset,
    Time(TimeOp),
    SetQuota(W),
    IsIdle,
    /// Sets the clock to `num/den` of the way into the current window, plus
    /// `delta` ns: window edges and exact fractions of `W` are where the
    /// counters' rounding lives, and random nanoseconds never land there.
    Edge {
        num: u8,
        den: u8,
        delta: i16,
    },
}

/// What the runner needs from a window limiter.
pub trait WindowSubject: Sized + Debug {
    const KIND: window::Kind;
    fn build(w: Window, clock: ManualClock) -> Result<Self, ConfigError>;
    fn check_n(&self, n: u64) -> Result<Decision, InsufficientCapacity>;
    fn check_n_at(&self, t: u64, n: u64) -> Result<Decision, InsufficientCapacity>;
    fn peek_n(&self, n: u64) -> Result<Decision, InsufficientCapacity>;
    fn refund(&self, n: u64);
    fn reset(&self);
    fn set_quota(&self, w: Window) -> Result<(), ConfigError>;
    fn quota(&self) -> Window;
    fn capacity(&self) -> u64;
    fn is_idle(&self) -> bool;
}

macro_rules! window_subject {
    ($ty:ty, $kind:expr) => {
        impl WindowSubject for $ty {
            const KIND: window::Kind = $kind;
            fn build(w: Window, clock: ManualClock) -> Result<Self, ConfigError> {
                <$ty>::with_clock(w, clock)
            }
            fn check_n(&self, n: u64) -> Result<Decision, InsufficientCapacity> {
                <$ty>::check_n(self, n)
            }
            fn check_n_at(&self, t: u64, n: u64) -> Result<Decision, InsufficientCapacity> {
                <$ty>::check_n_at(self, t, n)
            }
            fn peek_n(&self, n: u64) -> Result<Decision, InsufficientCapacity> {
                <$ty>::peek_n(self, n)
            }
            fn refund(&self, n: u64) {
                <$ty>::refund(self, n)
            }
            fn reset(&self) {
                <$ty>::reset(self)
            }
            fn set_quota(&self, w: Window) -> Result<(), ConfigError> {
                <$ty>::set_quota(self, w)
            }
            fn quota(&self) -> Window {
                <$ty>::quota(self)
            }
            fn capacity(&self) -> u64 {
                <$ty>::capacity(self)
            }
            fn is_idle(&self) -> bool {
                <$ty>::is_idle(self)
            }
        }
    };
}

window_subject!(FixedWindow<ManualClock>, window::Kind::Fixed);
window_subject!(SlidingWindowCounter<ManualClock>, window::Kind::Sliding);
window_subject!(SlidingWindowLog<ManualClock>, window::Kind::Log);

/// Decodes and runs one window scenario; panics on any disagreement.
pub fn run_window<S: WindowSubject, W: WindowSpec>(data: &[u8]) {
    let kind = S::KIND;
    let mut u = Unstructured::new(data);
    let Ok(spec) = W::arbitrary(&mut u) else {
        return;
    };
    let model_quota = |spec: &W| {
        let (limit, length) = spec.parts(kind);
        window::violations(kind, limit, length)
    };
    let clock = ManualClock::new();
    let mut time = TimeModel::default();
    let last = kind.last_ns();
    let (real, mut model) = match (
        S::build(spec.window(kind), clock.clone()),
        model_quota(&spec),
    ) {
        (Ok(real), Ok(q)) => (real, window::WindowModel::new(kind, q)),
        (Err(e), Err(allowed)) => {
            assert!(
                allowed.contains(&e),
                "{kind:?} {spec:?}: ratewall says {e:?}, the rules broken are {allowed:?}"
            );
            return;
        }
        (Ok(real), Err(v)) => panic!("{kind:?} {spec:?} accepted ({real:?}) but breaks {v:?}"),
        (Err(e), Ok(q)) => panic!("{kind:?} {spec:?} rejected with {e:?} but is valid: {q:?}"),
    };
    let mut quota = spec.window(kind);
    for step in 0..MAX_STEPS {
        if u.is_empty() {
            break;
        }
        let Ok(op) = WindowOp::<W>::arbitrary(&mut u) else {
            break;
        };
        let ctx = (kind, step, op, time);
        let cap = model.quota.limit;
        let check = |got: Result<Decision, InsufficientCapacity>, want: Option<Dec>, n: u64| match (
            got, want,
        ) {
            (Ok(d), Some(m)) => assert_decision(&d, &m, &ctx),
            (Err(e), None) => assert_eq!(
                e,
                InsufficientCapacity {
                    requested: n,
                    capacity: cap
                },
                "at {ctx:?}"
            ),
            (got, want) => panic!("at {ctx:?}: ratewall {got:?}, model {want:?}"),
        };
        match op {
            WindowOp::Check(n) => {
                let n = u64::from(n);
                let got = real.check_n(n);
                let t = time.read().min(last);
                check(got, model.check(t, n, true), n);
            }
            WindowOp::CheckHuge(n) => {
                let got = real.check_n(n);
                let t = time.read().min(last);
                check(got, model.check(t, n, true), n);
            }
            WindowOp::CheckAt { ms, ahead, n } => {
                let delta = u64::from(ms) * 1_000_000;
                let at = if ahead {
                    time.clock.saturating_add(delta)
                } else {
                    time.clock.saturating_sub(delta)
                };
                let n = u64::from(n);
                let got = real.check_n_at(at, n);
                let t = time.observe(at).min(last);
                check(got, model.check(t, n, true), n);
            }
            WindowOp::Peek(n) => {
                let n = u64::from(n);
                let got = real.peek_n(n);
                let t = time.read().min(last);
                check(got, model.check(t, n, false), n);
            }
            WindowOp::Refund(n) => {
                real.refund(n.into());
                let t = time.read().min(last);
                model.refund(t, n.into());
            }
            WindowOp::RefundHuge(n) => {
                real.refund(n);
                let t = time.read().min(last);
                model.refund(t, n);
            }
            WindowOp::Reset => {
                real.reset();
                model.reset();
            }
            WindowOp::Time(op) => op.apply(&clock, &mut time),
            WindowOp::SetQuota(w) => match (real.set_quota(w.window(kind)), model_quota(&w)) {
                (Ok(()), Ok(q)) => {
                    let t = time.read().min(last);
                    model.set_quota(t, q);
                    quota = w.window(kind);
                }
                (Err(e), Err(v)) => assert!(v.contains(&e), "at {ctx:?}: {e:?} not in {v:?}"),
                (got, want) => panic!("at {ctx:?}: set_quota {got:?}, model {want:?}"),
            },
            WindowOp::IsIdle => {
                let got = real.is_idle();
                let t = time.read().min(last);
                assert_eq!(got, model.is_idle(t), "is_idle at {ctx:?}: {model:?}");
            }
            WindowOp::Edge { num, den, delta } => {
                let w = model.quota.length;
                let start = u128::from(time.clock) / w * w;
                let into = w * u128::from(num) / u128::from(den.max(1));
                let at = offset(start + into, delta);
                TimeOp::Set(at).apply(&clock, &mut time);
            }
        }
        assert_eq!(real.capacity(), model.quota.limit, "capacity at {ctx:?}");
        assert_eq!(real.quota(), quota, "quota at {ctx:?}");
    }
}

/// The window target: the first byte picks the algorithm.
pub fn run_windows(data: &[u8]) {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    match which % 3 {
        0 => run_window::<FixedWindow<ManualClock>, SmallWindow>(rest),
        1 => run_window::<SlidingWindowCounter<ManualClock>, SmallWindow>(rest),
        _ => run_window::<SlidingWindowLog<ManualClock>, SmallWindow>(rest),
    }
}

// ---------------------------------------------------------------------------
// Keyed limiters and multi-limit checks.

pub mod keyed;

#[allow(unused_imports)]
pub use keyed::{run_keyed, run_multi};

// ---------------------------------------------------------------------------
// Header helpers.

pub mod headers;

#[allow(unused_imports)]
pub use headers::run_headers;

// ---------------------------------------------------------------------------
// Leases (a striped token bucket with several holders).

pub mod lease;

#[allow(unused_imports)]
pub use lease::{run_lease, run_lease_keyed};

// ---------------------------------------------------------------------------
// What an upstream announces (the client side).

pub mod announce;

#[allow(unused_imports)]
pub use announce::run_announce;

// ---------------------------------------------------------------------------
// One client, one key: hostile header lines through the HTTP layer.

pub mod client_keys;

#[allow(unused_imports)]
pub use client_keys::run_client_keys;
