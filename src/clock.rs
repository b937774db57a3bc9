//! Time sources.
//!
//! Every limiter reads time as nanoseconds (`u64`) since its clock's epoch.
//! The horizon is therefore 2^64 ns, about 584 years after the epoch; the
//! epoch of [`QuantaClock`] and [`StdClock`] is the first use of that clock
//! type in the process, shared by all instances, so one reading is valid for
//! every limiter built on the same clock type (see `check_at`).
//!
//! A clock that reports `is_monotonic() == true` promises readings that never
//! go backwards, on any thread. Limiters trust such a clock as it is. For any
//! other clock (such as [`ManualClock`], or your own) the limiter keeps a
//! high-water mark of the readings it has used, so that a step backwards is
//! seen as time standing still: it can neither deny a request that the latest
//! time would allow, nor let extra requests through.

use crate::sync::{AtomicU64, Ordering};
use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// A source of time in nanoseconds since the clock's epoch.
///
/// # Example
///
/// A clock that reads a value shared with a test driver:
///
/// ```
/// use ratewall::{Clock, TokenBucket, Rate};
/// use std::sync::{Arc, Mutex};
///
/// #[derive(Debug, Clone, Default)]
/// struct Ticks(Arc<Mutex<u64>>);
///
/// impl Clock for Ticks {
///     fn now(&self) -> u64 {
///         *self.0.lock().unwrap() * 1_000_000 // one tick is 1 ms
///     }
/// }
///
/// let ticks = Ticks::default();
/// let bucket = TokenBucket::with_clock(Rate::per_second(1).burst(1), ticks.clone()).unwrap();
/// assert!(bucket.check().is_allowed());
/// assert!(!bucket.check().is_allowed());
/// *ticks.0.lock().unwrap() = 1_000; // one second later
/// assert!(bucket.check().is_allowed());
/// ```
pub trait Clock: Send + Sync + fmt::Debug {
    /// Nanoseconds since this clock's epoch.
    fn now(&self) -> u64;

    /// Whether readings are guaranteed never to go backwards, across all
    /// threads. Return `true` only if that holds; limiters then skip their
    /// own guard (a shared atomic read-modify-write per check).
    fn is_monotonic(&self) -> bool {
        false
    }
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    #[inline]
    fn now(&self) -> u64 {
        (**self).now()
    }
    fn is_monotonic(&self) -> bool {
        (**self).is_monotonic()
    }
}

impl<C: Clock + ?Sized> Clock for &C {
    #[inline]
    fn now(&self) -> u64 {
        (**self).now()
    }
    fn is_monotonic(&self) -> bool {
        (**self).is_monotonic()
    }
}

/// The default clock: the CPU's time-stamp counter via `quanta`, about 10 ns
/// a read, when the kernel has verified that counter is synchronized across
/// cores; the OS monotonic clock otherwise.
///
/// `quanta` alone trusts any CPU that claims an invariant TSC. On machines
/// whose cores' counters are not synchronized (some VMs and multi-socket
/// boards), its readings go backwards when a thread moves between cores, and
/// `governor` denied requests it should have allowed (its issue #299).
/// Linux checks TSC synchronization at boot and watches it afterwards; it
/// keeps `tsc` as the clocksource only while the check passes. `QuantaClock`
/// uses the TSC only when `/sys/devices/system/clocksource/clocksource0/current_clocksource`
/// reads `tsc`, and falls back to `std::time::Instant` (`CLOCK_MONOTONIC`,
/// which the kernel keeps monotonic across cores) everywhere else.
///
/// All `QuantaClock`s in a process share one epoch.
///
/// # Example
///
/// ```
/// use ratewall::{Clock, QuantaClock};
///
/// let clock = QuantaClock::new();
/// let a = clock.now();
/// let b = clock.now();
/// assert!(b >= a);
/// println!("time source: {}", clock.source());
/// ```
#[cfg(feature = "quanta")]
#[derive(Clone)]
pub struct QuantaClock {
    source: &'static QuantaSource,
}

#[cfg(feature = "quanta")]
enum QuantaSource {
    Tsc { clock: quanta::Clock, epoch: u64 },
    Os(std::time::Instant),
}

