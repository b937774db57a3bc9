//! Reloads of the real binary under load: whole configurations swapped in
//! one step while callers hammer gRPC, unchanged limits keeping their
//! counts, a broken file leaving the last good configuration serving, and a
//! Kubernetes ConfigMap mount (`..data` symlinks).

mod support;

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use support::{call, eventually, metric, request, ConfigDir, Server};

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

/// The limit every configuration shares, unchanged: its counter must
/// survive every reload. An hour, so no window ends within the test.
const STEADY: u64 = 50;

/// A configuration where `x` and `y` change together (so an answer that
/// mixed two configurations would show it) and `steady` never changes.
fn config((x, y): (u32, u32)) -> String {
    format!(
        "domain: reload\ndescriptors:\n  - key: steady\n    rate_limit: {{ unit: hour, requests_per_unit: {STEADY} }}\n  - key: x\n    rate_limit: {{ unit: hour, requests_per_unit: {x} }}\n  - key: y\n    rate_limit: {{ unit: hour, requests_per_unit: {y} }}\n"
    )
}

/// Limits far above what the test calls, so `x` and `y` never run out.
const A: (u32, u32) = (1_000_000, 2_000_000);
const B: (u32, u32) = (1_000_001, 2_000_001);
const C: (u32, u32) = (3_000_000, 4_000_000);

const RELOADS: u64 = 20;
const CALLERS: usize = 8;

/// What the callers saw.
#[derive(Default)]
struct Seen {
    /// (x's limit, y's limit) as answered, and how many times.
    pairs: Mutex<HashMap<(u32, u32), u64>>,
    /// Answers after the broken file was reported that were not the last
    /// good configuration's.
    stale_after_broken: Mutex<Vec<(u32, u32)>>,
    calls: AtomicU64,
    failed: Mutex<Vec<String>>,
    steady_admitted: AtomicU64,
}

/// Probes `x`'s limit until it is `want`'s (at most 10 s).
async fn serving(server: &Server, want: (u32, u32)) -> bool {
    let c = server.client().await;
    eventually(Duration::from_secs(10), || {
        let mut c = c.clone();
        async move {
            let r = call(&mut c, request("reload", &[&[("x", "probe")]], 1)).await;
            r.statuses[0]
                .current_limit
                .as_ref()
                .is_some_and(|l| l.requests_per_unit == want.0)
        }
    })
    .await
}

