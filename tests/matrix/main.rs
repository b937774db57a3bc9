//! The rule matrix, tested as a whole (issue 30 item 2): every rule kind
//! (the five algorithms, tiered, lockout, local and Redis concurrency,
//! shadow) on every store (local, Redis, Redis Cluster) under every
//! failure policy (open, closed, fallback-share, fallback), through three
//! phases (healthy, Redis killed, Redis back), each cell served by a real
//! axum server to a real HTTP client. The cells are generated from the
//! axes' enums (`cells.rs`); a cell that cannot exist is excluded by one
//! function that says why. Every cell keeps the invariants of
//! `invariants.rs`; the cells that do not are listed in `cells::KNOWN`,
//! and the run asserts that list is exactly the failing set.
//!
//! The cells of one store and failure policy share one Redis (or one
//! 3-master Cluster), one backend with a short breaker cool-down, one layer
//! with each rule on its own path, and one server (`group.rs`); the groups
//! run in parallel.

#![cfg(all(
    feature = "axum",
    feature = "redis",
    feature = "metrics",
    feature = "tracing"
))]

#[path = "../support/mod.rs"]
mod support;

mod cells;
mod group;
mod invariants;
mod observe;

use cells::{cells_of, excluded, Cell, Failure, Kind, Phase, Store, KNOWN};
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Instant;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_cell_of_the_rule_matrix_keeps_every_invariant() {
    let started = Instant::now();
    observe::observers();
    let sink: invariants::Failures = Arc::new(Mutex::new(Vec::new()));
    let mut groups = Vec::new();
    for &store in Store::ALL {
        for &failure in Failure::ALL {
            let cells = cells_of(store, failure);
            if !cells.is_empty() {
                groups.push(tokio::spawn(group::run(
                    store,
                    failure,
                    cells,
                    sink.clone(),
                )));
            }
        }
    }
    let mut ran = BTreeSet::new();
    for g in groups {
        ran.extend(g.await.expect("a group panicked"));
    }

    // The matrix's size: the product of the axes, minus the exclusions.
    let mut out = Vec::new();
    for &kind in Kind::ALL {
        for &store in Store::ALL {
            for &failure in Failure::ALL {
                if let Some(why) = excluded(kind, store, failure) {
                    out.push((
                        Cell {
                            kind,
                            store,
                            failure,
                        },
                        why,
                    ));
                }
            }
        }
    }
    let product = Kind::ALL.len() * Store::ALL.len() * Failure::ALL.len() * Phase::ALL.len();
    let excluded_cells = out.len() * Phase::ALL.len();
    println!(
        "rule matrix: {} cells of {product} ran ({} kinds x {} stores x {} failure policies x {} phases), {excluded_cells} excluded, in {:?}:",
        ran.len(),
        Kind::ALL.len(),
        Store::ALL.len(),
        Failure::ALL.len(),
        Phase::ALL.len(),
        started.elapsed()
    );
    for (cell, why) in &out {
        println!(
            "  excluded {} (x {} phases): {why}",
            cell.name(),
            Phase::ALL.len()
        );
    }
    assert_eq!(
        ran.len(),
        product - excluded_cells,
        "every cell not excluded ran once"
    );

    println!("{:?}", invariants::MEASURED.lock().unwrap());
    let text = observe::observers().logs.text();
    let lines: Vec<&str> = text.lines().filter(|l| l.contains(" ratewall")).collect();
    println!("{} ratewall log lines", lines.len());
    for l in lines.iter().filter(|l| !l.contains('`')) {
        println!("  unattributed: {l}");
    }

    // The failing cells are exactly the known ones.
    let failures = sink.lock().unwrap().clone();
    for (cell, phase, what) in &failures {
        println!("FAIL {} {}: {what}", cell.name(), phase.label());
    }
    let failing: BTreeSet<(Kind, Store, Failure, Phase)> = failures
        .iter()
        .map(|(c, p, _)| (c.kind, c.store, c.failure, *p))
        .collect();
    let known: BTreeSet<(Kind, Store, Failure, Phase)> =
        KNOWN.iter().map(|&(k, s, f, p, _)| (k, s, f, p)).collect();
    for (k, s, f, p, what) in KNOWN {
        println!(
            "  known failure {}-{}-{} {}: {what}",
            s.label(),
            f.label(),
            k.label(),
            p.label()
        );
    }
    let new: Vec<_> = failing.difference(&known).collect();
    let fixed: Vec<_> = known.difference(&failing).collect();
    assert!(
        new.is_empty() && fixed.is_empty(),
        "failing cells not in KNOWN: {new:?}; KNOWN cells that pass now (remove them): {fixed:?}"
    );
}
