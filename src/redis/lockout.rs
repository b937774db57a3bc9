//! All-or-nothing checks with lockouts, for the HTTP layer's Redis rules
//! with `block_for` (features `tower` and `redis`).
//!
//! # Protocol
//!
//! As [`check_all`](super::check_all), with a block key per limit that
//! has a lockout ([`RedisLimiter::block_key`], holding the block's end and
//! expiring then). One script (`lua/lockout.lua`) reads the blocks and
//! decides every limit at one server time: a blocked key denies (until the
//! block's end) and nothing is written at all; otherwise all allow and
//! take, or nothing is taken and each denying limit with a lockout starts
//! its block in the same call. One round trip, shared by every process on
//! that Redis.
//!
//! Limits that one script cannot reach together (Cluster keys in
//! different slots, several backends) run the same script one limit per
//! call, in parallel, and what the others took is given back if one
//! denies (the window of [`check_all`](super::check_all)'s parallel path);
//! there each call starts its own limit's block, even when another limit's
//! block rejects the request. A cost of 0 takes the plain peek, which reads
//! no block.
//! When Redis cannot answer, each limit's failure policy decides, without
//! blocks (the local fallback knows none). The deny cache is neither read
//! nor fed here: a block is read in the same call as the limit.

// The HTTP layer (feature `tower`) is its only caller.
#![cfg_attr(not(feature = "tower"), allow(dead_code))]

use super::door;
use super::events::Watch;
use super::limiter::RedisLimiter;
use super::multi::{failed_over, finish};
use super::wire::{lockout_call, parse_multi};
use super::{RedisDecision, RedisError};
use futures_util::future::join_all;
use redis::cluster_routing::Slot;
use std::time::Duration;

/// One limit of a check with lockouts: the limiter, the key, the cost,
/// and the lockout: the limiter whose keys name the block (the rule's own,
/// for every tier of it) and the block's length.
pub(crate) struct Locked<'a> {
    pub(crate) limit: &'a RedisLimiter,
    pub(crate) key: &'a [u8],
    pub(crate) cost: u64,
    pub(crate) block: Option<(&'a RedisLimiter, Duration)>,
}

/// A block's length in whole microseconds, rounded up (never shorter).
fn block_us(block: Option<(&RedisLimiter, Duration)>) -> u64 {
    block.map_or(0, |(_, d)| {
        u64::try_from(d.as_nanos().div_ceil(1000))
            .unwrap_or(u64::MAX)
            .max(1)
    })
}

