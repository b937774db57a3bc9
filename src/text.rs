//! Limits written as text: `FromStr` and `Display` for [`Rate`], [`Window`]
//! and [`Policy`], and (with the `serde` feature) their string forms in
//! configuration files.
//!
//! The grammar is in `docs/configuration.md`:
//!
//! ```text
//! policy    = amount "/" period { clause }
//! clause    = algorithm | "burst" count | "queue" count | "soft" tolerance
//! algorithm = "token-bucket" | "leaky" | "fixed-window" | "sliding-window" | "sliding-log"
//! period    = [ count ] unit          (no space: "s", "10s", "250ms")
//! unit      = "ns" | "us" | "ms" | "s" | "min" | "h" | "d"   (and long forms)
//! tolerance = count "%" | count
//! ```
//!
//! `Display` writes the canonical form, which parses back to the same value.

use crate::error::ConfigError;
use crate::policy::{Policy, PolicyAlgorithm};
use crate::quota::{Rate, Window};
use crate::soft::Tolerance;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// Text that is not a rate, window or policy, and what was expected.
///
/// # Example
///
/// ```
/// use ratewall::{ParseError, Policy};
///
/// let err = "100/s brust 20".parse::<Policy>().unwrap_err();
/// assert_eq!(
///     err,
///     ParseError::Unexpected { token: "brust".into(), at: 6, expected: "an algorithm, `burst`, `queue` or `soft`" }
/// );
/// assert_eq!(err.to_string(), "unexpected `brust` at byte 6: expected an algorithm, `burst`, `queue` or `soft`");
/// ```
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ParseError {
    /// A token that does not fit where it stands.
    Unexpected {
        /// The token, as written.
        token: String,
        /// Its byte offset in the text.
        at: usize,
        /// What the grammar expects there.
        expected: &'static str,
    },
    /// The text ended where more was expected.
    Missing {
        /// What the grammar expects next.
        expected: &'static str,
    },
    /// The text is well formed, but the policy cannot be built (policies are
    /// validated when parsed; rates and windows when a limiter is built).
    Invalid(ConfigError),
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParseError::Unexpected {
                token,
                at,
                expected,
            } => write!(f, "unexpected `{token}` at byte {at}: expected {expected}"),
            ParseError::Missing { expected } => {
                write!(f, "the text ends early: expected {expected}")
            }
            ParseError::Invalid(e) => write!(f, "invalid policy: {e}"),
        }
    }
}

impl std::error::Error for ParseError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ParseError::Invalid(e) => Some(e),
            _ => None,
        }
    }
}

impl From<ConfigError> for ParseError {
    fn from(e: ConfigError) -> Self {
        ParseError::Invalid(e)
    }
}

/// A token and its byte offset.
#[derive(Clone, Copy, Debug)]
struct Token<'a> {
    text: &'a str,
    at: usize,
}

impl Token<'_> {
    fn unexpected(self, expected: &'static str) -> ParseError {
        ParseError::Unexpected {
            token: self.text.to_owned(),
            at: self.at,
            expected,
        }
    }

    fn is(self, word: &str) -> bool {
        self.text.eq_ignore_ascii_case(word)
    }
}

/// Splits on whitespace; `/` and `%` are tokens of their own.
struct Tokens<'a> {
    src: &'a str,
    pos: usize,
}

impl<'a> Tokens<'a> {
    fn new(src: &'a str) -> Self {
        Tokens { src, pos: 0 }
    }

    fn next_token(&mut self) -> Option<Token<'a>> {
        let rest = &self.src[self.pos..];
        let skip = rest.len() - rest.trim_start().len();
        self.pos += skip;
        let rest = &self.src[self.pos..];
        let first = rest.chars().next()?;
        let len = if first == '/' || first == '%' {
            1
        } else {
            rest.find(|c: char| c.is_whitespace() || c == '/' || c == '%')
                .unwrap_or(rest.len())
        };
        let t = Token {
            text: &rest[..len],
            at: self.pos,
        };
        self.pos += len;
        Some(t)
    }

    fn peek(&self) -> Option<Token<'a>> {
        Tokens {
            src: self.src,
            pos: self.pos,
        }
        .next_token()
    }

    fn expect(&mut self, expected: &'static str) -> Result<Token<'a>, ParseError> {
        self.next_token().ok_or(ParseError::Missing { expected })
    }
}

