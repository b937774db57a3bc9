//! The client side (feature `client`): what an upstream API announces about
//! its limits, what a client calling it learns per partition, and
//! [`PacingLayer`], a tower layer that paces any HTTP client by both.
//!
//! - [`Announcement::read`] reads one response: `RateLimit-Policy` and
//!   `RateLimit` (draft-ietf-httpapi-ratelimit-headers-10 and -11, one wire
//!   format: RFC 9651 structured-field lists), the legacy
//!   `X-RateLimit-Limit`, `-Remaining` and `-Reset` (delta seconds, or a
//!   Unix time in seconds or milliseconds, told apart by magnitude), and
//!   `Retry-After` on a 429 or a 503 (delta seconds or an HTTP date).
//!   Malformed, hostile or absurd values are ignored; pauses, and the
//!   interval of an announced pace, are clamped to [`MAX_PAUSE`].
//! - [`Partitions`] keeps, per upstream partition, the announced quota,
//!   what is left, and how long the partition is paused, in a bounded
//!   table (least recently used evicted), with counters of waits,
//!   [`Refusals`] by status (429 and 503) and retries, and a printable
//!   [`PartitionView`]. An announcement only ever slows the pace the user
//!   set ([`Partitions::pace`]); its quota paces with the upstream's burst.
//! - [`PacingLayer`] waits each request's turn per partition (not paused,
//!   and one unit of the partition's pace free, through
//!   [`Wait::until`](crate::wait::Wait::until)), learns from every
//!   response, and retries idempotent empty-body requests after a 429 or
//!   a 503 when asked to, backing off between retries
//!   ([`RETRY_BACKOFF_BASE`] doubling up to [`RETRY_BACKOFF_CAP`], jitter
//!   on top).
//!
//! docs/client.md ("What the client reads and trusts") gives every rule
//! in one place.
//!
//! | file | what lives there |
//! |---|---|
//! | `sf.rs` | the RFC 9651 structured-field subset (a List of Items with Parameters), bounded and allocation-free |
//! | `announce.rs` | [`Announcement`], [`Quota`], [`Remaining`], the clamps |
//! | `partition.rs` | [`Partitions`], [`PartitionView`], [`PartitionsError`] |
//! | `refusals.rs` | [`Refusals`]: the 429s and 503s acted on, by status |
//! | `backoff.rs` | the wait before a retry: exponential, capped, jittered |
//! | `pacer.rs` | one partition's local pace: a token bucket at the pace in force, lowered to what the upstream says is left |
//! | `layer.rs` | [`PacingLayer`], [`PacingBuilder`], [`PacingConfigError`], [`PacingError`] |
//! | `service.rs` | [`PacingService`]: one request's loop (wait, send, learn, retry) |
//!
//! ```
//! use http::{HeaderMap, HeaderValue, StatusCode};
//! use ratewall::client::{Announcement, Partitions};
//!
//! let partitions = Partitions::new(1024).unwrap();
//! let mut headers = HeaderMap::new();
//! headers.insert("ratelimit-policy", HeaderValue::from_static(r#""default";q=100;w=60"#));
//! headers.insert("ratelimit", HeaderValue::from_static(r#""default";r=0;t=12"#));
//! let said = Announcement::read(StatusCode::OK, &headers);
//! partitions.learn(&"api.example.com", &said);
//! // Nothing is left for 12 s: the partition is paused.
//! assert!(partitions.paused_for(&"api.example.com").is_some());
//! ```

mod announce;
mod backoff;
mod flights;
mod layer;
mod pacer;
mod partition;
mod refusals;
mod service;
mod sf;

pub use announce::{Announcement, Quota, Remaining, DEFAULT_PAUSE, MAX_PAUSE, MAX_WINDOW};
pub use backoff::{RETRY_BACKOFF_BASE, RETRY_BACKOFF_CAP};
pub use layer::{
    PacingBuilder, PacingConfigError, PacingError, PacingLayer, DEFAULT_PARTITIONS,
    DEFAULT_TIMEOUT, MAX_RETRIES,
};
pub use partition::{PartitionView, Partitions, PartitionsError, MAX_PARTITIONS};
pub use refusals::Refusals;
pub use service::PacingService;