#[cfg(feature = "quanta")]
impl QuantaClock {
    /// The process-wide quanta clock (detection and calibration run once).
    pub fn new() -> Self {
        static SOURCE: OnceLock<QuantaSource> = OnceLock::new();
        let source = SOURCE.get_or_init(|| {
            if tsc_is_kernel_verified() {
                let clock = quanta::Clock::new();
                let epoch = clock.raw();
                QuantaSource::Tsc { clock, epoch }
            } else {
                QuantaSource::Os(std_epoch())
            }
        });
        QuantaClock { source }
    }

    /// `"tsc"` when reading the CPU counter, `"os-monotonic"` when it fell back.
    pub fn source(&self) -> &'static str {
        match self.source {
            QuantaSource::Tsc { .. } => "tsc",
            QuantaSource::Os(_) => "os-monotonic",
        }
    }
}

#[cfg(feature = "quanta")]
fn tsc_is_kernel_verified() -> bool {
    if cfg!(miri) || cfg!(ratewall_loom) {
        return false; // quanta's cpuid/rdtsc cannot run there
    }
    match std::fs::read_to_string(
        "/sys/devices/system/clocksource/clocksource0/current_clocksource",
    ) {
        Ok(s) => s.trim() == "tsc",
        Err(_) => false,
    }
}

#[cfg(feature = "quanta")]
impl Default for QuantaClock {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(feature = "quanta")]
impl fmt::Debug for QuantaClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QuantaClock")
            .field("source", &self.source())
            .finish()
    }
}

#[cfg(feature = "quanta")]
impl Clock for QuantaClock {
    #[inline]
    fn now(&self) -> u64 {
        match self.source {
            // `delta_as_nanos` returns 0 rather than wrapping if the counter
            // were ever below the epoch reading.
            QuantaSource::Tsc { clock, epoch } => clock.delta_as_nanos(*epoch, clock.raw()),
            QuantaSource::Os(epoch) => duration_nanos(epoch.elapsed()),
        }
    }
    fn is_monotonic(&self) -> bool {
        true
    }
}

/// A cached clock: one relaxed load of a process-wide word (about 1 ns)
/// instead of reading the time-stamp counter (about 10 ns).
///
/// A background thread, started by the first `CoarseClock` in the process and
/// never stopped, stores a [`QuantaClock`] reading into that word every
/// interval (1 ms unless the first clock asked for another with
/// [`with_interval`](Self::with_interval)). Readings are therefore in the same
/// epoch as `QuantaClock`'s, so the two can be mixed in `check_at`.
///
/// # Precision trade-off
///
/// - A reading lags real time by up to the interval plus however long the
///   OS keeps the updating thread from running (on a loaded machine, a
///   scheduler tick or more). All checks within one interval see the same time.
/// - A limiter on this clock refills late: it may deny a request that a
///   precise clock would already allow, by up to the lag.
/// - Admission bounds hold in the clock's own time. Measured in real time, a
///   token bucket admits at most `burst + rate * (d + lag)` in any interval of
///   length `d`: the lag stretches the interval, it never multiplies the rate.
///   Use it where a rate of 1000/s must not cost 10 ns a check, not where a
///   limit must hold to the microsecond.
/// - Readings never go backwards: the thread only ever raises the word
///   (`fetch_max`), so [`is_monotonic`](Clock::is_monotonic) is `true`.
/// - If the thread cannot be spawned, the clock reads `QuantaClock` directly.
///
/// # Example
///
/// ```
/// use ratewall::{Clock, CoarseClock, Rate, TokenBucket};
/// use std::time::Duration;
///
/// let clock = CoarseClock::new();
/// assert_eq!(clock.interval(), Duration::from_millis(1));
/// let bucket = TokenBucket::with_clock(Rate::per_second(1000), clock).unwrap();
/// assert!(bucket.check().is_allowed());
/// let a = clock.now();
/// std::thread::sleep(Duration::from_millis(20));
/// assert!(clock.now() > a, "the background thread moves it forward");
/// ```
#[cfg(all(feature = "quanta", not(ratewall_loom)))]
#[derive(Clone, Copy)]
pub struct CoarseClock {
    /// `None` when the updating thread could not be started.
    interval: Option<Duration>,
}