const COUNT: &str = "a whole number (digits, `_` allowed between them)";
const SLASH: &str = "`/` between the count and the period";
const PERIOD: &str = "a period such as `s`, `10s`, `250ms`, `min`, `h` or `d`";
const CLAUSE: &str = "an algorithm, `burst`, `queue` or `soft`";
const TOLERANCE: &str = "a tolerance such as `10%` or `5` (units)";

/// Digits with single `_`s between them (`digit { digit | "_" digit }`), as
/// a `u128` (`None` if not a number, a `_` not between two digits, or too
/// large).
fn digits(s: &str) -> Option<u128> {
    if s.is_empty() || s.starts_with('_') || s.ends_with('_') || s.contains("__") {
        return None;
    }
    let mut v: u128 = 0;
    for c in s.chars() {
        if c == '_' {
            continue;
        }
        let d = c.to_digit(10)?;
        v = v.checked_mul(10)?.checked_add(u128::from(d))?;
    }
    Some(v)
}

fn count(t: Token<'_>) -> Result<u64, ParseError> {
    digits(t.text)
        .and_then(|v| u64::try_from(v).ok())
        .ok_or_else(|| t.unexpected(COUNT))
}

/// Units of time, in nanoseconds, with their names. The first name of each
/// is the one `Display` writes.
const UNITS: [(u128, &[&str]); 7] = [
    (86_400_000_000_000, &["d", "day", "days"]),
    (3_600_000_000_000, &["h", "hr", "hour", "hours"]),
    (60_000_000_000, &["min", "m", "minute", "minutes", "mins"]),
    (1_000_000_000, &["s", "sec", "secs", "second", "seconds"]),
    (1_000_000, &["ms", "millisecond", "milliseconds"]),
    (1_000, &["us", "µs", "microsecond", "microseconds"]),
    (1, &["ns", "nanosecond", "nanoseconds"]),
];

fn period(t: Token<'_>) -> Result<Duration, ParseError> {
    let split = t
        .text
        .find(|c: char| !(c.is_ascii_digit() || c == '_'))
        .ok_or_else(|| t.unexpected(PERIOD))?;
    let (num, unit) = t.text.split_at(split);
    let k = if num.is_empty() {
        1
    } else {
        digits(num).ok_or_else(|| t.unexpected(PERIOD))?
    };
    let ns_per = UNITS
        .iter()
        .find(|(_, names)| names.iter().any(|n| n.eq_ignore_ascii_case(unit)))
        .map(|(ns, _)| *ns)
        .ok_or_else(|| t.unexpected(PERIOD))?;
    let ns = k.checked_mul(ns_per).ok_or_else(|| t.unexpected(PERIOD))?;
    let secs = u64::try_from(ns / 1_000_000_000).map_err(|_| t.unexpected(PERIOD))?;
    Ok(Duration::new(secs, (ns % 1_000_000_000) as u32))
}

/// A duration written as a period (`15min`, `30s`, `1h`, `250ms`): for
/// settings such as an HTTP rule's `block_for`.
#[cfg_attr(not(all(feature = "tower", feature = "serde")), allow(dead_code))]
pub(crate) fn duration(text: &str) -> Result<Duration, ParseError> {
    let mut tokens = Tokens::new(text);
    let d = period(tokens.expect(PERIOD)?)?;
    end(&mut tokens, "the end of the duration")?;
    Ok(d)
}

/// `count "/" period`.
fn amount(tokens: &mut Tokens<'_>) -> Result<(u64, Duration), ParseError> {
    let n = count(tokens.expect(COUNT)?)?;
    let slash = tokens.expect(SLASH)?;
    if slash.text != "/" {
        return Err(slash.unexpected(SLASH));
    }
    let p = period(tokens.expect(PERIOD)?)?;
    Ok((n, p))
}

fn end(tokens: &mut Tokens<'_>, expected: &'static str) -> Result<(), ParseError> {
    match tokens.next_token() {
        None => Ok(()),
        Some(t) => Err(t.unexpected(expected)),
    }
}

