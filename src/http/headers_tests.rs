//! Unit tests of the header writer's choices (`headers.rs`), written for
//! issue 23's mutation run: which rules each setting lists, when the value
//! rendered at build is reused, the legacy trio, the tie-breaks and the
//! rounding. The rendering of single items is tested beside the code.

use super::*;
use crate::http::compiled::Entry;
use crate::http::{RateLimitLayer, Rule};
use crate::{ManualClock, Rate, Window};
use std::sync::Arc;

/// The rules as built, and the joint `RateLimit-Policy` value of the shown
/// ones.
struct Built {
    rules: Vec<Compiled<ManualClock>>,
    all_policy: Option<(u64, HeaderValue)>,
}

fn build(rules: Vec<Rule>) -> Built {
    let mut b = RateLimitLayer::builder().clock(ManualClock::new());
    for r in rules {
        b = b.rule(r);
    }
    let shared = Arc::try_unwrap(b.build().unwrap().shared)
        .ok()
        .expect("one owner");
    Built {
        rules: shared.rules,
        all_policy: shared.all_policy,
    }
}

impl Built {
    /// The headers `which` asks for, for these entries.
    fn of(&self, which: Headers, entries: &[Entry]) -> Admitted {
        Admitted::of::<_, false>(which, &self.rules, entries, self.all_policy.as_ref())
    }
}

fn entry(rule: u16, decision: Option<Decision>) -> Entry {
    Entry {
        rule,
        key: 0,
        cost: 1,
        shadow: false,
        untracked: false,
        decision,
    }
}

fn text(v: &Option<HeaderValue>) -> Option<&str> {
    v.as_ref().map(|v| v.to_str().unwrap())
}

/// Whether two values share their bytes: a value rendered once and cloned,
/// not rendered again.
fn same_buffer(a: &Option<HeaderValue>, b: &HeaderValue) -> bool {
    a.as_ref()
        .is_some_and(|a| std::ptr::eq(a.as_bytes().as_ptr(), b.as_bytes().as_ptr()))
}

const S: u64 = 1_000_000_000;

fn bucket() -> Policy {
    Policy::token_bucket(Rate::per_minute(100).burst(20)) // q=20;w=12
}

fn window() -> Policy {
    Policy::fixed_window(Window::per_minute(10)) // q=10;w=60
}

fn three_shown_and_a_hidden() -> Built {
    build(vec![
        Rule::per_ip("a", bucket()),
        Rule::global("b", window()),
        Rule::per_route("c", Policy::fixed_window(Window::per_hour(1000))),
        Rule::per_header("d", "x-key", window()).hide_headers(),
    ])
}

#[test]
fn every_shown_rule_is_listed_in_order_and_the_built_value_reused() {
    let b = three_shown_and_a_hidden();
    let all = b.all_policy.as_ref().expect("three shown rules");
    assert_eq!(all.0, 0b111, "the mask of the shown rules");
    let entries = [
        entry(0, Some(Decision::allow(20, 19, 600_000_000))),
        entry(1, Some(Decision::allow(10, 3, 40 * S))),
        entry(2, Some(Decision::allow(1000, 999, 3600 * S))),
        entry(3, Some(Decision::allow(10, 0, 60 * S))),
    ];
    let a = b.of(Headers::Draft(Items::All), &entries);
    assert_eq!(
        text(&a.ratelimit),
        Some("\"a\";r=19;t=1, \"b\";r=3;t=40, \"c\";r=999;t=3600")
    );
    assert_eq!(
        text(&a.policy),
        Some("\"a\";q=20;w=12, \"b\";q=10;w=60, \"c\";q=1000;w=3600")
    );
    assert!(same_buffer(&a.policy, &all.1), "rendered at build, reused");
    assert_eq!(a.legacy, None);
    assert!(!a.is_empty());
}

