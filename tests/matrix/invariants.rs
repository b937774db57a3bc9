//! The invariants every cell keeps, one function each, and the client
//! that drives a cell through a phase while tallying what it saw.

use crate::cells::{Cell, Failure, Kind, Phase, Store};
use crate::group::{hit_as, Built, Client, COOL_DOWN, HOLD, MARGIN, TIMEOUT};
use crate::observe::{log_lines_naming, log_text_naming, observers, Events};
use crate::support::http_client::Seen;
use crate::support::redis_server::raw_command;
use futures_util::future::join_all;
use http::StatusCode;
use ratewall::http::RateLimitLayer;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What the run measured, for its summary: Retry-After waits checked,
/// the slowest request, the slowest recovery after Redis returned.
#[derive(Debug, Default)]
pub struct Measured {
    pub retry_after_checks: u64,
    pub slowest_request: Duration,
    pub slowest_recovery: Duration,
}

pub static MEASURED: Mutex<Measured> = Mutex::new(Measured {
    retry_after_checks: 0,
    slowest_request: Duration::ZERO,
    slowest_recovery: Duration::ZERO,
});

/// Every broken invariant: (cell, phase, what).
pub type Failures = Arc<Mutex<Vec<(Cell, Phase, String)>>>;

fn fail(sink: &Failures, cell: Cell, phase: Phase, what: String) {
    sink.lock().unwrap().push((cell, phase, what));
}

/// What the client saw in one phase of one cell.
#[derive(Debug, Default)]
pub struct Tally {
    /// 200s, and among them those the body says were admitted open or by
    /// the fallback.
    pub ok: u64,
    pub ok_fail_open: u64,
    pub ok_fallback: u64,
    /// 429s.
    pub limited: u64,
    /// 503s: a fail-closed store's, a concurrency rule's shed.
    pub closed: u64,
    pub shed: u64,
    /// Any other answer (each is also a failure of its own).
    pub other: u64,
    /// Requests sent.
    pub sent: u64,
}

/// Whether `phase` lets a `Closed` limiter answer 503 (during an outage,
/// and before the limiter recovers).
fn closed_allowed(cell: Cell, outage: bool) -> bool {
    outage
        && cell.failure == Failure::Closed
        && cell.store != Store::Local
        && cell.kind != Kind::Shadow
}

/// Counts one answer; checks it is one the cell may give and that it came
/// in time. Returns its `Retry-After` if it was a denial.
pub fn record(
    cell: Cell,
    phase: Phase,
    outage: bool,
    got: (Option<Seen>, Duration),
    t: &mut Tally,
    sink: &Failures,
) -> Option<u64> {
    t.sent += 1;
    let (seen, took) = got;
    // No request outlives its timeout: the backend's, the handler's hold,
    // and a loaded machine's margin.
    let bound = TIMEOUT + HOLD + MARGIN;
    {
        let mut m = MEASURED.lock().unwrap();
        m.slowest_request = m.slowest_request.max(took);
    }
    if took > bound {
        fail(
            sink,
            cell,
            phase,
            format!("a request took {took:?} (bound {bound:?})"),
        );
    }
    let Some(seen) = seen else {
        fail(
            sink,
            cell,
            phase,
            "a request got no answer within 30 s".into(),
        );
        return None;
    };
    match seen.status {
        StatusCode::OK => {
            t.ok += 1;
            let body = seen.text();
            if body.contains("FailOpen") {
                t.ok_fail_open += 1;
            } else if body.contains("Fallback") {
                t.ok_fallback += 1;
            }
            None
        }
        StatusCode::TOO_MANY_REQUESTS => {
            t.limited += 1;
            denial_tells_the_truth(cell, phase, &seen, sink);
            seen.retry_after()
        }
        StatusCode::SERVICE_UNAVAILABLE => {
            let body = seen.text();
            if body.contains("temporary-reduced-capacity") && cell.kind.is_concurrency() {
                t.shed += 1;
                seen.retry_after()
            } else if closed_allowed(cell, outage) {
                t.closed += 1;
                if !seen.retry_after().is_some_and(|s| s >= 1) {
                    fail(
                        sink,
                        cell,
                        phase,
                        "a fail-closed 503 without Retry-After".into(),
                    );
                }
                None
            } else {
                t.other += 1;
                fail(sink, cell, phase, format!("an undocumented 503: {body}"));
                None
            }
        }
        s => {
            t.other += 1;
            fail(
                sink,
                cell,
                phase,
                format!("an unexpected {s}: {}", seen.text()),
            );
            None
        }
    }
}