/// The period in the largest unit that divides it: `s`, `10s`, `250ms`.
struct PeriodText(Duration);

impl fmt::Display for PeriodText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ns = self.0.as_nanos();
        if ns == 0 {
            return f.write_str("0s");
        }
        for (per, names) in UNITS {
            if ns % per == 0 {
                let k = ns / per;
                return if k == 1 {
                    f.write_str(names[0])
                } else {
                    write!(f, "{k}{}", names[0])
                };
            }
        }
        unreachable!("every period is a whole number of nanoseconds")
    }
}

impl fmt::Display for Rate {
    /// `100/s`, or `100/s burst 20` when the burst was set.
    ///
    /// ```
    /// # use ratewall::Rate;
    /// assert_eq!(Rate::per_minute(5).burst(10).to_string(), "5/min burst 10");
    /// ```
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.count(), PeriodText(self.period()))?;
        if let Some(b) = self.burst_setting() {
            write!(f, " burst {b}")?;
        }
        Ok(())
    }
}

impl FromStr for Rate {
    type Err = ParseError;

    /// `count/period [burst b]`: `"100/s"`, `"5/min burst 10"`,
    /// `"3/250ms"`. Validated when a limiter is built.
    ///
    /// ```
    /// # use ratewall::Rate;
    /// assert_eq!("5/min burst 10".parse::<Rate>()?, Rate::per_minute(5).burst(10));
    /// assert!("5 per minute".parse::<Rate>().is_err());
    /// # Ok::<(), ratewall::ParseError>(())
    /// ```
    fn from_str(s: &str) -> Result<Self, ParseError> {
        let mut tokens = Tokens::new(s);
        let (n, p) = amount(&mut tokens)?;
        let mut rate = Rate::new(n, p);
        if let Some(t) = tokens.next_token() {
            if !t.is("burst") {
                return Err(t.unexpected("`burst` or the end"));
            }
            rate = rate.burst(count(tokens.expect(COUNT)?)?);
        }
        end(&mut tokens, "the end of the rate")?;
        Ok(rate)
    }
}

impl fmt::Display for Window {
    /// `100/min`: the limit per window length.
    ///
    /// ```
    /// # use ratewall::Window;
    /// # use std::time::Duration;
    /// assert_eq!(Window::new(3, Duration::from_millis(1500)).to_string(), "3/1500ms");
    /// ```
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.limit(), PeriodText(self.length()))
    }
}

impl FromStr for Window {
    type Err = ParseError;

    /// `limit/length`: `"1000/h"`. Validated when a limiter is built.
    ///
    /// ```
    /// # use ratewall::Window;
    /// assert_eq!("1000/h".parse::<Window>()?, Window::per_hour(1000));
    /// # Ok::<(), ratewall::ParseError>(())
    /// ```
    fn from_str(s: &str) -> Result<Self, ParseError> {
        let mut tokens = Tokens::new(s);
        let (n, p) = amount(&mut tokens)?;
        end(&mut tokens, "the end of the window")?;
        Ok(Window::new(n, p))
    }
}

impl PolicyAlgorithm {
    /// The keyword of the text form (`"leaky"`, `"sliding-window"`...).
    ///
    /// ```
    /// # use ratewall::PolicyAlgorithm;
    /// assert_eq!(PolicyAlgorithm::SlidingWindowLog.keyword(), "sliding-log");
    /// ```
    pub const fn keyword(self) -> &'static str {
        match self {
            PolicyAlgorithm::TokenBucket => "token-bucket",
            PolicyAlgorithm::LeakyBucket => "leaky",
            PolicyAlgorithm::FixedWindow => "fixed-window",
            PolicyAlgorithm::SlidingWindowCounter => "sliding-window",
            PolicyAlgorithm::SlidingWindowLog => "sliding-log",
        }
    }

    fn from_keyword(word: &str) -> Option<PolicyAlgorithm> {
        const NAMES: [(&str, PolicyAlgorithm); 8] = [
            ("token-bucket", PolicyAlgorithm::TokenBucket),
            ("leaky", PolicyAlgorithm::LeakyBucket),
            ("leaky-bucket", PolicyAlgorithm::LeakyBucket),
            ("fixed-window", PolicyAlgorithm::FixedWindow),
            ("sliding-window", PolicyAlgorithm::SlidingWindowCounter),
            (
                "sliding-window-counter",
                PolicyAlgorithm::SlidingWindowCounter,
            ),
            ("sliding-log", PolicyAlgorithm::SlidingWindowLog),
            ("sliding-window-log", PolicyAlgorithm::SlidingWindowLog),
        ];
        NAMES
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(word))
            .map(|(_, a)| *a)
    }
}

