//! [`PacingLayer`]: the client pacing layer, its builder, its errors and
//! what it exposes. The service, its request loop and the `Layer` impl are
//! in `service.rs`.

use super::partition::{PartitionView, Partitions, PartitionsError};
use super::refusals::{RefusalCounters, Refusals};
use crate::clock::Clock;
use crate::decision::Decision;
use crate::error::ConfigError;
use crate::limiter::{DefaultClock, TokenBucket};
use crate::quota::Rate;
use crate::sync::{AtomicU64, Ordering};
use crate::wait::Wait;
use std::fmt;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

/// The most retries a [`PacingLayer`] may make of one request.
pub const MAX_RETRIES: u32 = 10;

/// How long a request waits for its turn unless the builder says otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// How many partitions a layer remembers unless the builder says otherwise.
pub const DEFAULT_PARTITIONS: usize = 1024;

/// What picks a request's partition.
pub(crate) type KeyFn<K> = Arc<dyn Fn(&http::request::Parts) -> K + Send + Sync>;

/// The default partition: the request's authority (`host:port` of an
/// absolute URI), else its `Host` header, else the empty string.
fn authority(parts: &http::request::Parts) -> String {
    if let Some(a) = parts.uri.authority() {
        return a.as_str().to_owned();
    }
    parts
        .headers
        .get(http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or_default()
        .to_owned()
}

/// What the layer and all its services share.
pub(crate) struct Shared<K, C: Clock> {
    pub(crate) partitions: Partitions<K, C>,
    pub(crate) key: KeyFn<K>,
    pub(crate) rate: Option<Rate>,
    pub(crate) wait: Wait,
    pub(crate) retries: u32,
    pub(crate) waits: AtomicU64,
    pub(crate) refusals: RefusalCounters,
    pub(crate) retried: AtomicU64,
}

/// Adds one to one of the layer's counters.
pub(crate) fn count(counter: &AtomicU64) {
    // Relaxed: a counter; it publishes no other memory.
    counter.fetch_add(1, Ordering::Relaxed);
}

/// A tower [`Layer`](tower_layer::Layer) for outgoing HTTP that paces
/// requests per upstream partition (the request's authority by default):
/// each request waits (up to a timeout) until its partition is not paused
/// and its local pace admits it; every response teaches the partition what
/// the upstream announced ([`Announcement::read`](super::Announcement::read)):
/// a 429 or `r=0` pauses it, an announced quota paces it with the
/// upstream's burst (never faster than the user's pace; no response makes
/// it wait longer than [`MAX_PAUSE`](super::MAX_PAUSE)), and what is left
/// (`r`) lowers its pace to match. Retries of idempotent requests after a
/// 429 or a 503 are opt-in ([`PacingBuilder::retries`]) and back off;
/// every 429 and 503 is counted ([`refusals`](Self::refusals)). Needs a
/// tokio runtime (the wait sleeps on tokio's timer). Clones share one state.
///
/// ```
/// use ratewall::client::PacingLayer;
/// use ratewall::Rate;
/// use std::time::Duration;
///
/// let pacing = PacingLayer::builder()
///     .rate(Rate::per_second(10))
///     .timeout(Duration::from_secs(5))
///     .jitter(Duration::from_millis(50))
///     .retries(2)
///     .build()?;
/// // let client = tower::ServiceBuilder::new().layer(pacing.clone()).service(hyper_client);
/// for (authority, view) in pacing.views() {
///     println!("{authority}: {view}");
/// }
/// assert_eq!(pacing.refusals().total(), 0);
/// # Ok::<(), ratewall::client::PacingConfigError>(())
/// ```
pub struct PacingLayer<K = String, C: Clock = DefaultClock> {
    pub(crate) shared: Arc<Shared<K, C>>,
}

impl<K, C: Clock> Clone for PacingLayer<K, C> {
    fn clone(&self) -> Self {
        PacingLayer {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<K, C: Clock> fmt::Debug for PacingLayer<K, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.shared;
        f.debug_struct("PacingLayer")
            .field("rate", &s.rate)
            .field("wait", &s.wait)
            .field("retries", &s.retries)
            .field("partitions", &s.partitions)
            .finish_non_exhaustive()
    }
}

impl PacingLayer {
    /// A builder: no pace of its own (only what upstreams announce), a
    /// [`DEFAULT_TIMEOUT`], no jitter, no retries, [`DEFAULT_PARTITIONS`]
    /// partitions keyed by authority, on the default clock.
    ///
    /// ```
    /// let layer = ratewall::client::PacingLayer::builder().build().unwrap();
    /// assert_eq!(layer.waits(), 0);
    /// ```
    pub fn builder() -> PacingBuilder {
        PacingBuilder {
            rate: None,
            wait: Wait::new().timeout(DEFAULT_TIMEOUT),
            retries: 0,
            capacity: DEFAULT_PARTITIONS,
            key: Arc::new(authority),
            clock: DefaultClock::default(),
        }
    }
}

impl<K: Hash + Eq + Clone, C: Clock> PacingLayer<K, C> {
    /// What the layer learned about partition `key`, if it holds it.
    ///
    /// ```
    /// # let layer = ratewall::client::PacingLayer::builder().build().unwrap();
    /// assert!(layer.view(&"api.example.com".to_string()).is_none());
    /// ```
    pub fn view(&self, key: &K) -> Option<PartitionView> {
        self.shared.partitions.view(key)
    }

    /// Every partition's key and what was learned about it.
    ///
    /// ```
    /// # let layer = ratewall::client::PacingLayer::builder().build().unwrap();
    /// assert!(layer.views().is_empty());
    /// ```
    pub fn views(&self) -> Vec<(K, PartitionView)> {
        self.shared.partitions.views()
    }
}

impl<K, C: Clock> PacingLayer<K, C> {
    /// How many requests waited for their turn (each counted once).
    ///
    /// ```
    /// # let layer = ratewall::client::PacingLayer::builder().build().unwrap();
    /// assert_eq!(layer.waits(), 0);
    /// ```
    pub fn waits(&self) -> u64 {
        // Relaxed: a counter, read for display.
        self.shared.waits.load(Ordering::Relaxed)
    }

    /// How many refusals came back, by status (429s and 503s, retried
    /// ones included), over every partition.
    ///
    /// ```
    /// # let layer = ratewall::client::PacingLayer::builder().build().unwrap();
    /// let refused = layer.refusals();
    /// assert_eq!((refused.too_many_requests, refused.unavailable), (0, 0));
    /// println!("{refused}"); // 0 refused (429: 0, 503: 0)
    /// ```
    pub fn refusals(&self) -> Refusals {
        self.shared.refusals.load()
    }

    /// How many retries the layer made.
    ///
    /// ```
    /// # let layer = ratewall::client::PacingLayer::builder().build().unwrap();
    /// assert_eq!(layer.retries_made(), 0);
    /// ```
    pub fn retries_made(&self) -> u64 {
        // Relaxed: a counter, read for display.
        self.shared.retried.load(Ordering::Relaxed)
    }
}

/// Builds a [`PacingLayer`]; see [`PacingLayer::builder`] for the defaults.
///
/// ```
/// use ratewall::client::PacingLayer;
/// use ratewall::Rate;
///
/// // One partition per API key header instead of per authority.
/// let layer = PacingLayer::builder()
///     .rate(Rate::per_minute(600))
///     .key_fn(|parts| parts.headers.get("x-api-key").map(|v| v.as_bytes().to_vec()))
///     .partitions(64)
///     .build()?;
/// assert!(layer.views().is_empty());
/// # Ok::<(), ratewall::client::PacingConfigError>(())
/// ```
#[must_use = "a builder does nothing until `build`"]
pub struct PacingBuilder<K = String, C = DefaultClock> {
    rate: Option<Rate>,
    wait: Wait,
    retries: u32,
    capacity: usize,
    key: KeyFn<K>,
    clock: C,
}

impl<K, C: fmt::Debug> fmt::Debug for PacingBuilder<K, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PacingBuilder")
            .field("rate", &self.rate)
            .field("wait", &self.wait)
            .field("retries", &self.retries)
            .field("capacity", &self.capacity)
            .field("clock", &self.clock)
            .finish_non_exhaustive()
    }
}