#[test]
fn one_shown_rule_reuses_its_own_item_and_a_subset_is_rendered() {
    let b = three_shown_and_a_hidden();
    // Only `b` matched (and the hidden `d`).
    let entries = [
        entry(1, Some(Decision::allow(10, 9, 60 * S))),
        entry(3, Some(Decision::allow(10, 9, 60 * S))),
    ];
    let a = b.of(Headers::Draft(Items::All), &entries);
    assert_eq!(text(&a.ratelimit), Some("\"b\";r=9;t=60"));
    assert_eq!(text(&a.policy), Some("\"b\";q=10;w=60"));
    assert!(same_buffer(
        &a.policy,
        b.rules[1].policy_item.as_ref().unwrap()
    ));
    // `a` and `c` matched, not `b`: the pair is rendered for this request.
    let entries = [
        entry(0, Some(Decision::allow(20, 20, 0))),
        entry(2, Some(Decision::allow(1000, 5, 7 * S))),
    ];
    let a = b.of(Headers::Draft(Items::All), &entries);
    assert_eq!(
        text(&a.policy),
        Some("\"a\";q=20;w=12, \"c\";q=1000;w=3600")
    );
    assert_eq!(text(&a.ratelimit), Some("\"a\";r=20;t=0, \"c\";r=5;t=7"));
    // A rule whose entry has no decision (not checked) is left out.
    let entries = [
        entry(0, None),
        entry(1, Some(Decision::allow(10, 1, S))),
        entry(2, Some(Decision::allow(1000, 2, S))),
    ];
    let a = b.of(Headers::Draft(Items::All), &entries);
    assert_eq!(text(&a.ratelimit), Some("\"b\";r=1;t=1, \"c\";r=2;t=1"));
    assert_eq!(
        text(&a.policy),
        Some("\"b\";q=10;w=60, \"c\";q=1000;w=3600")
    );
}

#[test]
fn nothing_shown_writes_nothing() {
    let b = three_shown_and_a_hidden();
    let hidden_only = [entry(3, Some(Decision::allow(10, 9, 60 * S)))];
    let undecided = [entry(0, None), entry(1, None)];
    for which in [
        Headers::Draft(Items::All),
        Headers::Draft(Items::ClosestToExhaustion),
        Headers::Legacy,
        Headers::None,
    ] {
        for entries in [&hidden_only[..], &undecided[..], &[]] {
            let a = b.of(which, entries);
            assert!(a.is_empty(), "{which:?}");
            let mut h = HeaderMap::new();
            a.write(&mut h);
            assert!(h.is_empty(), "{which:?}");
        }
    }
    // And `None` writes nothing even for shown rules.
    let shown = [entry(0, Some(Decision::allow(20, 1, S)))];
    assert!(b.of(Headers::None, &shown).is_empty());
}

#[test]
fn closest_to_exhaustion_and_legacy_name_the_rule_with_the_least_share_left() {
    let b = three_shown_and_a_hidden();
    let entries = [
        entry(0, Some(Decision::allow(20, 10, 6 * S))), // half left
        entry(1, Some(Decision::allow(10, 2, 30 * S))), // a fifth left
        entry(2, Some(Decision::allow(1000, 700, 3600 * S))),
        entry(3, Some(Decision::allow(10, 0, 60 * S))), // hidden: never named
    ];
    let a = b.of(Headers::Draft(Items::ClosestToExhaustion), &entries);
    assert_eq!(text(&a.ratelimit), Some("\"b\";r=2;t=30"));
    assert_eq!(text(&a.policy), Some("\"b\";q=10;w=60"));
    assert_eq!(a.legacy, None);
    let l = b.of(Headers::Legacy, &entries);
    assert_eq!(l.legacy, Some([10, 2, 30]));
    assert_eq!((l.policy.as_ref(), l.ratelimit.as_ref()), (None, None));
    assert!(!l.is_empty(), "the legacy trio alone is something to write");
    // Whatever the order of the entries.
    let mut reversed = entries;
    reversed.reverse();
    let l = b.of(Headers::Legacy, &reversed);
    assert_eq!(l.legacy, Some([10, 2, 30]));
    // The legacy trio is written as three headers, t capped as in `RateLimit`.
    let mut h = HeaderMap::new();
    l.write(&mut h);
    let get = |n: &str| h.get(n).map(|v| v.to_str().unwrap().to_owned());
    assert_eq!(get("x-ratelimit-limit").as_deref(), Some("10"));
    assert_eq!(get("x-ratelimit-remaining").as_deref(), Some("2"));
    assert_eq!(get("x-ratelimit-reset").as_deref(), Some("30"));
    assert_eq!(h.len(), 3);
}

