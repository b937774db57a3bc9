//! Shared pieces of the two window counters: their validated parameters and
//! a division by the window length that costs one multiply.

use crate::clock::HORIZON;
use crate::error::ConfigError;
use crate::quota::Window;

/// The latest time the window counters see: `HORIZON - 1`, so that every
/// time is below 2^63 (what [`FastDiv`] needs). Time stands still there.
pub(crate) const LAST_NS: u64 = HORIZON - 1;

/// `n / d` for any `n < 2^63`, as one 64x64->128-bit multiply and a shift.
///
/// Granlund and Montgomery's round-up method: with `l = ceil(log2 d)`,
/// `s = 63 + l` and `m = ceil(2^s / d)`, the error `e = m*d - 2^s` is below
/// `d <= 2^l = 2^(s - 63)`, which makes `floor(n*m / 2^s) == floor(n / d)`
/// for every `n < 2^63`; and `m < 2^64` for every `d` (it is `2^63` when `d`
/// is a power of two, and below `2^64` otherwise). A hardware 64-bit divide
/// costs 40-90 cycles on this generation of Xeon; this costs about 4.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FastDiv {
    pub(crate) d: u64,
    m: u64,
    s: u32,
}

impl FastDiv {
    /// `d` must be in `2..=2^62` (window lengths are validated to at least
    /// 2^23 ns), so that `s >= 64` and the quotient is the high half of the
    /// product shifted by `s - 64`.
    pub(crate) fn new(d: u64) -> Self {
        debug_assert!((2..=1 << 62).contains(&d));
        let l = 64 - (d - 1).leading_zeros(); // ceil(log2 d); 0 for d = 1
        let s = 63 + l;
        let m = (1u128 << s).div_ceil(u128::from(d));
        debug_assert!(m < 1 << 64);
        FastDiv { d, m: m as u64, s }
    }

    /// `n / d`; `n` must be below 2^63.
    #[inline]
    pub(crate) fn div(self, n: u64) -> u64 {
        debug_assert!(n < 1 << 63);
        let high = ((u128::from(n) * u128::from(self.m)) >> 64) as u64;
        high >> (self.s - 64)
    }
}

/// The parameters of a window counter: length `W` (ns), limit `L`, and the
/// reciprocal of `W`. They fill the three words of a `ParamCell` as
/// `[W, m, L | s << 32]` (`L < 2^24`, `s < 128`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct WindowParams {
    pub(crate) length: u64,
    pub(crate) limit: u64,
    pub(crate) div: FastDiv,
}

impl WindowParams {
    pub(crate) fn new(w: &Window, max_limit: u64, min_ns: u64) -> Result<Self, ConfigError> {
        debug_assert!(max_limit < 1 << 32);
        let (limit, length) = w.validate(max_limit, min_ns)?;
        Ok(WindowParams {
            length,
            limit,
            div: FastDiv::new(length),
        })
    }

    pub(crate) fn encode(&self) -> [u64; 3] {
        [
            self.length,
            self.div.m,
            self.limit | u64::from(self.div.s) << 32,
        ]
    }

    pub(crate) fn decode(w: [u64; 3]) -> Self {
        WindowParams {
            length: w[0],
            limit: w[2] & 0xFFFF_FFFF,
            div: FastDiv {
                d: w[0],
                m: w[1],
                s: (w[2] >> 32) as u32,
            },
        }
    }

    /// The window id of `now` (already clamped to `LAST_NS`).
    #[inline]
    pub(crate) fn id(&self, now: u64) -> u64 {
        self.div.div(now)
    }
}

/// A window counter's keyed packing: its window length (fixed per table:
/// quota changes and per-key quotas keep it) and the id arithmetic, for a
/// window id kept modulo `2^BITS` (fixed window: 16 bits; sliding counter:
/// 12). The id is read back relative to the id of `now`: `nid ..< nid +
/// 2^(BITS-1)` (the current window, or a later one when time is behind the
/// state's), or `nid - 1`; any other is a stale window. A stale id reads as
/// current again only `2^(BITS-1)` windows later: the wrap sweep reclaims
/// idle keys every `2^(BITS-3)` windows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct KeyedWindow<const BITS: u32> {
    params: WindowParams,
}