impl<K, C> PacingBuilder<K, C> {
    /// The pace to keep per partition (burst included). Announcements
    /// only slow it; without it, the pace is what the upstream announces.
    ///
    /// ```
    /// # use ratewall::{client::PacingLayer, Rate};
    /// assert!(PacingLayer::builder().rate(Rate::per_second(0)).build().is_err());
    /// ```
    pub fn rate(mut self, rate: Rate) -> Self {
        self.rate = Some(rate);
        self
    }

    /// How long one request may wait for its turn ([`DEFAULT_TIMEOUT`]);
    /// past it, or at once when its turn is known to come later, the call
    /// fails with [`PacingError::Deadline`].
    ///
    /// ```
    /// # use ratewall::client::PacingLayer;
    /// # use std::time::Duration;
    /// let layer = PacingLayer::builder().timeout(Duration::from_secs(2)).build().unwrap();
    /// ```
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.wait = self.wait.timeout(timeout);
        self
    }

    /// A random extra in `[0, max]` on each wait (a pause included), so
    /// requests released together do not arrive together. Off by default.
    ///
    /// ```
    /// # use ratewall::client::PacingLayer;
    /// # use std::time::Duration;
    /// let layer = PacingLayer::builder().jitter(Duration::from_millis(100)).build().unwrap();
    /// ```
    pub fn jitter(mut self, max: Duration) -> Self {
        self.wait = self.wait.jitter(max);
        self
    }

    /// Retries an idempotent request (GET, HEAD, OPTIONS, PUT, DELETE,
    /// TRACE) with an empty body up to `retries` times after a 429 or a
    /// 503, each after a backoff (retry `n` waits a random time in
    /// `[d_n, 2·d_n]`, `d_n` = [`RETRY_BACKOFF_BASE`](super::RETRY_BACKOFF_BASE)
    /// doubled per retry up to [`RETRY_BACKOFF_CAP`](super::RETRY_BACKOFF_CAP),
    /// whatever `Retry-After` says) and then its turn again (the pause
    /// included). Other requests are never retried. 0 (the default) is
    /// off; at most [`MAX_RETRIES`].
    ///
    /// ```
    /// # use ratewall::client::{PacingConfigError, PacingLayer};
    /// assert_eq!(
    ///     PacingLayer::builder().retries(11).build().unwrap_err(),
    ///     PacingConfigError::TooManyRetries { retries: 11 }
    /// );
    /// ```
    pub fn retries(mut self, retries: u32) -> Self {
        self.retries = retries;
        self
    }

    /// How many partitions to remember (least recently used forgotten;
    /// [`DEFAULT_PARTITIONS`]).
    ///
    /// ```
    /// # use ratewall::client::PacingLayer;
    /// assert!(PacingLayer::builder().partitions(0).build().is_err());
    /// ```
    pub fn partitions(mut self, capacity: usize) -> Self {
        self.capacity = capacity;
        self
    }

    /// Partitions requests by `key` instead of by authority.
    ///
    /// ```
    /// # use ratewall::client::PacingLayer;
    /// let layer = PacingLayer::builder().key_fn(|parts| parts.uri.path().to_owned()).build().unwrap();
    /// ```
    pub fn key_fn<K2>(
        self,
        key: impl Fn(&http::request::Parts) -> K2 + Send + Sync + 'static,
    ) -> PacingBuilder<K2, C> {
        PacingBuilder {
            rate: self.rate,
            wait: self.wait,
            retries: self.retries,
            capacity: self.capacity,
            key: Arc::new(key),
            clock: self.clock,
        }
    }

    /// The clock of the pace and the pauses (waits sleep on tokio's timer).
    ///
    /// ```
    /// # use ratewall::client::PacingLayer;
    /// let layer = PacingLayer::builder().clock(ratewall::StdClock::new()).build().unwrap();
    /// ```
    pub fn clock<C2: Clock + Clone>(self, clock: C2) -> PacingBuilder<K, C2> {
        PacingBuilder {
            rate: self.rate,
            wait: self.wait,
            retries: self.retries,
            capacity: self.capacity,
            key: self.key,
            clock,
        }
    }

    /// The layer, or what to change.
    ///
    /// ```
    /// # use ratewall::client::PacingLayer;
    /// let layer = PacingLayer::builder().build()?;
    /// # Ok::<(), ratewall::client::PacingConfigError>(())
    /// ```
    pub fn build(self) -> Result<PacingLayer<K, C>, PacingConfigError>
    where
        K: Hash + Eq + Clone,
        C: Clock + Clone,
    {
        if let Some(rate) = self.rate {
            TokenBucket::with_clock(rate, self.clock.clone()).map_err(PacingConfigError::Rate)?;
        }
        if self.retries > MAX_RETRIES {
            return Err(PacingConfigError::TooManyRetries {
                retries: self.retries,
            });
        }
        let partitions = Partitions::with_clock(self.capacity, self.clock)
            .map_err(PacingConfigError::Partitions)?;
        Ok(PacingLayer {
            shared: Arc::new(Shared {
                partitions,
                key: self.key,
                rate: self.rate,
                wait: self.wait,
                retries: self.retries,
                waits: AtomicU64::new(0),
                refusals: RefusalCounters::default(),
                retried: AtomicU64::new(0),
            }),
        })
    }
}