#[test]
fn draft_headers_are_written_under_their_names() {
    let b = three_shown_and_a_hidden();
    let entries = [
        entry(0, Some(Decision::allow(20, 19, S))),
        entry(1, Some(Decision::allow(10, 9, 60 * S))),
    ];
    let a = b.of(Headers::Draft(Items::All), &entries);
    let mut h = HeaderMap::new();
    a.write(&mut h);
    assert_eq!(
        h.get("ratelimit-policy").unwrap(),
        "\"a\";q=20;w=12, \"b\";q=10;w=60"
    );
    assert_eq!(
        h.get("ratelimit").unwrap(),
        "\"a\";r=19;t=1, \"b\";r=9;t=60"
    );
    assert_eq!(h.len(), 2);
}

#[test]
fn more_rules_than_the_mask_holds_are_listed_too() {
    // 66 shown rules: no joint value at build (the mask has 64 bits), and
    // rules 64 and 65 still listed (and never shifted into the mask).
    // Each its own window length, so no two charge the same limit.
    let rules = (0..66)
        .map(|i| {
            let w = Window::new(10, Duration::from_secs(60 + i));
            Rule::global(format!("r{i}"), Policy::fixed_window(w))
        })
        .collect();
    let b = build(rules);
    assert!(b.all_policy.is_none());
    let entries: Vec<Entry> = (0..66)
        .map(|i| entry(i, Some(Decision::allow(10, u64::from(i % 10), S))))
        .collect();
    let a = b.of(Headers::Draft(Items::All), &entries);
    let policy = text(&a.policy).unwrap();
    let ratelimit = text(&a.ratelimit).unwrap();
    assert_eq!(policy.matches(";q=10;w=").count(), 66);
    assert!(policy.starts_with("\"r0\";q=10;w=60, \"r1\";q=10;w=61"));
    assert!(policy.ends_with("\"r64\";q=10;w=124, \"r65\";q=10;w=125"));
    assert!(ratelimit.starts_with("\"r0\";r=0;t=1, \"r1\";r=1;t=1"));
    assert!(ratelimit.ends_with("\"r64\";r=4;t=1, \"r65\";r=5;t=1"));
}

#[test]
fn ties_in_share_go_to_the_longer_wait_and_a_zero_limit_counts_as_one() {
    let soon = Decision::allow(10, 5, S);
    let later = Decision::allow(20, 10, 9 * S);
    assert!(closer_to_exhaustion(&later, &soon));
    assert!(!closer_to_exhaustion(&soon, &later));
    assert!(
        !closer_to_exhaustion(&soon, &soon),
        "not closer than itself"
    );
    // Shares compared by cross-multiplication: 1/3 < 2/5 though 1 < 2 and 3 < 5.
    let third = Decision::allow(3, 1, S);
    let two_fifths = Decision::allow(5, 2, S);
    assert!(closer_to_exhaustion(&third, &two_fifths));
    assert!(!closer_to_exhaustion(&two_fifths, &third));
    // A limit of 0 (nothing can ever pass) is read as 1, not as 0.
    let empty = Decision::deny(0, 0, S, S);
    let full = Decision::allow(4, 4, 0);
    assert!(closer_to_exhaustion(&empty, &full));
    assert!(!closer_to_exhaustion(&full, &empty));
    let zero_left = Decision::allow(0, 0, 0);
    let one_left = Decision::allow(8, 1, 0);
    assert!(closer_to_exhaustion(&zero_left, &one_left));
}