impl<const BITS: u32> KeyedWindow<BITS> {
    const MASK: u64 = (1 << BITS) - 1;

    pub(crate) fn new(params: &WindowParams) -> Self {
        KeyedWindow { params: *params }
    }

    /// The id of `now` (clamped to `LAST_NS`).
    #[inline]
    pub(crate) fn id(&self, now: u64) -> u64 {
        self.params.id(now.min(LAST_NS))
    }

    /// The `BITS` low bits of `id`.
    #[inline]
    pub(crate) fn low(id: u64) -> u64 {
        id & Self::MASK
    }

    /// The low bits an idle state is packed with at `now`'s id `nid`:
    /// `2^(BITS-3)` windows (a sweep period) back, so that it reads as stale
    /// from that many windows (less two) before `nid` (checks at earlier
    /// instants) to three times as many after (the wrap sweep rewrites it
    /// within two; after that it would read as a window with nothing
    /// counted: idle all the same).
    #[inline]
    pub(crate) fn idle(nid: u64) -> u64 {
        Self::low(nid.wrapping_sub(1 << (BITS - 3)))
    }

    /// The id whose low bits are `low`, read at `now`'s id `nid` (see the
    /// type's doc); `None`: stale.
    #[inline]
    pub(crate) fn full(low: u64, nid: u64) -> Option<u64> {
        let ahead = low.wrapping_sub(nid) & Self::MASK;
        if ahead < 1 << (BITS - 1) {
            Some(nid + ahead)
        } else if ahead == Self::MASK {
            nid.checked_sub(1)
        } else {
            None
        }
    }

    /// `2^(BITS-3)` windows.
    pub(crate) fn sweep_period(&self) -> u64 {
        self.params.length.saturating_mul(1 << (BITS - 3))
    }

    /// Whether parameters `p` keep this table's window length.
    pub(crate) fn fits(&self, p: &WindowParams) -> Result<(), ConfigError> {
        if p.length == self.params.length {
            Ok(())
        } else {
            Err(ConfigError::Incompatible {
                reason: "a keyed window counter keeps the window length it was built with (its slots count windows of that length): change the limit only, or build another limiter for the new window",
            })
        }
    }
}

#[cfg(all(test, not(ratewall_loom)))]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn fast_div_matches_hardware_division_at_the_edges() {
        let ds = [
            2u64,
            3,
            7,
            1_000_000_000,
            (1 << 23) - 1,
            1 << 23,
            (1 << 23) + 1,
            60_000_000_000,
            (1 << 62) - 1,
            1 << 62,
        ];
        let ns = [0u64, 1, 2, (1 << 62) - 1, 1 << 62, LAST_NS - 1, LAST_NS];
        for d in ds {
            let f = FastDiv::new(d);
            for n in ns.iter().copied().chain([d - 1, d, d + 1, 3 * d - 1]) {
                if n <= LAST_NS {
                    assert_eq!(f.div(n), n / d, "{n} / {d}");
                }
            }
        }
    }

    proptest! {
        #[test]
        fn fast_div_is_exact(d in 2u64..=1 << 62, n in 0u64..=LAST_NS) {
            prop_assert_eq!(FastDiv::new(d).div(n), n / d);
        }

        #[test]
        fn fast_div_is_exact_for_small_divisors(d in 2u64..10_000_000_000, n in 0u64..=LAST_NS) {
            prop_assert_eq!(FastDiv::new(d).div(n), n / d);
        }

        #[test]
        fn params_round_trip(limit in 1u64..(1 << 24), length in 2u64..=1 << 62) {
            let p = WindowParams { length, limit, div: FastDiv::new(length) };
            prop_assert_eq!(WindowParams::decode(p.encode()), p);
        }
    }
}