/// Checks the limits all or nothing, with their lockouts (see the module
/// docs). Returns whether the request may proceed and one decision per
/// limit; a blocked limit's decision is a denial until the block's end.
pub(crate) async fn check_all_locked(
    limits: &[Locked<'_>],
) -> Result<(bool, Vec<RedisDecision>), RedisError> {
    let mut rkeys = Vec::with_capacity(limits.len());
    let mut block_keys = Vec::with_capacity(limits.len());
    for l in limits {
        l.limit.validate(l.key, l.cost)?;
        let rkey = l.limit.redis_key(l.key)?;
        block_keys.push(match l.block {
            Some((owner, _)) => owner.block_key(l.key, &rkey)?,
            // Never read (its block length is 0): a key of the same slot.
            None => l.limit.block_key(l.key, &rkey)?,
        });
        rkeys.push(rkey);
    }
    let Some(first) = limits.first() else {
        return Ok((true, Vec::new()));
    };
    let backend = first.limit.backend();
    let together = limits
        .iter()
        .all(|l| l.cost > 0 && l.limit.backend().same(backend))
        && (1..rkeys.len()).all(|i| !rkeys[..i].contains(&rkeys[i]))
        && (!backend.is_cluster() || {
            let slot = Slot::for_key(&rkeys[0]);
            rkeys
                .iter()
                .chain(&block_keys)
                .all(|k| Slot::for_key(k) == slot)
        });
    if together {
        return one_script(limits, &rkeys, &block_keys).await;
    }
    let (rkeys, block_keys) = (&rkeys, &block_keys);
    let results = join_all(limits.iter().enumerate().map(|(i, l)| async move {
        if l.cost == 0 {
            // A cost of 0 takes nothing: the plain peek (no block involved).
            return l.limit.check_key_n(l.key, 0).await;
        }
        let (_, mut d) = one_script(
            std::slice::from_ref(l),
            std::slice::from_ref(&rkeys[i]),
            std::slice::from_ref(&block_keys[i]),
        )
        .await?;
        Ok(d.remove(0))
    }))
    .await;
    let triples: Vec<(&RedisLimiter, &[u8], u64)> =
        limits.iter().map(|l| (l.limit, l.key, l.cost)).collect();
    finish(&triples, results).await
}

async fn one_script(
    limits: &[Locked<'_>],
    rkeys: &[Vec<u8>],
    block_keys: &[Vec<u8>],
) -> Result<(bool, Vec<RedisDecision>), RedisError> {
    let invocation = lockout_call(
        rkeys,
        block_keys,
        limits
            .iter()
            .map(|l| (l.limit.program(), l.cost, block_us(l.block))),
    );
    let watches: Vec<&Watch> = limits.iter().map(|l| l.limit.watch()).collect();
    let got = limits[0]
        .limit
        .backend()
        .invoke(&watches, &invocation, |v| parse_multi(&v, limits.len()))
        .await;
    match got {
        Ok((all, raw)) => {
            // Each limit's decision counted at the door, as for its plain
            // check (the call was accounted there for each).
            let decisions = limits
                .iter()
                .zip(raw)
                .map(|(l, raw)| door::decided(l.limit.watch(), l.limit.redis_decision(raw)))
                .collect();
            Ok((all, decisions))
        }
        Err(RedisError::Unavailable { retry_in, cause }) => {
            let triples: Vec<(&RedisLimiter, &[u8], u64)> =
                limits.iter().map(|l| (l.limit, l.key, l.cost)).collect();
            let results = failed_over(&triples, retry_in, &cause);
            finish(&triples, results).await
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    //! `lua/lockout.lua` against a local model (the local steps, all or
    //! nothing, and a block end per limit), decision by decision, at the
    //! same microsecond times; with both limits in one script and with the
    //! per-limit calls of the parallel path.

    use super::*;
    use crate::redis::testing::at;
    use crate::redis::tests::server::RedisServer;
    use crate::redis::tests::Rng;
    use crate::redis::RedisBackend;
    use crate::{Decision, KeyedPolicyLimiter, ManualClock, Policy, Rate, Window};

    const T0_US: u64 = 1_700_000_000_223_457;

    fn key_fields(d: Decision) -> (bool, u64, u64, u64) {
        let us = |x: Duration| (x.as_nanos() as u64).div_ceil(1000);
        (
            d.is_allowed(),
            d.limit(),
            d.remaining(),
            us(d.retry_after()),
        )
    }

    async fn run(together: bool, server: &RedisServer, prefix: &str) {
        let backend = || {
            RedisBackend::builder(server.url())
                .timeout(Duration::from_secs(5))
                .build()
                .unwrap()
        };
        let (b1, b2) = (backend(), if together { None } else { Some(backend()) });
        let policies = [
            Policy::token_bucket(Rate::per_second(4).burst(2)),
            Policy::fixed_window(Window::new(3, Duration::from_millis(200))),
        ];
        // The first block is shorter than its limit's longest wait (500 ms).
        let blocks = [Duration::from_millis(200), Duration::from_millis(300)];
        let clock = ManualClock::new();
        let local: Vec<KeyedPolicyLimiter<u8, ManualClock>> = policies
            .iter()
            .map(|&p| {
                KeyedPolicyLimiter::builder(p)
                    .clock(clock.clone())
                    .build()
                    .unwrap()
            })
            .collect();
        let remote: Vec<RedisLimiter> = policies
            .iter()
            .enumerate()
            .map(|(i, &p)| {
                let b = if i == 1 {
                    b2.as_ref().unwrap_or(&b1)
                } else {
                    &b1
                };
                RedisLimiter::builder(p, b)
                    .prefix(prefix)
                    .name(format!("l{i}"))
                    .build()
                    .unwrap()
            })
            .collect();
        let mut ends = [0u64; 2];
        let mut rng = Rng(0x5EED ^ u64::from(together));
        let mut t = T0_US;
        let mut blocked_seen = 0;
        for step in 0..300 {
            t += match rng.below(10) {
                0..=3 => 0,
                4..=8 => rng.below(120_000),
                _ => rng.below(900_000),
            };
            let now = t * 1000;
            clock.set_nanos(now);
            let limits: Vec<Locked<'_>> = (0..2)
                .map(|i| Locked {
                    limit: &remote[i],
                    key: b"k",
                    cost: 1,
                    block: Some((&remote[i], blocks[i])),
                })
                .collect();
            let (all, got) = at(t, check_all_locked(&limits)).await.unwrap();
            // The model.
            let blocked: Vec<bool> = (0..2).map(|i| t < ends[i]).collect();
            let peeks: Vec<Decision> = (0..2)
                .map(|i| local[i].peek_key_n(&1, 1).unwrap())
                .collect();
            let mut want: Vec<Decision> = Vec::new();
            // A wait is never shorter than the limit's own.
            let own = |i: usize| {
                if peeks[i].is_allowed() {
                    0
                } else {
                    (peeks[i].retry_after().as_nanos() as u64).div_ceil(1000) * 1000
                }
            };
            for i in 0..2 {
                let left = ((ends[i] - t.min(ends[i])) * 1000).max(own(i));
                want.push(if blocked[i] {
                    Decision::deny(peeks[i].limit(), 0, left, left)
                } else {
                    peeks[i]
                });
            }
            let one_blocked = blocked.iter().any(|&b| b);
            let want_all = !one_blocked && peeks.iter().all(Decision::is_allowed);
            for i in 0..2 {
                // Together: a blocked request starts no block. Apart: each
                // limit's call starts its own.
                let starts = !blocked[i] && !peeks[i].is_allowed() && (!together || !one_blocked);
                if starts {
                    let b = blocks[i].as_micros() as u64;
                    ends[i] = t + b;
                    let wait = (b * 1000).max(own(i));
                    want[i] = Decision::deny(peeks[i].limit(), 0, wait, wait);
                }
            }
            if want_all {
                for l in &local {
                    let _ = l.check_key_n_at(&1, now, 1).unwrap();
                }
            }
            blocked_seen += usize::from(one_blocked);
            let ctx = format!("together {together}, step {step}, t0+{}", t - T0_US);
            assert_eq!(all, want_all, "{ctx}");
            for i in 0..2 {
                assert_eq!(
                    key_fields(got[i].decision()),
                    key_fields(want[i]),
                    "{ctx}, limit {i}"
                );
            }
        }
        assert!(blocked_seen > 10, "blocks exercised: {blocked_seen}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_lockout_script_matches_the_model_together_and_apart() {
        let server = RedisServer::start();
        run(true, &server, "lt").await;
        run(false, &server, "la").await;
    }
}