#[test]
fn w_rounds_up_to_whole_seconds_and_is_at_least_one() {
    let cases = [
        (Policy::token_bucket(Rate::per_second(10).burst(5)), 1), // 0.5 s
        (Policy::token_bucket(Rate::per_second(2).burst(3)), 2),  // 1.5 s
        (Policy::token_bucket(Rate::per_second(1).burst(3)), 3),  // 3 s exactly
        (Policy::token_bucket(Rate::per_minute(100).burst(20)), 12),
        (Policy::fixed_window(Window::per_minute(10)), 60),
        (
            Policy::fixed_window(Window::new(10, Duration::from_millis(1))),
            1,
        ),
        (
            Policy::fixed_window(Window::new(10, Duration::from_millis(60_001))),
            61,
        ),
    ];
    for (p, w) in cases {
        assert_eq!(window_secs(&p), w, "{p:?}");
    }
}

#[test]
fn t_is_capped_at_a_window_when_admitted_only() {
    let counter = Policy::sliding_window_counter(Window::per_minute(10));
    let admitted = Decision::allow(10, 9, 119 * S);
    assert_eq!(t_secs(&admitted, &counter), 60);
    let admitted_soon = Decision::allow(10, 9, 59 * S + 1);
    assert_eq!(t_secs(&admitted_soon, &counter), 60);
    let denied = Decision::deny(10, 0, 65 * S, 119 * S);
    assert_eq!(t_secs(&denied, &counter), 65, "a wait is never shortened");
    // A window of a second and a bit caps at 2, not 1.
    let odd = Policy::sliding_window_counter(Window::new(10, Duration::from_millis(1_500)));
    assert_eq!(t_secs(&Decision::allow(10, 1, 3 * S), &odd), 2);
    // Buckets are never capped (a soft bucket's time to full may pass w).
    let b = Policy::token_bucket(Rate::per_second(1).burst(2));
    assert_eq!(t_secs(&Decision::allow(2, 0, 3 * S), &b), 3);
    // The same `t` as `Decision::ratelimit_header`.
    assert_eq!(
        admitted.ratelimit_header("x", &counter).unwrap(),
        "\"x\";r=9;t=60"
    );
}

#[test]
fn the_buffer_moves_to_the_heap_at_exactly_its_size() {
    for (first, second) in [(384, 0), (383, 1), (384, 1), (380, 10), (1, 383)] {
        let mut b = Buf::new();
        assert!(b.is_empty());
        let x = vec![b'x'; first];
        let y = vec![b'y'; second];
        b.bytes(&x);
        b.bytes(&y);
        let mut want = x.clone();
        want.extend_from_slice(&y);
        assert_eq!(b.as_slice(), &want[..], "{first} + {second}");
        assert!(!b.is_empty());
        // And more after the move.
        b.bytes(b"z");
        want.push(b'z');
        assert_eq!(b.as_slice(), &want[..], "{first} + {second} + 1");
    }
    // Empty writes leave an empty buffer empty: no separator is written.
    let mut b = Buf::new();
    b.bytes(b"");
    assert!(b.is_empty());
    b.item(b"\"a\";q=1;w=1");
    b.item(b"\"b\";q=2;w=2");
    assert_eq!(b.as_slice(), b"\"a\";q=1;w=1, \"b\";q=2;w=2");
    // A buffer that only reached the heap is not empty.
    let mut b = Buf::new();
    b.bytes(&[b'h'; 400]);
    assert!(!b.is_empty());
    b.separator();
    assert_eq!(&b.as_slice()[398..], b"hh, ");
}
