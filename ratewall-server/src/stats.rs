//! The server's counters and their Prometheus text (`GET /metrics`).
//!
//! Per limit, the counts envoyproxy/ratelimit keeps (in hits): total,
//! within the limit, near it (above 80% of it), over it, and over it in
//! shadow mode. Labels are the configuration's names (domain and
//! descriptor path), never a client's values unless the limit asks for
//! `detailed_metric`.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use std::collections::BTreeMap;
use std::sync::OnceLock;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

use crate::service::Service;
use crate::store::{LimitState, LimitStats, MAX_SERIES};

/// The process's recorder of the library's own metrics (Redis calls and
/// their latency, failovers, the breaker, the deny cache): installed once,
/// as the `metrics` facade's global recorder, by the first server started.
/// `None` when another recorder was installed first (an embedding program
/// with its own exporter: those metrics go there).
pub(crate) fn library_metrics() -> Option<&'static PrometheusHandle> {
    static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new().build_recorder();
            let handle = recorder.handle();
            metrics::set_global_recorder(recorder).ok().map(|()| handle)
        })
        .as_ref()
}

/// Upper bounds of the call latency histogram, in seconds.
const BUCKETS: [f64; 12] = [
    0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.1, 1.0,
];

/// Calls by transport and answer, and their latency.
#[derive(Debug, Default)]
pub(crate) struct CallStats {
    /// gRPC, JSON.
    calls: [[AtomicU64; 3]; 2],
    latency_buckets: [AtomicU64; BUCKETS.len()],
    latency_count: AtomicU64,
    latency_sum_ns: AtomicU64,
    /// Configuration loads that failed (the old one kept serving).
    pub(crate) reload_errors: AtomicU64,
    /// Configuration loads that replaced the one serving.
    pub(crate) reloads: AtomicU64,
}

/// How a call was carried.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Transport {
    Grpc = 0,
    Json = 1,
}

/// What a call was answered.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Answer {
    Ok = 0,
    OverLimit = 1,
    Error = 2,
}

const ANSWERS: [&str; 3] = ["ok", "over_limit", "error"];
const TRANSPORTS: [&str; 2] = ["grpc", "json"];

fn bump(c: &AtomicU64, n: u64) {
    // Relaxed: statistics, each read alone; they order nothing.
    c.fetch_add(n, Ordering::Relaxed);
}

fn read(c: &AtomicU64) -> u64 {
    // Relaxed: see `bump`.
    c.load(Ordering::Relaxed)
}

impl CallStats {
    pub(crate) fn record(&self, transport: Transport, answer: Answer, took: Duration) {
        bump(&self.calls[transport as usize][answer as usize], 1);
        let secs = took.as_secs_f64();
        if let Some(i) = BUCKETS.iter().position(|&b| secs <= b) {
            bump(&self.latency_buckets[i], 1);
        }
        bump(&self.latency_count, 1);
        bump(
            &self.latency_sum_ns,
            u64::try_from(took.as_nanos()).unwrap_or(u64::MAX),
        );
    }
}

/// One of a limit's counters.
type Field = fn(&LimitStats) -> &AtomicU64;

/// A limit's counters, in the order of the series written.
const FIELDS: [Field; 5] = [
    |s| &s.total_hits,
    |s| &s.within_limit,
    |s| &s.near_limit,
    |s| &s.over_limit,
    |s| &s.shadow_mode,
];