impl fmt::Display for Policy {
    /// The canonical text form: the amount, the algorithm (omitted for the
    /// default token bucket), `burst` or `queue` when set, `soft` when soft.
    ///
    /// ```
    /// # use ratewall::{Policy, Rate, Tolerance, Window};
    /// assert_eq!(Policy::token_bucket(Rate::per_second(100)).to_string(), "100/s");
    /// assert_eq!(Policy::leaky_bucket(Rate::per_second(10).burst(20)).to_string(), "10/s leaky queue 20");
    /// let soft = Policy::sliding_window_counter(Window::per_hour(1000)).soft(Tolerance::Percent(5));
    /// assert_eq!(soft.to_string(), "1000/h sliding-window soft 5%");
    /// ```
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.rate(), self.window()) {
            (Some(r), _) => {
                write!(f, "{}/{}", r.count(), PeriodText(r.period()))?;
                let burst_word = match self.algorithm() {
                    PolicyAlgorithm::LeakyBucket => {
                        f.write_str(" leaky")?;
                        "queue"
                    }
                    _ => "burst",
                };
                if let Some(b) = r.burst_setting() {
                    write!(f, " {burst_word} {b}")?;
                }
            }
            (None, Some(w)) => write!(f, "{w} {}", self.algorithm().keyword())?,
            (None, None) => unreachable!("a policy has a rate or a window"),
        }
        if let Some(t) = self.tolerance() {
            write!(f, " soft {t}")?;
        }
        Ok(())
    }
}

impl FromStr for Policy {
    type Err = ParseError;