/// The configuration written `i`-th (from 0): B, A, B, …
fn nth(i: u64) -> (u32, u32) {
    if i.is_multiple_of(2) {
        B
    } else {
        A
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reloads_under_load_are_whole_keep_unchanged_counts_and_survive_a_broken_file() {
    let dir = ConfigDir::new(&[("config.yaml", &config(A))]);
    let server = Server::start(&dir.path, &[]);
    let replaced = "ratewall_server_config_loads_total{result=\"replaced\"}";
    let errors = "ratewall_server_config_loads_total{result=\"error\"}";
    assert_eq!(metric(server.http, replaced).await, Some(0));

    let seen = Arc::new(Seen::default());
    let stop = Arc::new(AtomicBool::new(false));
    let broken = Arc::new(AtomicBool::new(false));
    let last_good = nth(RELOADS - 1);
    let mut callers = Vec::new();
    for caller in 0..CALLERS {
        let mut c = server.client().await;
        let (seen, stop, broken) = (seen.clone(), stop.clone(), broken.clone());
        callers.push(tokio::spawn(async move {
            let value = format!("c{caller}");
            // Bounded: the test stops them long before.
            for _ in 0..1_000_000 {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let after_broken = broken.load(Ordering::Relaxed);
                let req = request(
                    "reload",
                    &[&[("x", &value)], &[("y", &value)], &[("steady", "shared")]],
                    1,
                );
                let r = match c.should_rate_limit(req).await {
                    Ok(r) => r.into_inner(),
                    Err(e) => {
                        seen.failed.lock().unwrap().push(e.to_string());
                        continue;
                    }
                };
                seen.calls.fetch_add(1, Ordering::Relaxed);
                let rpu = |i: usize| {
                    r.statuses[i]
                        .current_limit
                        .as_ref()
                        .map_or(0, |l| l.requests_per_unit)
                };
                let pair = (rpu(0), rpu(1));
                *seen.pairs.lock().unwrap().entry(pair).or_default() += 1;
                if after_broken && pair != last_good {
                    seen.stale_after_broken.lock().unwrap().push(pair);
                }
                if r.statuses[2].code == OK {
                    seen.steady_admitted.fetch_add(1, Ordering::Relaxed);
                } else {
                    assert_eq!(r.statuses[2].code, OVER, "{r:?}");
                }
            }
        }));
    }

    // 20 rewrites, B, A, B, … each seen serving before the next.
    for i in 0..RELOADS {
        let next = nth(i);
        dir.write("config.yaml", &config(next));
        assert!(
            serving(&server, next).await,
            "rewrite {i} ({next:?}) never served"
        );
    }
    assert_eq!(metric(server.http, replaced).await, Some(RELOADS));
    assert_eq!(metric(server.http, errors).await, Some(0));

    // A broken file mid-load: reported once, and the calls answered after
    // the report are all from the last good configuration.
    let bad = "  - key: z\n    rate_limit: { unit: fortnight, requests_per_unit: 1 }\n";
    dir.write("config.yaml", &format!("{}{bad}", config(C)));
    let reported = eventually(Duration::from_secs(10), || async {
        metric(server.http, errors).await == Some(1)
    })
    .await;
    assert!(reported, "the broken file was never reported");
    broken.store(true, Ordering::Relaxed);
    let before = seen.calls.load(Ordering::Relaxed);
    let more = eventually(Duration::from_secs(20), || async {
        seen.calls.load(Ordering::Relaxed) >= before + 400
    })
    .await;
    assert!(more, "the callers stalled after the broken file");
    // Fixed again: it loads.
    dir.write("config.yaml", &config(C));
    assert!(serving(&server, C).await, "the fixed file never served");

    stop.store(true, Ordering::Relaxed);
    for t in callers {
        t.await.unwrap();
    }
    let failed = std::mem::take(&mut *seen.failed.lock().unwrap());
    assert!(
        failed.is_empty(),
        "{} calls failed: {:?}",
        failed.len(),
        &failed[..failed.len().min(5)]
    );
    let pairs = std::mem::take(&mut *seen.pairs.lock().unwrap());
    let mixed: Vec<_> = pairs.keys().filter(|p| ![A, B, C].contains(p)).collect();
    assert!(
        mixed.is_empty(),
        "answers that mix configurations: {mixed:?} of {pairs:?}"
    );
    assert!(
        pairs.contains_key(&A) && pairs.contains_key(&B),
        "both configurations should have answered: {pairs:?}"
    );
    let stale = std::mem::take(&mut *seen.stale_after_broken.lock().unwrap());
    // C is the fix, written after the broken phase was over.
    let stale: Vec<_> = stale.iter().filter(|p| **p != C).collect();
    assert!(
        stale.is_empty(),
        "answers from before the last good configuration: {stale:?}"
    );
    let calls = seen.calls.load(Ordering::Relaxed);
    assert!(calls > 10 * STEADY, "too few calls to tell: {calls}");
    assert_eq!(
        seen.steady_admitted.load(Ordering::Relaxed),
        STEADY,
        "the unchanged limit admitted more than its limit over {calls} calls: its counter was reset"
    );
    assert_eq!(metric(server.http, replaced).await, Some(RELOADS + 1));
    assert_eq!(metric(server.http, errors).await, Some(1));
    assert_eq!(server.log_lines("not reloaded").len(), 1);
}

/// A Kubernetes ConfigMap mount: each file a symlink into `..data`, itself
/// a symlink to a timestamped directory that holds the files; an update
/// swaps `..data`.
fn configmap(root: &Path, version: &str, yaml: &str) {
    let real = root.join(format!("..{version}"));
    std::fs::create_dir_all(&real).unwrap();
    std::fs::write(real.join("config.yaml"), yaml).unwrap();
    let tmp = root.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(format!("..{version}"), &tmp).unwrap();
    std::fs::rename(&tmp, root.join("..data")).unwrap();
    let link = root.join("config.yaml");
    if std::fs::symlink_metadata(&link).is_err() {
        std::os::unix::fs::symlink("..data/config.yaml", &link).unwrap();
    }
}

fn k8s_config(n: u32) -> String {
    format!("domain: k8s\ndescriptors:\n  - key: k\n    rate_limit: {{ unit: hour, requests_per_unit: {n} }}\n")
}

#[tokio::test]
async fn a_configmap_mount_loads_once_with_ignore_dot_files_and_follows_its_swap() {
    let dir = ConfigDir::new(&[]);
    configmap(&dir.path, "2026_11_28_08_00_00.1", &k8s_config(3));

    // As envoyproxy/ratelimit without RUNTIME_IGNOREDOTFILES: the file is
    // read twice (through the link and in its directory), the domain twice.
    let refused = support::refused(&dir.path);
    assert_eq!(refused.code, Some(1), "{refused:?}");
    assert!(
        refused.stderr.contains("duplicate domain 'k8s'"),
        "{}",
        refused.stderr
    );

    let server = Server::start(&dir.path, &["--ignore-dot-files"]);
    let mut c = server.client().await;
    let k = || request("k8s", &[&[("k", "v")]], 1);
    // Loaded once: 3 an hour, counted once per call.
    for left in [2, 1, 0] {
        let r = call(&mut c, k()).await;
        assert_eq!((r.overall_code, r.statuses[0].limit_remaining), (OK, left));
    }
    assert_eq!(call(&mut c, k()).await.overall_code, OVER);
    let body = support::http(server.http, "GET", "/metrics", "").await.body;
    let listed = body
        .lines()
        .filter(|l| l.starts_with("ratewall_server_hits_total{descriptor=\"k8s.k\"}"))
        .count();
    assert_eq!(listed, 1, "{body}");

    // The update: a new directory, `..data` swapped to it.
    configmap(&dir.path, "2026_11_28_09_00_00.2", &k8s_config(5));
    let swapped = eventually(Duration::from_secs(10), || {
        let mut c = c.clone();
        async move {
            let r = call(&mut c, request("k8s", &[&[("k", "other")]], 0)).await;
            r.statuses[0]
                .current_limit
                .as_ref()
                .is_some_and(|l| l.requests_per_unit == 5)
        }
    })
    .await;
    assert!(swapped, "the swapped ConfigMap was not loaded");
    let replaced = "ratewall_server_config_loads_total{result=\"replaced\"}";
    assert_eq!(metric(server.http, replaced).await, Some(1));
    assert!(
        server.log_lines("not reloaded").is_empty(),
        "{:?}",
        server.log_lines("not reloaded")
    );
}

/// Calls `k` of `domain` once, hits 1: the answer's code and the limit it
/// reports (0 when none).
async fn code_and_limit(
    c: &mut envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient<tonic::transport::Channel>,
    domain: &str,
    value: &str,
) -> (i32, u32) {
    let r = call(c, request(domain, &[&[("k", value)]], 1)).await;
    let limit = r.statuses[0]
        .current_limit
        .as_ref()
        .map_or(0, |l| l.requests_per_unit);
    (r.overall_code, limit)
}

/// What does not change counting (`name`, `shadow_mode`) changes at a
/// reload without resetting the count; a removed file takes its domain
/// away; a limit that cannot be built leaves the old configuration serving.
#[tokio::test]
async fn reloads_change_flags_in_place_drop_removed_files_and_refuse_unbuildable_limits() {
    let limited = "domain: one\ndescriptors:\n  - key: k\n    rate_limit: { unit: hour, requests_per_unit: 2 }\n";
    let other = "domain: two\ndescriptors:\n  - key: k\n    rate_limit: { unit: hour, requests_per_unit: 9 }\n";
    let dir = ConfigDir::new(&[("one.yaml", limited), ("two.yaml", other)]);
    let server = Server::start(&dir.path, &[]);
    let mut c = server.client().await;
    for _ in 0..2 {
        assert_eq!(code_and_limit(&mut c, "one", "v").await, (OK, 2));
    }
    assert_eq!(code_and_limit(&mut c, "one", "v").await, (OVER, 2));

    // Shadow mode and a name switched on: the count is kept (still over),
    // but answered OK and counted as shadow.
    let shadow = "domain: one\ndescriptors:\n  - key: k\n    shadow_mode: true\n    rate_limit: { name: renamed, unit: hour, requests_per_unit: 2 }\n";
    dir.write("one.yaml", shadow);
    let series = "ratewall_server_shadow_mode_total{descriptor=\"one.k\"}";
    let shadowed = eventually(Duration::from_secs(10), || {
        let mut c = c.clone();
        async move { code_and_limit(&mut c, "one", "v").await.0 == OK }
    })
    .await;
    assert!(shadowed, "shadow_mode was not loaded");
    let counted = metric(server.http, series).await.unwrap();
    assert!(counted >= 1, "{counted}");
    let r = call(&mut c, request("one", &[&[("k", "v")]], 1)).await;
    assert_eq!(
        r.statuses[0].current_limit.as_ref().unwrap().name,
        "renamed"
    );
    assert_eq!(metric(server.http, series).await, Some(counted + 1));

    // The second file removed: its domain has no limit any more.
    assert_eq!(code_and_limit(&mut c, "two", "v").await, (OK, 9));
    std::fs::remove_file(dir.path.join("two.yaml")).unwrap();
    let gone = eventually(Duration::from_secs(10), || {
        let mut c = c.clone();
        async move { code_and_limit(&mut c, "two", "v").await == (OK, 0) }
    })
    .await;
    assert!(gone, "the removed file's domain still limits");

    // A policy that reads but that no limiter holds: refused at reload,
    // the old configuration keeps serving (still shadow, still 2).
    let errors = "ratewall_server_config_loads_total{result=\"error\"}";
    dir.write(
        "one.yaml",
        "domain: one\ndescriptors:\n  - key: k\n    rate_limit: { policy: \"1000000/s burst 100000000\" }\n",
    );
    let refused = eventually(Duration::from_secs(10), || async {
        metric(server.http, errors).await == Some(1)
    })
    .await;
    assert!(refused, "the unbuildable limit was not reported");
    assert_eq!(code_and_limit(&mut c, "one", "v").await, (OK, 2));
    assert_eq!(server.log_lines("not reloaded").len(), 1);
}