/// The latest reading stored by the coarse clock's thread, ns since the
/// `QuantaClock` epoch. Only ever raised (`fetch_max`).
#[cfg(all(feature = "quanta", not(ratewall_loom)))]
static COARSE_NOW: AtomicU64 = AtomicU64::new(0);

#[cfg(all(feature = "quanta", not(ratewall_loom)))]
impl CoarseClock {
    /// The interval used when the first clock does not choose one.
    pub const DEFAULT_INTERVAL: Duration = Duration::from_millis(1);
    /// The shortest interval accepted (shorter ones are raised to it), so
    /// the thread never spins.
    pub const MIN_INTERVAL: Duration = Duration::from_micros(50);

    /// The process-wide coarse clock; starts its thread (1 ms interval) on
    /// first use.
    pub fn new() -> Self {
        Self::with_interval(Self::DEFAULT_INTERVAL)
    }

    /// Like [`new`](Self::new), but the first call in the process sets the
    /// update interval (at least [`MIN_INTERVAL`](Self::MIN_INTERVAL)).
    /// Later calls get the interval already running; check it with
    /// [`interval`](Self::interval).
    ///
    /// ```
    /// use ratewall::CoarseClock;
    /// use std::time::Duration;
    /// let clock = CoarseClock::with_interval(Duration::from_micros(200));
    /// assert!(clock.interval() >= CoarseClock::MIN_INTERVAL);
    /// ```
    pub fn with_interval(interval: Duration) -> Self {
        static STARTED: OnceLock<Option<Duration>> = OnceLock::new();
        let interval = *STARTED.get_or_init(|| {
            let interval = interval.max(Self::MIN_INTERVAL);
            let precise = QuantaClock::new();
            // Relaxed: the word publishes no other memory; `fetch_max` keeps it
            // non-decreasing in its modification order, which every reader follows.
            COARSE_NOW.fetch_max(precise.now(), Ordering::Relaxed);
            std::thread::Builder::new()
                .name("ratewall-coarse-clock".into())
                .spawn(move || loop {
                    std::thread::sleep(interval);
                    // Relaxed: as above.
                    COARSE_NOW.fetch_max(precise.now(), Ordering::Relaxed);
                })
                .ok()
                .map(|_| interval)
        });
        CoarseClock { interval }
    }

    /// The update interval: the readings' granularity, and the least lag.
    /// Zero if the thread could not start and the clock reads `QuantaClock`.
    pub fn interval(&self) -> Duration {
        self.interval.unwrap_or(Duration::ZERO)
    }
}

#[cfg(all(feature = "quanta", not(ratewall_loom)))]
impl Default for CoarseClock {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(all(feature = "quanta", not(ratewall_loom)))]
impl fmt::Debug for CoarseClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CoarseClock")
            .field("interval", &self.interval())
            .finish()
    }
}

#[cfg(all(feature = "quanta", not(ratewall_loom)))]
impl Clock for CoarseClock {
    #[inline]
    fn now(&self) -> u64 {
        if self.interval.is_some() {
            // Relaxed: read-read coherence on one word means a thread never
            // sees it go back; it publishes no other memory.
            COARSE_NOW.load(Ordering::Relaxed)
        } else {
            QuantaClock::new().now()
        }
    }
    fn is_monotonic(&self) -> bool {
        true
    }
}

fn std_epoch() -> std::time::Instant {
    static EPOCH: OnceLock<std::time::Instant> = OnceLock::new();
    *EPOCH.get_or_init(std::time::Instant::now)
}

/// Saturating conversion: 2^64 ns is 584 years.
pub(crate) fn duration_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// `std::time::Instant` (the OS monotonic clock, about 18 ns a read here).
///
/// All `StdClock`s in a process share one epoch.
///
/// # Example
///
/// ```
/// use ratewall::{Clock, StdClock, TokenBucket, Rate};
///
/// let bucket = TokenBucket::with_clock(Rate::per_second(10), StdClock::new()).unwrap();
/// assert!(bucket.check().is_allowed());
/// assert!(StdClock::new().is_monotonic());
/// ```
#[derive(Debug, Clone, Copy)]
pub struct StdClock {
    epoch: std::time::Instant,
}

