//! The words of user-facing messages: counts with their nouns ("1 second",
//! "2 seconds") and waits in milliseconds rounded up, so that no message
//! says "1 seconds" or "in 0 ms" beside a `Retry-After: 1`. Every message
//! that prints a count or a wait writes it through here.

use std::fmt;
use std::time::Duration;

/// `n` and `noun`, the noun plural unless `n` is 1: "1 check", "2 checks",
/// "0 checks". Nouns whose plural is not `noun + "s"` are not used.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Count<'a> {
    n: u64,
    noun: &'a str,
}

/// `n` and `noun` with the plural right ([`Count`]).
#[inline]
pub(crate) fn plural(n: u64, noun: &str) -> Count<'_> {
    Count { n, noun }
}

impl fmt::Display for Count<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = if self.n == 1 { "" } else { "s" };
        write!(f, "{} {}{s}", self.n, self.noun)
    }
}

/// A wait in whole milliseconds, rounded up as `Retry-After` rounds to
/// whole seconds: a wait of a nanosecond is "1 ms", never "0 ms"; only no
/// wait at all is "0 ms".
#[derive(Clone, Copy, Debug)]
pub(crate) struct Millis(pub(crate) Duration);

impl fmt::Display for Millis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ms", self.0.as_nanos().div_ceil(1_000_000))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_take_the_plural_unless_one() {
        let said: Vec<String> = [0, 1, 2, 60]
            .iter()
            .map(|&n| plural(n, "second").to_string())
            .collect();
        assert_eq!(said, ["0 seconds", "1 second", "2 seconds", "60 seconds"]);
    }

    #[test]
    fn waits_round_up_and_never_say_zero() {
        let ms = |d| Millis(d).to_string();
        assert_eq!(ms(Duration::from_nanos(1)), "1 ms");
        assert_eq!(ms(Duration::from_micros(1500)), "2 ms");
        assert_eq!(ms(Duration::from_millis(250)), "250 ms");
        assert_eq!(ms(Duration::ZERO), "0 ms");
    }
}
