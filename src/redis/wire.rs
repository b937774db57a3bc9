//! The wire format: the calls the client sends (a single-key call, a
//! batch of them) and the parsing of every script's reply into decisions.
//! Nothing here does I/O; `connection.rs` sends, the limiters decide.

use super::fault::{self, bad_reply, Fault};
use super::script::{Mode, Program, BATCH, CONCURRENCY, ELASTIC, LEASE, LOCKOUT, MULTI};
use crate::algo::gcra_decide;
use crate::decision::Decision;
use redis::{Cmd, ScriptInvocation, Value};

/// One single-key script call: a check, peek or refund.
pub(crate) struct Call {
    pub(crate) script: &'static redis::Script,
    /// The algorithm's code in `lua/batch.lua` (`g`, `f`, `s`, `l`).
    pub(crate) code: &'static str,
    pub(crate) key: Vec<u8>,
    pub(crate) mode: Mode,
    pub(crate) n: u64,
    pub(crate) params: [u64; 3],
    /// The unit tests' time for this call (see `testing.rs`).
    #[cfg(test)]
    pub(crate) now_us: Option<u64>,
}

impl Call {
    /// The call alone, as its algorithm's own script (`lua/check.lua`).
    pub(crate) fn command(&self) -> Cmd {
        let [a, b, c] = self.params;
        let mut cmd = evalsha(self.script, 1, 6, self.key.len() + 80);
        cmd.arg(&self.key)
            .arg(self.mode.arg())
            .arg(self.n)
            .arg(a)
            .arg(b)
            .arg(c);
        #[cfg(test)]
        cmd.arg(super::testing::arg(self.now_us));
        cmd
    }

    /// This call's reply, read alone (its own script's, `lua/check.lua`):
    /// a check's or peek's decision, or a refund's `1`.
    pub(crate) fn read(&self, reply: &Value) -> Result<Decision, Fault> {
        match (self.mode, reply) {
            (Mode::Refund, Value::Int(1)) => Ok(REFUNDED),
            (Mode::Refund, _) => Err(bad_reply("refund", reply)),
            _ => parse_decision(reply),
        }
    }

    /// How many values this call's answer takes in a batch's reply: one
    /// for a GCRA check or peek (the fast path), five otherwise.
    pub(crate) fn reply_width(&self) -> usize {
        if self.code == "g" && self.mode != Mode::Refund {
            1
        } else {
            5
        }
    }
}

/// What a refund answers in place of a decision: the batch script's
/// `{1, 0, 0, 0, 0}` for it, read as the decision fields they are.
pub(crate) const REFUNDED: Decision = Decision::allow(0, 0, 0);

/// An `EVALSHA` of `script` with `keys` keys, its arguments (`keys`
/// keys, then the script's arguments) to be added by the caller, in a
/// command with room for `args` arguments and `bytes` bytes of them.
pub(crate) fn evalsha(script: &redis::Script, keys: usize, args: usize, bytes: usize) -> Cmd {
    let mut cmd = Cmd::with_capacity(3 + args, 64 + bytes);
    cmd.arg("EVALSHA").arg(script.get_hash()).arg(keys);
    cmd
}