/// The parameters `r` and `t` of the `RateLimit` item of rule `name`.
fn ratelimit_item(seen: &Seen, name: &str) -> Option<(i64, Option<i64>)> {
    let v = seen.header("ratelimit")?;
    let list: sfv::List = sfv::Parser::new(v.as_bytes()).parse_list().ok()?;
    list.into_iter().find_map(|e| {
        let sfv::ListEntry::Item(item) = e else {
            return None;
        };
        if item.bare_item.as_string()?.as_str() != name {
            return None;
        }
        let param = |p: &str| {
            item.params
                .iter()
                .find(|(k, _)| k.as_str() == p)
                .and_then(|(_, v)| v.as_integer())
                .map(i64::from)
        };
        Some((param("r")?, param("t")))
    })
}

/// A 429 says when to come back, and the rule's `RateLimit` item agrees:
/// nothing left (`r=0`), and its `t` (a rate rule's) no later than
/// `Retry-After`.
fn denial_tells_the_truth(cell: Cell, phase: Phase, seen: &Seen, sink: &Failures) {
    let Some(retry) = seen.retry_after().filter(|&s| s >= 1) else {
        fail(
            sink,
            cell,
            phase,
            "a 429 without a Retry-After of at least 1".into(),
        );
        return;
    };
    match ratelimit_item(seen, &cell.name()) {
        Some((0, None)) if cell.kind.is_concurrency() => {}
        Some((0, Some(t))) if !cell.kind.is_concurrency() && t >= 1 && t as u64 <= retry => {}
        item => fail(
            sink,
            cell,
            phase,
            format!("a 429 with Retry-After {retry} and the rule's RateLimit item (r, t) {item:?}"),
        ),
    }
}

/// The cell's clients: a tiered cell has two (premium, then the rule's
/// own policy), on one key.
fn clients(cell: Cell) -> &'static [Client] {
    match cell.kind {
        Kind::Tiered => &[Client::Premium, Client::Plain],
        _ => &[Client::Premium],
    }
}

/// The cell's requests of one phase, per client (a tiered cell has two:
/// premium, then the rule's own policy): 5 in a row (3 at once for a
/// concurrency cell, whose limit is 1), then, where nothing but the cell's
/// own limit decides (Redis up, a local store, or a fallback deciding while
/// Redis is down), one more after exactly the `Retry-After` of the last
/// denial, which must be admitted.
pub async fn exercise(addr: SocketAddr, cell: Cell, phase: Phase, t: &mut Tally, sink: &Failures) {
    let outage = phase == Phase::Killed;
    for &client in clients(cell) {
        let mut retry = None;
        if cell.kind.is_concurrency() {
            let got = join_all((0..3).map(|_| hit_as(addr, cell, client))).await;
            for g in got {
                retry = record(cell, phase, outage, g, t, sink).or(retry);
            }
        } else {
            for _ in 0..5 {
                let g = hit_as(addr, cell, client).await;
                retry = record(cell, phase, outage, g, t, sink).or(retry);
            }
        }
        let decided_here = !outage
            || cell.store == Store::Local
            || matches!(cell.failure, Failure::FallbackShare | Failure::Fallback);
        if let (true, Some(secs)) = (decided_here, retry) {
            retry_after_admits(addr, cell, phase, client, secs, t, sink).await;
        }
    }
}

/// A client that waits exactly `Retry-After` is admitted when nothing
/// else happened.
async fn retry_after_admits(
    addr: SocketAddr,
    cell: Cell,
    phase: Phase,
    client: Client,
    secs: u64,
    t: &mut Tally,
    sink: &Failures,
) {
    tokio::time::sleep(Duration::from_secs(secs)).await;
    MEASURED.lock().unwrap().retry_after_checks += 1;
    let g = hit_as(addr, cell, client).await;
    let status = g.0.as_ref().map(|s| (s.status, s.text()));
    record(cell, phase, phase == Phase::Killed, g, t, sink);
    if !matches!(status, Some((StatusCode::OK, _))) {
        fail(
            sink,
            cell,
            phase,
            format!("waited Retry-After {secs} s, then got {status:?}"),
        );
    }
}