    /// The text form (see `docs/configuration.md`), validated as
    /// [`Policy::validate`] does:
    ///
    /// ```
    /// use ratewall::{ConfigError, ParseError, Policy, Rate, Tolerance, Window};
    ///
    /// assert_eq!("100/s".parse::<Policy>()?, Policy::token_bucket(Rate::per_second(100)));
    /// assert_eq!("5/min burst 10".parse::<Policy>()?, Policy::token_bucket(Rate::per_minute(5).burst(10)));
    /// assert_eq!("1000/h sliding-window".parse::<Policy>()?, Policy::sliding_window_counter(Window::per_hour(1000)));
    /// assert_eq!("10/s leaky queue 20".parse::<Policy>()?, Policy::leaky_bucket(Rate::per_second(10).burst(20)));
    /// assert_eq!(
    ///     "100/min soft 10%".parse::<Policy>()?,
    ///     Policy::token_bucket(Rate::per_minute(100)).soft(Tolerance::Percent(10))
    /// );
    /// assert_eq!("0/s".parse::<Policy>(), Err(ParseError::Invalid(ConfigError::ZeroRate)));
    /// # Ok::<(), ParseError>(())
    /// ```
    fn from_str(s: &str) -> Result<Self, ParseError> {
        let mut tokens = Tokens::new(s);
        let (n, p) = amount(&mut tokens)?;
        let mut algorithm: Option<(PolicyAlgorithm, Token<'_>)> = None;
        let mut burst: Option<(u64, Token<'_>)> = None;
        let mut soft: Option<Tolerance> = None;
        while let Some(t) = tokens.next_token() {
            if let Some(a) = PolicyAlgorithm::from_keyword(t.text) {
                if algorithm.is_some() {
                    return Err(t.unexpected("one algorithm only"));
                }
                algorithm = Some((a, t));
            } else if t.is("burst") || t.is("queue") {
                if burst.is_some() {
                    return Err(t.unexpected("one `burst` or `queue` only"));
                }
                burst = Some((count(tokens.expect(COUNT)?)?, t));
            } else if t.is("soft") {
                if soft.is_some() {
                    return Err(t.unexpected("one `soft` only"));
                }
                let v = tokens.expect(TOLERANCE)?;
                let units = digits(v.text).ok_or_else(|| v.unexpected(TOLERANCE))?;
                soft = Some(if tokens.peek().is_some_and(|t| t.text == "%") {
                    let _ = tokens.next_token();
                    Tolerance::Percent(
                        u32::try_from(units)
                            .map_err(|_| v.unexpected("a percentage up to 4294967295"))?,
                    )
                } else {
                    Tolerance::Units(u64::try_from(units).map_err(|_| v.unexpected(TOLERANCE))?)
                });
            } else {
                return Err(t.unexpected(CLAUSE));
            }
        }
        let algorithm = algorithm.map_or(PolicyAlgorithm::TokenBucket, |(a, _)| a);
        let policy = match algorithm {
            PolicyAlgorithm::TokenBucket | PolicyAlgorithm::LeakyBucket => {
                let leaky = algorithm == PolicyAlgorithm::LeakyBucket;
                let mut rate = Rate::new(n, p);
                if let Some((b, word)) = burst {
                    if leaky && word.is("burst") {
                        return Err(word.unexpected("`queue` (a leaky bucket's capacity)"));
                    }
                    if !leaky && word.is("queue") {
                        return Err(word.unexpected("`burst` (`queue` is for `leaky`)"));
                    }
                    rate = rate.burst(b);
                }
                if leaky {
                    Policy::leaky_bucket(rate)
                } else {
                    Policy::token_bucket(rate)
                }
            }
            window => {
                if let Some((_, word)) = burst {
                    return Err(word.unexpected("`soft` or the end (windows have no burst)"));
                }
                let w = Window::new(n, p);
                match window {
                    PolicyAlgorithm::FixedWindow => Policy::fixed_window(w),
                    PolicyAlgorithm::SlidingWindowCounter => Policy::sliding_window_counter(w),
                    _ => Policy::sliding_window_log(w),
                }
            }
        };
        let policy = match soft {
            Some(t) => policy.soft(t),
            None => policy,
        };
        policy.validate()?;
        Ok(policy)
    }
}

#[cfg(feature = "serde")]
mod serde_impls {
    //! String forms for configuration files: a rate, window or policy is
    //! written and read as its text form (`"100/min soft 10%"`).

    use super::*;
    use serde::de::{Deserializer, Error, Visitor};
    use serde::{Deserialize, Serialize, Serializer};
    use std::marker::PhantomData;

    struct TextVisitor<T>(PhantomData<T>);

    impl<T: FromStr<Err = ParseError>> Visitor<'_> for TextVisitor<T> {
        type Value = T;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a limit as text, such as \"100/min burst 20\"")
        }
        fn visit_str<E: Error>(self, v: &str) -> Result<T, E> {
            v.parse().map_err(E::custom)
        }
    }

    macro_rules! text_serde {
        ($($ty:ty),*) => {$(
            impl Serialize for $ty {
                fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                    s.collect_str(self)
                }
            }
            impl<'de> Deserialize<'de> for $ty {
                fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                    d.deserialize_str(TextVisitor(PhantomData))
                }
            }
        )*};
    }
    text_serde!(Rate, Window, Policy);
}

#[cfg(all(test, not(ratewall_loom)))]
mod tests {
    use super::*;

    fn unexpected(token: &str, at: usize, expected: &'static str) -> ParseError {
        ParseError::Unexpected {
            token: token.into(),
            at,
            expected,
        }
    }

    #[test]
    fn issue_examples_parse() {
        let cases = [
            ("100/s", Policy::token_bucket(Rate::per_second(100))),
            (
                "5/min burst 10",
                Policy::token_bucket(Rate::per_minute(5).burst(10)),
            ),
            (
                "1000/h sliding-window",
                Policy::sliding_window_counter(Window::per_hour(1000)),
            ),
            (
                "10/s leaky queue 20",
                Policy::leaky_bucket(Rate::per_second(10).burst(20)),
            ),
            (
                "100/min soft 10%",
                Policy::token_bucket(Rate::per_minute(100)).soft(Tolerance::Percent(10)),
            ),
            (
                "  60 / 2min  fixed-window   soft 5 ",
                Policy::fixed_window(Window::new(60, Duration::from_secs(120)))
                    .soft(Tolerance::Units(5)),
            ),
            (
                "5/min sliding-log",
                Policy::sliding_window_log(Window::per_minute(5)),
            ),
            (
                "1_000/250MS token-bucket burst 10 soft 1 %",
                Policy::token_bucket(Rate::new(1000, Duration::from_millis(250)).burst(10))
                    .soft(Tolerance::Percent(1)),
            ),
        ];
        for (text, policy) in cases {
            assert_eq!(text.parse::<Policy>(), Ok(policy), "{text}");
        }
    }

