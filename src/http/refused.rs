//! Rules that count the requests other rules refused
//! ([`Rule::count_refused`]): the all-or-nothing step takes nothing from a
//! rule when another denies, unless that rule says to be charged anyway.

use super::rule::Rule;

impl Rule {
    /// Charges this rule for every request it matches that it admits, even
    /// when another rule of the same request denies or sheds it (as
    /// nginx's `limit_req`, which runs before `limit_conn`, counts the
    /// requests `limit_conn` rejects). The default is all or nothing: a
    /// request refused anywhere takes nothing from any rule, so a client
    /// hammering a route that sheds (`503` from a concurrency rule under
    /// [`Key::global`](super::Key::global)) never meets its own per-IP
    /// rate rule, at any rate. With `count_refused` on that rule, the
    /// client's refused requests spend its own quota, and once it is spent
    /// the client is told `429` by its own limit.
    ///
    /// A local rate rule only: on a concurrency rule (a permit nobody
    /// would release) or a Redis rule it is an
    /// [`HttpConfigError::InvalidValue`](super::HttpConfigError::InvalidValue)
    /// naming `count_refused`. A refused request it was charged for is
    /// counted in neither `allowed` nor `denied` of this rule (the client
    /// was refused by another), as under all-or-nothing.
    ///
    /// ```
    /// use ratewall::http::{Key, RateLimitLayer, Rule};
    /// use ratewall::{Policy, Rate};
    ///
    /// let layer = RateLimitLayer::builder()
    ///     .rule(Rule::per_ip("ip", Policy::token_bucket(Rate::per_second(10))).count_refused())
    ///     .rule(Rule::concurrent("reports", Key::global(), 8).on_path_prefix("/reports"))
    ///     .build()?;
    /// # let _ = layer;
    /// # Ok::<(), ratewall::http::HttpConfigError>(())
    /// ```
    pub fn count_refused(mut self) -> Rule {
        self.count_refused = true;
        self
    }
}