impl StdClock {
    /// The process-wide `Instant` clock.
    pub fn new() -> Self {
        StdClock { epoch: std_epoch() }
    }
}

impl Default for StdClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for StdClock {
    #[inline]
    fn now(&self) -> u64 {
        duration_nanos(self.epoch.elapsed())
    }
    fn is_monotonic(&self) -> bool {
        true
    }
}

/// A clock moved by hand, for tests and simulations. Clones share one time.
///
/// It can be stepped backwards on purpose, to check that a limiter copes with
/// a clock that misbehaves; it reports itself as not monotonic, so limiters
/// guard against those steps.
///
/// # Example
///
/// ```
/// use ratewall::{Clock, ManualClock, Rate, TokenBucket};
/// use std::time::Duration;
///
/// let clock = ManualClock::new();
/// let bucket = TokenBucket::with_clock(Rate::per_second(2).burst(1), clock.clone()).unwrap();
/// assert!(bucket.check().is_allowed());
/// assert!(!bucket.check().is_allowed());
/// clock.advance(Duration::from_millis(500));
/// assert!(bucket.check().is_allowed());
/// clock.step_back(Duration::from_millis(400)); // the limiter sees time stand still
/// assert_eq!(clock.now(), 100_000_000);
/// ```
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    nanos: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock at time 0.
    pub fn new() -> Self {
        Self::default()
    }

    /// A clock at `start` after its epoch.
    pub fn starting_at(start: Duration) -> Self {
        let c = Self::new();
        c.set(start);
        c
    }

    /// Moves time forward by `by` (saturating at the 584-year horizon).
    pub fn advance(&self, by: Duration) {
        let by = duration_nanos(by);
        // Relaxed: the reading publishes no other memory; RMWs on one word are totally ordered.
        let _ = self
            .nanos
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| {
                Some(t.saturating_add(by))
            });
    }

    /// Moves time backwards by `by` (saturating at the epoch).
    pub fn step_back(&self, by: Duration) {
        let by = duration_nanos(by);
        // Relaxed: as in `advance`.
        let _ = self
            .nanos
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| {
                Some(t.saturating_sub(by))
            });
    }

    /// Sets the time to `at` after the epoch, forwards or backwards.
    pub fn set(&self, at: Duration) {
        self.set_nanos(duration_nanos(at));
    }

    /// Sets the time in nanoseconds after the epoch.
    pub fn set_nanos(&self, nanos: u64) {
        // Relaxed: as in `advance`.
        self.nanos.store(nanos, Ordering::Relaxed);
    }
}

impl Clock for ManualClock {
    #[inline]
    fn now(&self) -> u64 {
        // Relaxed: as in `advance`.
        self.nanos.load(Ordering::Relaxed)
    }
}

/// A limiter's guard against clocks that are not monotonic: the largest
/// reading used so far. `Relaxed` is enough: the mark publishes no other
/// memory, and `fetch_max` reads the latest value in the word's modification
/// order, so the returned maximum is exact across threads.
pub(crate) struct TimeFloor(AtomicU64);

impl TimeFloor {
    pub(crate) fn new() -> Self {
        TimeFloor(AtomicU64::new(0))
    }

    /// Returns `max(t, every earlier t)`.
    #[inline]
    pub(crate) fn observe(&self, t: u64) -> u64 {
        self.0.fetch_max(t, Ordering::Relaxed).max(t)
    }
}

/// Time is clamped to this many nanoseconds after the clock epoch (2^63 ns,
/// about 292 years): past it, time stands still, so nothing overflows and
/// nothing extra is admitted.
pub(crate) const HORIZON: u64 = 1 << 63;

/// A clock plus, for clocks that are not monotonic, the guard above.
pub(crate) struct Timebase<C> {
    clock: C,
    monotonic: bool,
    floor: TimeFloor,
}

impl<C: Clock> Timebase<C> {
    pub(crate) fn new(clock: C) -> Self {
        Timebase {
            monotonic: clock.is_monotonic(),
            clock,
            floor: TimeFloor::new(),
        }
    }

