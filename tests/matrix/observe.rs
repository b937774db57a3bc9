//! What an operator sees, captured for the whole run: a metrics recorder
//! that never drains (so a gauge read twice reads what was last set), the
//! `tracing` lines, and every store event through each limiter's hook.

use crate::support::logs::Captured;
use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use ratewall::redis::StoreEvent;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

type Handles = Arc<Mutex<HashMap<Key, Arc<AtomicU64>>>>;

/// Counters and gauges by key; histograms are not kept.
#[derive(Clone, Default)]
pub struct Metrics {
    counters: Handles,
    gauges: Handles,
}

fn handle(map: &Handles, key: &Key) -> Arc<AtomicU64> {
    map.lock().unwrap().entry(key.clone()).or_default().clone()
}

impl Recorder for Metrics {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(handle(&self.counters, key))
    }
    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::from_arc(handle(&self.gauges, key))
    }
    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::noop()
    }
}

fn matches(key: &Key, name: &str, labels: &[(&str, &str)]) -> bool {
    key.name() == name
        && labels
            .iter()
            .all(|(l, v)| key.labels().any(|x| x.key() == *l && x.value() == *v))
}

impl Metrics {
    /// The sum of the counters `name` whose labels include `labels`.
    pub fn counter(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        let map = self.counters.lock().unwrap();
        map.iter()
            .filter(|(k, _)| matches(k, name, labels))
            // SeqCst: read after the requests that bumped it were answered.
            .map(|(_, v)| v.load(Ordering::SeqCst))
            .sum()
    }

    /// Every gauge `name`, as (the value of label `label`, value).
    pub fn gauges(&self, name: &str, label: &str) -> Vec<(String, f64)> {
        let map = self.gauges.lock().unwrap();
        map.iter()
            .filter(|(k, _)| k.name() == name)
            .map(|(k, v)| {
                let l = k
                    .labels()
                    .find(|x| x.key() == label)
                    .map_or(String::new(), |x| x.value().to_owned());
                // SeqCst: as for counters.
                (l, f64::from_bits(v.load(Ordering::SeqCst)))
            })
            .collect()
    }
}

/// The run's observers, installed once (global: the server's tasks run on
/// every worker thread).
pub struct Observers {
    pub metrics: Metrics,
    pub logs: Captured,
}

pub fn observers() -> &'static Observers {
    static OBS: OnceLock<Observers> = OnceLock::new();
    OBS.get_or_init(|| {
        let metrics = Metrics::default();
        metrics::set_global_recorder(metrics.clone()).expect("the only recorder");
        let logs = Captured::default();
        tracing::subscriber::set_global_default(logs.subscriber()).expect("the only subscriber");
        Observers { metrics, logs }
    })
}

/// The `ratewall` log lines (WARN or INFO) that name limiter `name`.
pub fn log_text_naming(name: &str) -> Vec<String> {
    let tag = format!("`{name}`");
    observers()
        .logs
        .text()
        .lines()
        .filter(|l| l.contains(" ratewall") && (l.contains(" WARN ") || l.contains(" INFO ")))
        .filter(|l| l.contains(&tag))
        .map(str::to_owned)
        .collect()
}

/// How many of them.
pub fn log_lines_naming(name: &str) -> usize {
    log_text_naming(name).len()
}

/// Store events seen through the hooks: (limiter, failing?, when).
#[derive(Clone, Default)]
pub struct Events(Arc<Mutex<Vec<(String, bool, Instant)>>>);

impl Events {
    pub fn hook(&self) -> impl Fn(&StoreEvent) + Send + Sync + 'static {
        let seen = self.0.clone();
        move |e: &StoreEvent| {
            let entry = match e {
                StoreEvent::Failing { limiter, .. } => (limiter.clone(), true),
                StoreEvent::Recovered { limiter, .. } => (limiter.clone(), false),
                _ => return,
            };
            seen.lock()
                .unwrap()
                .push((entry.0, entry.1, Instant::now()));
        }
    }

    /// The events of limiter `name`, in order: (failing?, when).
    pub fn of(&self, name: &str) -> Vec<(bool, Instant)> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|(l, ..)| l == name)
            .map(|&(_, f, t)| (f, t))
            .collect()
    }

    /// Whether limiter `name`'s last event says it fails.
    pub fn failing(&self, name: &str) -> bool {
        self.of(name).last().is_some_and(|&(f, _)| f)
    }
}