/// The `lua/batch.lua` call for the calls in `batch` (`call` gives each
/// one's [`Call`]): the distinct programs (algorithm and
/// parameters) once each, then the mode, program and cost that every call
/// shares (the common case: calls of one limiter), or each call's.
pub(crate) fn batch_command<Q>(batch: &[Q], call: impl Fn(&Q) -> &Call) -> Cmd {
    let mut programs: Vec<(&'static str, [u64; 3])> = Vec::new();
    let mut index = Vec::with_capacity(batch.len());
    for q in batch {
        let c = call(q);
        let p = (c.code, c.params);
        let i = match programs.iter().position(|x| *x == p) {
            Some(i) => i,
            None => {
                programs.push(p);
                programs.len() - 1
            }
        };
        index.push(i + 1);
    }
    let key_bytes: usize = batch.iter().map(|q| call(q).key.len()).sum();
    let args = 4 * batch.len() + 2 + 4 * programs.len();
    let mut cmd = evalsha(&BATCH, batch.len(), args, key_bytes + 8 * args);
    for q in batch {
        cmd.arg(&call(q).key);
    }
    cmd.arg(programs.len());
    for (code, [a, b, c]) in &programs {
        cmd.arg(*code).arg(*a).arg(*b).arg(*c);
    }
    let triple = |(q, i): (&Q, usize)| (call(q).mode, i, call(q).n);
    let first = triple((&batch[0], index[0]));
    if batch
        .iter()
        .zip(index.iter().copied())
        .all(|c| triple(c) == first)
    {
        // Calls of one limiter: one triple for all.
        let (mode, i, n) = first;
        cmd.arg("1").arg(mode.arg()).arg(i).arg(n);
    } else {
        cmd.arg("0");
        for (q, i) in batch.iter().zip(index) {
            cmd.arg(call(q).mode.arg()).arg(i).arg(call(q).n);
        }
    }
    // A batch's calls share one time (see `batch.rs`).
    #[cfg(test)]
    cmd.arg(super::testing::arg(call(&batch[0]).now_us));
    cmd
}

/// The `lua/multi.lua` call: the limits' keys, then each limit's program
/// and cost.
pub(crate) fn multi_call<'a>(
    rkeys: &[Vec<u8>],
    limits: impl Iterator<Item = (&'a Program, u64)>,
) -> ScriptInvocation<'static> {
    let mut invocation = MULTI.prepare_invoke();
    for k in rkeys {
        invocation.key(k);
    }
    for (p, cost) in limits {
        let [a, b, c] = p.params;
        invocation.arg(p.code()).arg(cost).arg(a).arg(b).arg(c);
    }
    test_time(&mut invocation);
    invocation
}

/// The `lua/lockout.lua` call: the limits' keys, their block keys, then
/// each limit's program, cost and block length in microseconds (0: none).
#[cfg_attr(not(feature = "tower"), allow(dead_code))]
pub(crate) fn lockout_call<'a>(
    rkeys: &[Vec<u8>],
    block_keys: &[Vec<u8>],
    limits: impl Iterator<Item = (&'a Program, u64, u64)>,
) -> ScriptInvocation<'static> {
    let mut invocation = LOCKOUT.prepare_invoke();
    for k in rkeys.iter().chain(block_keys) {
        invocation.key(k);
    }
    for (p, cost, block_us) in limits {
        let [a, b, c] = p.params;
        invocation
            .arg(p.code())
            .arg(cost)
            .arg(a)
            .arg(b)
            .arg(c)
            .arg(block_us);
    }
    test_time(&mut invocation);
    invocation
}

/// The `lua/elastic.lua` call for a cost of `n`: the keys (guarantee,
/// headroom, pool, the pool's interval), the guarantee's program and
/// capacity, the headroom's program, the pool's, and `extra`.
pub(crate) fn elastic_call(
    keys: [&[u8]; 4],
    n: u64,
    g: &Program,
    h: &Program,
    pool: &Program,
    extra: u64,
) -> ScriptInvocation<'static> {
    let mut invocation = ELASTIC.prepare_invoke();
    for k in keys {
        invocation.key(k);
    }
    invocation.arg(n).arg(g.code());
    let [a, b, c] = g.params;
    invocation.arg(a).arg(b).arg(c).arg(g.limit);
    let [a, b, c] = h.params;
    invocation.arg(a).arg(b).arg(c).arg(pool.code());
    let [a, b, c] = pool.params;
    invocation.arg(a).arg(b).arg(c).arg(extra);
    test_time(&mut invocation);
    invocation
}

/// One `lua/lease.lua` call (see its header for the arguments): `prev` is
/// the previous lease's id and the units it used.
pub(crate) struct LeaseCall<'a> {
    pub(crate) key: &'a [u8],
    /// `g` or `f`.
    pub(crate) algo: &'static str,
    /// `t` take, `p` peek, `r` release.
    pub(crate) mode: &'static str,
    pub(crate) n: u64,
    pub(crate) extra: u64,
    pub(crate) params: [u64; 3],
    pub(crate) life_us: u64,
    pub(crate) id: String,
    pub(crate) prev: Option<(String, u64)>,
}