    /// One reading, never earlier than a reading this timebase returned before.
    #[inline]
    pub(crate) fn now(&self) -> u64 {
        let t = self.clock.now();
        if self.monotonic {
            t
        } else {
            self.floor.observe(t)
        }
    }

    /// A reading the caller took (`check_at`) as the state words see it:
    /// guarded like [`now`](Self::now), and clamped at [`HORIZON`] (past
    /// it, time stands still). The one horizon clamp of the crate.
    #[inline]
    pub(crate) fn clamp(&self, t: u64) -> u64 {
        let t = if self.monotonic {
            t
        } else {
            self.floor.observe(t)
        };
        t.min(HORIZON)
    }

    /// The clock's own reading, clamped at [`HORIZON`], if the clock is
    /// monotonic; `None` otherwise, where a reading would move the floor
    /// that explicit instants are judged against (so only a check may).
    #[inline]
    pub(crate) fn monotonic_now(&self) -> Option<u64> {
        self.monotonic.then(|| self.clock.now().min(HORIZON))
    }

    /// One reading for the state words: [`now`](Self::now), clamped at
    /// [`HORIZON`].
    #[inline]
    pub(crate) fn clamped_now(&self) -> u64 {
        self.now().min(HORIZON)
    }

    pub(crate) fn clock(&self) -> &C {
        &self.clock
    }
}

impl<C: fmt::Debug> fmt::Debug for Timebase<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Timebase")
            .field("clock", &self.clock)
            .field("monotonic", &self.monotonic)
            .finish()
    }
}

#[cfg(all(test, not(ratewall_loom)))]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_both_ways_and_saturates() {
        let c = ManualClock::starting_at(Duration::from_secs(1));
        assert_eq!(c.now(), 1_000_000_000);
        c.advance(Duration::from_millis(5));
        assert_eq!(c.now(), 1_005_000_000);
        c.step_back(Duration::from_secs(10));
        assert_eq!(c.now(), 0);
        c.set_nanos(u64::MAX - 1);
        c.advance(Duration::from_secs(1));
        assert_eq!(c.now(), u64::MAX);
        assert!(!c.is_monotonic());
    }

    #[test]
    fn timebase_guards_only_non_monotonic_clocks() {
        let c = ManualClock::new();
        let tb = Timebase::new(c.clone());
        c.set_nanos(100);
        assert_eq!(tb.now(), 100);
        c.set_nanos(40);
        assert_eq!(tb.now(), 100, "a step back reads as time standing still");
        assert_eq!(tb.clamp(70), 100);
        c.set_nanos(150);
        assert_eq!(tb.now(), 150);
    }

    #[cfg(feature = "quanta")]
    #[test]
    #[cfg_attr(
        miri,
        ignore = "starts the process-wide updater thread, which never exits (miri reports it)"
    )]
    fn coarse_clock_lags_the_precise_one_and_moves_forward() {
        let coarse = CoarseClock::new();
        assert!(coarse.is_monotonic());
        assert!(coarse.interval() > Duration::ZERO, "the thread started");
        let a = coarse.now();
        let precise = QuantaClock::new().now();
        assert!(
            a <= precise,
            "coarse {a} is never ahead of precise {precise}"
        );
        let mut last = a;
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while coarse.now() == a && std::time::Instant::now() < deadline {
            let t = coarse.now();
            assert!(t >= last, "went back from {last} to {t}");
            last = t;
            std::thread::yield_now();
        }
        let b = coarse.now();
        assert!(b > a, "coarse clock stuck at {a}");
        // Same epoch as QuantaClock: the lag is small, not an epoch offset.
        let lag = QuantaClock::new().now().saturating_sub(b);
        assert!(lag < 1_000_000_000, "lag {lag} ns");
    }

    #[test]
    fn real_clocks_are_monotonic_and_share_an_epoch() {
        let a = StdClock::new();
        let b = StdClock::new();
        let x = a.now();
        let y = b.now();
        assert!(y >= x);
        #[cfg(feature = "quanta")]
        {
            let q = QuantaClock::new();
            let r = QuantaClock::new();
            let x = q.now();
            let y = r.now();
            assert!(y >= x, "{x} then {y}");
            assert!(q.is_monotonic());
        }
    }
}