/// A [`PacingLayer`] that cannot be built.
///
/// ```
/// use ratewall::client::{PacingConfigError, PacingLayer};
/// use ratewall::Rate;
///
/// let err = PacingLayer::builder().rate(Rate::per_second(0)).build().unwrap_err();
/// assert!(matches!(err, PacingConfigError::Rate(_)));
/// println!("{err}");
/// ```
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PacingConfigError {
    /// The rate is invalid (see the inner error for what to change).
    Rate(ConfigError),
    /// The partition capacity is invalid.
    Partitions(PartitionsError),
    /// More retries than [`MAX_RETRIES`]: lower them.
    TooManyRetries {
        /// The retries asked for.
        retries: u32,
    },
}

impl fmt::Display for PacingConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PacingConfigError::Rate(e) => write!(f, "the pacing rate is invalid: {e}"),
            PacingConfigError::Partitions(e) => e.fmt(f),
            PacingConfigError::TooManyRetries { retries } => write!(
                f,
                "a pacing layer retries a request at most {MAX_RETRIES} times; {retries} asked"
            ),
        }
    }
}

impl std::error::Error for PacingConfigError {}

/// Why a paced request failed. `E` is the inner client's error.
///
/// ```
/// use ratewall::client::PacingError;
///
/// let e: PacingError<std::io::Error> = PacingError::Deadline { last: None, paused_for: None };
/// assert!(e.to_string().contains("raise the timeout"));
/// ```
#[non_exhaustive]
#[derive(Debug)]
pub enum PacingError<E> {
    /// The request's turn would not come before its timeout (nothing was
    /// sent): `last` is the last denial (its `retry_after` is when the
    /// turn comes), `paused_for` how much longer the partition is paused.
    Deadline {
        /// The last denial.
        last: Option<Decision>,
        /// How much longer the partition is paused, if it is.
        paused_for: Option<Duration>,
    },
    /// The inner client failed; returned as is, never retried.
    Inner(E),
}

impl<E: fmt::Display> fmt::Display for PacingError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PacingError::Deadline { last, paused_for } => {
                f.write_str("the request's turn would not come before the timeout")?;
                if let Some(p) = paused_for {
                    write!(f, " (the upstream asked for a pause of {p:?} more)")?;
                } else if let Some(d) = last {
                    write!(f, " (next turn in {:?})", d.retry_after())?;
                }
                f.write_str("; raise the timeout or send fewer requests")
            }
            PacingError::Inner(e) => write!(f, "the inner client failed: {e}"),
        }
    }
}

impl<E: std::error::Error + 'static> std::error::Error for PacingError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            PacingError::Inner(e) => Some(e),
            PacingError::Deadline { .. } => None,
        }
    }
}