impl LeaseCall<'_> {
    pub(crate) fn invocation(self) -> ScriptInvocation<'static> {
        let [a, b, c] = self.params;
        let mut invocation = LEASE.prepare_invoke();
        invocation
            .key(self.key)
            .arg(self.algo)
            .arg(self.mode)
            .arg(self.n)
            .arg(self.extra)
            .arg(a)
            .arg(b)
            .arg(c)
            .arg(self.life_us)
            .arg(self.id);
        match self.prev {
            Some((pid, used)) => invocation.arg(pid).arg(used),
            None => invocation.arg("").arg(0),
        };
        test_time(&mut invocation);
        invocation
    }
}

/// One `lua/concurrency.lua` call (see its header): the permits' key and
/// their sum's, the mode (`a`, `r`, `n`), the expiry in us, then the mode's
/// arguments.
pub(crate) fn concurrency_call(
    keys: [&[u8]; 2],
    mode: &'static str,
    expiry_us: u64,
    args: &[&str],
) -> ScriptInvocation<'static> {
    let mut invocation = CONCURRENCY.prepare_invoke();
    invocation
        .key(keys[0])
        .key(keys[1])
        .arg(mode)
        .arg(expiry_us);
    for a in args {
        invocation.arg(*a);
    }
    test_time(&mut invocation);
    invocation
}

/// In the crate's unit tests, the time argument every call of a test build
/// ends with (see `testing.rs`); nothing otherwise.
#[allow(unused_variables)]
fn test_time(invocation: &mut ScriptInvocation<'_>) {
    #[cfg(test)]
    invocation.arg(super::testing::arg(super::testing::now_us()));
}

/// One call's answer in a batch's reply: `items` yields the reply's
/// values, and this call takes [`Call::reply_width`] of them.
pub(crate) fn batch_entry(
    call: &Call,
    items: &mut impl Iterator<Item = Value>,
) -> Result<Decision, Fault> {
    if call.reply_width() == 1 {
        // The caller checked the reply's length: one item per such call.
        gcra_entry(call, items.next().unwrap_or(Value::Nil))
    } else {
        let mut fields = [Value::Nil, Value::Nil, Value::Nil, Value::Nil, Value::Nil];
        for (slot, item) in fields.iter_mut().zip(items.take(5)) {
            *slot = item;
        }
        entry(&fields)
    }
}

/// A fast-path GCRA call's reply value (`held`, see `lua/batch.lua`) as the
/// five decision fields its own script would have returned, by the one
/// GCRA arithmetic ([`gcra_decide`], as the local step), or its error
/// message.
fn gcra_entry(call: &Call, held: Value) -> Result<Decision, Fault> {
    let held = match held {
        Value::Int(h) if h >= 0 => h as u64,
        Value::BulkString(message) => {
            return Err(fault::of_message(&String::from_utf8_lossy(&message)))
        }
        other => return Err(bad_reply("batch", &other)),
    };
    let [t, tau, burst] = call.params;
    // A program's interval is at least 1 us, and n x T <= tau <= 2^52
    // (a larger cost is refused before the call): no overflow.
    let t = t.max(1);
    let (allowed, credit, retry, reset) = gcra_decide(held, call.n.saturating_mul(t), tau);
    Ok(fields_decision([
        u64::from(allowed),
        burst,
        credit / t,
        retry,
        reset,
    ]))
}

/// One call's five reply fields: the decision's, or an error message in
/// the first field (that call failed in the script; the others did not).
/// A Lua string in a script's reply is always a bulk string.
fn entry(fields: &[Value; 5]) -> Result<Decision, Fault> {
    match &fields[0] {
        Value::BulkString(message) => Err(fault::of_message(&String::from_utf8_lossy(message))),
        _ => parse_fields(fields).ok_or_else(|| bad_reply("batch", &Value::Array(fields.to_vec()))),
    }
}

