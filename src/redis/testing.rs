//! The unit tests' clock. The differential tests run each script at the
//! times they run the local step, so the scripts of a test build (built
//! with `lua/test_clock.lua` appended to the prelude, see `script.rs`) take
//! the time from the last argument of every call, which the calls of a
//! test build add: the time fixed with [`at`] for the calling task, or ''
//! for the server's `TIME`. None of this is compiled outside the crate's
//! unit tests: a production call carries no time and its script always
//! reads the server's `TIME`.

use std::future::Future;

tokio::task_local! {
    static NOW_US: u64;
}

/// Runs `f` with every script call it makes (from this task) at the server
/// time `now_us` (us since 1970).
pub(crate) async fn at<F: Future>(now_us: u64, f: F) -> F::Output {
    NOW_US.scope(now_us, f).await
}

/// The time fixed for this task, if any.
pub(crate) fn now_us() -> Option<u64> {
    NOW_US.try_with(|t| *t).ok()
}

/// The argument a test build adds to every call: the time, or '' for the
/// server's.
pub(crate) fn arg(now_us: Option<u64>) -> String {
    now_us.map(|t| t.to_string()).unwrap_or_default()
}