/// After Redis returns: every limiter of the cell that reported `Failing`
/// reports `Recovered` within one breaker cool-down (and a margin) once a
/// request reaches it, and its `ratewall_redis_failing` gauge is 0.
pub async fn recovers(
    addr: SocketAddr,
    b: &Built,
    events: &Events,
    back_at: Instant,
    t: &mut Tally,
    sink: &Failures,
) {
    let cell = b.cell;
    let deadline = back_at + COOL_DOWN + MARGIN;
    loop {
        let failing: Vec<&String> = b.limiters.iter().filter(|l| events.failing(l)).collect();
        if failing.is_empty() {
            let mut m = MEASURED.lock().unwrap();
            m.slowest_recovery = m.slowest_recovery.max(back_at.elapsed());
            break;
        }
        if Instant::now() > deadline {
            fail(
                sink,
                cell,
                Phase::Back,
                format!(
                    "{failing:?} still failing {:?} after Redis returned",
                    back_at.elapsed()
                ),
            );
            break;
        }
        // A request from each client: a tier's sibling and the rule's own
        // limiter each recover on a request of their own.
        for &client in clients(cell) {
            let g = hit_as(addr, cell, client).await;
            record(cell, Phase::Back, true, g, t, sink);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for l in &b.limiters {
        let gauges = observers()
            .metrics
            .gauges("ratewall_redis_failing", "limiter");
        match gauges.iter().find(|(n, _)| n == l) {
            Some((_, v)) if *v != 0.0 => fail(
                sink,
                cell,
                Phase::Back,
                format!("ratewall_redis_failing{{limiter={l}}} is {v} after recovery"),
            ),
            _ => {}
        }
    }
}

/// The keys of `port`'s server matching `pattern`.
fn keys(port: u16, pattern: &str) -> Vec<String> {
    raw_command(port, &["KEYS", pattern])
        .map(|r| {
            r.lines()
                .filter(|l| !l.starts_with('*') && !l.starts_with('$') && !l.is_empty())
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// What the cell holds in Redis (`ports`: each server or Cluster node):
/// live permits (a permit set's members), and lockout blocks.
fn held_in_redis(ports: &[u16], cell: Cell) -> Vec<String> {
    let mut held = Vec::new();
    for &port in ports {
        for k in keys(port, &format!("mx:{}:*", cell.name())) {
            let ask = |args: &[&str]| raw_command(port, args).unwrap_or_default();
            let kind = ask(&["TYPE", &k]);
            if kind.starts_with("+zset") {
                let n = ask(&["ZCARD", &k]);
                if n.trim() != ":0" {
                    held.push(format!("{k}: {} permits", n.trim()));
                }
            } else if k.contains("#b:") {
                held.push(format!("block {k}, PTTL {}", ask(&["PTTL", &k]).trim()));
            }
        }
    }
    held
}

/// Nothing left held after a phase where Redis serves: no permit out (in
/// the process, or in Redis), and no lockout block once the client was
/// told it ended (each denial's `Retry-After` was waited out).
pub async fn nothing_held(
    layer: &RateLimitLayer,
    b: &Built,
    phase: Phase,
    ports: &[u16],
    sink: &Failures,
) {
    if phase != Phase::Killed && b.cell.store != Store::Local {
        let held = tokio::task::block_in_place(|| held_in_redis(ports, b.cell));
        if !held.is_empty() {
            // A permit's release may trail its answer: look once more.
            tokio::time::sleep(HOLD).await;
            let held = tokio::task::block_in_place(|| held_in_redis(ports, b.cell));
            if !held.is_empty() {
                fail(
                    sink,
                    b.cell,
                    phase,
                    format!("left held in Redis after the phase: {held:?}"),
                );
            }
        }
    }
    if !b.cell.kind.is_concurrency() {
        return;
    }
    let deadline = Instant::now() + HOLD + MARGIN;
    loop {
        let local = layer
            .stats()
            .iter()
            .find(|s| s.name() == b.cell.name())
            .map_or(0, |s| s.in_flight());
        let remote = b
            .permits
            .as_ref()
            .map_or(0, |l| l.held_here(b"*").unwrap_or(u64::MAX));
        if local == 0 && remote == 0 {
            return;
        }
        if Instant::now() > deadline {
            fail(
                sink,
                b.cell,
                phase,
                format!("still held after the phase: {local} local, {remote} in Redis"),
            );
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A rule's counters, read from `RuleStats`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub allowed: u64,
    pub denied: u64,
    pub shadow_denied: u64,
    pub errors: u64,
    pub fallbacks: u64,
    pub shed: u64,
}

impl Snapshot {
    pub fn of(layer: &RateLimitLayer, rule: &str) -> Snapshot {
        let stats = layer.stats();
        let s = stats
            .iter()
            .find(|s| s.name() == rule)
            .expect("the cell's rule");
        Snapshot {
            allowed: s.allowed(),
            denied: s.denied(),
            shadow_denied: s.shadow_denied(),
            errors: s.errors(),
            fallbacks: s.fallbacks(),
            shed: s.shed(),
        }
    }

    fn minus(self, o: Snapshot) -> Snapshot {
        Snapshot {
            allowed: self.allowed - o.allowed,
            denied: self.denied - o.denied,
            shadow_denied: self.shadow_denied - o.shadow_denied,
            errors: self.errors - o.errors,
            fallbacks: self.fallbacks - o.fallbacks,
            shed: self.shed - o.shed,
        }
    }
}

/// `RuleStats` equal what the client saw in the phase, outcome by outcome.
pub fn tally_matches(
    cell: Cell,
    phase: Phase,
    t: &Tally,
    before: &Snapshot,
    now: &Snapshot,
    sink: &Failures,
) {
    let d = now.minus(*before);
    let mut wrong = Vec::new();
    let answered = t.ok + t.limited + t.closed + t.shed + t.other;
    if cell.kind == Kind::ConcurrencyLocal && cell.store != Store::Local {
        // A 503 of the store, or an admission open or by the fallback, is
        // the companion's (`companion_matches`).
        if d.errors != 0 || d.fallbacks != 0 {
            wrong.push("a local concurrency rule counted errors or fallbacks");
        }
        if d.allowed != t.ok || d.denied != t.limited || d.shed != t.shed || answered != t.sent {
            wrong.push("allowed, denied or shed != the client's");
        }
        if !wrong.is_empty() {
            fail(
                sink,
                cell,
                phase,
                format!("{wrong:?}: client saw {t:?}, RuleStats moved by {d:?}"),
            );
        }
        return;
    }
    if cell.kind == Kind::Shadow {
        // A shadow rule never rejects: each 200 is counted once, as
        // admitted (a fail-open admission too, also an error), as
        // would-have-denied, or (fail-closed, the store down) as an error.
        let undecided = d.errors.saturating_sub(t.ok_fail_open);
        if d.allowed + d.shadow_denied + undecided != t.ok {
            wrong.push("allowed + shadow_denied + undecided errors != 200s");
        }
    } else if d.allowed != t.ok {
        wrong.push("allowed != 200s");
    }
    if d.denied != t.limited {
        wrong.push("denied != 429s");
    }
    if d.shed != t.shed {
        wrong.push("shed != shed 503s");
    }
    let closed_shadow = cell.kind == Kind::Shadow && cell.failure == Failure::Closed;
    if !closed_shadow && d.errors != t.closed + t.ok_fail_open + t.other {
        wrong.push("errors != fail-closed 503s + fail-open 200s + other answers");
    }
    // A fallback's denial (429, or a shed 503) does not say it was one.
    if d.fallbacks < t.ok_fallback || d.fallbacks > t.ok_fallback + t.limited + t.shed {
        wrong.push("fallbacks outside [fallback 200s, fallback 200s + 429s + sheds]");
    }
    if answered != t.sent {
        wrong.push("answers != requests");
    }
    if !wrong.is_empty() {
        fail(
            sink,
            cell,
            phase,
            format!("{wrong:?}: client saw {t:?}, RuleStats moved by {d:?}"),
        );
    }
}

/// The Redis rate rule beside a local concurrency rule counts what the
/// client saw: every admission, no denial (it has room for all), and each
/// store failure (fail-closed 503s, fail-open admissions) or fallback
/// decision, of which those the concurrency rule then shed are invisible to
/// the client (between the visible count and that plus the sheds).
pub fn companion_matches(
    cell: Cell,
    phase: Phase,
    t: &Tally,
    before: &Snapshot,
    now: &Snapshot,
    sink: &Failures,
) {
    let d = now.minus(*before);
    let mut wrong = Vec::new();
    if d.allowed != t.ok {
        wrong.push("allowed != 200s");
    }
    if d.denied != 0 || d.shed != 0 || d.shadow_denied != 0 {
        wrong.push("denied, shed or shadow-denied");
    }
    let visible = t.closed + t.ok_fail_open + t.other;
    if d.errors < visible || d.errors > visible + t.shed {
        wrong.push("errors outside [fail-closed 503s + fail-open 200s, + sheds]");
    }
    if d.fallbacks < t.ok_fallback || d.fallbacks > t.ok_fallback + t.shed {
        wrong.push("fallbacks outside [fallback 200s, + sheds]");
    }
    if !wrong.is_empty() {
        fail(
            sink,
            cell,
            phase,
            format!("companion {wrong:?}: client saw {t:?}, its RuleStats moved by {d:?}"),
        );
    }
}

/// The metrics counters equal `RuleStats`, outcome by outcome (the
/// recorder never drains: each phase's equality holds for its delta too).
pub fn metrics_match(cell: Cell, phase: Phase, rule: &str, now: &Snapshot, sink: &Failures) {
    let name = rule;
    let m = &observers().metrics;
    let count = |outcome: &str| {
        m.counter(
            "ratewall_http_requests_total",
            &[("rule", name), ("outcome", outcome)],
        )
    };
    let seen = Snapshot {
        allowed: count("allowed"),
        denied: count("denied"),
        shadow_denied: count("shadow_denied"),
        errors: count("error"),
        fallbacks: count("fallback"),
        shed: count("shed"),
    };
    if seen != *now {
        fail(
            sink,
            cell,
            phase,
            format!("metrics {seen:?} != RuleStats {now:?}"),
        );
    }
}

/// The Redis limiters' own metrics agree with the rule's `RuleStats`:
/// its fallback decisions are `ratewall_redis_decisions_total{source=
/// "fallback"}`, and its errors (the store could not decide) are the
/// fail-open decisions plus `ratewall_redis_unavailable_total` (answered
/// closed), summed over the limiters the rule's requests reach.
pub fn store_metrics_match(
    cell: Cell,
    phase: Phase,
    limiters: &[String],
    now: &Snapshot,
    sink: &Failures,
) {
    let m = &observers().metrics;
    let sum = |name: &str, source: Option<&str>| -> u64 {
        limiters
            .iter()
            .map(|l| match source {
                Some(s) => m.counter(name, &[("limiter", l), ("source", s)]),
                None => m.counter(name, &[("limiter", l)]),
            })
            .sum()
    };
    let fallback = sum("ratewall_redis_decisions_total", Some("fallback"));
    let fail_open = sum("ratewall_redis_decisions_total", Some("fail_open"));
    let closed = sum("ratewall_redis_unavailable_total", None);
    if fallback != now.fallbacks || fail_open + closed != now.errors {
        fail(
            sink,
            cell,
            phase,
            format!(
                "limiters {limiters:?}: decisions by the fallback {fallback}, fail-open {fail_open}, answered closed {closed}; RuleStats {now:?}"
            ),
        );
    }
}

/// At most two log lines (and two store events) per limiter per outage:
/// one when it fails, one when it is back.
pub fn quiet_after_outage(b: &Built, events: &Events, sink: &Failures) {
    for l in &b.limiters {
        let lines = log_lines_naming(l);
        let evs = events.of(l).len();
        if lines > 2 || evs > 2 {
            fail(
                sink,
                b.cell,
                Phase::Back,
                format!(
                    "limiter {l}: {lines} log lines, {evs} store events in one outage: {:?}",
                    log_text_naming(l)
                ),
            );
        }
    }
}

/// A healthy store decides every request: no limiter of the cell reports
/// `Failing` before Redis is killed.
pub fn healthy_is_decided_by_redis(b: &Built, events: &Events, sink: &Failures) {
    for l in &b.limiters {
        if !events.of(l).is_empty() {
            fail(
                sink,
                b.cell,
                Phase::Healthy,
                format!(
                    "limiter {l} reported a store event while Redis was up: {:?}",
                    log_text_naming(l)
                ),
            );
        }
    }
}