/// A label value with `\`, `"` and newlines escaped.
fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The Prometheus text of every counter.
pub(crate) fn render(service: &Service, calls: &CallStats) -> String {
    let mut out = String::new();
    let generation = service.generation();
    let mut limits: Vec<&LimitState> = generation.by_id.values().map(|s| &**s).collect();
    let overrides = service.override_states();
    // Each configured limit's series, then its values' (`detailed_metric`),
    // and the descriptors that carried their own limit, by stats key. Rows
    // of one stats key are summed (a descriptor's own limit and a
    // configured one can share it, as in the Go service's stats).
    let mut rows: BTreeMap<String, [u64; 5]> = BTreeMap::new();
    let mut put = |key: &str, s: &LimitStats| {
        let row = rows.entry(key.to_owned()).or_default();
        for (slot, field) in row.iter_mut().zip(FIELDS) {
            *slot += read(field(s));
        }
    };
    for l in &limits {
        put(&l.def.full_key, &l.stats);
    }
    for l in limits.iter().copied().chain(overrides.iter().map(|s| &**s)) {
        let map = l.series.by_key.lock().unwrap_or_else(|e| e.into_inner());
        for (k, v) in map.iter() {
            put(k, v);
        }
    }
    limits.sort_by(|a, b| a.def.full_key.cmp(&b.def.full_key));
    let names: [(&str, &str); 5] = [
        (
            "ratewall_server_hits_total",
            "hits (cost units) counted against a limit",
        ),
        ("ratewall_server_within_limit_total", "hits admitted"),
        (
            "ratewall_server_near_limit_total",
            "admitted hits above 80% of the limit",
        ),
        (
            "ratewall_server_over_limit_total",
            "hits over the limit (shadow mode included)",
        ),
        (
            "ratewall_server_shadow_mode_total",
            "hits over a shadow-mode limit, answered OK",
        ),
    ];
    for (i, (name, help)) in names.iter().enumerate() {
        let _ = writeln!(out, "# HELP {name} {help}.\n# TYPE {name} counter");
        for (key, row) in &rows {
            let _ = writeln!(out, "{name}{{descriptor=\"{}\"}} {}", label(key), row[i]);
        }
    }
    let _ = writeln!(
        out,
        "# HELP ratewall_server_series_dropped_total hits counted only in their limit's own series: their stats key (a detailed_metric value, value_to_metric's values) found none of the {MAX_SERIES} per limit left; descriptor=\"\" sums the limits descriptors carried themselves.\n# TYPE ratewall_server_series_dropped_total counter"
    );
    for l in &limits {
        let _ = writeln!(
            out,
            "ratewall_server_series_dropped_total{{descriptor=\"{}\"}} {}",
            label(&l.def.full_key),
            read(&l.series.dropped)
        );
    }
    let own: u64 = overrides.iter().map(|l| read(&l.series.dropped)).sum();
    let _ = writeln!(
        out,
        "ratewall_server_series_dropped_total{{descriptor=\"\"}} {own}"
    );
    let _ = writeln!(
        out,
        "# HELP ratewall_server_override_limits_refused_total descriptors whose own limit found no room (max_override_limits).\n# TYPE ratewall_server_override_limits_refused_total counter\nratewall_server_override_limits_refused_total {}",
        read(&service.overrides_refused)
    );
    let _ = writeln!(
        out,
        "# HELP ratewall_server_calls_total ShouldRateLimit calls by transport and answer.\n# TYPE ratewall_server_calls_total counter"
    );
    for (t, tname) in TRANSPORTS.iter().enumerate() {
        for (a, aname) in ANSWERS.iter().enumerate() {
            let _ = writeln!(
                out,
                "ratewall_server_calls_total{{transport=\"{tname}\",answer=\"{aname}\"}} {}",
                read(&calls.calls[t][a])
            );
        }
    }
    let _ = writeln!(
        out,
        "# HELP ratewall_server_call_seconds Time to answer a call, from its decoded request to its answer.\n# TYPE ratewall_server_call_seconds histogram"
    );
    let mut cumulative = 0;
    for (i, b) in BUCKETS.iter().enumerate() {
        cumulative += read(&calls.latency_buckets[i]);
        let _ = writeln!(
            out,
            "ratewall_server_call_seconds_bucket{{le=\"{b}\"}} {cumulative}"
        );
    }
    let count = read(&calls.latency_count);
    let _ = writeln!(
        out,
        "ratewall_server_call_seconds_bucket{{le=\"+Inf\"}} {count}"
    );
    let _ = writeln!(
        out,
        "ratewall_server_call_seconds_sum {}\nratewall_server_call_seconds_count {count}",
        read(&calls.latency_sum_ns) as f64 / 1e9
    );
    let _ = writeln!(
        out,
        "# HELP ratewall_server_config_loads_total Configuration loads by result.\n# TYPE ratewall_server_config_loads_total counter\nratewall_server_config_loads_total{{result=\"replaced\"}} {}\nratewall_server_config_loads_total{{result=\"error\"}} {}",
        read(&calls.reloads),
        read(&calls.reload_errors)
    );
    if let Some(library) = library_metrics() {
        library.run_upkeep();
        out.push_str(&library.render());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::ServiceOptions;

    /// `detailed_metric`: one series per value, up to `MAX_SERIES`; past
    /// that, values count in the limit's own series and as dropped.
    #[tokio::test]
    async fn detailed_metric_series_are_per_value_and_bounded() {
        let yaml = "domain: d\ndescriptors:\n  - key: user\n    detailed_metric: true\n    rate_limit: { unit: hour, requests_per_unit: 2 }\n";
        let config = Config::from_sources(&[("d.yaml".into(), yaml.into())]).unwrap();
        let s = Service::new(config, ServiceOptions::default()).unwrap();
        for _ in 0..3 {
            s.check("d", &[&[("user", "ada")]], 1).await.unwrap();
        }
        let text = render(&s, &CallStats::default());
        assert!(
            text.contains("ratewall_server_hits_total{descriptor=\"d.user_ada\"} 3"),
            "{text}"
        );
        assert!(
            text.contains("ratewall_server_over_limit_total{descriptor=\"d.user_ada\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("ratewall_server_hits_total{descriptor=\"d.user\"} 3"),
            "{text}"
        );
        let extra = 5;
        for i in 0..MAX_SERIES - 1 + extra {
            s.check("d", &[&[("user", &format!("u{i}"))]], 1)
                .await
                .unwrap();
        }
        let text = render(&s, &CallStats::default());
        let values = text
            .lines()
            .filter(|l| l.starts_with("ratewall_server_hits_total{descriptor=\"d.user_"))
            .count();
        assert_eq!(values, MAX_SERIES);
        assert!(
            text.contains(&format!(
                "ratewall_server_series_dropped_total{{descriptor=\"d.user\"}} {extra}"
            )),
            "{text}"
        );
    }
}