/// A script's reply `{allowed, limit, remaining, retry_after_us,
/// reset_after_us}` as a decision.
pub(crate) fn parse_decision(reply: &Value) -> Result<Decision, Fault> {
    let bad = || bad_reply("script", reply);
    let Value::Array(items) = reply else {
        return Err(bad());
    };
    parse_fields(items).ok_or_else(bad)
}

/// `N` reply values as non-negative integers; `None` if they are not.
fn integers<const N: usize>(items: &[Value]) -> Option<[u64; N]> {
    let mut f = [0u64; N];
    if items.len() != N {
        return None;
    }
    for (slot, item) in f.iter_mut().zip(items) {
        match item {
            Value::Int(v) if *v >= 0 => *slot = *v as u64,
            _ => return None,
        }
    }
    Some(f)
}

/// Five reply fields as a decision; `None` if they are not five
/// non-negative integers with `allowed` 0 or 1 and `remaining` at most
/// `limit` (out of range: not a decision any script makes).
pub(crate) fn parse_fields(items: &[Value]) -> Option<Decision> {
    integers::<5>(items)
        .filter(|[allowed, limit, remaining, ..]| *allowed <= 1 && remaining <= limit)
        .map(fields_decision)
}

/// The five fields `{allowed, limit, remaining, retry_after_us,
/// reset_after_us}` as a decision.
pub(crate) fn fields_decision(f: [u64; 5]) -> Decision {
    let [allowed, limit, remaining, retry_us, reset_us] = f;
    let reset = reset_us.saturating_mul(1000);
    if allowed == 1 {
        Decision::allow(limit, remaining, reset)
    } else {
        Decision::deny(limit, remaining, retry_us.saturating_mul(1000), reset)
    }
}

/// The multi-limit script's reply for `count` limits: whether all allowed,
/// and each limit's decision (the script's own, before any soft view).
pub(crate) fn parse_multi(reply: &Value, count: usize) -> Result<(bool, Vec<Decision>), Fault> {
    let bad = || bad_reply("multi-limit", reply);
    let Value::Array(items) = reply else {
        return Err(bad());
    };
    if items.len() != 1 + 5 * count {
        return Err(bad());
    }
    let all = match items[0] {
        Value::Int(all @ (0 | 1)) => all == 1,
        _ => return Err(bad()),
    };
    let decisions = items[1..]
        .chunks(5)
        .map(|f| parse_fields(f).ok_or_else(bad))
        .collect::<Result<Vec<_>, _>>()?;
    Ok((all, decisions))
}

/// The elastic script's reply: five decision fields and the above-limit flag.
pub(crate) fn parse_elastic(reply: &Value) -> Result<Decision, Fault> {
    let bad = || bad_reply("elastic script", reply);
    let Value::Array(items) = reply else {
        return Err(bad());
    };
    if items.len() != 6 {
        return Err(bad());
    }
    let decision = parse_fields(&items[..5]).ok_or_else(bad)?;
    match items[5] {
        Value::Int(above @ (0 | 1)) => Ok(decision.with_above_limit(above == 1)),
        _ => Err(bad()),
    }
}

/// A lease script reply (`lua/lease.lua`).
#[derive(Debug)]
pub(crate) struct LeaseReply {
    pub(crate) decision: Decision,
    pub(crate) granted: u64,
    pub(crate) now_us: u64,
    pub(crate) end_us: u64,
    pub(crate) window: u64,
}

/// `{allowed, limit, remaining, retry_after_us, reset_after_us, granted,
/// now, end, window}`.
pub(crate) fn parse_lease(reply: &Value) -> Result<LeaseReply, Fault> {
    let bad = || bad_reply("lease script", reply);
    let Value::Array(items) = reply else {
        return Err(bad());
    };
    let f = integers::<9>(items).ok_or_else(bad)?;
    let [allowed, limit, remaining, retry_us, reset_us, granted, now_us, end_us, window] = f;
    if allowed > 1 || remaining > limit {
        return Err(bad());
    }
    Ok(LeaseReply {
        decision: fields_decision([allowed, limit, remaining, retry_us, reset_us]),
        granted,
        now_us,
        end_us,
        window,
    })
}

#[cfg(test)]
#[path = "wire_tests.rs"]
mod tests;