    #[test]
    fn errors_name_the_token_and_what_was_expected() {
        let cases: [(&str, ParseError); 14] = [
            ("", ParseError::Missing { expected: COUNT }),
            ("ten/s", unexpected("ten", 0, COUNT)),
            ("10 s", unexpected("s", 3, SLASH)),
            ("10/", ParseError::Missing { expected: PERIOD }),
            ("10/fortnight", unexpected("fortnight", 3, PERIOD)),
            ("10/5", unexpected("5", 3, PERIOD)),
            ("10/s brust 3", unexpected("brust", 5, CLAUSE)),
            ("10/s burst", ParseError::Missing { expected: COUNT }),
            ("10/s burst -1", unexpected("-1", 11, COUNT)),
            (
                "10/s leaky burst 3",
                unexpected("burst", 11, "`queue` (a leaky bucket's capacity)"),
            ),
            (
                "10/s queue 3",
                unexpected("queue", 5, "`burst` (`queue` is for `leaky`)"),
            ),
            (
                "10/s fixed-window burst 3",
                unexpected("burst", 18, "`soft` or the end (windows have no burst)"),
            ),
            ("10/s soft lots", unexpected("lots", 10, TOLERANCE)),
            (
                "10/s leaky sliding-log",
                unexpected("sliding-log", 11, "one algorithm only"),
            ),
        ];
        for (text, err) in cases {
            assert_eq!(text.parse::<Policy>(), Err(err.clone()), "{text:?}");
            let msg = err.to_string();
            assert!(msg.contains("expected"), "{msg}");
        }
        assert_eq!(
            "99999999999999999999/s".parse::<Rate>(),
            Err(unexpected("99999999999999999999", 0, COUNT))
        );
        assert_eq!(
            "10/s burst 2 burst 3".parse::<Rate>(),
            Err(unexpected("burst", 13, "the end of the rate"))
        );
        assert_eq!(
            "10/s burst".parse::<Window>(),
            Err(unexpected("burst", 5, "the end of the window"))
        );
    }

    #[test]
    fn policies_are_validated_when_parsed() {
        assert_eq!(
            "0/min fixed-window".parse::<Policy>(),
            Err(ParseError::Invalid(ConfigError::ZeroLimit))
        );
        let e = "10000/min sliding-window soft 100%"
            .parse::<Policy>()
            .unwrap_err();
        assert!(
            matches!(
                e,
                ParseError::Invalid(ConfigError::ToleranceTooLarge {
                    limit: 10_000,
                    tolerance: 10_000,
                    max: 6383
                })
            ),
            "{e:?}"
        );
        assert!(e.to_string().contains("at most 6383"), "{e}");
        // Rates and windows alone are checked when a limiter is built.
        assert_eq!("0/s".parse::<Rate>(), Ok(Rate::per_second(0)));
    }

    #[test]
    fn periods_print_in_the_largest_exact_unit() {
        let cases = [
            (Duration::from_secs(86_400), "d"),
            (Duration::from_secs(7200), "2h"),
            (Duration::from_secs(90), "90s"),
            (Duration::from_secs(120), "2min"),
            (Duration::from_millis(1500), "1500ms"),
            (Duration::from_micros(3), "3us"),
            (Duration::from_nanos(7), "7ns"),
            (Duration::ZERO, "0s"),
            (Duration::MAX, "18446744073709551615999999999ns"),
        ];
        for (d, text) in cases {
            assert_eq!(PeriodText(d).to_string(), text);
            let w: Window = format!("1/{text}").parse().unwrap();
            assert_eq!(w.length(), d, "{text}");
        }
        assert!("1/18446744073709551616s".parse::<Window>().is_err());
    }
}
